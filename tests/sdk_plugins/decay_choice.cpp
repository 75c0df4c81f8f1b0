// A ReZero-like scheme that decides weight decay for some parameters through the SDK
// (Scheme::weight_decay, ABI 7): its first layer's gates decay although they are scheme
// parameters, and the token embedding does not although it is a matrix.
#include <normlab/sdk.h>

#include <string>

namespace {
using namespace normlab;

class GateWiring final : public PerSublayerWiring {
 public:
  explicit GateWiring(LayerBuilder& b) : PerSublayerWiring(b.geometry()) {
    for (int i = 0; i < num_sublayers_; ++i)
      gates_[i] =
          b.add_parameter(std::string(to_string(sublayers_[i])) + "_gate", torch::full({1}, 0.5));
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return x + ops.param(gates_[i]) * ops.branch(s, x);
  }

 private:
  int gates_[3] = {0, 0, 0};
};

class DecayChoice final : public Scheme {
 public:
  DecayChoice(const ParamView&, const ModelGeometry&) {}
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<GateWiring>(b);
  }
  std::optional<bool> weight_decay(const std::string& parameter) const override {
    if (parameter.rfind("decoder.layers.0.", 0) == 0 &&
        parameter.find("_gate") != std::string::npos)
      return true;
    if (parameter == "decoder.embed_tokens.weight") return false;
    return std::nullopt;
  }
};

}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(DecayChoice, "decay-choice", "1.0.0",
                                "test scheme: gated residuals that choose their weight decay",
                                "y = x + g*F(x)")
