// Host entry points of normlab's own CUDA kernels (elementwise_kernels.cu). Plain C++: callers
// need neither CUDA's nor LibTorch's headers. Each returns nullptr, or CUDA's error message.
#pragma once

#include "elementwise_bodies.h"

namespace normlab::kernels {

enum class Dtype { Float, Half, BFloat16 };

// y = rope(x) (backward: y = ropeᵀ(x)); cos and sin [time, width] of x's dtype.
const char* launch_rope(Dtype dtype, const RopeGeometry& g, const void* x, const void* cos,
                        const void* sin, void* y, bool backward, void* stream);

// out = silu(gate)·up.
const char* launch_swiglu_forward(Dtype dtype, const SwigluGeometry& g, const void* packed,
                                  void* out, void* stream);

// d_packed [rows, 2·width], contiguous: d up in its first half, d gate in its second; dy
// contiguous.
const char* launch_swiglu_backward(Dtype dtype, const SwigluGeometry& g, const void* packed,
                                   const void* dy, void* d_packed, void* stream);

}  // namespace normlab::kernels
