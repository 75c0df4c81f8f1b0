// Softmax attention on the CPU in fp32 as one autograd node: per (sentence, head) block it calls
// the BLAS sgemm directly on q, k and v where the packed projection left them, and writes the
// context as [B, T, H·dh]. ATen's CPU bmm (without MKL) runs one dispatched addmm, three selects
// and their views per matrix, and the unfused path adds q/k/v and context copies and their
// gradients' copies: ~20 operators per attention and direction instead of 2.
#pragma once

#include <torch/types.h>

namespace normlab {

// Whether the fused path computes this attention: CPU fp32 projections, a float additive mask (or
// none), a dropout rate below 1 on the probabilities, a BLAS sgemm found in the process, and the
// lever on (`normlab bench --disable attention` turns it off).
bool fused_attention_applies(const torch::Tensor& projection, const torch::Tensor& mask,
                             double attention_dropout);

// qkv [B, T, 3, H, dh] (the packed q/k/v projection, viewed); mask additive, broadcastable to
// [B, H, T, T], or undefined. Returns Drop(softmax(q·kᵀ/√dh + mask))·v as [B, T, H·dh]; `dropout`
// is the rate on the probabilities (0 outside training), with counter_dropout's mask and seed
// (counter_dropout.h: one draw from LibTorch's CPU generator per call, so resume is bitwise).
torch::Tensor fused_self_attention(const torch::Tensor& qkv, const torch::Tensor& mask,
                                   double dropout = 0.0);

// q [B, Tq, 1, H, dh] and kv [B, Tk, 2, H, dh] (cross-attention's projections); returns [B, Tq,
// H·dh].
torch::Tensor fused_cross_attention(const torch::Tensor& q, const torch::Tensor& kv,
                                    const torch::Tensor& mask, double dropout = 0.0);

}  // namespace normlab
