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

// What the softmax of one attention sees, for the analysis probes: q [B,H,Tq,dh] and k [B,H,Tk,dh]
// after the projections, every q/k norm and the rotary positions (k repeated per query head), and
// the additive mask, broadcastable to [B,H,Tq,Tk] (undefined: none; `causal`: causal as well). The
// softmax's input is softcap(scale·q·kᵀ) + mask, softcap(x) = s·tanh(x/s) when softcap s > 0.
struct AttentionScores {
  torch::Tensor q, k, mask;
  bool causal = false;
  double scale = 1.0;
  double softcap = 0.0;
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
  // Whether on_attention wants the scores of this layer's attentions: only then are they kept
  // (and the attention is computed without a fused kernel).
  virtual bool wants_attention(const LayerId&) const { return false; }
  virtual void on_attention(const LayerId&, Sublayer, const AttentionScores&) {}
};

// Shared by every layer of one model so an observer can be attached or removed at any time.
struct ModelHooks {
  ActivationObserver* observer = nullptr;
  bool recompute_layers = false;  // activation checkpointing (run.activation_checkpointing)
};

}  // namespace normlab
