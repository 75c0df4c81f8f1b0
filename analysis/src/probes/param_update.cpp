// param_update: the relative parameter update of one optimizer step, ‖θ_u − θ_{u−1}‖ / ‖θ_{u−1}‖,
// per layer, for the model, the embeddings and the output. docs/analysis.md.
#include "normlab/analysis/probe.h"

namespace normlab::analysis {
namespace {

class ParamUpdate final : public Probe {
 public:
  void before_step(ProbeContext& ctx) override {
    before_.clear();
    for (const ProbedParam& p : ctx.params) before_.push_back(p.value.detach().clone());
  }
  void after_step(ProbeContext& ctx) override {
    if (before_.empty()) return;
    std::vector<torch::Tensor> deltas;
    for (size_t i = 0; i < ctx.params.size(); ++i)
      deltas.push_back(ctx.params[i].value.detach() - before_[i]);
    const std::vector<double> num = squared_norms(deltas), den = squared_norms(before_);
    emit_grouped(ctx, "param_update", num, &den, /*total=*/true);
    before_.clear();
  }

 private:
  std::vector<torch::Tensor> before_;  // θ before the step, in ctx.params order
};

}  // namespace

NORMLAB_PROBE("param_update", ParamUpdate);

}  // namespace normlab::analysis
