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
// On model.family = "llama", the authors' LLaMA code (other_tasks/LLaMA/fms_fsdp/models/llama.py):
// - DyT(x) = γ ⊙ tanh(α·x), no β (it replaces an RMSNorm, which has none);
// - the token embeddings times a learned scalar, init √d (`shared_scale`): decoder.embed_scale;
// - α₀ by width from the run commands of other_tasks/LLaMA/README.md (attention / FFN / final):
//   4096 → 0.8 / 0.2 / 0.2, 5120 → 0.6 / 0.15 / 0.15, 8192 → 0.2 / 0.05 / 0.05; a width takes the
//   row of the largest listed width ≤ it, and widths under 4096 the 4096 row (an extrapolation:
//   the paper says only that wider models want smaller α₀). `llama_alpha_table = false` or an
//   explicit alpha0_attn/ffn/final overrides it.
#include <normlab/sdk.h>

#include <cmath>

namespace {
using namespace normlab;

NormSpec dyt(double alpha0, Family family) {
  NormSpec s = NormSpec::of(NormKind::DyT);
  s.dyt_alpha0 = alpha0;
  s.bias = family != Family::Llama;
  return s;
}

struct AlphaRow {
  int64_t width;
  double attn, ffn, final;
};
// The authors' LLaMA runs (other_tasks/LLaMA/README.md: attn_/ffn_/dec_alpha_init_value).
constexpr AlphaRow kLlamaAlpha[] = {
    {4096, 0.8, 0.2, 0.2}, {5120, 0.6, 0.15, 0.15}, {8192, 0.2, 0.05, 0.05}};

AlphaRow llama_alpha_row(int64_t width) {
  AlphaRow row = kLlamaAlpha[0];
  for (const AlphaRow& r : kLlamaAlpha)
    if (r.width <= width) row = r;
  return row;
}

// x ← s·x on the embedded input, s a learned scalar starting at √d (llama.py: shared_scale).
class EmbeddingScaleStack final : public StackWiring {
 public:
  explicit EmbeddingScaleStack(StackBuilder& b)
      : scale_(b.add_parameter("embed_scale",
                               torch::full({1}, std::sqrt(double(b.model().d_model))))) {}
  Streams begin(StackOps& ops, const torch::Tensor& x) override { return {x * ops.param(scale_)}; }
  torch::Tensor end(StackOps&, Streams& s) override { return s[0]; }

 private:
  int scale_;
};

class DytWiring final : public PerSublayerWiring {
 public:
  DytWiring(LayerBuilder& b, double alpha0_attn, double alpha0_ffn)
      : PerSublayerWiring(b.geometry()) {
    const Family family = b.geometry().model.family;
    for (int i = 0; i < num_sublayers_; ++i)
      norms_[i] =
          b.add_norm(norm_name(sublayers_[i]),
                     dyt(sublayers_[i] == Sublayer::FFN ? alpha0_ffn : alpha0_attn, family));
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
  Dyt(const ParamView& p, const ModelGeometry& g) : family_(g.family) {
    table_ = family_ == Family::Llama && p.flag("llama_alpha_table");
    const AlphaRow row = llama_alpha_row(g.d_model);
    const double a = p.number("alpha0");
    auto pick = [&](const char* key, double from_table) {
      if (p.number(key) > 0) return p.number(key);
      return table_ ? from_table : a;
    };
    attn_ = pick("alpha0_attn", row.attn);
    ffn_ = pick("alpha0_ffn", row.ffn);
    final_ = pick("alpha0_final", row.final);
  }
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<DytWiring>(b, attn_, ffn_);
  }
  std::unique_ptr<StackWiring> build_stack(StackBuilder& b) override {
    if (family_ != Family::Llama) return nullptr;
    return std::make_unique<EmbeddingScaleStack>(b);
  }
  std::optional<NormSpec> final_norm(Stack, const NormSpec&) const override {
    return dyt(final_, family_);
  }
  std::vector<DerivedValue> derive() const override {
    const char* otherwise = table_ ? ", else the LLaMA table by width" : ", else alpha0";
    return {{"alpha0", "attention inputs", attn_, std::string("alpha0_attn") + otherwise},
            {"alpha0", "ffn inputs", ffn_, std::string("alpha0_ffn") + otherwise},
            {"alpha0", "final norm", final_, std::string("alpha0_final") + otherwise}};
  }

 private:
  Family family_;
  bool table_ = false;
  double attn_ = 0.5, ffn_ = 0.5, final_ = 0.5;
};

constexpr normlab_param_info kParams[] = {
    {"alpha0", "float", "0.5", "", 1e-6, 100, "initial alpha of every DyT (paper default 0.5)"},
    {"alpha0_attn", "float", "0", "", 0, 100, "initial alpha of SA/CA-input DyTs; 0 = alpha0"},
    {"alpha0_ffn", "float", "0", "", 0, 100, "initial alpha of FFN-input DyTs; 0 = alpha0"},
    {"alpha0_final", "float", "0", "", 0, 100,
     "initial alpha of each stack's final DyT; 0 = alpha0"},
    {"llama_alpha_table", "bool", "true", "", 0, 0,
     "llama family: unset alpha0_attn/ffn/final from the authors' LLaMA table by width"},
};
}  // namespace

NORMLAB_EXPORT_SCHEME(Dyt, "dyt", "1.0.0",
                      "DyT: Pre-LN with every norm a Dynamic Tanh, gamma*tanh(alpha*x)+beta",
                      "y = x + Drop(F(DyT(x))), DyT(x) = g*tanh(a*x)+b, final DyT "
                      "[Zhu et al. 2025, DyT]",
                      kParams)
