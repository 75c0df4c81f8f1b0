// Reordered norm, OLMo 2's block (Team OLMo, "2 OLMo 2 Furious", 2024, arXiv:2501.00656, §3.2;
// "reordered norm" is the paper's name): each sublayer's norm moved from its input to its output,
// no input norm and nothing on the residual stream itself:
//   y = x + Norm(Drop(F(x)))      for SA, CA and FFN, each norm with its own γ (β)
//   final Norm after each stack (OLMo 2 normalizes the last hidden state before the LM head).
// Code read: allenai/OLMo-core, src/olmo_core/nn/transformer/block.py,
// ReorderedNormTransformerBlock (attention_norm on the attention's output, feed_forward_norm on the
// feed-forward's, then the residual add of ResidualStream) and nn/transformer/config.py (olmo2_*:
// the block, RMSNorm with eps 1e-6, QK-norm, the LM head's norm). docs/schemes/reordered_norm.md.
// Dropout: the SDK's branch() applies residual dropout inside the branch, so the norm follows
// dropout here, where OLMo-core drops the normalized output; OLMo 2 trains without dropout.
// Cross-attention (encoder-decoder) gets the same treatment as the other sublayers: normlab's.
#include <normlab/sdk.h>

namespace {
using namespace normlab;

class ReorderedNormWiring final : public PerSublayerWiring {
 public:
  explicit ReorderedNormWiring(LayerBuilder& b) : PerSublayerWiring(b.geometry()) {
    for (int i = 0; i < num_sublayers_; ++i)
      out_[i] = b.add_layer_norm(std::string(to_string(sublayers_[i])) + "_out_norm");
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return x + ops.norm(out_[i], ops.branch(s, x));
  }

 private:
  int out_[3] = {0, 0, 0};
};

class ReorderedNorm final : public Scheme {
 public:
  ReorderedNorm(const ParamView&, const ModelGeometry&) {}
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<ReorderedNormWiring>(b);
  }
  std::optional<NormSpec> final_norm(Stack, const NormSpec& configured) const override {
    return configured;
  }
};
}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(
    ReorderedNorm, "reordered-norm", "1.0.0",
    "Reordered norm (OLMo 2): norm on each sublayer's output only, final norm per stack",
    "y = x + Norm(Drop(F(x))), final Norm [Team OLMo 2024, OLMo 2 reordered norm]")
