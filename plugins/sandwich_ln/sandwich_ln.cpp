// Sandwich-LN (Ding et al. 2021, CogView sec. 2.4): y = x + LN_out(Drop(F(LN_in(x)))), a LayerNorm
// on the branch input and on its output, and a final LayerNorm per stack. Written against the SDK
// only, as a user would.
#include <normlab/sdk.h>

namespace {
using namespace normlab;

class SandwichWiring final : public PerSublayerWiring {
 public:
  explicit SandwichWiring(LayerBuilder& b) : PerSublayerWiring(b.geometry()) {
    for (int i = 0; i < num_sublayers_; ++i) {
      in_[i] = b.add_layer_norm(norm_name(sublayers_[i]));
      out_[i] = b.add_layer_norm(std::string(to_string(sublayers_[i])) + "_out_norm");
    }
  }

 protected:
  // As in CogView's code, the output LayerNorm follows the branch's dropout.
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return x + ops.norm(out_[i], ops.branch(s, ops.norm(in_[i], x)));
  }

 private:
  int in_[3] = {0, 0, 0}, out_[3] = {0, 0, 0};
};

class SandwichLn final : public Scheme {
 public:
  SandwichLn(const ParamView&, const ModelGeometry&) {}
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<SandwichWiring>(b);
  }
  std::optional<NormSpec> final_norm(Stack, const NormSpec& configured) const override {
    return configured;
  }
};

}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(
    SandwichLn, "sandwich-ln", "1.0.0",
    "Sandwich-LN: LayerNorm on the branch input and output, final LayerNorm",
    "y = x + LN_out(Drop(F(LN_in(x)))) [Ding et al. 2021, CogView sec. 2.4]")
