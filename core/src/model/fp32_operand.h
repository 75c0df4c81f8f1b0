// When a fused CPU kernel may stand in for ATen's ops: they compute in fp32 on the CPU.
#pragma once

#include <ATen/ATen.h>

#include "cpu_gemm.h"
#include "torch_compat.h"

namespace normlab::cpu {

// A CPU float tensor while CPU autocast is off. Under run.dtype = "bf16" autocast runs ATen's
// products in bf16; an fp32 kernel taking fp32 inputs there would silently keep them in fp32.
inline bool fp32_operand(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat &&
         !compat::autocast_state().cpu;
}

// A parameter the fused kernels read as fp32 (a module's weights stay fp32 under autocast too).
inline bool fp32_param(const at::Tensor& t) {
  return t.defined() && t.device().is_cpu() && t.scalar_type() == at::kFloat;
}

// Under CPU bf16 autocast (run.dtype = "bf16"), a CPU float or bf16 tensor that a fused kernel may
// take in bf16 GEMMs (the operands rounded to bf16 as autocast rounds them, fp32 accumulation and
// results), where oneDNN's bf16 GEMM runs here.
inline bool bf16_operand(const at::Tensor& t) {
  const compat::AutocastState a = compat::autocast_state();
  return t.defined() && t.device().is_cpu() &&
         (t.scalar_type() == at::kFloat || t.scalar_type() == at::kBFloat16) && a.cpu &&
         a.cpu_dtype == at::kBFloat16 && onednn_gemm_bf16() != nullptr;
}

}  // namespace normlab::cpu
