// Before a run's first update on a GPU (issue 57.3): each fused operation the run will take is run
// once on its device, on small random tensors in the run's dtype with a NaN and a ±Inf among them,
// forward and backward, against its ATen composition. An operation beyond its dtype's tolerance is
// turned off for the run (SpeedLevers), so a wrong kernel never reaches a user's model: the run
// trains with the reference composition and says so. NORMLAB_FUSED_SELF_CHECK=0 skips the check.
#pragma once

#include <ATen/core/Tensor.h>

#include <iosfwd>
#include <string>
#include <vector>

#include "normlab/model/config.h"

namespace normlab {

// The fused operations a model takes (model/config.h's family, norm kind and heads decide).
struct FusedOpsUsed {
  bool rope = false, swiglu = false, rms_norm = false, grouped_heads = false, adamw = false;
};
FusedOpsUsed fused_ops_used(const ModelConfig& config);

struct FusedOpCheck {
  std::string op;         // "rope", "swiglu", "rms_norm", "grouped_heads", "adamw"
  bool ok = true;         // false: turned off for this run
  std::string error;      // what differed, where not ok
  std::string unchecked;  // why it could not be compared (kept on)
};

struct FusedSelfCheck {
  bool ran = false;  // false: not on the GPU path, or skipped (`skipped` says why)
  std::string skipped;
  double seconds = 0;
  std::vector<FusedOpCheck> ops;
};

// Checks the operations of `used` that this LibTorch and device have, in `dtype` (AdamW in fp32),
// and turns each failing one off in speed_levers(). Runs where tensors on `device` take the GPU
// path (a CUDA device, or the CPU under the tests' gpu_paths_on_cpu lever).
FusedSelfCheck self_check_fused_ops(const at::Device& device, at::ScalarType dtype,
                                    const FusedOpsUsed& used);

// One line on `out` for each operation the check turned off (what `normlab train` says, and every
// command that runs a model: eval, ablate, forward, translate).
void report_fused_self_check(const FusedSelfCheck& check, const at::Device& device,
                             std::ostream& out);

}  // namespace normlab
