// attn_entropy: the mean Shannon entropy (nats) of the attention distributions of each selected
// layer's attentions on the probe batch, per head and averaged over the heads: for each
// non-padding query, H = −Σ_k p_k ln p_k of the softmax over the keys its mask allows (after any
// soft-cap). Entropy collapse — a head attending to one key — precedes divergence (Zhai et al.
// 2023, "Stabilizing Transformer Training by Preventing Attention Entropy Collapse").
// docs/analysis.md.
#include <fmt/format.h>

#include <limits>

#include "normlab/analysis/probe.h"
#include "torch_api.h"

namespace normlab::analysis {
namespace {

class AttnEntropy final : public Probe {
 public:
  bool needs_probe_pass(const ProbeContext&) const override { return true; }
  bool watches_attention() const override { return true; }
  void on_attention(ProbeContext& ctx, const LayerId& id, Sublayer s,
                    const AttentionScores& a) override {
    const torch::Tensor& queries = ctx.masks.at(int(id.stack));  // [B,Tq]
    const torch::Tensor count = queries.sum().clamp_min(1).to(torch::kDouble);
    std::vector<torch::Tensor> per_head;
    for (int64_t h = 0; h < a.q.size(1); ++h) {
      torch::Tensor z = attention_logits(a, h);
      if (a.softcap > 0) z = torch::tanh(z / a.softcap) * a.softcap;
      z = z.masked_fill(attention_allowed(a, h).logical_not(),
                        -std::numeric_limits<double>::infinity());
      const torch::Tensor p = torch::softmax(z, -1);
      const torch::Tensor entropy = -torch::xlogy(p, p).sum(-1);  // [B,Tq]; 0·ln 0 = 0
      // A padding query's row may be all −inf (NaN): masked_fill, not a product, drops it.
      per_head.push_back(entropy.masked_fill(queries.logical_not(), 0).sum().to(torch::kDouble) /
                         count);
    }
    const torch::Tensor m = torch::stack(per_head).cpu();  // one host transfer
    const double* v = m.data_ptr<double>();
    const std::string sub = to_string(s);
    for (int64_t h = 0; h < m.numel(); ++h)
      ctx.emit("attn_entropy", stack_name(id.stack), id.index, fmt::format("{}.head:{}", sub, h),
               v[h]);
    ctx.emit("attn_entropy", stack_name(id.stack), id.index, sub, m.mean().item<double>());
  }
};

}  // namespace

NORMLAB_PROBE("attn_entropy", AttnEntropy);

}  // namespace normlab::analysis
