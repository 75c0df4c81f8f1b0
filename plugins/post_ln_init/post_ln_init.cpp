// Post-LN-init (Wang et al. 2022, DeepNet sec. II, Fig. 2): Post-LN whose v_proj, out_proj, fc1 and
// fc2 are Xavier-normal with DeepNorm's gain beta, but without DeepNorm's alpha on the skip: the
// paper's control showing that down-scaled init alone stabilizes an 18L-18L Post-LN.
#include <normlab/sdk.h>

namespace {
using namespace normlab;

class PostLnInit final : public Scheme {
 public:
  PostLnInit(const ParamView&, const ModelGeometry& g) {
    for (Stack s : {Stack::Encoder, Stack::Decoder})
      if (g.has_stack(s)) beta_[int(s)] = deepnorm_constants(deepnorm_form(g, s), g.enc_layers, g.dec_layers).beta;
  }
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<PostLnWiring>(b);
  }
  bool final_layer_norm(Stack) const override { return false; }
  void init_layer(torch::nn::Module& layer, const LayerGeometry& g) override {
    deepnorm_init_layer(layer, g, beta_[int(g.stack)]);
  }

 private:
  double beta_[2] = {1.0, 1.0};
};

}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(PostLnInit, "post-ln-init", "1.0.0",
                                "Post-LN-init: Post-LN with DeepNorm's beta-scaled init, no alpha",
                                "y = LN(x + Drop(F(x))); xavier_normal(gain=beta) on v,out,fc1,fc2 [Wang et al. 2022, DeepNet sec. II]")
