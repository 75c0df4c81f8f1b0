// Which parameters AdamW's weight decay reaches (optim.no_decay, issue 45.1). The codebases the
// papers come from differ: fairseq decays every parameter; HF Trainer skips biases and norm
// weights; nanoGPT and OLMo skip every tensor with fewer than 2 dimensions; nGPT uses no decay.
// A scheme may decide for a parameter itself (Scheme::weight_decay, SDK ABI 7).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "normlab/model/transformer_model.h"

namespace normlab {

struct DecayPlan {
  std::string rule;          // the resolved rule: nothing | vectors | vectors+scheme
  std::vector<bool> decays;  // per model->parameters(), in their order
  int64_t decayed_tensors = 0, decayed_elements = 0, tensors = 0, elements = 0;
  int64_t scheme_decisions = 0;  // parameters whose decay the scheme decided
  // "weight decay 0.1 on 50 of 98 tensors (1,234,567 of 1,240,000 elements; no_decay =
  // vectors+scheme)"
  std::string summary(double weight_decay) const;
};

// `no_decay`: auto | nothing | vectors | vectors+scheme; auto is nothing for the transformer
// family (fairseq) and vectors+scheme for the llama family (nanoGPT, OLMo).
DecayPlan plan_weight_decay(TransformerModelImpl& model, const std::string& no_decay);

}  // namespace normlab
