// DeepNorm (Wang et al. 2022, DeepNet sec. III): y = LN(α·x + Drop(F(x))) — α scales the skip —
// with Xavier-normal init, gain β on v_proj/out_proj/fc1/fc2 (DeepNet sec. III-C).
#include <normlab/sdk.h>

#include <cmath>

#include "common/deepnorm_init.h"

namespace {

using namespace normlab;

class DeepNormWiring final : public PerSublayerWiring {
 public:
  DeepNormWiring(LayerBuilder& b, double alpha) : PerSublayerWiring(b.geometry()), alpha_(alpha) {
    for (int i = 0; i < num_sublayers_; ++i) norms_[i] = b.add_layer_norm(norm_name(sublayers_[i]));
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return ops.residual_norm(norms_[i], x, ops.branch(s, x), alpha_);
  }

 private:
  double alpha_;
  int norms_[3] = {0, 0, 0};
};

// torchscale keeps PyTorch's default nn.Linear init for the FFN: U(±1/√fan_in) for weight and bias.
void pytorch_default_linear_init(const torch::Tensor& w, const torch::Tensor& b) {
  const double bound = 1.0 / std::sqrt(double(w.size(1)));
  torch::nn::init::uniform_(w, -bound, bound);
  if (b.defined()) torch::nn::init::uniform_(b, -bound, bound);
}

class DeepNormScheme final : public Scheme {
 public:
  DeepNormScheme(const ParamView& p, const ModelGeometry& g)
      : geom_(g), torchscale_(p.flag("torchscale_compat")) {
    for (Stack s : {Stack::Encoder, Stack::Decoder})
      if (g.has_stack(s))
        c_[int(s)] =
            deepnorm_constants(deepnorm_form(g, s), g.enc_layers, g.dec_layers, torchscale_);
  }

  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<DeepNormWiring>(b, c_[int(b.geometry().stack)].alpha);
  }

  void init_layer(torch::nn::Module& layer, const LayerGeometry& g) override {
    const double beta = c_[int(g.stack)].beta;
    if (!torchscale_) return deepnorm_init_layer(layer, g, beta);
    // torchscale: keep the existing init (attention as fairseq, FFN as PyTorch's default
    // Linear, q/k/v biases as PyTorch's default) and divide v/out/fc1/fc2 by 1/β, biases too.
    torch::NoGradGuard no_grad;
    for (const std::string& proj : layer_projections(g)) {
      auto w = layer_param(layer, proj + ".weight");
      auto bias = layer_param_or_none(layer, proj + ".bias");  // none in the Llama family
      const bool is_ffn = proj.rfind("ffn.", 0) == 0;
      const bool is_qkv = proj.find("out_proj") == std::string::npos && !is_ffn;
      if (is_ffn) pytorch_default_linear_init(w, bias);
      if (is_qkv && bias.defined())
        torch::nn::init::uniform_(bias, -1.0 / std::sqrt(double(w.size(1))),
                                  1.0 / std::sqrt(double(w.size(1))));
      if (deepnorm_scaled_projection(proj)) {
        w.mul_(beta);
        if (bias.defined()) bias.mul_(beta);
      }
    }
  }

  std::vector<DerivedValue> derive() const override {
    std::vector<DerivedValue> out;
    for (Stack s : {Stack::Encoder, Stack::Decoder}) {
      if (!geom_.has_stack(s)) continue;
      std::string a, b;
      switch (deepnorm_form(geom_, s)) {
        case DeepNormForm::EncDecEncoder:
          a = "0.81*(N^4*M)^(1/16)";
          b = torchscale_ ? "1.15*(N^4*M)^(-1/16) [torchscale]" : "0.87*(N^4*M)^(-1/16)";
          break;
        case DeepNormForm::EncDecDecoder:
          a = "(3M)^(1/4)";
          b = "(12M)^(-1/4)";
          break;
        case DeepNormForm::EncoderOnly:
          a = "(2N)^(1/4)";
          b = "(8N)^(-1/4)";
          break;
        case DeepNormForm::DecoderOnly:
          a = "(2M)^(1/4)";
          b = "(8M)^(-1/4)";
          break;
      }
      out.push_back({"alpha", to_string(s), c_[int(s)].alpha, a});
      out.push_back({"beta", to_string(s), c_[int(s)].beta, b});
    }
    return out;
  }

 private:
  ModelGeometry geom_;
  bool torchscale_;
  DeepNormConstants c_[2] = {{1.0, 1.0}, {1.0, 1.0}};
};

constexpr normlab_param_info kParams[] = {
    {"torchscale_compat", "bool", "false", "", 0, 0,
     "torchscale's variant: scale the existing init by beta (biases too), encoder beta 1.15*(N^4 "
     "M)^(-1/16)"},
};

}  // namespace

NORMLAB_EXPORT_SCHEME(DeepNormScheme, "deepnorm", "1.0.0",
                      "DeepNorm: up-weighted skip alpha*x inside Post-LN, beta-scaled init",
                      "y = LN(alpha*x + Drop(F(x))); xavier_normal(gain=beta) for v,out,fc1,fc2 "
                      "[Wang et al. 2022, DeepNet sec. III-A, alpha and beta from sec. III-C]",
                      kParams)
