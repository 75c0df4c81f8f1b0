// Mix-LN (Li, Yin, Liu, "Mix-LN: Unleashing the Power of Deeper Layers by Combining Pre-LN and
// Post-LN", ICLR 2025, arXiv:2412.13795): Post-LN in the first k = ⌊α·L⌋ layers of a stack,
// Pre-LN in the rest, and a final norm after the stack:
//   ℓ ≤ k:  y = Norm(x + Drop(F(x)))       (per sublayer)
//   ℓ > k:  y = x + Drop(F(Norm(x)))
// with ℓ the 1-based layer index and L the layers in its stack. α = 0.25 is the value the authors'
// scripts use (POST_NUM = 3 of 12, 6 of 24 layers; floor, as Python's //). Checked in the authors'
// code (peft_pretraining/modeling_llama.py: Post-LN while layer_index < POST_NUM); the paper's
// full text could not be read here. The embedding enters layer 1
// un-normalized, no extra norm at the Post/Pre boundary. The paper's models are decoder-only;
// each stack of an encoder-decoder gets its own k (normlab's mapping, docs/schemes/mix_ln.md), and
// a Post-LN decoder layer has all three sublayers (SA, CA, FFN) Post-LN.
#include <normlab/sdk.h>

#include <cmath>

namespace {
using namespace normlab;

class MixLnWiring final : public PerSublayerWiring {
 public:
  MixLnWiring(LayerBuilder& b, bool post) : PerSublayerWiring(b.geometry()), post_(post) {
    for (int i = 0; i < num_sublayers_; ++i) norms_[i] = b.add_layer_norm(norm_name(sublayers_[i]));
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    if (post_) return ops.norm(norms_[i], x + ops.branch(s, x));
    return x + ops.branch(s, ops.norm(norms_[i], x));
  }

 private:
  bool post_;
  int norms_[3] = {0, 0, 0};
};

class MixLn final : public Scheme {
 public:
  MixLn(const ParamView& p, const ModelGeometry& g) : geom_(g), alpha_(p.number("alpha")) {}

  // Post-LN layers in a stack of L layers (the small epsilon keeps e.g. 0.25·12 = 3 from flooring
  // to 2).
  int post_layers(Stack s) const { return int(std::floor(alpha_ * geom_.layers(s) + 1e-9)); }

  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    const LayerGeometry& g = b.geometry();
    return std::make_unique<MixLnWiring>(b, g.index < post_layers(g.stack));
  }
  std::optional<NormSpec> final_norm(Stack, const NormSpec& configured) const override {
    return configured;
  }
  std::vector<DerivedValue> derive() const override {
    std::vector<DerivedValue> out;
    for (Stack s : {Stack::Encoder, Stack::Decoder})
      if (geom_.has_stack(s))
        out.push_back({"post_ln_layers", to_string(s), double(post_layers(s)),
                       s == Stack::Encoder ? "floor(alpha*N)" : "floor(alpha*M)"});
    return out;
  }

 private:
  ModelGeometry geom_;
  double alpha_;
};

constexpr normlab_param_info kParams[] = {
    {"alpha", "float", "0.25", "", 0, 1,
     "share of each stack's layers (from the bottom) that are Post-LN"}};
}  // namespace

NORMLAB_EXPORT_SCHEME(
    MixLn, "mix-ln", "1.0.0",
    "Mix-LN: Post-LN in the first floor(alpha*L) layers, Pre-LN above, final norm",
    "l <= floor(alpha*L): y = Norm(x + Drop(F(x))); else y = x + Drop(F(Norm(x))); "
    "final Norm [Li et al. 2025, Mix-LN]",
    kParams)
