#include "update_profiler.h"

#include <fmt/format.h>
#include <fmt/ostream.h>

#include <chrono>
#include <cstdlib>
#include <set>
#include <stdexcept>
#include <string>

#include "torch_compat.h"

#if NORMLAB_TORCH_2
#include <torch/csrc/autograd/profiler_kineto.h>
#endif
#ifdef NORMLAB_WITH_CUDA
#include <torch/cuda.h>
#endif

namespace normlab {

namespace {
double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
}  // namespace

std::optional<int64_t> UpdateProfiler::requested_update() {
  const char* v = std::getenv("NORMLAB_PROFILE_UPDATE");
  if (v == nullptr || *v == '\0') return std::nullopt;
  size_t used = 0;
  int64_t u = 0;
  try {
    u = std::stoll(v, &used);
  } catch (const std::exception&) {
    used = 0;
  }
  if (used != std::string(v).size() || u < 1)
    throw std::invalid_argument(fmt::format(
        "NORMLAB_PROFILE_UPDATE: expected the number of the update to profile (1, 2, …), got '{}'",
        v));
  return u;
}

UpdateProfiler::UpdateProfiler(int64_t update, std::filesystem::path run_dir,
                               const c10::Device& device)
    : update_(update),
      file_(run_dir / fmt::format("profile-update-{}.json", update)),
      device_(device) {}

void UpdateProfiler::before(int64_t u) {
  if (u != update_) return;
#if NORMLAB_TORCH_2
  namespace prof = torch::profiler::impl;
  const prof::ProfilerConfig config(prof::ProfilerState::KINETO);
  std::set<prof::ActivityType> activities{prof::ActivityType::CPU};
  if (device_.is_cuda()) activities.insert(prof::ActivityType::CUDA);
  torch::autograd::profiler::prepareProfiler(config, activities);
  torch::autograd::profiler::enableProfiler(config, activities);
  active_ = true;
  started_ = now_seconds();
#endif
}

void UpdateProfiler::after(int64_t u, std::ostream& out) {
  if (u != update_) return;
#if NORMLAB_TORCH_2
  if (!active_) return;
#ifdef NORMLAB_WITH_CUDA
  if (device_.is_cuda()) torch::cuda::synchronize(device_.index());  // its kernels, finished
#endif
  const double seconds = now_seconds() - started_;
  std::unique_ptr<torch::autograd::profiler::ProfilerResult> result =
      torch::autograd::profiler::disableProfiler();
  active_ = false;
  result->save(file_.string());
  fmt::print(out,
             "profile: update {} ({:.1f} ms with the profiler on) written to {}; "
             "bench/profile_summary.py summarises it\n",
             u, 1e3 * seconds, file_.string());
#else
  fmt::print(out,
             "profile: NORMLAB_PROFILE_UPDATE needs LibTorch 2.x's profiler (Kineto); this normlab "
             "is built against LibTorch {}: update {} was not profiled\n",
             TORCH_VERSION, u);
#endif
}

}  // namespace normlab
