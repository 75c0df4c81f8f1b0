// Label-smoothed cross entropy as fairseq's label_smoothed_cross_entropy computes it.
#pragma once

#include <torch/types.h>

namespace normlab {

struct LossSums {
  torch::Tensor loss;  // sum over non-pad targets of the smoothed loss (+ z_loss·log²Z)
  torch::Tensor nll;   // sum of −log p(target) (no gradient)
  torch::Tensor z;     // sum of log²Z, Z = Σ_v exp(logit_v) (no gradient; 0 when z_loss is off)
};

// Every function below adds optim.z_loss's c·log²Z_i per non-pad target to `loss` (PaLM,
// Chowdhery et al. 2022 §5), with its gradient 2c·log Z_i·softmax_i; never to `nll`.

// logits [..., V], target [...]: loss_i = (1 − ε − ε/(V−1))·nll_i + ε/(V−1)·Σ_v −log p_v.
// CPU float logits take one fused kernel (one pass forward, one backward, no log-prob tensor);
// others the composition of ATen kernels.
LossSums label_smoothed_loss(const torch::Tensor& logits, const torch::Tensor& target,
                             double epsilon, int64_t pad_id, double z_loss = 0.0);

// The same loss of logits = hidden·weightᵀ (hidden [..., D], weight [V, D]) without the logits
// tensor: blocks of rows are projected, reduced and differentiated while in cache, and pad rows
// are skipped. For CPU fp32 where projected_loss_applies().
bool projected_loss_applies(const torch::Tensor& hidden, const torch::Tensor& weight);
LossSums projected_label_smoothed_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                                       const torch::Tensor& target, double epsilon, int64_t pad_id,
                                       double z_loss = 0.0);

// The same loss of logits = linear(hidden.to(gemm_dtype), weight.to(gemm_dtype)), taken in fp32 —
// what bf16/fp16 autocast's linear gives, or fp32 — on any device, by blocks of `block_rows` rows
// (0: about 32 M logits a block): never the [N, V] logits, log-probabilities or their gradient.
// The GPU path, where blocked_loss_applies(the output weight, the products' dtype): not fp16.
// `softcap` > 0: the loss of s·tanh(logits/s) (model.final_logit_softcap), which the CPU's
// projected loss does not apply (its callers take the logits' loss then).
bool blocked_loss_applies(const torch::Tensor& weight, at::ScalarType gemm_dtype);
LossSums blocked_projected_loss(const torch::Tensor& hidden, const torch::Tensor& weight,
                                const torch::Tensor& target, double epsilon, int64_t pad_id,
                                at::ScalarType gemm_dtype, int64_t block_rows = 0,
                                double z_loss = 0.0, double softcap = 0.0);

}  // namespace normlab
