// scheme_state: the scheme's live state — its values() (BranchNorm's alpha_t), its saved state
// tensors (Admin's profile: .mean/.min/.max) and the mean of each layer parameter it added
// (ReZero's g). Typed: nothing is parsed from status(). docs/analysis.md.
#include "normlab/analysis/probe.h"
#include "normlab/model/transformer_model.h"

namespace normlab::analysis {
namespace {

class SchemeState final : public Probe {
 public:
  void on_start(ProbeContext& ctx) override { record(ctx); }
  void after_step(ProbeContext& ctx) override { record(ctx); }

 private:
  static void record(ProbeContext& ctx) {
    const Scheme& scheme = ctx.model.scheme();
    for (const SchemeValue& v : scheme.values())
      ctx.emit("scheme_state", "model", -1, v.name, v.value);
    for (const auto& [name, t] : scheme.state()) {
      if (!t.defined() || !t.is_floating_point() || t.numel() == 0) continue;
      const torch::Tensor d = t.detach().to(torch::kDouble);
      if (d.numel() == 1) {
        ctx.emit("scheme_state", "model", -1, name, d.item<double>());
      } else {
        ctx.emit("scheme_state", "model", -1, name + ".mean", d.mean().item<double>());
        ctx.emit("scheme_state", "model", -1, name + ".min", d.min().item<double>());
        ctx.emit("scheme_state", "model", -1, name + ".max", d.max().item<double>());
      }
    }
    for (const ProbedParam& p : ctx.params)
      if (p.slot.sublayer == "extra")
        ctx.emit("scheme_state", p.slot.stack, p.slot.layer, p.name.substr(p.name.rfind('.') + 1),
                 p.value.detach().to(torch::kDouble).mean().item<double>());
  }
};

}  // namespace

NORMLAB_PROBE("scheme_state", SchemeState);

}  // namespace normlab::analysis
