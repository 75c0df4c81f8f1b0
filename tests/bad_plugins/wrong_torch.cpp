// A plugin that claims another LibTorch: the registry must refuse it, naming both versions.
#define NORMLAB_PLUGIN_TORCH_VERSION "0.9.0"
#include <normlab/sdk.h>

namespace {
class OldTorchScheme final : public normlab::Scheme {
 public:
  OldTorchScheme(const normlab::ParamView&, const normlab::ModelGeometry&) {}
  std::unique_ptr<normlab::LayerWiring> build_layer(normlab::LayerBuilder&) override {
    return nullptr;
  }
};
}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(OldTorchScheme, "old-torch", "1.0.0", "built for another LibTorch",
                                "y = ?")
