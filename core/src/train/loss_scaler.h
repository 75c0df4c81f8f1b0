// Dynamic loss scaling for fp16 training (Micikevicius et al. 2018, as fairseq and torch.amp's
// GradScaler): the loss is multiplied by `scale` before backward so small gradients survive fp16;
// an update whose gradients overflowed is skipped and the scale halved; after `growth_interval`
// good updates in a row the scale doubles. No LibTorch here.
#pragma once

#include <cstdint>

namespace normlab {

class DynamicLossScaler {
 public:
  explicit DynamicLossScaler(double initial_scale = 65536.0, int64_t growth_interval = 2000,
                             double min_scale = 1e-4)
      : scale_(initial_scale), growth_interval_(growth_interval), min_scale_(min_scale) {}

  double scale() const { return scale_; }
  int64_t good_steps() const { return good_steps_; }

  // After the backward pass of one update; returns whether the optimizer may step (false: the
  // gradients overflowed, the update is skipped).
  bool update(bool gradients_finite) {
    if (!gradients_finite) {
      scale_ /= 2;
      good_steps_ = 0;
      return false;
    }
    if (++good_steps_ >= growth_interval_) {
      scale_ *= 2;
      good_steps_ = 0;
    }
    return true;
  }

  // The scale fell below its floor: the overflow is not a scaling problem but divergence.
  bool exhausted() const { return scale_ < min_scale_; }

  // Checkpointed with the run, so a resumed fp16 run continues with the same scale.
  void restore(double scale, int64_t good_steps) {
    scale_ = scale;
    good_steps_ = good_steps;
  }

 private:
  double scale_;
  int64_t growth_interval_;
  double min_scale_;
  int64_t good_steps_ = 0;
};

}  // namespace normlab
