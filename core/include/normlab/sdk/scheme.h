// normlab scheme SDK — what a residual/normalization scheme decides, and the core services it
// uses to do so. A scheme never owns attention, FFN or LayerNorm code: the core does, and
// instruments them, so every scheme gets all analysis probes for free.
#pragma once

#include <torch/nn/module.h>
#include <torch/types.h>

#include <cstdint>
#include <cstdio>
#include <memory>
#include <optional>
#include <stdexcept>
#include <string>
#include <utility>
#include <vector>

#include "normlab/sdk/abi.h"
#include "normlab/sdk/geometry.h"
#include "normlab/sdk/norm.h"
#include "normlab/sdk/params.h"

namespace normlab {

using NamedTensors = std::vector<std::pair<std::string, torch::Tensor>>;

// The tensors that run through a stack between layers: one for most schemes, several for schemes
// with more than one residual stream (ResiDual, Hyper-Connections). Stream 0 is what probes see.
using Streams = std::vector<torch::Tensor>;

// Points inside a sublayer where the core applies a scheme-declared norm (add_branch_norm).
enum class BranchPoint {
  Query,      // q per head, over head_dim, before the scores
  Key,        // k per head, over head_dim
  Value,      // v per head, over head_dim
  AttnInner,  // the concatenated heads (dim d_model), before out_proj (Magneto's Sub-LN)
  FfnInner,   // the FFN activation (dim ffn_dim), after activation dropout, before fc2
  FfnUp,      // gated FFN: fc1·h (dim ffn_dim), before the product (nGPT's s_u)
  FfnGate,    // gated FFN: gate·h (dim ffn_dim), before its SiLU (nGPT's s_ν)
};

inline const char* to_string(BranchPoint p) {
  switch (p) {
    case BranchPoint::Query:
      return "q_norm";
    case BranchPoint::Key:
      return "k_norm";
    case BranchPoint::Value:
      return "v_norm";
    case BranchPoint::AttnInner:
      return "inner_norm";
    case BranchPoint::FfnInner:
      return "inner_norm";
    case BranchPoint::FfnUp:
      return "up_norm";
    case BranchPoint::FfnGate:
      return "gate_norm";
  }
  return "?";
}

// Core services inside one layer's forward pass.
class LayerOps {
 public:
  // Drop(F(x)): the sublayer (self-attention, cross-attention on the encoder output, or FFN)
  // followed by residual dropout.
  virtual torch::Tensor branch(Sublayer s, const torch::Tensor& x) = 0;
  // A norm declared with LayerBuilder::add_layer_norm / add_norm.
  virtual torch::Tensor norm(int norm_id, const torch::Tensor& x) = 0;
  // norm(α·x + b), a residual add and the norm after it: the value of norm(norm_id, x * alpha + b)
  // (x + b where α = 1), computed as one fused node where the core has a kernel for it (a
  // LayerNorm on the CPU in fp32).
  virtual torch::Tensor residual_norm(int norm_id, const torch::Tensor& x, const torch::Tensor& b,
                                      double alpha = 1.0) = 0;
  // A parameter declared with LayerBuilder::add_parameter.
  virtual const torch::Tensor& param(int param_id) = 0;
  virtual bool training() const = 0;

 protected:
  ~LayerOps() = default;
};

// Core services while one layer is built.
class LayerBuilder {
 public:
  virtual const LayerGeometry& geometry() const = 0;
  // A norm of the manifest's kind (`scheme.norm`, LayerNorm by default: d_model, eps 1e-5, γ=1,
  // β=0) registered on the layer as `name` (e.g. decoder.layers.7.<name>.weight). Returns its id
  // for LayerOps::norm.
  virtual int add_layer_norm(const std::string& name) = 0;
  // A norm of a given kind over d_model (dim 0) or `dim` features.
  virtual int add_norm(const std::string& name, const NormSpec& spec, int64_t dim = 0) = 0;
  // A norm the core applies inside sublayer `s` at `p` on every call of LayerOps::branch,
  // registered as <sublayer>.<q_norm|k_norm|v_norm|inner_norm>. At most one per point.
  virtual void add_branch_norm(Sublayer s, BranchPoint p, const NormSpec& spec) = 0;
  // A learnable tensor registered on the layer as `name`. Returns its id for LayerOps::param.
  virtual int add_parameter(const std::string& name, const torch::Tensor& init) = 0;

 protected:
  ~LayerBuilder() = default;
};

// How one layer wires its sublayers, LayerNorms and skip paths (layer level, so connections
// across sublayers such as B2T fit).
class LayerWiring {
 public:
  virtual ~LayerWiring() = default;
  // One-stream schemes implement this.
  virtual torch::Tensor forward(LayerOps& /*ops*/, const torch::Tensor& /*x*/) {
    throw std::logic_error("this scheme's layers take several streams (forward_streams)");
  }
  // Schemes with several streams (StackWiring) implement this; `s` comes in and goes out.
  virtual void forward_streams(LayerOps& ops, Streams& s) { s[0] = forward(ops, s[0]); }
};

// Core services for a stack's own wiring (its parameters and norms live on the stack:
// e.g. decoder.<name>.weight).
class StackOps {
 public:
  virtual torch::Tensor norm(int norm_id, const torch::Tensor& x) = 0;
  virtual const torch::Tensor& param(int param_id) = 0;
  virtual bool training() const = 0;

 protected:
  ~StackOps() = default;
};

class StackBuilder {
 public:
  virtual const ModelGeometry& model() const = 0;
  virtual Stack stack() const = 0;
  virtual int add_norm(const std::string& name, const NormSpec& spec, int64_t dim = 0) = 0;
  virtual int add_parameter(const std::string& name, const torch::Tensor& init) = 0;

 protected:
  ~StackBuilder() = default;
};

// What happens at the two ends of a stack: `begin` turns the embedded input (after embedding
// dropout) into the streams every layer passes on; `end` turns them back into one tensor, before
// the stack's final norm (Scheme::final_norm).
class StackWiring {
 public:
  virtual ~StackWiring() = default;
  virtual Streams begin(StackOps& ops, const torch::Tensor& x) = 0;
  virtual torch::Tensor end(StackOps& ops, Streams& s) = 0;
};

// A scalar of a scheme's live state, for probes and logs ("alpha_t").
struct SchemeValue {
  std::string name;
  double value = 0.0;
};

// Runs the data-dependent setup pass: one forward pass of the model on the first training batch,
// in training mode, without gradients.
class SetupPass {
 public:
  virtual void forward_first_batch() = 0;

 protected:
  ~SetupPass() = default;
};

// A value a scheme derives from the geometry (shown by `normlab plugins show`).
struct DerivedValue {
  std::string name;   // "alpha", "beta", "omega", "alpha_t"
  std::string where;  // "encoder", "decoder", "t=1000", …
  double value = 0.0;
  std::string formula;
};

class Scheme {
 public:
  virtual ~Scheme() = default;

  // Wiring of one layer; declare its norms and parameters on `b`.
  virtual std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) = 0;
  // Wiring of a stack's ends; none (the default) = one stream, passed through.
  virtual std::unique_ptr<StackWiring> build_stack(StackBuilder& /*b*/) { return nullptr; }
  // The stack's final norm (registered as <stack>.layer_norm); nullopt (the default) = none.
  // `configured` is a norm of the manifest's kind: Pre-LN returns it.
  virtual std::optional<NormSpec> final_norm(Stack /*stack*/,
                                             const NormSpec& /*configured*/) const {
    return std::nullopt;
  }
  // Called after the core's standard initialization of a layer; parameters are addressed by
  // name ("self_attn.v_proj.weight", "ffn.fc1.weight", …).
  virtual void init_layer(torch::nn::Module& /*layer*/, const LayerGeometry& /*g*/) {}
  // Run hooks, in the order the trainer calls them for one update:
  // before the update's first forward pass, with the number of completed updates (runs on the
  // host; with run.cuda_graph the forward and after_backward of most updates are replayed from a
  // recording, so a number they read that changes per update must be in a tensor that on_update
  // fills, as BranchNorm's α: a plain double would keep its recorded value);
  virtual void on_update(int64_t /*updates_done*/) {}
  // after the update's gradients are complete (p.grad() of the model's named parameters);
  virtual void after_backward(const NamedTensors& /*params*/) {}
  // after the optimizer step (not after a skipped one), under no_grad; also once when the model
  // is built, so that an initial projection (nGPT's unit-norm weights) holds from the start;
  virtual void after_step(const NamedTensors& /*params*/) {}
  // after each validation, with its mean token NLL.
  virtual void on_validate(int64_t /*updates_done*/, double /*valid_nll*/) {}
  // Data-dependent setup before training (e.g. Admin profiling).
  virtual bool needs_setup_pass() const { return false; }
  virtual void setup(SetupPass& /*pass*/) {}
  // Saved with checkpoints and restored on resume.
  virtual NamedTensors state() const { return {}; }
  virtual void load_state(const NamedTensors& /*state*/) {}
  // Values derived for this geometry, for `plugins show` and run logs.
  virtual std::vector<DerivedValue> derive() const { return {}; }
  // A learned per-token gain on the decoder's logits, z = s ⊙ (W_out h) (nGPT's s_z ∈ ℝ^V), as a
  // NormKind::Scale spec over the vocabulary (registered as decoder.logit_scale.weight); nullopt =
  // none.
  virtual std::optional<NormSpec> logit_scale() const { return std::nullopt; }
  // Whether weight decay reaches a parameter, by its name in the model
  // ("decoder.layers.3.ffn_gate", "decoder.embed_tokens.weight", …): true or false overrides the
  // manifest's optim.no_decay rule for it (ABI 7), nullopt (the default) leaves it to the rule.
  // The rule "nothing" (every parameter decays, as fairseq) is never overridden.
  virtual std::optional<bool> weight_decay(const std::string& /*parameter*/) const {
    return std::nullopt;
  }
  // Llama family: whether the q/k norms (BranchPoint::Query/Key) come before the rotary positions
  // (HybridNorm's code, OLMo-2) or after them (the default; nGPT's code).
  virtual bool qk_norm_before_rope() const { return false; }
  // Live state as numbers, for probes (scheme_state) and logs, e.g. {"alpha_t", 0.25}.
  virtual std::vector<SchemeValue> values() const { return {}; }
  // Short live state for log lines; by default "name=value …" of values().
  virtual std::string status() const {
    std::string out;
    for (const SchemeValue& v : values()) {
      char buf[64];
      std::snprintf(buf, sizeof buf, "%.4g", v.value);
      out += (out.empty() ? "" : " ") + v.name + "=" + buf;
    }
    return out;
  }
};

// For schemes that treat each sublayer alike: implement build/forward of one sublayer.
class PerSublayerWiring : public LayerWiring {
 public:
  torch::Tensor forward(LayerOps& ops, const torch::Tensor& x) override {
    torch::Tensor h = x;
    for (int i = 0; i < num_sublayers_; ++i) h = sublayer(ops, i, sublayers_[i], h);
    return h;
  }

 protected:
  explicit PerSublayerWiring(const LayerGeometry& g) : num_sublayers_(g.num_sublayers()) {
    for (int i = 0; i < num_sublayers_; ++i) sublayers_[i] = g.sublayer(i);
  }
  virtual torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) = 0;

  int num_sublayers_;
  Sublayer sublayers_[3] = {Sublayer::SelfAttn, Sublayer::FFN, Sublayer::FFN};
};

// Conventional names for the LayerNorm after (Post-LN) or before (Pre-LN) each sublayer.
inline std::string norm_name(Sublayer s) { return std::string(to_string(s)) + "_norm"; }

// Post-LN wiring, y = LN(x + Drop(F(x))) per sublayer: for schemes that change only the init.
class PostLnWiring final : public PerSublayerWiring {
 public:
  explicit PostLnWiring(LayerBuilder& b) : PerSublayerWiring(b.geometry()) {
    for (int i = 0; i < num_sublayers_; ++i) norms_[i] = b.add_layer_norm(norm_name(sublayers_[i]));
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return ops.residual_norm(norms_[i], x, ops.branch(s, x));
  }

 private:
  int norms_[3] = {0, 0, 0};
};

}  // namespace normlab
