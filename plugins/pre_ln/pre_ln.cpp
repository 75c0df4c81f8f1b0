// Pre-LN (Xiong et al. 2020): y = x + Drop(F(LN(x))); a final LayerNorm closes each stack.
#include <normlab/sdk.h>

namespace {

using normlab::LayerOps;
using normlab::Sublayer;

class PreLnWiring final : public normlab::PerSublayerWiring {
 public:
  explicit PreLnWiring(normlab::LayerBuilder& b) : PerSublayerWiring(b.geometry()) {
    for (int i = 0; i < num_sublayers_; ++i)
      norms_[i] = b.add_layer_norm(normlab::norm_name(sublayers_[i]));
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return x + ops.branch(s, ops.norm(norms_[i], x));
  }

 private:
  int norms_[3] = {0, 0, 0};
};

class PreLnScheme final : public normlab::Scheme {
 public:
  PreLnScheme(const normlab::ParamView&, const normlab::ModelGeometry&) {}
  std::unique_ptr<normlab::LayerWiring> build_layer(normlab::LayerBuilder& b) override {
    return std::make_unique<PreLnWiring>(b);
  }
  std::optional<normlab::NormSpec> final_norm(normlab::Stack,
                                              const normlab::NormSpec& configured) const override {
    return configured;
  }
};

}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(
    PreLnScheme, "pre-ln", "1.0.0",
    "Pre-LN: LayerNorm on each sublayer input, final LayerNorm per stack",
    "y = x + Drop(F(LN(x))), final LN after each stack [Xiong et al. 2020]")
