// ResiDual (Xie et al. 2023, "ResiDual: Transformer with Dual Residual Connections",
// arXiv:2304.14802, §3 "ResiDual" / Pre-Post-LN): two residual streams per stack, both starting
// at the embedded input e (x_a = x_d = e):
//   for every sublayer F (SA, [CA], FFN):  o = Drop(F(x_a));  x_d ← x_d + o;  x_a ← LN(x_a + o)
//   end of the stack:                      out = x_a + LN_final(x_d)
// x_a is the Post-LN stream (stream 0, what probes see), x_d the Pre-LN-like "dual" accumulator.
// F reads x_a as it is (no pre-norm); the same dropped-out o feeds both streams; no other final
// norm; the encoder's `out` is the decoder's cross-attention memory.
// Sources: the paper's text beyond its abstract could not be read here, so the equations were
// checked against the official code (github.com/microsoft/ResiDual, resi_dual_layers.py): it
// matches the form above; the section number is [unverified]. Code constants: LN_final
// ε = 1e-7 (`final_ln_eps`), all other norms the manifest's (LayerNorm ε 1e-5). Not expressed: the
// code's extra dropout on the encoder's `out` (the stack's ends have no dropout op), and its knobs
// `*_alpha` / `*_res_input_norm_scale` (default 1, i.e. off).
#include <normlab/sdk.h>

namespace {
using namespace normlab;

// Streams: s[0] = x_a (Post-LN), s[1] = x_d (dual).
class ResiDualLayer final : public LayerWiring {
 public:
  explicit ResiDualLayer(LayerBuilder& b) : g_(b.geometry()) {
    for (int i = 0; i < g_.num_sublayers(); ++i)
      norms_[i] = b.add_layer_norm(norm_name(g_.sublayer(i)));
  }
  void forward_streams(LayerOps& ops, Streams& s) override {
    for (int i = 0; i < g_.num_sublayers(); ++i) {
      torch::Tensor o = ops.branch(g_.sublayer(i), s[0]);
      s[1] = s[1] + o;
      s[0] = ops.norm(norms_[i], s[0] + o);
    }
  }

 private:
  LayerGeometry g_;
  int norms_[3] = {0, 0, 0};
};

class ResiDualStack final : public StackWiring {
 public:
  ResiDualStack(StackBuilder& b, double final_eps) {
    NormSpec spec = b.model().norm;
    spec.eps = final_eps;
    dual_norm_ = b.add_norm("dual_norm", spec);
  }
  Streams begin(StackOps&, const torch::Tensor& x) override { return {x, x}; }
  torch::Tensor end(StackOps& ops, Streams& s) override {
    return s[0] + ops.norm(dual_norm_, s[1]);
  }

 private:
  int dual_norm_ = 0;
};

class ResiDual final : public Scheme {
 public:
  ResiDual(const ParamView& p, const ModelGeometry&) : final_eps_(p.number("final_ln_eps")) {}
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<ResiDualLayer>(b);
  }
  std::unique_ptr<StackWiring> build_stack(StackBuilder& b) override {
    return std::make_unique<ResiDualStack>(b, final_eps_);
  }
  std::optional<NormSpec> final_norm(Stack, const NormSpec&) const override { return std::nullopt; }
  std::vector<DerivedValue> derive() const override {
    return {
        {"final_ln_eps", "each stack", final_eps_, "eps of LN_final in out = x_a + LN_final(x_d)"},
        {"streams", "each stack", 2.0, "x_a (Post-LN, stream 0), x_d (dual)"}};
  }

 private:
  double final_eps_;
};

constexpr normlab_param_info kParams[] = {
    {"final_ln_eps", "float", "1e-7", "", 0, 1,
     "eps of the final norm on the dual stream (official code: 1e-7)"},
};

}  // namespace

NORMLAB_EXPORT_SCHEME(
    ResiDual, "residual", "1.0.0",
    "ResiDual: a Post-LN stream and a dual (Pre-LN-like) stream, summed at the end",
    "o = Drop(F(x_a)); x_d += o; x_a = LN(x_a + o); out = x_a + LN_final(x_d), "
    "eps 1e-7 [Xie et al. 2023, ResiDual sec. 3]",
    kParams)
