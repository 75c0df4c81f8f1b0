// Hyper-Connections (Zhu et al., "Hyper-Connections", ICLR 2025, arXiv:2409.19606), shared by the
// plugins `hyper-connections` (static, SHC) and `hyper-connections-dynamic` (DHC).
//
// A stack carries n streams H = (H_1 … H_n) (the "hyper hidden matrix", n×d per token), created as
// n copies of the embedded input. Every sublayer k of the stack (SA, [CA], FFN each count as one
// layer T^k, 0-based within the stack) has its own connection weights and does (paper §2.1,
// HC = [[0, B], [A_m, A_r]], H ← A_rᵀ H + Bᵀ T(Hᵀ A_m)ᵀ):
//   h_in = Σ_i A_m[i] · H_i                     (width connection: the layer's input)
//   t    = Drop(F(Norm(h_in)))                  (the branch keeps its Pre-LN input norm)
//   H_j  ← Σ_i A_r[i,j] · H_i + B[j] · t        (depth connection), j = 1 … n
// Dynamic (paper §2.2), per token, with H̄ = Norm_hc(H) row-wise (one norm per stream):
//   A_m(H) = A_m + s_α · tanh(H̄ W_m),  A_r(H) = A_r + s_α · tanh(H̄ W_r),  B(H) = B + s_β · tanh(H̄
//   W_β)ᵀ W_m ∈ ℝ^{d×1}, W_r ∈ ℝ^{d×n}, W_β ∈ ℝ^{d×1}; s_α, s_β learnable scalars.
// Init (paper §2.3): A_m = e_{k mod n}, A_r = I_n, B = 1_n, W_* = 0, s_α = s_β = 0.01. Every stream
// then stays equal to the Pre-LN hidden state h; the end of the stack sums the streams (n·h) and
// applies the final norm, which is scale-invariant: at init the model computes Pre-LN's output (up
// to the norm's ε).
// Readings (docs/schemes/hyper_connections.md): the paper's full text could not be read; the
// equations are those restated from its §2 by secondary sources and by the unofficial
// lucidrains/hyper-connections (which follows the paper's Appendix J, Algorithm 2); the section
// numbers are as cited there. Followed: merge = sum of the streams, then the stack's final norm
// [code, unofficial]; Norm_hc = the manifest's norm kind (LayerNorm by default; the paper says LN,
// lucidrains uses RMSNorm) with its affine parameters; s_α is shared by A_m and A_r.
// Encoder-decoder [proposal]: each stack has its own n streams, k counts the stack's sublayers, the
// cross-attention memory is the merged encoder output.
#pragma once

#include <normlab/sdk.h>

#include <string>

namespace normlab::hc {

struct Options {
  int n = 4;
  bool dynamic = false;
};

// Weights of one sublayer's hyper-connection.
struct SublayerParams {
  int input_norm = 0;           // the Pre-LN norm of the branch input
  int am = 0, ar = 0, b = 0;    // static A_m [n], A_r [n,n], B [n]
  int wm = 0, wr = 0, wb = 0;   // dynamic W_m [d], W_r [d,n], W_β [d]
  int s_alpha = 0, s_beta = 0;  // dynamic scalars
  int hc_norm = 0;              // dynamic Norm_hc
};

class HyperLayer final : public LayerWiring {
 public:
  HyperLayer(LayerBuilder& b, const Options& o) : g_(b.geometry()), opt_(o) {
    const int n = o.n;
    const int64_t d = g_.model.d_model;
    for (int i = 0; i < g_.num_sublayers(); ++i) {
      const Sublayer s = g_.sublayer(i);
      const std::string p = std::string(to_string(s)) + "_hc_";
      const int k = g_.index * g_.num_sublayers() + i;  // T^k's index within its stack
      SublayerParams& w = params_[i];
      w.input_norm = b.add_layer_norm(norm_name(s));
      w.am = b.add_parameter(
          p + "am", torch::zeros({n}).index_fill_(0, torch::tensor({int64_t(k % n)}), 1.0));
      w.ar = b.add_parameter(p + "ar", torch::eye(n));
      w.b = b.add_parameter(p + "b", torch::ones({n}));
      if (o.dynamic) {
        w.wm = b.add_parameter(p + "wm", torch::zeros({d}));
        w.wr = b.add_parameter(p + "wr", torch::zeros({d, int64_t(n)}));
        w.wb = b.add_parameter(p + "wb", torch::zeros({d}));
        w.s_alpha = b.add_parameter(p + "s_alpha", torch::full({1}, 0.01));
        w.s_beta = b.add_parameter(p + "s_beta", torch::full({1}, 0.01));
        w.hc_norm = b.add_layer_norm(p + "norm");
      }
    }
  }

  void forward_streams(LayerOps& ops, Streams& s) override {
    for (int i = 0; i < g_.num_sublayers(); ++i) sublayer(ops, i, s);
  }

 private:
  void sublayer(LayerOps& ops, int i, Streams& s) {
    const SublayerParams& w = params_[i];
    torch::Tensor H = torch::stack(s, -2);  // [B, T, n, d]
    torch::Tensor am = ops.param(w.am), ar = ops.param(w.ar), b = ops.param(w.b);
    if (opt_.dynamic) {
      std::vector<torch::Tensor> rows;
      rows.reserve(s.size());
      for (const torch::Tensor& h : s) rows.push_back(ops.norm(w.hc_norm, h));
      torch::Tensor Hn = torch::stack(rows, -2);
      am = am + ops.param(w.s_alpha) * torch::tanh(torch::matmul(Hn, ops.param(w.wm)));  // [B,T,n]
      ar =
          ar + ops.param(w.s_alpha) * torch::tanh(torch::matmul(Hn, ops.param(w.wr)));  // [B,T,n,n]
      b = b + ops.param(w.s_beta) * torch::tanh(torch::matmul(Hn, ops.param(w.wb)));    // [B,T,n]
    }
    torch::Tensor h_in = (am.unsqueeze(-1) * H).sum(-2);
    torch::Tensor t = ops.branch(g_.sublayer(i), ops.norm(w.input_norm, h_in));
    // H_j = Σ_i A_r[i,j] H_i + B[j] t: A_rᵀ H.
    torch::Tensor out = torch::matmul(ar.transpose(-1, -2), H) + b.unsqueeze(-1) * t.unsqueeze(-2);
    s = out.unbind(-2);
  }

  LayerGeometry g_;
  Options opt_;
  SublayerParams params_[3];
};

class HyperStack final : public StackWiring {
 public:
  explicit HyperStack(int n) : n_(n) {}
  Streams begin(StackOps&, const torch::Tensor& x) override { return Streams(size_t(n_), x); }
  torch::Tensor end(StackOps&, Streams& s) override { return torch::stack(s, 0).sum(0); }

 private:
  int n_;
};

class HyperConnections final : public Scheme {
 public:
  HyperConnections(const ParamView& p, const ModelGeometry& g) : g_(g) {
    opt_.n = int(p.integer("n"));
    opt_.dynamic = p.flag("dynamic");
  }
  std::unique_ptr<LayerWiring> build_layer(LayerBuilder& b) override {
    return std::make_unique<HyperLayer>(b, opt_);
  }
  std::unique_ptr<StackWiring> build_stack(StackBuilder&) override {
    return std::make_unique<HyperStack>(opt_.n);
  }
  std::optional<NormSpec> final_norm(Stack, const NormSpec& configured) const override {
    return configured;
  }
  std::vector<DerivedValue> derive() const override {
    const double n = opt_.n, d = g_.d_model;
    std::vector<DerivedValue> out = {
        {"streams", "each stack", n, "n (expansion rate)"},
        {"params_per_sublayer", "static", n + n * n + n, "A_m (n) + A_r (n*n) + B (n)"}};
    if (opt_.dynamic) {
      out.push_back({"params_per_sublayer", "dynamic extra", d * (n + 2) + 2,
                     "W_m, W_r, W_beta (d*(n+2)) + s_alpha, s_beta (+ Norm_hc)"});
      out.push_back({"s_alpha", "init", 0.01, "paper sec. 2.3"});
      out.push_back({"s_beta", "init", 0.01, "paper sec. 2.3"});
    }
    for (Stack st : {Stack::Encoder, Stack::Decoder})
      if (g_.has_stack(st))
        out.push_back({"sublayers", to_string(st), double(g_.residual_sublayers(st)),
                       "T^k, k = 0.., A_m init = e_(k mod n)"});
    return out;
  }

 private:
  ModelGeometry g_;
  Options opt_;
};

}  // namespace normlab::hc
