// mHC: Manifold-Constrained Hyper-Connections (Xie et al., DeepSeek-AI 2025, arXiv:2512.24880).
// Hyper-Connections whose residual mixing matrix is projected (approximately) onto the doubly
// stochastic matrices by Sinkhorn–Knopp. Per sublayer, with the stack's n streams x_l ∈ ℝ^{n×C}
// (C = d_model), paper eqs. 7–9:
//   x̃      = RMSNorm(vec(x_l)) ∈ ℝ^{nC}                     (over the flattened n·C vector)
//   H̃_pre  = α_pre · (x̃ φ_pre) + b_pre ∈ ℝ^{1×n}          φ_pre, φ_post ∈ ℝ^{nC×n}
//   H̃_post = α_post · (x̃ φ_post) + b_post ∈ ℝ^{1×n}
//   H̃_res  = α_res · mat(x̃ φ_res) + b_res ∈ ℝ^{n×n}        φ_res ∈ ℝ^{nC×n²}
//   H_pre = σ(H̃_pre),  H_post = 2σ(H̃_post),  H_res = SinkhornKnopp(H̃_res)  (t_max iterations)
//   x_{l+1} = H_res x_l + H_postᵀ F(H_pre x_l):
//     stream i ← Σ_j H_res[i,j] x_l[j] + H_post[i] · Drop(F(Norm(Σ_j H_pre[j] x_l[j])))
// F keeps its Pre-LN input norm (as in HC); the stack's streams are n copies of the embedded input
// and are summed at the end, then the stack's final norm (as HC).
// Constants (paper Table 5): n = 4, t_max = 20, α_pre = α_post = α_res = 0.01 at init (learnable).
// Readings: the paper's text could not be read here; eqs. 7–9 and Table 5 are as quoted by
// re-implementations (docs/schemes/mhc.md). The inits of φ and b are not confirmed there; this
// plugin picks inits under which mHC computes Pre-LN at init: φ = 0,
// b_post = 0 (H_post = 2σ(0) = 1), b_res = 0 (H_res = 1/n everywhere; a doubly stochastic H_res
// keeps equal streams equal), and b_pre giving *distinct* read weights σ(b_pre_j) = 2(j+1)/(n(n+1))
// (summing to 1, so the branch still reads exactly the stream everyone holds: Pre-LN). The first
// proposal's equal b_pre = −ln(n−1) (σ = 1/n) with φ = 0 is a fixed point: identical streams get
// identical gradients, so b_res and φ stay 0 and the streams stay copies for ever (measured:
// exactly 0 after 200 updates). Distinct read weights give each stream its own gradient, and they
// separate. The RMSNorm of x̃ has no gain (it would only rescale φ) and ε = 1e-6 (DeepSeek's
// inference code). Merging by sum and the copy at the start are [unverified for mHC] (taken from
// HC). Residual mixing stream i ← Σ_j H_res[i,j] x_j follows the paper's H_res x_l (DeepSeek-V4's
// inference code applies the transpose; with a doubly stochastic matrix both keep equal streams
// equal).
#include <normlab/sdk.h>

#include <cmath>
#include <vector>

#include "sinkhorn.h"

namespace {
using namespace normlab;

struct Options {
  int n = 4;
  int t_max = 20;
};

constexpr double kAlpha0 = 0.01;

// σ(b_pre_j) = 2(j+1)/(n(n+1)): distinct read weights that sum to 1 (see the top).
double read_weight(int64_t j, int64_t n) { return 2.0 * double(j + 1) / double(n * (n + 1)); }
torch::Tensor pre_bias(int64_t n) {
  std::vector<float> b;
  for (int64_t j = 0; j < n; ++j)
    b.push_back(float(std::log(read_weight(j, n) / (1 - read_weight(j, n)))));
  return torch::tensor(b);
}

struct SublayerParams {
  int input_norm = 0, mix_norm = 0;
  int phi_pre = 0, phi_post = 0, phi_res = 0;
  int b_pre = 0, b_post = 0, b_res = 0;
  int a_pre = 0, a_post = 0, a_res = 0;
};

class MhcLayer final : public LayerWiring {
 public:
  MhcLayer(LayerBuilder& b, const Options& o) : g_(b.geometry()), opt_(o) {
    const int64_t n = o.n, nc = n * g_.model.d_model;
    NormSpec rms = NormSpec::of(NormKind::RMSNorm);
    rms.affine = false;
    rms.eps = 1e-6;
    for (int i = 0; i < g_.num_sublayers(); ++i) {
      const Sublayer s = g_.sublayer(i);
      const std::string p = std::string(to_string(s)) + "_mhc_";
      SublayerParams& w = params_[i];
      w.input_norm = b.add_layer_norm(norm_name(s));
      w.mix_norm = b.add_norm(p + "norm", rms, nc);
      w.phi_pre = b.add_parameter(p + "phi_pre", torch::zeros({nc, n}));
      w.phi_post = b.add_parameter(p + "phi_post", torch::zeros({nc, n}));
      w.phi_res = b.add_parameter(p + "phi_res", torch::zeros({nc, n * n}));
      w.b_pre = b.add_parameter(p + "b_pre", pre_bias(n));
      w.b_post = b.add_parameter(p + "b_post", torch::zeros({n}));
      w.b_res = b.add_parameter(p + "b_res", torch::zeros({n, n}));
      w.a_pre = b.add_parameter(p + "alpha_pre", torch::full({1}, kAlpha0));
      w.a_post = b.add_parameter(p + "alpha_post", torch::full({1}, kAlpha0));
      w.a_res = b.add_parameter(p + "alpha_res", torch::full({1}, kAlpha0));
    }
  }

  void forward_streams(LayerOps& ops, Streams& s) override {
    for (int i = 0; i < g_.num_sublayers(); ++i) sublayer(ops, i, s);
  }

 private:
  void sublayer(LayerOps& ops, int i, Streams& s) {
    const SublayerParams& w = params_[i];
    const int64_t n = opt_.n;
    torch::Tensor x = torch::stack(s, -2);  // [B, T, n, C]
    torch::Tensor xt = ops.norm(w.mix_norm, x.flatten(-2));
    torch::Tensor pre = torch::sigmoid(
        ops.param(w.a_pre) * torch::matmul(xt, ops.param(w.phi_pre)) + ops.param(w.b_pre));
    torch::Tensor post =
        2.0 * torch::sigmoid(ops.param(w.a_post) * torch::matmul(xt, ops.param(w.phi_post)) +
                             ops.param(w.b_post));
    std::vector<int64_t> square = x.sizes().vec();  // [B, T, n, n]
    square.back() = n;
    torch::Tensor res_logits =
        ops.param(w.a_res) * torch::matmul(xt, ops.param(w.phi_res)).reshape(square) +
        ops.param(w.b_res);
    torch::Tensor h_res = mhc::sinkhorn_knopp(res_logits, opt_.t_max);  // [B, T, n, n]
    torch::Tensor h_in = (pre.unsqueeze(-1) * x).sum(-2);
    torch::Tensor t = ops.branch(g_.sublayer(i), ops.norm(w.input_norm, h_in));
    s = (torch::matmul(h_res, x) + post.unsqueeze(-1) * t.unsqueeze(-2)).unbind(-2);
  }

  LayerGeometry g_;
  Options opt_;
  SublayerParams params_[3];
};

class MhcStack final : public StackWiring {
 public:
  explicit MhcStack(int n) : n_(n) {}
  Streams begin(StackOps&, const torch::Tensor& x) override { return Streams(size_t(n_), x); }
  torch::Tensor end(StackOps&, Streams& s) override { return torch::stack(s, 0).sum(0); }

 private:
  int n_;
};

class Mhc final : public Scheme {
 public:
  Mhc(const ParamView& p, const ModelGeometry& g) : g_(g) {
    opt_.n = int(p.integer("n"));
    opt_.t_max = int(p.integer("t_max"));
  }
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<MhcLayer>(b, opt_);
  }
  std::unique_ptr<StackWiring> build_stack(StackBuilder&) override {
    return std::make_unique<MhcStack>(opt_.n);
  }
  std::optional<NormSpec> final_norm(Stack, const NormSpec& configured) const override {
    return configured;
  }
  std::vector<DerivedValue> derive() const override {
    const double n = opt_.n, nc = n * g_.d_model;
    return {{"streams", "each stack", n, "n (paper Table 5: 4)"},
            {"t_max", "Sinkhorn-Knopp", double(opt_.t_max),
             "row then column normalizations (Table 5: 20)"},
            {"alpha", "init", kAlpha0, "alpha_pre = alpha_post = alpha_res (Table 5)"},
            {"b_pre", "init", std::log(read_weight(0, opt_.n) / (1 - read_weight(0, opt_.n))),
             "stream 0's; sigma(b_pre_j) = 2(j+1)/(n(n+1)): distinct read weights summing to 1"},
            {"H_post", "init", 1.0, "2*sigma(b_post = 0)"},
            {"H_res", "init", 1.0 / n, "SinkhornKnopp(b_res = 0): every entry 1/n"},
            {"params_per_sublayer", "each", nc * (2 * n + n * n) + 2 * n + n * n + 3,
             "phi_pre, phi_post (nC*n each), phi_res (nC*n^2), b (2n + n^2), 3 alphas"}};
  }

 private:
  ModelGeometry g_;
  Options opt_;
};

constexpr normlab_param_info kParams[] = {
    {"n", "int", "4", "", 2, 64, "residual streams per stack (paper Table 5: 4)"},
    {"t_max", "int", "20", "", 1, 1000, "Sinkhorn-Knopp iterations (paper Table 5: 20)"},
};

}  // namespace

NORMLAB_EXPORT_SCHEME(
    Mhc, "mhc", "1.0.0",
    "mHC: hyper-connections with a Sinkhorn-Knopp (doubly stochastic) residual mix",
    "x_(l+1) = H_res x_l + H_post^T Drop(F(LN(H_pre x_l))), H_pre = sigma(.), "
    "H_post = 2 sigma(.), H_res = SinkhornKnopp(.) (20 it.), from RMSNorm(vec x_l) "
    "[Xie et al. 2025, mHC eqs. 7-9, Table 5]",
    kParams)
