// A plugin whose static initializer throws an int, as a metadata function computed at load time
// once did: listing must not run it, so `plugins list` still works and shows the others.
#include <normlab/sdk.h>

namespace {
int throws_when_loaded() { throw 42; }
const int loaded = throws_when_loaded();

class NeverBuilt final : public normlab::Scheme {
 public:
  NeverBuilt(const normlab::ParamView&, const normlab::ModelGeometry&) {}
  std::unique_ptr<normlab::LayerWiring> build_layer(normlab::LayerBuilder&) override {
    return nullptr;
  }
  std::optional<normlab::NormSpec> final_norm(normlab::Stack,
                                              const normlab::NormSpec& c) const override {
    return loaded != 0 ? std::optional<normlab::NormSpec>(c) : std::nullopt;
  }
};
}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(NeverBuilt, "init-throws", "1.0.0",
                                "its static initializer throws 42", "y = ?")
