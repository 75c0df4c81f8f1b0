// Label-smoothed cross entropy as fairseq's label_smoothed_cross_entropy computes it.
#pragma once

#include <torch/types.h>

namespace normlab {

struct LossSums {
  torch::Tensor loss;  // sum over non-pad targets of the smoothed loss
  torch::Tensor nll;   // sum of −log p(target)
};

// logits [..., V], target [...]: loss_i = (1 − ε − ε/(V−1))·nll_i + ε/(V−1)·Σ_v −log p_v.
inline LossSums label_smoothed_loss(const torch::Tensor& logits, const torch::Tensor& target,
                                    double epsilon, int64_t pad_id) {
  const int64_t V = logits.size(-1);
  auto lprobs = torch::log_softmax(logits.reshape({-1, V}).to(torch::kFloat), -1);
  auto tgt = target.reshape({-1, 1});
  auto keep = tgt.ne(pad_id).to(torch::kFloat).squeeze(1);
  auto nll = -lprobs.gather(-1, tgt).squeeze(1) * keep;
  LossSums s;
  s.nll = nll.sum();
  if (epsilon > 0) {
    auto smooth = -lprobs.sum(-1) * keep;
    const double eps_i = epsilon / double(V - 1);
    s.loss = (1.0 - epsilon - eps_i) * s.nll + eps_i * smooth.sum();
  } else {
    s.loss = s.nll;
  }
  return s;
}

}  // namespace normlab
