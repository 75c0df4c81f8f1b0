// massive_activations: the largest |h| of each selected layer's output (the residual stream,
// stream 0) over the probe batch's non-padding positions and features, its ratio to the median |h|
// there, and where it sits — sequence of the probe batch, token position and feature index (the
// first such entry in that order). Sun et al. 2024, "Massive Activations in Large Language Models":
// a few entries ~10³–10⁴ times the median, at fixed features of the first or delimiter tokens.
// docs/analysis.md.
#include "normlab/analysis/probe.h"
#include "torch_api.h"

namespace normlab::analysis {
namespace {

class MassiveActivations final : public Probe {
 public:
  bool needs_probe_pass(const ProbeContext&) const override { return true; }
  void on_layer_output(ProbeContext& ctx, const LayerId& id, const torch::Tensor& out) override {
    if (ctx.pass != Pass::ProbeBatch) return;
    const torch::Tensor& mask = ctx.masks.at(int(id.stack));        // [B,T]
    const torch::Tensor a = out.detach().abs().to(torch::kDouble);  // [B,T,d]
    if (!mask.any().item<bool>()) return;
    // Padding below every |h|: argmax finds the first largest entry at a real position.
    const int64_t at = a.masked_fill(mask.logical_not().unsqueeze(-1), -1).argmax().item<int64_t>();
    const int64_t T = a.size(1), d = a.size(2);
    const int64_t b = at / (T * d), t = at / d % T, j = at % d;
    const double largest = a[b][t][j].item<double>();
    const double median = a.index({mask}).median().item<double>();  // the lower middle value
    const char* stack = stack_name(id.stack);
    ctx.emit("massive_activation_max", stack, id.index, "output", largest);
    ctx.emit("massive_activation_ratio", stack, id.index, "output", largest / median);
    ctx.emit("massive_activation_sequence", stack, id.index, "output", double(b));
    ctx.emit("massive_activation_position", stack, id.index, "output", double(t));
    ctx.emit("massive_activation_feature", stack, id.index, "output", double(j));
  }
};

}  // namespace

NORMLAB_PROBE("massive_activations", MassiveActivations);

}  // namespace normlab::analysis
