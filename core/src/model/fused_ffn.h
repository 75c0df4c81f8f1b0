// The FFN branch Drop(W2·Drop_act(ReLU(W1·x + b1)) + b2) on the CPU in fp32 as one autograd node:
// four sgemm calls and three vectorised loops forward, the hand-written backward likewise, with the
// same counter-based dropout masks (same seeds, drawn in the same order) as the unfused path. The
// unfused path runs ~12 operators forward and ~25 backward per FFN, each dispatched, allocated
// and recorded by autograd: at d_model 64 that costs as much as the arithmetic. Under CPU bf16
// autocast the GEMMs take bf16 operands (oneDNN's bf16 GEMM, fp32 accumulation); the rest is fp32.
#pragma once

#include <torch/types.h>

namespace normlab {

class FeedForwardImpl;

// Whether the fused path computes this FFN: CPU fp32 (or bf16 autocast), no norm inside the FFN, a
// BLAS sgemm in the process, dropout (if any) by counter-based masks, and the lever on (`normlab
// bench --disable ffn`).
bool fused_ffn_applies(const torch::Tensor& x, const FeedForwardImpl& ffn, double dropout,
                       bool training);

// x [..., D] → the branch output [..., D]. When act is given it receives ReLU(W1·x + b1) before the
// activation dropout (a value without graph, for observers).
torch::Tensor fused_ffn_branch(const torch::Tensor& x, const FeedForwardImpl& ffn, double dropout,
                               bool training, torch::Tensor* act = nullptr);

}  // namespace normlab
