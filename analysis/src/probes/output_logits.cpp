// output_logits: the output layer's logits z on the probe batch, over the non-padding target
// positions: the mean log-partition log Z = logsumexp_v z_v (output_log_z), and the mean and the
// largest |z_v| over the positions and the vocabulary (output_logit_mean_abs, output_logit_max_abs)
// — Wortsman et al. 2023's "output logit divergence" (log Z drifting far from 0; the z-loss's
// target). The logits the loss sees (after model.final_logit_softcap). docs/analysis.md.
#include "normlab/analysis/probe.h"
#include "torch_api.h"

namespace normlab::analysis {
namespace {

class OutputLogits final : public Probe {
 public:
  bool needs_probe_pass(const ProbeContext&) const override { return true; }
  void on_probe_pass(ProbeContext& ctx, const ProbePass& pass) override {
    const torch::Tensor& targets = ctx.masks.at(int(Stack::Decoder));  // [B,T]
    // [N,V] at the N non-padding positions; float at least (bf16 sums lose digits).
    torch::Tensor z = pass.logits.index({targets});
    if (z.scalar_type() != torch::kDouble) z = z.to(torch::kFloat);
    if (z.size(0) == 0) return;
    const torch::Tensor abs = z.abs();
    const torch::Tensor values =
        torch::stack({z.logsumexp(-1).mean(), abs.mean(), abs.max()}).to(torch::kDouble).cpu();
    const double* v = values.data_ptr<double>();
    ctx.emit("output_log_z", "model", -1, "logits", v[0]);
    ctx.emit("output_logit_mean_abs", "model", -1, "logits", v[1]);
    ctx.emit("output_logit_max_abs", "model", -1, "logits", v[2]);
  }
};

}  // namespace

NORMLAB_PROBE("output_logits", OutputLogits);

}  // namespace normlab::analysis
