// HybridNorm (Zhuo et al., "HybridNorm: Towards Stable and Efficient Transformer Training via
// Hybrid Normalization", arXiv:2503.04598): QKV-norm in attention, "Post-Norm" for the FFN.
//   attention (no input norm):  a = x + Drop(W_O · Attn(Norm_q(xW_Q), Norm_k(xW_K), Norm_v(xW_V)))
//                               Norm_q/k/v per head over head_dim, each with its own γ
//   FFN:                        n = Norm_ffn(a);  y = n + Drop(FFN(n))
//   final Norm after each stack.
// Checked in the authors' code (dense_model/olmo/model.py): the q/k/v norms have size head_dim
// (one γ shared by the heads) and act after the split into heads; the FFN's normalized value
// replaces the residual stream (the norm sits between the attention add and the FFN, and the FFN
// output is not normalized). `first_layer_prenorm` = HybridNorm*: layer 1 of each stack is
// Pre-Norm in every sublayer, QKV-norm kept (the code's {0: attn_norm, no ffn_residual}):
//   a = x + Drop(Attn(QKV-norm of Norm_attn(x)));  y = a + Drop(FFN(Norm_ffn(a))).
// The paper's full text could not be read here. Its models are decoder-only; in an
// encoder-decoder, cross-attention also gets Q-norm on the decoder queries and K/V-norm on the
// projected encoder memory and no input norm (normlab's mapping, docs/schemes/hybridnorm.md).
#include <normlab/sdk.h>

namespace {
using namespace normlab;

class HybridNormWiring final : public PerSublayerWiring {
 public:
  HybridNormWiring(LayerBuilder& b, bool prenorm)
      : PerSublayerWiring(b.geometry()), prenorm_(prenorm) {
    const NormSpec& norm = b.geometry().model.norm;
    for (int i = 0; i < num_sublayers_; ++i) {
      const Sublayer s = sublayers_[i];
      if (s != Sublayer::FFN)
        for (BranchPoint p : {BranchPoint::Query, BranchPoint::Key, BranchPoint::Value})
          b.add_branch_norm(s, p, norm);
      if (prenorm_ || s == Sublayer::FFN) norms_[i] = b.add_layer_norm(norm_name(s));
    }
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    if (prenorm_) return x + ops.branch(s, ops.norm(norms_[i], x));
    if (s != Sublayer::FFN) return x + ops.branch(s, x);
    torch::Tensor n = ops.norm(norms_[i], x);
    return n + ops.branch(s, n);
  }

 private:
  bool prenorm_;
  int norms_[3] = {0, 0, 0};
};

class HybridNorm final : public Scheme {
 public:
  HybridNorm(const ParamView& p, const ModelGeometry&)
      : first_prenorm_(p.flag("first_layer_prenorm")) {}
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<HybridNormWiring>(b, first_prenorm_ && b.geometry().index == 0);
  }
  std::optional<NormSpec> final_norm(Stack, const NormSpec& configured) const override {
    return configured;
  }
  // Llama family: the authors' code normalizes q and k, then rotates them
  // (docs/schemes/hybridnorm.md; HybridNorm dense_model/olmo/model.py, as OLMo-2).
  bool qk_norm_before_rope() const override { return true; }

 private:
  bool first_prenorm_;
};

constexpr normlab_param_info kParams[] = {
    {"first_layer_prenorm", "bool", "false", "", 0, 0,
     "HybridNorm*: the first layer of each stack is Pre-Norm in every sublayer (QKV-norm kept)"}};
}  // namespace

NORMLAB_EXPORT_SCHEME(
    HybridNorm, "hybridnorm", "1.0.0",
    "HybridNorm: QKV-norm in attention (no input norm), Post-Norm FFN, final norm",
    "a = x + Drop(Attn(Norm(Q), Norm(K), Norm(V))); n = Norm(a); y = n + Drop(FFN(n)) "
    "[Zhuo et al. 2025, HybridNorm]",
    kParams)
