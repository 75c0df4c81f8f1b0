// Multi-head attention with separate, stably named q/k/v/out projections.
#pragma once

#include <torch/nn/module.h>
#include <torch/nn/pimpl.h>

#include "normlab/model/config.h"
#include "normlab/model/norm.h"
#include "normlab/model/observer.h"
#include "normlab/model/projection.h"
#include "normlab/sdk/scheme.h"

namespace normlab {

// What differs between the model families' attention (config.h): biases, rotary positions and
// grouped key/value heads.
struct AttentionOptions {
  int64_t d_model = 512, heads = 8;
  int64_t kv_heads = 0;  // 0 = heads
  double attention_dropout = 0.0;
  bool bias = true;
  double rope_theta = 0.0;  // > 0: rotary positions on q and k (self-attention only)
  bool qk_norm_before_rope = false;
  // model.qk_norm (issue 67.1): q and k normalized right after their projections, before RoPE:
  // per head over dh (Qwen3, Gemma 3) or over the whole projection (`qk_norm_all`, OLMo 2).
  QkNorm qk_norm = QkNorm::None;
  bool qk_norm_all = false;
  // model.attn_logit_softcap: s·tanh(x/s) on q·kᵀ/√dh before the mask (Gemma 2); 0 = off. Only
  // the explicit attention applies it: the fused CPU kernel and SDPA are not used then.
  double logit_softcap = 0.0;
};

class MultiheadAttentionImpl : public torch::nn::Module {
 public:
  explicit MultiheadAttentionImpl(const AttentionOptions& o);
  MultiheadAttentionImpl(int64_t d_model, int64_t heads, double attention_dropout)
      : MultiheadAttentionImpl(AttentionOptions{d_model, heads, 0, attention_dropout}) {}

  // query [B,Tq,D]; memory [B,Tk,D] (the query itself for self-attention); mask additive,
  // broadcastable to [B,H,Tq,Tk], or undefined. `causal`: the mask is exactly the causal one (no
  // padding), which lets LibTorch 2.x use a causal kernel instead of the mask tensor.
  // `positions` [B,Tq]: rotary positions other than 0 … Tq−1 (self-attention; undefined: those).
  // `scores`: filled with what the softmax sees (observer.h), for the probes; null: nothing kept.
  torch::Tensor forward(const torch::Tensor& query, const torch::Tensor& memory,
                        const torch::Tensor& mask, bool self_attention, bool causal = false,
                        const torch::Tensor& positions = {}, AttentionScores* scores = nullptr);

  // A scheme's norm at Query/Key/Value (per head) or AttnInner (before out_proj).
  void add_norm(BranchPoint p, const NormSpec& spec);

  Projection q_proj{nullptr}, k_proj{nullptr}, v_proj{nullptr}, out_proj{nullptr};
  Norm q_norm{nullptr}, k_norm{nullptr}, v_norm{nullptr}, inner_norm{nullptr};  // null = none
  // model.qk_norm's norms (AttentionOptions::qk_norm), null when off.
  Norm q_qknorm{nullptr}, k_qknorm{nullptr};
  const AttentionOptions& options() const { return o_; }

 private:
  // Rotary positions on [B,H,T,dh]: 0 … T−1, or `positions` [B,T].
  torch::Tensor rotate(const torch::Tensor& x, const torch::Tensor& positions);
  // model.qk_norm on q [B,H,T,dh] and k [B,Hkv,T,dh].
  void normalize_qk(torch::Tensor& q, torch::Tensor& k);
  torch::Tensor forward_rotary(const torch::Tensor& query, const torch::Tensor& mask, bool causal,
                               const torch::Tensor& positions, AttentionScores* scores);

  AttentionOptions o_;
  int64_t d_model_, heads_, kv_heads_;
  double attention_dropout_;
  torch::Tensor rope_cos_,
      rope_sin_;  // [T,dh] tables on the device of the last forward, grown as needed
};
TORCH_MODULE(MultiheadAttention);

// Gemma 2's soft-cap s·tanh(x/s) (s > 0), on attention or output logits.
torch::Tensor soft_cap(const torch::Tensor& x, double s);

// Rotary position embedding (Su et al. 2021, RoFormer eq. 34) in the half-split layout of
// GPT-NeoX and Hugging Face's Llama: with x = [x₁, x₂] (halves of dh) and angles t·θ^(−2i/dh),
// rope(x)_t = x·cos + [−x₂, x₁]·sin. `cos`/`sin` are [T,dh] (each angle twice).
torch::Tensor apply_rope(const torch::Tensor& x, const torch::Tensor& cos,
                         const torch::Tensor& sin);
void rope_tables(int64_t T, int64_t dh, double theta, const torch::TensorOptions& opts,
                 torch::Tensor* cos, torch::Tensor* sin);

// FFN(h) = W2 · Drop_act(act(h)), split so the core can observe the activation:
//   ReLU (Transformer family): act = ReLU(W1·h)
//   SwiGLU (Llama family, Shazeer 2020 eq. 6): act = SiLU(W_gate·h) ⊙ (W1·h)
class FeedForwardImpl : public torch::nn::Module {
 public:
  FeedForwardImpl(int64_t d_model, int64_t ffn_dim, double activation_dropout, bool gated = false,
                  bool bias = true);
  int64_t ffn_dim() const { return fc1->weight.size(0); }
  double activation_dropout() const { return activation_dropout_; }
  torch::Tensor activation(const torch::Tensor& h);
  torch::Tensor project(const torch::Tensor& act);  // W2 · Drop_act(act)
  torch::Tensor forward(const torch::Tensor& h) { return project(activation(h)); }
  // A scheme's norm over the activation, before fc2 (BranchPoint::FfnInner), or in a gated FFN
  // after fc1 (FfnUp) or gate (FfnGate).
  void add_norm(BranchPoint p, const NormSpec& spec);

  Projection fc1{nullptr}, fc2{nullptr};
  Projection gate{nullptr};  // SwiGLU only
  Norm inner_norm{nullptr}, up_norm{nullptr}, gate_norm{nullptr};

 private:
  double activation_dropout_;
};
TORCH_MODULE(FeedForward);

}  // namespace normlab
