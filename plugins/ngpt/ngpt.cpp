// nGPT: normalized Transformer on the hypersphere (Loshchilov, Hsieh, Sun, Ginsburg, ICLR 2025,
// arXiv:2410.01131). Norm(x) = x / ‖x‖₂ over the last dim (NormKind::L2); no LayerNorm anywhere.
//   hidden state (§2.2.2), per sublayer F (SA, [CA], FFN), with learned α ∈ ℝ^d:
//     h ← Norm( h + α_F ⊙ (Norm(Drop(F(h))) − h) )
//   attention (§2.3.2): q ← s_qk ⊙ Norm(q), k ← s_qk ⊙ Norm(k) per head; softmax scale √d_k
//   weights (§2.6): after every optimizer step (and once at build) every matrix is normalized along
//     the embedding dimension d: rows of the embeddings, output projection, q/k/v_proj, fc1;
//     columns (the d side) of out_proj and fc2.
//   "scaled" parameters (§2.5; NVIDIA/ngpt model.py): a vector stored starting at `scale` acts as
//     stored · init/scale, so Adam moves it init/scale times faster:
//     α: init 0.05, scale 1/√d;  s_qk: init 1, scale 1/√d.
// Encoder-decoder [normlab's mapping, docs/schemes/ngpt.md]: the encoder as above (non-causal);
// decoder CA is a third update with its own α and its own q/k norms, memory = the encoder's last
// h (unit norm).
// Choices: α as in the paper (the official code uses |α|); Drop before the Norm of h_F.
// Sources: the paper's text could be read here only up to its introduction, so the section
// numbers above are [unverified]; every equation was checked against the official code
// (github.com/NVIDIA/ngpt, model.py and train.py's normalize_matrices).
//
// On model.family = "llama" (the paper's architecture) the FFN, positions and logits are nGPT's:
// - FFN (§2.4.2): SwiGLU with u = s_u ⊙ (W_u h) (BranchPoint::FfnUp, a NormKind::Scale gain, init
// 1)
//   and ν = s_ν ⊙ (W_ν h) · √d (FfnGate, init 1, out_scale √d): h_M = W_o′ (u ⊙ SiLU(ν)), as the
//   paper writes it. NVIDIA/ngpt model.py multiplies u by √d too; h_M is re-normalized, so the
//   output is the same (docs/schemes/ngpt.md).
// - Positions: RoPE on q and k, then the q/k norms (the core's default order; nGPT's code);
//   h₀ = Norm(E[tok]) = E[tok] (unit rows).
// - Logits: z = s_z ⊙ (E_out h), s_z ∈ ℝ^V (Scheme::logit_scale: init 1, scale 1/√d), no final
// norm. On model.family = "transformer" it is the fairseq-body adaptation, kept as it was:
// - FFN: fc2(ReLU(fc1 x)) with biases, no s_u/s_ν (ReLU is positively homogeneous, so a global
//   scale would not matter, but the per-channel scale is lost). Biases of all projections are
//   held at 0 after every step (nGPT has none); `biases = true` lets them train.
// - Positions: the core embeds √d·E[tok] + sinusoidal positions (+ dropout); the stack's begin()
//   normalizes that: h₀ = Norm(√d·E[tok] + PE).
// - Logits: the decoder's final norm is L2 with a scaled gain s ∈ ℝ^d (init 1, scale 1/√d):
//   z = E_out (s ⊙ h), a learned logit temperature per feature, not per token. The encoder has no
//   final norm.
// - s_qk: the core's q/k norms (per head, over d_k) have their own gains: s_q and s_k, each of
//   size d_k shared by the heads, instead of one s_qk ∈ ℝ^d shared by q and k (on "llama" it is
//   nGPT's: one s_qk ∈ ℝ^d = heads × d_k, used by q and k). The factor d_k on the q norm's
//   output turns the core's 1/√d_k into nGPT's √d_k.
#include <normlab/sdk.h>

#include <cmath>

namespace {
using namespace normlab;

constexpr double kAlpha0 = 0.05;
constexpr double kEps = 1e-12;  // clamp under ‖x‖ (the official code has none)

NormSpec l2() {
  NormSpec s = NormSpec::of(NormKind::L2);
  s.eps = kEps;
  return s;
}

// An L2 norm with a learned gain stored "scaled": starts at `scale`, acts as stored · 1/scale.
NormSpec scaled_l2(double scale, double out_scale = 1.0) {
  NormSpec s = l2();
  s.affine = true;
  s.gain_init = 1.0;
  s.gain_scale = scale;
  s.out_scale = out_scale;
  return s;
}

class NgptLayer final : public LayerWiring {
 public:
  NgptLayer(LayerBuilder& b, double alpha_scale) : g_(b.geometry()), alpha_scale_(alpha_scale) {
    const int64_t d = g_.model.d_model, d_k = d / g_.model.heads;
    for (int i = 0; i < g_.num_sublayers(); ++i) {
      const Sublayer s = g_.sublayer(i);
      const std::string name = to_string(s);
      if (s != Sublayer::FFN) {
        NormSpec q = scaled_l2(alpha_scale, double(d_k)), k = scaled_l2(alpha_scale);
        if (g_.model.family == Family::Llama) {  // one s_qk ∈ ℝ^d for q and k (model.py: sqk)
          q.gain_per_head = k.gain_per_head = true;
          k.gain_from_query = true;
        }
        b.add_branch_norm(s, BranchPoint::Query, q);
        b.add_branch_norm(s, BranchPoint::Key, k);
      } else if (g_.model.gated_ffn()) {
        // s_u and s_ν·√d (NVIDIA/ngpt model.py: suv, init 1, scale 1)
        NormSpec s_u = NormSpec::of(NormKind::Scale), s_v = NormSpec::of(NormKind::Scale);
        s_v.out_scale = std::sqrt(double(d));
        b.add_branch_norm(s, BranchPoint::FfnUp, s_u);
        b.add_branch_norm(s, BranchPoint::FfnGate, s_v);
      }
      alpha_[i] = b.add_parameter(name + "_alpha", torch::full({d}, alpha_scale));
      out_norm_[i] = b.add_norm(name + "_out_norm", l2());
      norm_[i] = b.add_norm(name + "_norm", l2());
    }
  }
  torch::Tensor forward(LayerOps& ops, const torch::Tensor& x) override {
    torch::Tensor h = x;
    for (int i = 0; i < g_.num_sublayers(); ++i) {
      torch::Tensor alpha = ops.param(alpha_[i]) * (kAlpha0 / alpha_scale_);
      torch::Tensor h_f = ops.norm(out_norm_[i], ops.branch(g_.sublayer(i), h));
      h = ops.norm(norm_[i], h + alpha * (h_f - h));
    }
    return h;
  }

 private:
  LayerGeometry g_;
  double alpha_scale_;
  int alpha_[3] = {0, 0, 0}, out_norm_[3] = {0, 0, 0}, norm_[3] = {0, 0, 0};
};

class NgptStack final : public StackWiring {
 public:
  explicit NgptStack(StackBuilder& b) : embed_norm_(b.add_norm("embed_norm", l2())) {}
  Streams begin(StackOps& ops, const torch::Tensor& x) override {
    return {ops.norm(embed_norm_, x)};
  }
  torch::Tensor end(StackOps&, Streams& s) override { return s[0]; }

 private:
  int embed_norm_;
};

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() &&
         s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// The dimension along which a weight's vectors lie in the embedding space (nGPT §2.6), or -1.
int64_t unit_norm_dim(const std::string& name) {
  for (const char* p : {"embed_tokens.weight", "output_projection.weight", "q_proj.weight",
                        "k_proj.weight", "v_proj.weight", "fc1.weight", "gate.weight"})
    if (ends_with(name, p)) return 1;  // [out, d]: rows
  for (const char* p : {"out_proj.weight", "fc2.weight"})
    if (ends_with(name, p)) return 0;  // [d, in]: columns
  return -1;
}

bool projection_bias(const std::string& name) {
  for (const char* p :
       {"q_proj.bias", "k_proj.bias", "v_proj.bias", "out_proj.bias", "fc1.bias", "fc2.bias"})
    if (ends_with(name, p)) return true;
  return false;
}

class Ngpt final : public Scheme {
 public:
  Ngpt(const ParamView& p, const ModelGeometry& g)
      : g_(g), scale_(1.0 / std::sqrt(double(g.d_model))), biases_(p.flag("biases")) {}

  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<NgptLayer>(b, scale_);
  }
  std::unique_ptr<StackWiring> build_stack(StackBuilder& b) override {
    return std::make_unique<NgptStack>(b);
  }
  std::optional<NormSpec> final_norm(Stack stack, const NormSpec&) const override {
    if (stack == Stack::Encoder || g_.family == Family::Llama) return std::nullopt;
    return scaled_l2(scale_);  // the transformer family's logit scale, see the header
  }
  std::optional<NormSpec> logit_scale() const override {  // s_z ∈ ℝ^V: init 1, scale 1/√d
    if (g_.family != Family::Llama) return std::nullopt;
    NormSpec s = NormSpec::of(NormKind::Scale);
    s.gain_init = 1.0;
    s.gain_scale = scale_;
    return s;
  }

  void after_step(const NamedTensors& params) override {
    torch::NoGradGuard no_grad;
    // The α mean stays a tensor on the weights' device until values() reads it (at log and probe
    // intervals): a .item() here would block the host on the GPU after every step.
    torch::Tensor alpha_sum;
    int64_t alpha_count = 0;
    for (const auto& [name, t] : params) {
      const int64_t dim = unit_norm_dim(name);
      if (dim >= 0) {
        t.div_(t.norm(2, {dim}, true).clamp_min(kEps));
      } else if (!biases_ && projection_bias(name)) {
        t.zero_();
      } else if (ends_with(name, "_alpha")) {
        alpha_sum = alpha_sum.defined() ? alpha_sum + t.sum() : t.sum();
        alpha_count += t.numel();
      }
    }
    alpha_sum_ = alpha_sum;
    alpha_count_ = alpha_count;
  }

  std::vector<SchemeValue> values() const override {
    const double mean = !alpha_sum_.defined() ? kAlpha0
                        : alpha_count_
                            ? alpha_sum_.item<double>() * (kAlpha0 / scale_) / double(alpha_count_)
                            : 0.0;
    return {{"alpha_mean", mean}};
  }

  std::vector<DerivedValue> derive() const override {
    const double d = g_.d_model, d_k = d / g_.heads;
    return {
        {"alpha", "init", kAlpha0, "eigen learning rate alpha_A = alpha_M (= alpha_C), effective"},
        {"alpha_scale", "stored init", scale_, "1/sqrt(d): alpha = stored * 0.05 * sqrt(d)"},
        {"s_qk", "init", 1.0, "q/k gains, effective (stored init 1/sqrt(d))"},
        {"softmax_scale", "attention", std::sqrt(d_k), "sqrt(d_k) (standard: 1/sqrt(d_k))"},
        {"q_out_scale", "attention", d_k, "d_k on Norm(q): core's 1/sqrt(d_k) becomes sqrt(d_k)"},
        {"logit_scale", "init", 1.0,
         g_.family == Family::Llama ? "s_z in R^V on the logits (stored init 1/sqrt(d))"
                                    : "decoder final L2 norm gain s (stored init 1/sqrt(d))"},
        {"s_v_scale", "ffn", g_.family == Family::Llama ? std::sqrt(d) : 0.0,
         "sqrt(d) on s_nu * (W_nu h) (llama family; 0: no SwiGLU)"}};
  }

 private:
  ModelGeometry g_;
  double scale_;
  bool biases_;
  torch::Tensor alpha_sum_;  // the stored α entries' sum after the last step (undefined: none yet)
  int64_t alpha_count_ = 0;
};

constexpr normlab_param_info kParams[] = {
    {"biases", "bool", "false", "", 0, 0,
     "let the projections' biases train (nGPT has none: false holds them at 0 after every step)"},
};

}  // namespace

NORMLAB_EXPORT_SCHEME(
    Ngpt, "ngpt", "1.0.0",
    "nGPT: unit-norm hidden states and weights, updates by learned eigen learning rates",
    "h = Norm(h + alpha (Norm(Drop(F(h))) - h)), Norm = x/|x|, alpha0 = 0.05; q, k "
    "L2-normed per head, softmax scale sqrt(d_k); weights unit-norm after every step "
    "[Loshchilov et al., ICLR 2025, nGPT sec. 2.2-2.6]",
    kParams)
