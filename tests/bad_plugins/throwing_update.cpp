// A Pre-LN scheme that throws from on_update at the third update: a run failing in the middle
// (NORMLAB_TEST_THROW = runtime | bad_alloc | int | torch_oom picks what it throws) must end with
// status "failed" and one error line.
#include <normlab/sdk.h>

#include <cstdlib>
#include <new>
#include <stdexcept>
#include <string>

namespace {

using normlab::LayerOps;
using normlab::Sublayer;

class Wiring final : public normlab::PerSublayerWiring {
 public:
  explicit Wiring(normlab::LayerBuilder& b) : PerSublayerWiring(b.geometry()) {
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

class ThrowingUpdateScheme final : public normlab::Scheme {
 public:
  ThrowingUpdateScheme(const normlab::ParamView&, const normlab::ModelGeometry&) {}
  std::unique_ptr<normlab::LayerWiring> build_layer(normlab::LayerBuilder& b) override {
    return std::make_unique<Wiring>(b);
  }
  std::optional<normlab::NormSpec> final_norm(normlab::Stack,
                                              const normlab::NormSpec& configured) const override {
    return configured;
  }
  void on_update(int64_t updates_done) override {
    if (updates_done != 3) return;
    const char* kind = std::getenv("NORMLAB_TEST_THROW");
    const std::string k = kind ? kind : "runtime";
    if (k == "bad_alloc") throw std::bad_alloc();
    if (k == "int") throw 42;
    if (k == "torch_oom")
      (void)torch::empty({int64_t(1) << 50});  // LibTorch's own out-of-memory error
    throw std::runtime_error("throwing-update: injected failure at update 3");
  }
};

}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(ThrowingUpdateScheme, "throwing-update", "1.0.0",
                                "test scheme: Pre-LN that throws at update 3",
                                "y = x + Drop(F(LN(x)))")
