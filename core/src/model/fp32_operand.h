// When a fused CPU kernel may stand in for ATen's ops: they compute in fp32 on the CPU.
#pragma once

#include <ATen/ATen.h>

#include "torch_compat.h"

namespace normlab::cpu {

// A CPU float tensor while CPU autocast is off. Under run.dtype = "bf16" autocast runs ATen's
// products in bf16; an fp32 kernel taking fp32 inputs there would silently keep them in fp32.
inline bool fp32_operand(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat &&
         !compat::autocast_state().cpu;
}

}  // namespace normlab::cpu
