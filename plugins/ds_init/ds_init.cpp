// DS-Init (Zhang, Titov & Sennrich 2019, "Improving Deep Transformer with Depth-Scaled
// Initialization and Merged Attention", eq. 9): Post-LN whose layer l (1-based, per stack) has its
// weight matrices initialized from the usual distribution scaled by alpha/sqrt(l), alpha = 1.
#include <normlab/sdk.h>

#include <cmath>

namespace {
using namespace normlab;

class DsInit final : public Scheme {
 public:
  DsInit(const ParamView& p, const ModelGeometry&) : alpha_(p.number("alpha")) {}
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<PostLnWiring>(b);
  }
  void init_layer(torch::nn::Module& layer, const LayerGeometry& g) override {
    torch::NoGradGuard no_grad;
    const double scale = alpha_ / std::sqrt(double(g.index + 1));
    for (const std::string& proj : layer_projections(g))
      layer_param(layer, proj + ".weight").mul_(scale);
  }

 private:
  double alpha_;
};

constexpr normlab_param_info kParams[] = {
    {"alpha", "float", "1", "", 0, 10, "scale alpha in alpha/sqrt(l)"}};

}  // namespace

NORMLAB_EXPORT_SCHEME(
    DsInit, "ds-init", "1.0.0", "DS-Init: Post-LN with layer l's weights scaled by alpha/sqrt(l)",
    "y = LN(x + Drop(F(x))); W_l ~ init * alpha/sqrt(l) [Zhang et al. 2019, eq. 9]", kParams)
