// Post-LN-init (Wang et al. 2022, DeepNet sec. II, the Fig. 2 control): the Post-LN architecture
// whose layer l (1-based in its stack of L layers) is Xavier-initialized and then down-scaled by
// k_l = L − l + 1, so the lowest layer is narrowed most (by L) and the top layer not at all.
//
// Which weights: sec. II says "we down-scale the weights of l-th layer by k_l = N − l + 1 after
// performing Xavier initialization", e.g. FFN output W_o^l ~ N(0, 1/(k_l² d')) with d' the mean of
// fan-in and fan-out — Xavier-normal with gain 1/k_l. "The weights of the layer" are all of its
// Xavier-initialized matrices: q/k/v/out of self- (and cross-) attention, fc1 and fc2. LayerNorm
// gains are not Xavier-initialized, and scaling them would change the normalization the paper keeps
// ("Post-LN-init has the same architecture as Post-LN"); biases are 0. Encoder and decoder each use
// their own depth (N resp. M) for L; the paper's 18L-18L runs do not distinguish the two readings.
#include <normlab/sdk.h>

namespace {
using namespace normlab;

class PostLnInit final : public Scheme {
 public:
  PostLnInit(const ParamView&, const ModelGeometry&) {}
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<PostLnWiring>(b);
  }
  void init_layer(torch::nn::Module& layer, const LayerGeometry& g) override {
    torch::NoGradGuard no_grad;
    // g.index is 0-based, so l = index + 1 and k_l = L − l + 1 = L − index.
    const double k_l = double(g.stack_layers() - g.index);
    for (const std::string& proj : layer_projections(g)) {
      // DeepNet sec. II: W^l ~ N(0, 1/(k_l² d')), i.e. Xavier-normal with gain 1/k_l.
      torch::nn::init::xavier_normal_(layer_param(layer, proj + ".weight"), 1.0 / k_l);
      if (torch::Tensor b = layer_param_or_none(layer, proj + ".bias"); b.defined())
        torch::nn::init::zeros_(b);
    }
  }
};

}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(
    PostLnInit, "post-ln-init", "2.0.0",
    "Post-LN-init: Post-LN with layer l's Xavier init down-scaled by k_l = L-l+1",
    "y = LN(x + Drop(F(x))); q,k,v,out,fc1,fc2 of layer l ~ N(0, 1/(k_l^2 d')), "
    "k_l = L-l+1 [Wang et al. 2022, DeepNet sec. II, Fig. 2]")
