// normlab's own CUDA kernels as autograd operations (issue 43.5). Each replaces an ATen
// composition that stays its reference and fallback:
//   rope    attention.cpp's apply_rope(x, cos, sin), returning the result contiguous [B, H, T, dh]
//   swiglu  FeedForwardImpl's silu(gate)·up on the packed [.., 2F] projection (up first)
// On CPU tensors they run the kernels' per-element functions in a host loop (the tests' twin of
// the GPU launch); the model calls them only where *_applies() says so: CUDA tensors and the
// `cuda_fused` lever on (CPU tensors too under the tests' `gpu_paths_on_cpu`).
#pragma once

#include <ATen/core/Tensor.h>

namespace normlab {

bool cuda_rope_applies(const at::Tensor& x, const at::Tensor& cos);
// x [B, H, T, dh] (any strides); cos and sin [T, dh], x's dtype.
at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

bool cuda_swiglu_applies(const at::Tensor& packed);
// packed [.., 2F], contiguous; returns [.., F].
at::Tensor fused_swiglu(const at::Tensor& packed);

}  // namespace normlab
