// activation_kurtosis: outlier features in each selected layer's output (the residual stream,
// stream 0) on the probe batch — He et al. 2024, "Understanding and Minimising Outlier Features in
// Transformer Training", eq. (1): for the activations X [n tokens × d features] at the non-padding
// positions, s_j = √(mean_i X_ij²) per feature and Kurt(X) = mean_j s_j⁴ / (mean_j s_j²)². 1 when
// every feature has the same RMS, d when one feature holds all. docs/analysis.md.
#include "normlab/analysis/probe.h"
#include "torch_api.h"

namespace normlab::analysis {
namespace {

class ActivationKurtosis final : public Probe {
 public:
  bool needs_probe_pass(const ProbeContext&) const override { return true; }
  void on_layer_output(ProbeContext& ctx, const LayerId& id, const torch::Tensor& out) override {
    if (ctx.pass != Pass::ProbeBatch) return;
    const torch::Tensor x = out.detach().index({ctx.masks.at(int(id.stack))}).to(torch::kDouble);
    if (x.size(0) == 0) return;
    const torch::Tensor s2 = x.pow(2).mean(0);  // s_j², [d]
    ctx.emit("activation_kurtosis", stack_name(id.stack), id.index, "output",
             (s2.pow(2).mean() / s2.mean().pow(2)).item<double>());
  }
};

}  // namespace

NORMLAB_PROBE("activation_kurtosis", ActivationKurtosis);

}  // namespace normlab::analysis
