// A plugin built against a future SDK: the registry must refuse it, naming both ABI numbers.
#define NORMLAB_ABI_VERSION 999
#include <normlab/sdk.h>

namespace {
class FutureScheme final : public normlab::Scheme {
 public:
  FutureScheme(const normlab::ParamView&, const normlab::ModelGeometry&) {}
  std::unique_ptr<normlab::LayerWiring> build_layer(normlab::LayerBuilder&) override {
    return nullptr;
  }
};
}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(FutureScheme, "future", "9.9.9", "from the future", "y = ?")
