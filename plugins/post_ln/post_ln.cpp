// Post-LN (Vaswani et al. 2017): y = LN(x + Drop(F(x))); no final LayerNorm.
#include <normlab/sdk.h>

namespace {

using normlab::LayerOps;
using normlab::Sublayer;

class PostLnWiring final : public normlab::PerSublayerWiring {
 public:
  explicit PostLnWiring(normlab::LayerBuilder& b) : PerSublayerWiring(b.geometry()) {
    for (int i = 0; i < num_sublayers_; ++i)
      norms_[i] = b.add_layer_norm(normlab::norm_name(sublayers_[i]));
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return ops.norm(norms_[i], x + ops.branch(s, x));
  }

 private:
  int norms_[3] = {0, 0, 0};
};

class PostLnScheme final : public normlab::Scheme {
 public:
  PostLnScheme(const normlab::ParamView&, const normlab::ModelGeometry&) {}
  std::unique_ptr<normlab::LayerWiring> build_layer(normlab::LayerBuilder& b) override {
    return std::make_unique<PostLnWiring>(b);
  }
  bool final_layer_norm(normlab::Stack) const override { return false; }
};

}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(PostLnScheme, "post-ln", "1.0.0",
                                "Post-LN: LayerNorm after each residual addition",
                                "y = LN(x + Drop(F(x))), no final LayerNorm [Vaswani et al. 2017, sec. 3.1]")
