// grad_norm: L2 norm of ∂L/∂θ of each group of parameters (layer × sublayer, layer, embeddings, …)
// before clipping, and the global norm clipping uses (model/-1/total). docs/analysis.md.
#include "normlab/analysis/probe.h"

namespace normlab::analysis {
namespace {

class GradNorm final : public Probe {
 public:
  void after_backward(ProbeContext& ctx) override {
    std::vector<torch::Tensor> grads;
    for (const ProbedParam& p : ctx.params) grads.push_back(p.value.grad());
    emit_grouped(ctx, "grad_norm", squared_norms(grads), nullptr, /*total=*/false);
  }
  void on_grad_norm(ProbeContext& ctx, double total_before_clipping) override {
    ctx.emit("grad_norm", "model", -1, "total", total_before_clipping);
  }
};

}  // namespace

NORMLAB_PROBE("grad_norm", GradNorm);

}  // namespace normlab::analysis
