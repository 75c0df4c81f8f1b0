// Peri-LN (Kim et al. 2025, "Peri-LN: Revisiting Normalization Layer in the Transformer
// Architecture", ICML 2025, arXiv:2502.02732): a norm around each sublayer, on its input and on its
// output, and none on the residual stream itself:
//   y = x + Norm_out(Drop(F(Norm_in(x))))      for SA, CA and FFN, each norm with its own γ (β)
//   final Norm after each stack (as Pre-LN); optional Norm on the embedding output (off by
//   default).
// Reading followed: the paper's placement (input norm "A" as in Pre-LN plus output norm "B" before
// the residual add); no official code exists and the paper's full text could not be read here, so
// this follows docs/schemes/peri_ln.md (the equations as restated from the paper). The paper's
// models are decoder-only; cross-attention gets the same treatment (normlab's mapping).
// Dropout: the SDK's branch() applies residual dropout inside the branch, so the output norm
// follows dropout (as Sandwich-LN does); Drop after Norm_out was the other option. Same in eval.
#include <normlab/sdk.h>

namespace {
using namespace normlab;

class PeriLnWiring final : public PerSublayerWiring {
 public:
  explicit PeriLnWiring(LayerBuilder& b) : PerSublayerWiring(b.geometry()) {
    for (int i = 0; i < num_sublayers_; ++i) {
      in_[i] = b.add_layer_norm(norm_name(sublayers_[i]));
      out_[i] = b.add_layer_norm(std::string(to_string(sublayers_[i])) + "_out_norm");
    }
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return x + ops.norm(out_[i], ops.branch(s, ops.norm(in_[i], x)));
  }

 private:
  int in_[3] = {0, 0, 0}, out_[3] = {0, 0, 0};
};

// h₀ = Norm_emb(embedding): the paper's optional embedding norm, one stream otherwise untouched.
class EmbeddingNormStack final : public StackWiring {
 public:
  explicit EmbeddingNormStack(StackBuilder& b) : norm_(b.add_norm("embed_norm", b.model().norm)) {}
  Streams begin(StackOps& ops, const torch::Tensor& x) override { return {ops.norm(norm_, x)}; }
  torch::Tensor end(StackOps&, Streams& s) override { return s[0]; }

 private:
  int norm_;
};

class PeriLn final : public Scheme {
 public:
  PeriLn(const ParamView& p, const ModelGeometry&) : embedding_norm_(p.flag("embedding_norm")) {}
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<PeriLnWiring>(b);
  }
  std::unique_ptr<StackWiring> build_stack(StackBuilder& b) override {
    if (!embedding_norm_) return nullptr;
    return std::make_unique<EmbeddingNormStack>(b);
  }
  std::optional<NormSpec> final_norm(Stack, const NormSpec& configured) const override {
    return configured;
  }

 private:
  bool embedding_norm_;
};

constexpr normlab_param_info kParams[] = {
    {"embedding_norm", "bool", "false", "", 0, 0,
     "also normalize the embedding output, h0 = Norm(embedding) (optional in the paper)"}};
}  // namespace

NORMLAB_EXPORT_SCHEME(
    PeriLn, "peri-ln", "1.0.0",
    "Peri-LN: norm on each sublayer's input and output, final norm per stack",
    "y = x + Norm_out(Drop(F(Norm_in(x)))), final Norm [Kim et al. 2025, Peri-LN]", kParams)
