// A plugin from a future SDK with a static initializer: refused from its metadata alone, before
// anything in it runs.
#define NORMLAB_ABI_VERSION 999
#include <normlab/sdk.h>

#include "leave_trace.h"

namespace {
struct RunsWhenLoaded {
  RunsWhenLoaded() { leave_trace("wrong_abi_init: static initializer ran"); }
} runs_when_loaded;

class FutureScheme final : public normlab::Scheme {
 public:
  FutureScheme(const normlab::ParamView&, const normlab::ModelGeometry&) {}
  std::unique_ptr<normlab::LayerWiring> build_layer(normlab::LayerBuilder&) override {
    return nullptr;
  }
};
}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(FutureScheme, "future-init", "9.9.9",
                                "from the future, with an initializer", "y = ?")
