#include "normlab/model/norm.h"

#include <fmt/format.h>

#include <cmath>
#include <optional>
#include <stdexcept>
#include <string>

#include "cuda/fused_ops.h"
#include "normlab/model/projection.h"
#include "speed_levers.h"
#include "torch_api.h"
#include "torch_compat.h"

namespace normlab {

NormImpl::NormImpl(const NormSpec& spec, int64_t dim, int64_t heads)
    : spec_(spec), dim_(dim), gain_factor_(1.0) {
  if (dim <= 0) throw std::invalid_argument("norm over " + std::to_string(dim) + " features");
  if (!(spec.eps >= 0)) throw std::invalid_argument("norm eps must be >= 0");
  if (spec.kind == NormKind::None) return;
  const bool scaled = spec.gain_scale != 0.0;
  // Gain init: ScaleNorm's one scalar starts at √dim (Nguyen & Salazar 2019).
  const double gain0 = spec.kind == NormKind::ScaleNorm ? std::sqrt(double(dim)) : spec.gain_init;
  if (spec.gain_per_head && !(heads > 0 && spec.kind != NormKind::ScaleNorm))
    throw std::invalid_argument(
        "a per-head gain is for q/k norms of a kind with a gain per channel");
  const torch::TensorOptions on = torch::device(parameter_device());  // projection.h
  if (spec.affine) {
    if (scaled) gain_factor_ = gain0 / spec.gain_scale;
    const double start = scaled ? spec.gain_scale : gain0;
    // spec.gain_from_query: none of its own (forward_with_gain gets the Query norm's).
    if (spec.gain_per_head && !spec.gain_from_query)
      weight = register_parameter("weight", torch::full({heads, 1, dim}, start, on));
    else if (!spec.gain_from_query)
      weight = register_parameter(
          "weight", torch::full({spec.kind == NormKind::ScaleNorm ? 1 : dim}, start, on));
  }
  if (spec.has_bias()) bias = register_parameter("bias", torch::zeros({dim}, on));
  if (spec.kind == NormKind::DyT)
    alpha = register_parameter("alpha", torch::full({1}, spec.dyt_alpha0, on));
}

torch::Tensor NormImpl::forward(const torch::Tensor& x) { return forward_with_gain(x, weight); }

torch::Tensor NormImpl::forward_with_gain(const torch::Tensor& x, const torch::Tensor& weight) {
  TORCH_CHECK(x.size(-1) == dim_, "norm over ", dim_, " features applied to a tensor of ",
              x.size(-1));
  torch::Tensor gain = weight;
  if (gain.defined() && gain_factor_ != 1.0) gain = gain * gain_factor_;
  torch::Tensor y;
  switch (spec_.kind) {
    case NormKind::None:
      return x;
    case NormKind::LayerNorm:
      if (gain.defined() && gain.dim() > 1) {  // per head: [heads, 1, dim] broadcast over x
        y = torch::layer_norm(x, {dim_}, {}, {}, spec_.eps, /*cudnn_enable=*/true) * gain;
        if (bias.defined()) y = y + bias;
      } else {
        y = torch::layer_norm(x, {dim_}, gain, bias, spec_.eps, /*cudnn_enable=*/true);
      }
      break;
    case NormKind::RMSNorm: {
      // ε inside the root (Zhang & Sennrich's TF code, T5, torch.nn.RMSNorm); statistics in fp32.
#if NORMLAB_TORCH_RMS_NORM
      // On a GPU, LibTorch's fused kernel (at::rms_norm, forward and backward): the same formula,
      // where its result type is this one's (a gain of x's dtype, or none).
      if (on_gpu_path(x) && speed_levers().cuda_rms_norm) {
        if (!gain.defined() || (gain.dim() == 1 && gain.scalar_type() == x.scalar_type())) {
          y = at::rms_norm(x, {dim_},
                           gain.defined() ? std::optional<at::Tensor>(gain) : std::nullopt,
                           spec_.eps);
          break;
        }
        static FallbackSite site;
        const bool per_head = gain.dim() > 1;
        note_gpu_fallback(
            site, uint32_t(x.scalar_type()) << 16 | uint32_t(gain.scalar_type()) << 1 | per_head,
            [&] {
              return fmt::format("RMSNorm of {} inputs with a {} gain{}: ATen's composition",
                                 c10::toString(x.scalar_type()), c10::toString(gain.scalar_type()),
                                 per_head ? " per head" : "");
            });
      }
#endif
      const torch::Tensor xf = x.to(torch::kFloat);
      y = (xf * torch::rsqrt(xf.pow(2).mean(-1, true) + spec_.eps)).to(x.scalar_type());
      if (gain.defined()) y = y * gain;
      break;
    }
    case NormKind::ScaleNorm:
    case NormKind::L2: {
      // ε clamps the length from below (it is not added to it).
      y = x / x.norm(2, {-1}, /*keepdim=*/true).clamp_min(spec_.eps);
      if (gain.defined()) y = y * gain;
      break;
    }
    case NormKind::Scale:
      y = gain.defined() ? x * gain : x;
      break;
    case NormKind::DyT:
      y = torch::tanh(alpha * x);
      if (gain.defined()) y = y * gain;
      if (bias.defined()) y = y + bias;
      break;
  }
  if (spec_.out_scale != 1.0) y = y * spec_.out_scale;
  return y;
}

}  // namespace normlab
