// Post-LN (Vaswani et al. 2017): y = LN(x + Drop(F(x))); no final LayerNorm.
#include <normlab/sdk.h>

namespace {

class PostLnScheme final : public normlab::Scheme {
 public:
  PostLnScheme(const normlab::ParamView&, const normlab::ModelGeometry&) {}
  std::unique_ptr<normlab::LayerWiring> build_layer(normlab::LayerBuilder& b) override {
    return std::make_unique<normlab::PostLnWiring>(b);
  }
};

}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(
    PostLnScheme, "post-ln", "1.0.0", "Post-LN: LayerNorm after each residual addition",
    "y = LN(x + Drop(F(x))), no final LayerNorm [Vaswani et al. 2017, sec. 3.1]")
