// layer_angular_distance: for each selected layer, (1/π)·arccos(cos(h_in, h_out)) between the
// layer's input and output hidden states, averaged over the probe batch's non-padding positions: 0
// for a layer that leaves the direction of the stream unchanged, 1/2 for orthogonal (Gromov et al.
// 2024, "The Unreasonable Ineffectiveness of the Deeper Layers", eq. 7; used by Mix-LN and
// LayerNorm-Scaling). Stream 0 for multi-stream schemes. docs/analysis.md.
#include <cmath>
#include <map>
#include <utility>

#include "normlab/analysis/probe.h"
#include "torch_api.h"

namespace normlab::analysis {
namespace {

class LayerAngularDistance final : public Probe {
 public:
  bool needs_probe_pass(const ProbeContext&) const override { return true; }
  void on_layer_input(ProbeContext& ctx, const LayerId& id, const torch::Tensor& in) override {
    if (ctx.pass == Pass::ProbeBatch) inputs_[{int(id.stack), id.index}] = in.detach();
  }
  void on_layer_output(ProbeContext& ctx, const LayerId& id, const torch::Tensor& out) override {
    if (ctx.pass != Pass::ProbeBatch) return;
    const auto it = inputs_.find({int(id.stack), id.index});
    if (it == inputs_.end()) return;
    const torch::Tensor a = it->second.to(torch::kDouble), b = out.detach().to(torch::kDouble);
    inputs_.erase(it);
    const torch::Tensor cos = (a * b).sum(-1) / (a.norm(2, -1) * b.norm(2, -1)).clamp_min(1e-300);
    const torch::Tensor distance = torch::acos(cos.clamp(-1.0, 1.0)) / M_PI;  // [B,T]
    ctx.emit("layer_angular_distance", stack_name(id.stack), id.index, "layer",
             masked_mean(distance, ctx.masks.at(int(id.stack))));
  }

 private:
  std::map<std::pair<int, int>, torch::Tensor> inputs_;  // this probe pass's layer inputs
};

}  // namespace

NORMLAB_PROBE("layer_angular_distance", LayerAngularDistance);

}  // namespace normlab::analysis
