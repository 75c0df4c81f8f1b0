// Magneto / Sub-LN (Wang et al., "Foundation Transformers", arXiv:2210.06423; ICML 2023 "Magneto:
// A Foundation Transformer"): Pre-LN plus one more norm inside each branch, right before its
// output projection:
//   SA:  y = x + Drop(W_O · Norm_in(Attn(Q, K, V from Norm(x))))
//        Norm_in over the concatenated heads
//   FFN: y = x + Drop(W_2 · Norm_in(φ(W_1 · Norm(x))))
//        Norm_in over ffn_dim, after φ
//   CA:  plain Pre-LN, y = x + Drop(CA(Norm(x), mem)) — as torchscale (its decoder gives only
//        self-attention an inner LN); `cross_attn_subln = true` gives CA the inner norm and γ too.
//   final Norm after each stack.
// Init (DeepNet-derived): Xavier-normal with gain γ on fc1, fc2, v_proj, out_proj and gain 1 on
// q_proj, k_proj, biases 0 (the paper's form as docs/schemes/magneto.md restates it; not
// confirmed there — the paper's text could not be read). `torchscale_init = true` instead
// multiplies the core's standard init by γ, biases too, as torchscale does. γ (natural log):
//   encoder-only √(ln 2N); decoder-only (LM) √(ln 2M);
//   encoder-decoder: encoder √(ln(3M)·ln(2N)/3), decoder √(ln 3M).
// Read in torchscale (docs/schemes/magneto.md: equations, constants, sources).
#include <normlab/sdk.h>

#include <cmath>

#include "common/deepnorm_init.h"

namespace {
using namespace normlab;

double magneto_gamma(const ModelGeometry& g, Stack s) {
  const double N = g.enc_layers, M = g.dec_layers;
  if (g.arch == Arch::LM) return std::sqrt(std::log(2.0 * M));
  if (s == Stack::Encoder) return std::sqrt(std::log(3.0 * M) * std::log(2.0 * N) / 3.0);
  return std::sqrt(std::log(3.0 * M));
}

class MagnetoWiring final : public PerSublayerWiring {
 public:
  MagnetoWiring(LayerBuilder& b, bool cross_attn_subln) : PerSublayerWiring(b.geometry()) {
    const NormSpec& norm = b.geometry().model.norm;
    for (int i = 0; i < num_sublayers_; ++i) norms_[i] = b.add_layer_norm(norm_name(sublayers_[i]));
    b.add_branch_norm(Sublayer::SelfAttn, BranchPoint::AttnInner, norm);
    if (cross_attn_subln && b.geometry().has_cross_attn())
      b.add_branch_norm(Sublayer::CrossAttn, BranchPoint::AttnInner, norm);
    b.add_branch_norm(Sublayer::FFN, BranchPoint::FfnInner, norm);
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return x + ops.branch(s, ops.norm(norms_[i], x));
  }

 private:
  int norms_[3] = {0, 0, 0};
};

class Magneto final : public Scheme {
 public:
  Magneto(const ParamView& p, const ModelGeometry& g)
      : geom_(g),
        cross_attn_subln_(p.flag("cross_attn_subln")),
        torchscale_init_(p.flag("torchscale_init")) {}

  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<MagnetoWiring>(b, cross_attn_subln_);
  }
  std::optional<NormSpec> final_norm(Stack, const NormSpec& configured) const override {
    return configured;
  }

  void init_layer(torch::nn::Module& layer, const LayerGeometry& g) override {
    const double gamma = magneto_gamma(geom_, g.stack);
    torch::NoGradGuard no_grad;
    for (const std::string& proj : layer_projections(g)) {
      const bool cross = proj.rfind("cross_attn.", 0) == 0;
      const bool scaled = deepnorm_scaled_projection(proj) && (!cross || cross_attn_subln_);
      torch::Tensor w = layer_param(layer, proj + ".weight"),
                    bias = layer_param_or_none(layer, proj + ".bias");
      if (torchscale_init_) {
        if (scaled) {
          w.mul_(gamma);
          if (bias.defined()) bias.mul_(gamma);
        }
      } else {
        torch::nn::init::xavier_normal_(w, scaled ? gamma : 1.0);
        if (bias.defined()) torch::nn::init::zeros_(bias);
      }
    }
  }

  std::vector<DerivedValue> derive() const override {
    std::vector<DerivedValue> out;
    for (Stack s : {Stack::Encoder, Stack::Decoder}) {
      if (!geom_.has_stack(s)) continue;
      const char* f = geom_.arch == Arch::LM ? "sqrt(ln(2M))"
                      : s == Stack::Encoder  ? "sqrt(ln(3M)*ln(2N)/3)"
                                             : "sqrt(ln(3M))";
      out.push_back({"gamma", to_string(s), magneto_gamma(geom_, s), f});
    }
    return out;
  }

 private:
  ModelGeometry geom_;
  bool cross_attn_subln_, torchscale_init_;
};

constexpr normlab_param_info kParams[] = {
    {"cross_attn_subln", "bool", "false", "", 0, 0,
     "give cross-attention an inner norm and gamma-scaled v/out init too (torchscale: neither)"},
    {"torchscale_init", "bool", "false", "", 0, 0,
     "torchscale's init: the standard init times gamma (biases too) instead of "
     "xavier_normal(gain=gamma)"},
};
}  // namespace

NORMLAB_EXPORT_SCHEME(
    Magneto, "magneto", "1.0.0",
    "Magneto (Sub-LN): Pre-LN plus a norm before each branch's output projection",
    "SA: y = x + Drop(W_O*Norm(Attn(Norm(x)))); FFN: y = x + Drop(W_2*Norm(relu(W_1*Norm(x)))); "
    "xavier_normal(gain=gamma) on v,out,fc1,fc2 [Wang et al. 2022, Foundation Transformers]",
    kParams)
