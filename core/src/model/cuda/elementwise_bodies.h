// What one thread of the CUDA elementwise kernels computes, as plain functions: the kernels
// (elementwise_kernels.cu) call them per element, and the CPU tests call the same functions over
// every index, so the index arithmetic and the formulas are checked on machines without a GPU.
// No CUDA or LibTorch types here.
#pragma once

#include <math.h>

#include <cstdint>

#ifdef __CUDACC__
#define NORMLAB_HOST_DEVICE __host__ __device__ inline
#else
#define NORMLAB_HOST_DEVICE inline
#endif

namespace normlab::kernels {

// Rotary positions (RoFormer, Su et al. 2021, eq. 34; HF's rotate_half layout): x viewed as
// [batch, heads, time, width], each channel pair (j, j + width/2) rotated by the angle of
// (time, j). The tables cos and sin are [time, width], contiguous, both halves of a row equal.
// Strides are in elements, so x can be a transposed view into the packed q/k/v projection.
struct RopeGeometry {
  int64_t batch, heads, time, width;
  int64_t in_stride[4], out_stride[4];
  NORMLAB_HOST_DEVICE int64_t pairs() const { return batch * heads * time * (width / 2); }
};

// Where pair i (in [0, pairs())) reads, writes and finds its angle.
struct RopeOffsets {
  int64_t in1, in2, out1, out2, table1, table2;
};

// Index arithmetic in `Index`: uint32_t wherever the count fits (fits_u32), because a 64-bit
// division costs a GPU dozens of instructions and these kernels are otherwise memory-bound;
// offsets are always computed in 64 bits.
template <class Index>
NORMLAB_HOST_DEVICE RopeOffsets rope_offsets(const RopeGeometry& g, Index i) {
  const Index half = Index(g.width / 2), j = i % half;
  Index r = i / half;
  const Index t = r % Index(g.time);
  r /= Index(g.time);
  const Index h = r % Index(g.heads), b = r / Index(g.heads);
  const int64_t in =
      int64_t(b) * g.in_stride[0] + int64_t(h) * g.in_stride[1] + int64_t(t) * g.in_stride[2];
  const int64_t out =
      int64_t(b) * g.out_stride[0] + int64_t(h) * g.out_stride[1] + int64_t(t) * g.out_stride[2];
  const int64_t j1 = int64_t(j), j2 = int64_t(j) + int64_t(half), row = int64_t(t) * g.width;
  return {in + j1 * g.in_stride[3],
          in + j2 * g.in_stride[3],
          out + j1 * g.out_stride[3],
          out + j2 * g.out_stride[3],
          row + j1,
          row + j2};
}

NORMLAB_HOST_DEVICE bool fits_u32(int64_t count) { return count <= int64_t(0xffffffffu); }

// Forward: y = x·cos + rotate_half(x)·sin, rotate_half(x) = (−x₂, x₁):
//   y₁ = x₁·c₁ − x₂·s₁,  y₂ = x₂·c₂ + x₁·s₂.
// Backward (the transpose): dx₁ = dy₁·c₁ + dy₂·s₂,  dx₂ = dy₂·c₂ − dy₁·s₁.
NORMLAB_HOST_DEVICE void rope_rotate(float a1, float a2, float c1, float c2, float s1, float s2,
                                     bool backward, float* o1, float* o2) {
  if (!backward) {
    *o1 = a1 * c1 - a2 * s1;
    *o2 = a2 * c2 + a1 * s2;
  } else {
    *o1 = a1 * c1 + a2 * s2;
    *o2 = a2 * c2 - a1 * s1;
  }
}

// SwiGLU (Shazeer 2020, eq. 6; LLaMA's FFN): the packed projection [rows, 2·width] holds the up
// projection u in columns [0, width) and the gate g in [width, 2·width) (fc1, then gate);
// out = silu(g)·u, [rows, width], contiguous. `in_row_stride` is the packed rows' stride.
struct SwigluGeometry {
  int64_t rows, width, in_row_stride;
  NORMLAB_HOST_DEVICE int64_t elements() const { return rows * width; }
};

struct SwigluOffsets {
  int64_t up, gate, out;
};

template <class Index>
NORMLAB_HOST_DEVICE SwigluOffsets swiglu_offsets(const SwigluGeometry& g, Index i) {
  const Index width = Index(g.width), r = i / width, j = i % width;
  const int64_t row = int64_t(r) * g.in_row_stride;
  return {row + int64_t(j), row + g.width + int64_t(j), int64_t(i)};
}

// silu(g) = g·σ(g), as ATen computes it in float: g / (1 + e^(−g)).
NORMLAB_HOST_DEVICE float swiglu_forward(float up, float gate) {
  return gate / (1.0f + expf(-gate)) * up;
}

// d/du = dy·silu(g); d/dg = dy·u·σ(g)·(1 + g·(1 − σ(g))) (ATen's silu_backward).
NORMLAB_HOST_DEVICE void swiglu_backward(float up, float gate, float dy, float* d_up,
                                         float* d_gate) {
  const float s = 1.0f / (1.0f + expf(-gate));
  *d_up = dy * (gate * s);
  *d_gate = dy * up * (s * (1.0f + gate * (1.0f - s)));
}

}  // namespace normlab::kernels
