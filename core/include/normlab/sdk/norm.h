// normlab scheme SDK — the normalization layers the core implements, and how a scheme asks for one.
// One implementation for every kind: core/src/model/norm.cpp.
#pragma once

#include <cmath>
#include <optional>
#include <string>

namespace normlab {

enum class NormKind {
  LayerNorm,  // γ ⊙ (x − mean) / sqrt(var + ε) + β                      [Ba et al. 2016]
  RMSNorm,  // γ ⊙ x · rsqrt(mean(x²) + ε), ε inside the root          [Zhang & Sennrich 2019]
  ScaleNorm,  // g · x / max(‖x‖₂, ε), one scalar g, g₀ = √dim            [Nguyen & Salazar 2019]
  DyT,  // γ ⊙ tanh(α·x) + β, one scalar α, α₀ = dyt_alpha0         [Zhu et al. 2025]
  L2,  // γ ⊙ x / max(‖x‖₂, ε) (nGPT's Norm; γ only when affine)  [Loshchilov et al. 2025]
  None,   // identity, no parameters
  Scale,  // γ ⊙ x: a learned per-channel gain, no statistics (nGPT's s_u, s_ν, s_z)
};

inline const char* to_string(NormKind k) {
  switch (k) {
    case NormKind::LayerNorm:
      return "layernorm";
    case NormKind::RMSNorm:
      return "rmsnorm";
    case NormKind::ScaleNorm:
      return "scalenorm";
    case NormKind::DyT:
      return "dyt";
    case NormKind::L2:
      return "l2";
    case NormKind::None:
      return "none";
    case NormKind::Scale:
      return "scale";
  }
  return "?";
}

inline std::optional<NormKind> parse_norm_kind(const std::string& s) {
  for (NormKind k : {NormKind::LayerNorm, NormKind::RMSNorm, NormKind::ScaleNorm, NormKind::DyT,
                     NormKind::L2, NormKind::None, NormKind::Scale})
    if (s == to_string(k)) return k;
  return std::nullopt;
}

// One normalization layer. Parameter names under the layer's name: `weight` (γ, or ScaleNorm's g),
// `bias` (β), `alpha` (DyT's α).
struct NormSpec {
  NormKind kind = NormKind::LayerNorm;
  double eps = 1e-5;
  bool affine = true;  // learnable gain γ (per channel; ScaleNorm: one scalar g)
  bool bias = true;    // learnable β; only LayerNorm and DyT have one
  double dyt_alpha0 = 0.5;
  // Gain γ stored "scaled" (nGPT's code, NVIDIA/ngpt): the parameter starts at gain_scale and acts
  // as param · gain_init / gain_scale, so an optimizer step moves γ by gain_init / gain_scale times
  // more. gain_scale 0 = plain γ starting at gain_init.
  double gain_init = 1.0;
  double gain_scale = 0.0;
  double out_scale = 1.0;  // constant multiplier on the output (not learned)
  // q/k norms (BranchPoint::Query/Key) only: a gain per head and channel (heads × head_dim = d
  // values) instead of one per channel shared by the heads (nGPT's s_qk ∈ ℝ^d).
  bool gain_per_head = false;
  // Key norm only: no gain of its own, the Query norm's instead (nGPT's one s_qk for q and k).
  bool gain_from_query = false;

  static NormSpec of(NormKind k) {
    NormSpec s;
    s.kind = k;
    if (k == NormKind::RMSNorm || k == NormKind::ScaleNorm || k == NormKind::L2 ||
        k == NormKind::Scale)
      s.bias = false;
    if (k == NormKind::L2) s.affine = false;
    return s;
  }
  bool has_bias() const {
    return affine && bias && (kind == NormKind::LayerNorm || kind == NormKind::DyT);
  }
  bool operator==(const NormSpec& o) const {
    return kind == o.kind && eps == o.eps && affine == o.affine && bias == o.bias &&
           dyt_alpha0 == o.dyt_alpha0 && gain_init == o.gain_init && gain_scale == o.gain_scale &&
           out_scale == o.out_scale && gain_per_head == o.gain_per_head &&
           gain_from_query == o.gain_from_query;
  }
};

}  // namespace normlab
