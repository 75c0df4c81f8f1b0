// update_norm: the model update ‖F(x,θ_t) − F(x,θ_0)‖₂ on the fixed probe batch, of the logits and
// of each selected layer's output, averaged over non-padding positions. docs/analysis.md.
#include "normlab/analysis/probe.h"

namespace normlab::analysis {
namespace {

class UpdateNorm final : public Probe {
 public:
  void on_reference(ProbeContext&, const ProbePass& pass) override { initial_ = pass; }
  bool needs_probe_pass(const ProbeContext&) const override { return true; }
  void on_probe_pass(ProbeContext& ctx, const ProbePass& pass) override {
    if (!initial_.logits.defined()) return;
    const torch::Tensor& target_mask = ctx.masks.at(int(Stack::Decoder));
    ctx.emit("update_norm", "model", -1, "logits",
             masked_mean((pass.logits - initial_.logits).norm(2, -1), target_mask));
    for (const auto& [key, out] : pass.layer_out) {
      auto initial = initial_.layer_out.find(key);
      if (initial == initial_.layer_out.end()) continue;
      ctx.emit("update_norm", stack_name(Stack(key.first)), key.second, "output",
               masked_mean((out - initial->second).norm(2, -1), ctx.masks.at(key.first)));
    }
  }

 private:
  ProbePass initial_;  // F(x, θ_0)
};

}  // namespace

NORMLAB_PROBE("update_norm", UpdateNorm);

}  // namespace normlab::analysis
