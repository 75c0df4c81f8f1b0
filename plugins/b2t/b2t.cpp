// B2T connection (Takase et al. 2023, sec. 5): Post-LN plus the layer input added before the
// layer's last LayerNorm:
//   encoder / LM: h  = LN_a(x + Drop(SA(x))),   y = LN_f(h + Drop(FFN(h)) + x)
//   decoder:      h1 = LN_a(x + Drop(SA(x))),   h2 = LN_c(h1 + Drop(CA(h1)))
//                 y  = LN_f(h2 + Drop(FFN(h2)) + x)
// Equations, init and sources: docs/schemes/b2t.md.
#include <normlab/sdk.h>

#include <cmath>

namespace {

using namespace normlab;

class B2TWiring final : public LayerWiring {
 public:
  explicit B2TWiring(LayerBuilder& b) : cross_(b.geometry().has_cross_attn()) {
    ln_a_ = b.add_layer_norm(norm_name(Sublayer::SelfAttn));
    if (cross_) ln_c_ = b.add_layer_norm(norm_name(Sublayer::CrossAttn));
    ln_f_ = b.add_layer_norm(norm_name(Sublayer::FFN));
  }

  torch::Tensor forward(LayerOps& ops, const torch::Tensor& x) override {
    torch::Tensor h = ops.residual_norm(ln_a_, x, ops.branch(Sublayer::SelfAttn, x));
    if (cross_) h = ops.residual_norm(ln_c_, h, ops.branch(Sublayer::CrossAttn, h));
    // The bottom-to-top term: no scaling, no dropout.
    return ops.residual_norm(ln_f_, h + ops.branch(Sublayer::FFN, h), x);
  }

 private:
  bool cross_;
  int ln_a_ = 0, ln_c_ = 0, ln_f_ = 0;
};

class B2TScheme final : public Scheme {
 public:
  B2TScheme(const ParamView& p, const ModelGeometry&) : rescale_(p.flag("rescale_init")) {}

  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<B2TWiring>(b);
  }

  // The authors' code: every weight matrix of the layer times 1/√(layers in the stack), after
  // the standard init; biases, LayerNorms, embeddings and the output projection untouched.
  void init_layer(torch::nn::Module& layer, const LayerGeometry& g) override {
    if (!rescale_) return;
    torch::NoGradGuard no_grad;
    const double scale = 1.0 / std::sqrt(double(g.stack_layers()));
    for (const std::string& proj : layer_projections(g))
      layer_param(layer, proj + ".weight").mul_(scale);
  }

 private:
  bool rescale_;
};

constexpr normlab_param_info kParams[] = {
    {"rescale_init", "bool", "true", "", 0, 0,
     "multiply the layer's weight matrices by 1/sqrt(layers in the stack) after init (authors' "
     "code)"},
};

}  // namespace

NORMLAB_EXPORT_SCHEME(
    B2TScheme, "b2t", "1.0.0",
    "B2T connection: Post-LN plus the layer input added before the last LayerNorm",
    "y = LN_f(h + Drop(FFN(h)) + x), h = Post-LN sublayers before FFN "
    "[Takase et al. 2023, B2T connection sec. 5]",
    kParams)
