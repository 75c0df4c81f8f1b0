// sparsity: the share of exactly-zero (ffn_zero_fraction) and non-zero (ffn_nonzero_fraction)
// entries of each selected layer's FFN activation on the probe batch. docs/analysis.md.
#include "normlab/analysis/probe.h"

namespace normlab::analysis {
namespace {

class Sparsity final : public Probe {
 public:
  bool needs_probe_pass(const ProbeContext&) const override { return true; }
  void on_ffn_activation(ProbeContext& ctx, const LayerId& id, const torch::Tensor& act) override {
    if (ctx.pass != Pass::ProbeBatch) return;
    const double zeros =
        masked_mean(act.detach().eq(0).to(torch::kDouble).mean(-1), ctx.masks.at(int(id.stack)));
    ctx.emit("ffn_zero_fraction", stack_name(id.stack), id.index, "ffn", zeros);
    ctx.emit("ffn_nonzero_fraction", stack_name(id.stack), id.index, "ffn", 1.0 - zeros);
  }
};

}  // namespace

NORMLAB_PROBE("sparsity", Sparsity);

}  // namespace normlab::analysis
