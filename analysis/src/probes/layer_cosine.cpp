// layer_cosine: the mean per-token cosine similarity of the outputs of layers i and j of one stack
// on the probe batch, at the updates of analysis.cosine_at. docs/analysis.md.
#include <fmt/format.h>

#include "normlab/analysis/probe.h"
#include "normlab/analysis/probes.h"
#include "torch_api.h"

namespace normlab::analysis {
namespace {

class LayerCosine final : public Probe {
 public:
  bool needs_probe_pass(const ProbeContext& ctx) const override {
    return ctx.plan.cosine_due(ctx.update);
  }
  void on_probe_pass(ProbeContext& ctx, const ProbePass& pass) override {
    if (!ctx.plan.cosine_due(ctx.update)) return;
    for (const auto& [s, layers] : ctx.selected) {
      std::vector<torch::Tensor> outs;
      for (int i : layers) outs.push_back(pass.layer_out.at({s, i}));
      // [L, N, D] over the non-padding positions, unit rows; cos(i,j) = mean_n <h_i,h_j>.
      const torch::Tensor m = ctx.masks.at(s).reshape({-1});
      torch::Tensor h =
          torch::stack(outs).flatten(1, 2).index({torch::indexing::Slice(), m}).to(torch::kDouble);
      h = h / h.norm(2, -1, true).clamp_min(1e-12);
      // On the host before reading it element-wise (a CUDA tensor's data is not addressable here).
      const torch::Tensor sim =
          (torch::einsum("lnd,knd->lk", {h, h}) / double(std::max<int64_t>(1, h.size(1)))).cpu();
      const auto acc = sim.accessor<double, 2>();
      for (size_t i = 0; i < layers.size(); ++i)
        for (size_t j = 0; j < layers.size(); ++j)
          ctx.emit("layer_cosine", stack_name(Stack(s)), layers[i],
                   fmt::format("layer:{}", layers[j]), acc[long(i)][long(j)]);
    }
  }
};

}  // namespace

NORMLAB_PROBE("layer_cosine", LayerCosine);

}  // namespace normlab::analysis
