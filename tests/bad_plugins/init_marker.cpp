// A valid plugin whose static initializer leaves a trace: scanning and listing must not run it,
// creating its scheme must (so the fixture itself is known to work).
#include <normlab/sdk.h>

#include "leave_trace.h"

namespace {
struct RunsWhenLoaded {
  RunsWhenLoaded() { leave_trace("init_marker: static initializer ran"); }
} runs_when_loaded;

class TraceScheme final : public normlab::Scheme {
 public:
  TraceScheme(const normlab::ParamView&, const normlab::ModelGeometry&) {}
  std::unique_ptr<normlab::LayerWiring> build_layer(normlab::LayerBuilder& b) override {
    return std::make_unique<normlab::PostLnWiring>(b);
  }
};
}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(TraceScheme, "init-marker", "1.0.0", "leaves a trace when loaded",
                                "y = LN(x + Drop(F(x)))")
