// act_grad_norm: L2 norm of ∂L/∂h at each selected layer's output and each norm's input and
// output, over the training batch (the last batch of a due update). docs/analysis.md.
#include "normlab/analysis/probe.h"

namespace normlab::analysis {
namespace {

class ActGradNorm final : public Probe {
 public:
  void before_forward(ProbeContext&) override { pending_.clear(); }
  bool watches_training_pass() const override { return true; }
  void on_layer_output(ProbeContext& ctx, const LayerId& id, const torch::Tensor& out) override {
    if (ctx.pass == Pass::Training)
      watch(out, {ctx.update, "act_grad_norm", stack_name(id.stack), id.index, "output", 0});
  }
  void on_norm(ProbeContext& ctx, const LayerId& id, const std::string& norm,
               const torch::Tensor& in, const torch::Tensor& out) override {
    if (ctx.pass != Pass::Training) return;
    watch(in, {ctx.update, "act_grad_norm", stack_name(id.stack), id.index, norm + ".in", 0});
    watch(out, {ctx.update, "act_grad_norm", stack_name(id.stack), id.index, norm + ".out", 0});
  }
  void after_backward(ProbeContext& ctx) override {
    for (auto& [record, norm] : pending_)
      if (norm.defined()) {
        record.value = norm.item<double>();
        ctx.write(record);
      }
    pending_.clear();
  }

 private:
  // A tensor hook keeps the norm of the gradient that reaches `t` during backward.
  void watch(const torch::Tensor& t, Record r) {
    if (!t.requires_grad()) return;
    const size_t slot = pending_.size();
    pending_.emplace_back(std::move(r), torch::Tensor());
    t.register_hook([this, slot](torch::Tensor g) {
      if (slot < pending_.size()) pending_[slot].second = g.detach().norm();
    });
  }
  std::vector<std::pair<Record, torch::Tensor>> pending_;  // this update's, filled during backward
};

}  // namespace

NORMLAB_PROBE("act_grad_norm", ActGradNorm);

}  // namespace normlab::analysis
