// hidden_state_norm: the size of the residual stream after each selected layer on the probe batch —
// hidden_rms = √(mean h²) over the non-padding positions and the d features, and hidden_max_abs =
// max |h| there. Pre-LN's stream grows with depth; Peri-LN and LayerNorm-Scaling are built to stop
// that growth (docs/schemes/ln_scaling.md, docs/schemes/peri_ln.md). docs/analysis.md.
#include "normlab/analysis/probe.h"
#include "torch_api.h"

namespace normlab::analysis {
namespace {

class HiddenStateNorm final : public Probe {
 public:
  bool needs_probe_pass(const ProbeContext&) const override { return true; }
  void on_layer_output(ProbeContext& ctx, const LayerId& id, const torch::Tensor& out) override {
    if (ctx.pass != Pass::ProbeBatch) return;
    const torch::Tensor h = out.detach().to(torch::kDouble);
    const torch::Tensor& mask = ctx.masks.at(int(id.stack));
    const double rms = std::sqrt(masked_mean(h.pow(2).mean(-1), mask));
    const double max_abs =
        h.abs().amax(-1).masked_fill(mask.logical_not(), 0.0).max().item<double>();
    ctx.emit("hidden_rms", stack_name(id.stack), id.index, "output", rms);
    ctx.emit("hidden_max_abs", stack_name(id.stack), id.index, "output", max_abs);
  }
};

}  // namespace

NORMLAB_PROBE("hidden_state_norm", HiddenStateNorm);

}  // namespace normlab::analysis
