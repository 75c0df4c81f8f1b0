// A plugin whose scheme constructor throws: creating it must be a one-line error, not a crash.
#include <normlab/sdk.h>

#include <stdexcept>

namespace {
class ThrowingScheme final : public normlab::Scheme {
 public:
  ThrowingScheme(const normlab::ParamView&, const normlab::ModelGeometry&) {
    throw std::runtime_error("this scheme refuses to be built");
  }
  std::unique_ptr<normlab::LayerWiring> build_layer(normlab::LayerBuilder&) override {
    return nullptr;
  }
};
}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(ThrowingScheme, "throwing", "1.0.0", "always throws", "none")
