// Finds the first module whose output (forward order) or gradient (backward order) is not
// finite: attached for one diagnostic re-run of the batch on which training diverged.
#pragma once

#include <string>

#include "normlab/model/observer.h"
#include "normlab/model/transformer_model.h"
#include "torch_api.h"

namespace normlab {

class NonFiniteProbe final : public ActivationObserver {
 public:
  explicit NonFiniteProbe(TransformerModelImpl& model) : model_(model) {}

  void on_branch(const LayerId& id, Sublayer s, const torch::Tensor& out) override {
    check(out, name(id) + "." + to_string(s));
  }
  void on_norm(const LayerId& id, int norm_id, const torch::Tensor& in,
               const torch::Tensor& out) override {
    const std::string n =
        name(id) + "." + stack(id).layer(size_t(id.index)).norm_names()[size_t(norm_id)];
    check(in, n + " (input)");
    check(out, n);
  }
  void on_ffn_activation(const LayerId& id, const torch::Tensor& act) override {
    check(act, name(id) + ".ffn.activation");
  }
  void on_layer_output(const LayerId& id, const torch::Tensor& out) override {
    check(out, name(id));
  }

  const std::string& first_forward() const { return forward_; }
  const std::string& first_backward() const { return *backward_; }

 private:
  TransformerStackImpl& stack(const LayerId& id) {
    return id.stack == Stack::Encoder ? *model_.encoder : *model_.decoder;
  }
  static std::string name(const LayerId& id) {
    return std::string(to_string(id.stack)) + ".layers." + std::to_string(id.index);
  }
  void check(const torch::Tensor& t, const std::string& where) {
    if (forward_.empty() && !torch::isfinite(t).all().item<bool>()) forward_ = "output of " + where;
    if (t.requires_grad()) {
      auto slot = backward_;
      t.register_hook([slot, where](torch::Tensor g) {
        if (slot->empty() && !torch::isfinite(g).all().item<bool>()) *slot = "gradient at " + where;
      });
    }
  }

  TransformerModelImpl& model_;
  std::string forward_;
  std::shared_ptr<std::string> backward_ = std::make_shared<std::string>();
};

}  // namespace normlab
