// DyT (Zhu, Chen, He, LeCun, Liu, "Transformers without Normalization", CVPR 2025,
// arXiv:2503.10622): every normalization layer replaced one-for-one by Dynamic Tanh,
//   DyT(x) = γ ⊙ tanh(α·x) + β        (α one learnable scalar, γ and β per channel)
// in Pre-LN wiring, including the final norm of each stack:
//   y = x + Drop(F(DyT(x))),  final DyT after each stack.
// Init γ = 1, β = 0, α = α₀; α₀ = 0.5 is the paper's default for non-LLM models. For LLMs the
// authors' LLaMA runs use a larger α₀ on attention inputs than on FFN inputs and the final norm
// (e.g. 0.8 / 0.2 / 0.2 at width 4096; docs/schemes/dyt.md, from the official run commands):
// `alpha0_attn`, `alpha0_ffn`, `alpha0_final` set them (0 = alpha0). Cross-attention inputs count
// as attention (normlab's mapping: the paper has no encoder-decoder model; docs/schemes/dyt.md).
// Checked in the official code (dynamic_tanh.py: α = α₀·1, γ = 1, β = 0, every LayerNorm
// converted); the paper's full text could not be read here. `scheme.norm` does not apply.
#include <normlab/sdk.h>

namespace {
using namespace normlab;

NormSpec dyt(double alpha0) {
  NormSpec s = NormSpec::of(NormKind::DyT);
  s.dyt_alpha0 = alpha0;
  return s;
}

class DytWiring final : public PerSublayerWiring {
 public:
  DytWiring(LayerBuilder& b, double alpha0_attn, double alpha0_ffn)
      : PerSublayerWiring(b.geometry()) {
    for (int i = 0; i < num_sublayers_; ++i)
      norms_[i] = b.add_norm(norm_name(sublayers_[i]),
                             dyt(sublayers_[i] == Sublayer::FFN ? alpha0_ffn : alpha0_attn));
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return x + ops.branch(s, ops.norm(norms_[i], x));
  }

 private:
  int norms_[3] = {0, 0, 0};
};

class Dyt final : public Scheme {
 public:
  Dyt(const ParamView& p, const ModelGeometry&) {
    const double a = p.number("alpha0");
    auto or_default = [&](const char* key) { return p.number(key) > 0 ? p.number(key) : a; };
    attn_ = or_default("alpha0_attn");
    ffn_ = or_default("alpha0_ffn");
    final_ = or_default("alpha0_final");
  }
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<DytWiring>(b, attn_, ffn_);
  }
  std::optional<NormSpec> final_norm(Stack, const NormSpec&) const override { return dyt(final_); }
  std::vector<DerivedValue> derive() const override {
    return {{"alpha0", "attention inputs", attn_, "alpha0_attn, else alpha0"},
            {"alpha0", "ffn inputs", ffn_, "alpha0_ffn, else alpha0"},
            {"alpha0", "final norm", final_, "alpha0_final, else alpha0"}};
  }

 private:
  double attn_ = 0.5, ffn_ = 0.5, final_ = 0.5;
};

constexpr normlab_param_info kParams[] = {
    {"alpha0", "float", "0.5", "", 1e-6, 100, "initial alpha of every DyT (paper default 0.5)"},
    {"alpha0_attn", "float", "0", "", 0, 100, "initial alpha of SA/CA-input DyTs; 0 = alpha0"},
    {"alpha0_ffn", "float", "0", "", 0, 100, "initial alpha of FFN-input DyTs; 0 = alpha0"},
    {"alpha0_final", "float", "0", "", 0, 100,
     "initial alpha of each stack's final DyT; 0 = alpha0"},
};
}  // namespace

NORMLAB_EXPORT_SCHEME(Dyt, "dyt", "1.0.0",
                      "DyT: Pre-LN with every norm a Dynamic Tanh, gamma*tanh(alpha*x)+beta",
                      "y = x + Drop(F(DyT(x))), DyT(x) = g*tanh(a*x)+b, final DyT "
                      "[Zhu et al. 2025, DyT]",
                      kParams)
