// ln_input_norm: the mean L2 norm of each selected norm's input vector on the probe batch
// (compare with √d). docs/analysis.md.
#include "normlab/analysis/probe.h"

namespace normlab::analysis {
namespace {

class NormInputNorm final : public Probe {
 public:
  bool needs_probe_pass(const ProbeContext&) const override { return true; }
  void on_norm(ProbeContext& ctx, const LayerId& id, const std::string& norm,
               const torch::Tensor& in, const torch::Tensor&) override {
    if (ctx.pass != Pass::ProbeBatch) return;
    ctx.emit("ln_input_norm", stack_name(id.stack), id.index, norm,
             masked_mean(in.detach().norm(2, -1), ctx.masks.at(int(id.stack))));
  }
};

}  // namespace

NORMLAB_PROBE("ln_input_norm", NormInputNorm);

}  // namespace normlab::analysis
