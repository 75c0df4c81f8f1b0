// attn_logit_max: the largest |scale·q·kᵀ| of each selected layer's attentions (encoder self,
// decoder self, cross) on the probe batch, per head and over the heads, over the query/key pairs
// the softmax weighs: non-padding queries, keys its mask allows. The logits as the softmax sees
// them before any soft-cap (model.attn_logit_softcap), after q/k norms and rotary positions —
// "attention logit growth" (Dehghani et al. 2023; Wortsman et al. 2023, Fig. 2). docs/analysis.md.
#include <fmt/format.h>

#include "normlab/analysis/probe.h"
#include "torch_api.h"

namespace normlab::analysis {
namespace {

class AttnLogitMax final : public Probe {
 public:
  bool needs_probe_pass(const ProbeContext&) const override { return true; }
  bool watches_attention() const override { return true; }
  void on_attention(ProbeContext& ctx, const LayerId& id, Sublayer s,
                    const AttentionScores& a) override {
    const torch::Tensor queries = ctx.masks.at(int(id.stack)).unsqueeze(-1);  // [B,Tq,1]
    std::vector<torch::Tensor> per_head;
    for (int64_t h = 0; h < a.q.size(1); ++h) {
      const torch::Tensor pairs = attention_allowed(a, h) & queries;
      per_head.push_back(attention_logits(a, h).abs().masked_fill(pairs.logical_not(), 0).amax());
    }
    const torch::Tensor m = torch::stack(per_head).to(torch::kDouble).cpu();  // one host transfer
    const double* v = m.data_ptr<double>();
    const std::string sub = to_string(s);
    for (int64_t h = 0; h < m.numel(); ++h)
      ctx.emit("attn_logit_max", stack_name(id.stack), id.index, fmt::format("{}.head:{}", sub, h),
               v[h]);
    ctx.emit("attn_logit_max", stack_name(id.stack), id.index, sub, m.max().item<double>());
  }
};

}  // namespace

NORMLAB_PROBE("attn_logit_max", AttnLogitMax);

}  // namespace normlab::analysis
