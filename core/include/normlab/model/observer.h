// Core-owned instrumentation points. The analysis module implements ActivationObserver; when none
// is attached the forward path pays one pointer test per point.
#pragma once

#include <torch/types.h>

#include "normlab/sdk/geometry.h"

namespace normlab {

struct LayerId {
  Stack stack;
  int index;
};

class ActivationObserver {
 public:
  virtual ~ActivationObserver() = default;
  // Drop(F(x)) of one sublayer.
  virtual void on_branch(const LayerId&, Sublayer, const torch::Tensor& /*out*/) {}
  // Input and output of a scheme-declared LayerNorm (norm_id as returned by add_layer_norm).
  virtual void on_norm(const LayerId&, int /*norm_id*/, const torch::Tensor& /*in*/,
                       const torch::Tensor& /*out*/) {}
  // ReLU(W1·h) before activation dropout.
  virtual void on_ffn_activation(const LayerId&, const torch::Tensor& /*act*/) {}
  // Input of a whole layer (stream 0 of a multi-stream scheme).
  virtual void on_layer_input(const LayerId&, const torch::Tensor& /*in*/) {}
  // Output of a whole layer.
  virtual void on_layer_output(const LayerId&, const torch::Tensor& /*out*/) {}
};

// Shared by every layer of one model so an observer can be attached or removed at any time.
struct ModelHooks {
  ActivationObserver* observer = nullptr;
  bool recompute_layers = false;  // activation checkpointing (run.activation_checkpointing)
};

}  // namespace normlab
