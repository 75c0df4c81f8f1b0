// NORMLAB_PROFILE_UPDATE=N: LibTorch's profiler (Kineto) around update N of `normlab train`: the
// operators on the CPU and, on a GPU, every kernel with its time on the device. The trace goes to
// <run dir>/profile-update-N.json (Chrome trace format: Perfetto, chrome://tracing), and
// bench/profile_summary.py turns it into a table of where the update's time went. It observes
// only: the update computes what it computes without it.
#pragma once

#include <c10/core/Device.h>

#include <cstdint>
#include <filesystem>
#include <iosfwd>
#include <optional>

namespace normlab {

class UpdateProfiler {
 public:
  // The update NORMLAB_PROFILE_UPDATE names, if set; throws std::invalid_argument naming the
  // variable and the value when it is not a positive integer.
  static std::optional<int64_t> requested_update();

  UpdateProfiler(int64_t update, std::filesystem::path run_dir, const c10::Device& device);
  // Around run_update(u): start and stop the profiler for the requested update only.
  void before(int64_t u);
  void after(int64_t u, std::ostream& out);

 private:
  int64_t update_;
  std::filesystem::path file_;
  c10::Device device_;
  bool active_ = false;
  double started_ = 0;
};

}  // namespace normlab
