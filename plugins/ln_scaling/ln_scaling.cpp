// LayerNorm Scaling (Sun, Song, Li, Yin, Zheng, Liu, "The Curse of Depth in Large Language Models",
// arXiv:2502.05795): Pre-LN with every in-layer norm output multiplied by a fixed 1/√ℓ, ℓ the
// 1-based index of the layer in its stack:
//   y = x + Drop(F(Norm(x) / √ℓ))      (per sublayer; both/all norms of layer ℓ use 1/√ℓ)
//   final Norm after each stack, unscaled.
// The factor is a constant on the norm's output (NormSpec::out_scale), not folded into γ's init,
// so γ trains as in Pre-LN. Checked in the authors' code (peft_pretraining/modeling_llama.py,
// NORM_TYPE LNS: 1/sqrt(layer_index + 1) after both norms); the paper's full text could not be read
// here. ℓ restarts at 1 in each stack of an encoder-decoder (docs/schemes/ln_scaling.md, normlab's
// mapping: the paper's models are decoder-only); the cross-attention memory is not scaled. The
// authors advise against combining it with depth-scaled init; normlab's init is not scaled.
#include <normlab/sdk.h>

#include <cmath>

namespace {
using namespace normlab;

double layer_scale(int layer_index) { return 1.0 / std::sqrt(double(layer_index + 1)); }

class LnsWiring final : public PerSublayerWiring {
 public:
  explicit LnsWiring(LayerBuilder& b) : PerSublayerWiring(b.geometry()) {
    NormSpec spec = b.geometry().model.norm;
    spec.out_scale = layer_scale(b.geometry().index);
    for (int i = 0; i < num_sublayers_; ++i) norms_[i] = b.add_norm(norm_name(sublayers_[i]), spec);
  }

 protected:
  torch::Tensor sublayer(LayerOps& ops, int i, Sublayer s, const torch::Tensor& x) override {
    return x + ops.branch(s, ops.norm(norms_[i], x));
  }

 private:
  int norms_[3] = {0, 0, 0};
};

class LnScaling final : public Scheme {
 public:
  LnScaling(const ParamView&, const ModelGeometry& g) : geom_(g) {}
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<LnsWiring>(b);
  }
  std::optional<NormSpec> final_norm(Stack, const NormSpec& configured) const override {
    return configured;
  }
  // The factors of the first two and the last layer of each stack.
  std::vector<DerivedValue> derive() const override {
    std::vector<DerivedValue> out;
    for (Stack s : {Stack::Encoder, Stack::Decoder}) {
      if (!geom_.has_stack(s)) continue;
      const int L = geom_.layers(s);
      for (int l : {1, 2, L}) {
        if (l > L || (l == L && L <= 2)) continue;
        out.push_back({"scale", std::string(to_string(s)) + " layer " + std::to_string(l),
                       layer_scale(l - 1), "1/sqrt(l)"});
      }
    }
    return out;
  }

 private:
  ModelGeometry geom_;
};
}  // namespace

NORMLAB_EXPORT_SCHEME_NO_PARAMS(
    LnScaling, "ln-scaling", "1.0.0",
    "LayerNorm Scaling: Pre-LN, norm outputs of layer l times 1/sqrt(l)",
    "y = x + Drop(F(Norm(x)/sqrt(l))), l 1-based per stack; final Norm "
    "unscaled [Sun et al. 2025, The Curse of Depth]")
