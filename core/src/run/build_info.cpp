// `normlab --version` and the device check shared by the CLI and the trainer: what this build is
// and what it can run on, from LibTorch itself.
#include "run/build_info.h"

#include <fmt/format.h>
#include <torch/cuda.h>
#include <torch/version.h>

#include <cctype>
#include <string>

#include "normlab/sdk/abi.h"
#include "normlab_git_hash.h"  // generated at build time (cmake/git_hash.cmake)

namespace normlab {

namespace {

std::string cuda_text() {
#ifndef NORMLAB_WITH_CUDA
  return "no (built without CUDA)";
#else
  const auto n = torch::cuda::device_count();
  if (!torch::cuda::is_available() || n == 0) return "no (built with CUDA, no usable device)";
  return fmt::format("yes ({} device{})", n, n == 1 ? "" : "s");
#endif
}

}  // namespace

std::string version_text() {
  return fmt::format("normlab {}\ngit {}\nLibTorch {}\nCUDA {}\nSDK ABI {}", NORMLAB_VERSION,
                     NORMLAB_GIT_HASH, TORCH_VERSION, cuda_text(), NORMLAB_ABI_VERSION);
}

BuildIdentity build_identity() { return {NORMLAB_VERSION, NORMLAB_GIT_HASH, TORCH_VERSION}; }

std::string device_problem(const std::string& device) {
  if (device == "cpu") return "";
  size_t index_at = 0;
  if (device == "cuda") {
    index_at = device.size();
  } else if (device.rfind("cuda:", 0) == 0 && device.size() > 5 && device.size() <= 8) {
    index_at = 5;
    for (size_t i = index_at; i < device.size(); ++i)
      if (!std::isdigit(static_cast<unsigned char>(device[i]))) index_at = 0;
  }
  if (index_at == 0) return fmt::format("expected cpu, cuda or cuda:N, got \"{}\"", device);
#ifndef NORMLAB_WITH_CUDA
  return fmt::format("\"{}\": this normlab and its LibTorch {} are built without CUDA; use cpu",
                     device, TORCH_VERSION);
#endif
  if (!torch::cuda::is_available())
    return fmt::format("\"{}\": no usable CUDA device on this machine", device);
  const int64_t count = int64_t(torch::cuda::device_count());
  if (index_at < device.size() && std::stoll(device.substr(index_at)) >= count)
    return fmt::format("\"{}\": this machine has {} CUDA device{} (cuda:0{})", device, count,
                       count == 1 ? "" : "s",
                       count == 1 ? std::string() : fmt::format(" to cuda:{}", count - 1));
  return "";
}

}  // namespace normlab
