// Console wording of a run's progress, shared by the trainer's lines and its terminal bar.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>

namespace normlab {

// "02:03", or "1:02:03" from an hour on; "--:--" when not known (negative).
inline std::string duration_text(double seconds) {
  if (!(seconds >= 0)) return "--:--";
  const int64_t t = int64_t(seconds + 0.5);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

// "update 40/100" plus "| epoch 2/5" when the run also stops at max_epochs (epoch 1-based).
inline std::string position_text(int64_t update, int64_t max_updates, int64_t epoch,
                                 int64_t max_epochs) {
  return max_epochs > 0 ? fmt::format("update {:>6}/{} | epoch {:>3}/{}", update, max_updates,
                                      epoch, max_epochs)
                        : fmt::format("update {:>6}/{} | epoch {:>3}", update, max_updates, epoch);
}

}  // namespace normlab
