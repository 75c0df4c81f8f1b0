// ReZero (Bachlechner et al. 2021, "ReZero is All You Need"): y = x + g·Drop(F(x)), one learnable
// scalar gate g per sublayer, 0 at init, and no LayerNorm anywhere.
#include <normlab/sdk.h>

namespace {
using namespace normlab;

class ReZeroWiring final : public PerSublayerWiring {
 public:
  ReZeroWiring(LayerBuilder& b, double init) : PerSublayerWiring(b.geometry()) {
    for (int i = 0; i < num_sublayers_; ++i)
      gates_[i] =
          b.add_parameter(std::string(to_string(sublayers_[i])) + "_gate", torch::full({1}, init));
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return x + ops.param(gates_[i]) * ops.branch(s, x);
  }

 private:
  int gates_[3] = {0, 0, 0};
};

class ReZero final : public Scheme {
 public:
  ReZero(const ParamView& p, const ModelGeometry&) : init_(p.number("init")) {}
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<ReZeroWiring>(b, init_);
  }

 private:
  double init_;
};

constexpr normlab_param_info kParams[] = {
    {"init", "float", "0", "", 0, 1, "initial value of every residual gate"}};
}  // namespace

NORMLAB_EXPORT_SCHEME(ReZero, "rezero", "1.0.0", "ReZero: gated residual branches, no LayerNorm",
                      "y = x + g*F(x) [Bachlechner et al. 2021]", kParams)
