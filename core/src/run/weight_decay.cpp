#include "run/weight_decay.h"

#include <fmt/format.h>

#include <unordered_set>

#include "normlab/model/norm.h"

namespace normlab {

DecayPlan plan_weight_decay(TransformerModelImpl& model, const std::string& no_decay) {
  DecayPlan plan;
  plan.rule = no_decay != "auto"                             ? no_decay
              : model.config().family == Family::Transformer ? "nothing"
                                                             : "vectors+scheme";
  std::unordered_set<const void*> scheme_owned, norm_owned;
  for (const auto& t : model.scheme_parameters()) scheme_owned.insert(t.unsafeGetTensorImpl());
  // A norm's gain and bias are exempt by role, whatever their shape: nGPT's s_qk is a q/k norm
  // gain stored [heads, 1, d_k], which "fewer than 2 dims" decayed (issue 60.2).
  for (const auto& m : model.modules(/*include_self=*/false))
    if (dynamic_cast<const NormImpl*>(m.get()))
      for (const auto& t : m->parameters()) norm_owned.insert(t.unsafeGetTensorImpl());
  for (const auto& item : model.named_parameters()) {
    const torch::Tensor& p = item.value();
    bool decays = true;
    if (plan.rule != "nothing") {
      decays = p.dim() >= 2 && !norm_owned.count(p.unsafeGetTensorImpl());
      if (plan.rule == "vectors+scheme" && scheme_owned.count(p.unsafeGetTensorImpl()))
        decays = false;
      if (const std::optional<bool> chosen = model.scheme().weight_decay(item.key())) {
        decays = *chosen;
        ++plan.scheme_decisions;
      }
    }
    plan.decays.push_back(decays);
    ++plan.tensors;
    plan.elements += p.numel();
    plan.decayed_tensors += decays;
    plan.decayed_elements += decays ? p.numel() : 0;
  }
  return plan;
}

std::string DecayPlan::summary(double weight_decay) const {
  if (weight_decay == 0) return "no weight decay";
  return fmt::format("weight decay {} on {} of {} tensors ({} of {} elements; no_decay = {}{})",
                     weight_decay, decayed_tensors, tensors, decayed_elements, elements, rule,
                     scheme_decisions > 0
                         ? fmt::format(", {} decided by the scheme", scheme_decisions)
                         : std::string());
}

}  // namespace normlab
