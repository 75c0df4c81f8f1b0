// normlab's CUDA kernels: grid-stride loops around the per-element functions of
// elementwise_bodies.h, computing in float whatever the storage type. No LibTorch headers, so nvcc
// compiles this file in seconds.
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <type_traits>

#include "launchers.h"

namespace normlab::kernels {
namespace {

__device__ inline float to_float(float v) { return v; }
__device__ inline float to_float(__half v) { return __half2float(v); }
__device__ inline float to_float(__nv_bfloat16 v) { return __bfloat162float(v); }

template <class T>
__device__ T from_float(float v);
template <>
__device__ float from_float<float>(float v) {
  return v;
}
template <>
__device__ __half from_float<__half>(float v) {
  return __float2half_rn(v);
}
template <>
__device__ __nv_bfloat16 from_float<__nv_bfloat16>(float v) {
  return __float2bfloat16_rn(v);
}

constexpr int kThreads = 256;

// Enough blocks to fill the GPU; the grid-stride loops take any remainder.
unsigned blocks_for(int64_t n) {
  return unsigned(std::clamp<int64_t>((n + kThreads - 1) / kThreads, 1, int64_t(1) << 20));
}

__device__ inline int64_t first_index() { return int64_t(blockIdx.x) * blockDim.x + threadIdx.x; }
__device__ inline int64_t grid_stride() { return int64_t(gridDim.x) * blockDim.x; }

template <class T, class Index>
__global__ void rope_kernel(RopeGeometry g, const T* x, const T* cos, const T* sin, T* y,
                            bool backward) {
  const int64_t n = g.pairs();
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const RopeOffsets o = rope_offsets(g, Index(i));
    float y1, y2;
    rope_rotate(to_float(x[o.in1]), to_float(x[o.in2]), to_float(cos[o.table1]),
                to_float(cos[o.table2]), to_float(sin[o.table1]), to_float(sin[o.table2]), backward,
                &y1, &y2);
    y[o.out1] = from_float<T>(y1);
    y[o.out2] = from_float<T>(y2);
  }
}

template <class T, class Index>
__global__ void swiglu_forward_kernel(SwigluGeometry g, const T* packed, T* out) {
  const int64_t n = g.elements();
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const SwigluOffsets o = swiglu_offsets(g, Index(i));
    out[o.out] = from_float<T>(swiglu_forward(to_float(packed[o.up]), to_float(packed[o.gate])));
  }
}

template <class T, class Index>
__global__ void swiglu_backward_kernel(SwigluGeometry g, const T* packed, const T* dy,
                                       T* d_packed) {
  const int64_t n = g.elements();
  const SwigluGeometry d{g.rows, g.width, 2 * g.width};  // the gradient is packed contiguously
  for (int64_t i = first_index(); i < n; i += grid_stride()) {
    const SwigluOffsets o = swiglu_offsets(g, Index(i)), od = swiglu_offsets(d, Index(i));
    float du, dg;
    swiglu_backward(to_float(packed[o.up]), to_float(packed[o.gate]), to_float(dy[o.out]), &du,
                    &dg);
    d_packed[od.up] = from_float<T>(du);
    d_packed[od.gate] = from_float<T>(dg);
  }
}

const char* launched() {
  const cudaError_t e = cudaGetLastError();
  return e == cudaSuccess ? nullptr : cudaGetErrorString(e);
}

// Calls f with null pointers of the storage type `dtype` names and of the index type for `count`
// elements (uint32_t where it fits).
template <class F>
void with_types(Dtype dtype, int64_t count, F&& f) {
  auto with_index = [&](auto* type) {
    if (fits_u32(count)) return f(type, static_cast<uint32_t*>(nullptr));
    return f(type, static_cast<int64_t*>(nullptr));
  };
  switch (dtype) {
    case Dtype::Float:
      return with_index(static_cast<float*>(nullptr));
    case Dtype::Half:
      return with_index(static_cast<__half*>(nullptr));
    case Dtype::BFloat16:
      return with_index(static_cast<__nv_bfloat16*>(nullptr));
  }
}

}  // namespace

const char* launch_rope(Dtype dtype, const RopeGeometry& g, const void* x, const void* cos,
                        const void* sin, void* y, bool backward, void* stream) {
  if (g.pairs() == 0) return nullptr;
  with_types(dtype, g.pairs(), [&](auto* type, auto* index) {
    using T = std::remove_pointer_t<decltype(type)>;
    using Index = std::remove_pointer_t<decltype(index)>;
    rope_kernel<T, Index><<<blocks_for(g.pairs()), kThreads, 0, cudaStream_t(stream)>>>(
        g, static_cast<const T*>(x), static_cast<const T*>(cos), static_cast<const T*>(sin),
        static_cast<T*>(y), backward);
  });
  return launched();
}

const char* launch_swiglu_forward(Dtype dtype, const SwigluGeometry& g, const void* packed,
                                  void* out, void* stream) {
  if (g.elements() == 0) return nullptr;
  with_types(dtype, g.elements(), [&](auto* type, auto* index) {
    using T = std::remove_pointer_t<decltype(type)>;
    using Index = std::remove_pointer_t<decltype(index)>;
    swiglu_forward_kernel<T, Index>
        <<<blocks_for(g.elements()), kThreads, 0, cudaStream_t(stream)>>>(
            g, static_cast<const T*>(packed), static_cast<T*>(out));
  });
  return launched();
}

const char* launch_swiglu_backward(Dtype dtype, const SwigluGeometry& g, const void* packed,
                                   const void* dy, void* d_packed, void* stream) {
  if (g.elements() == 0) return nullptr;
  with_types(dtype, g.elements(), [&](auto* type, auto* index) {
    using T = std::remove_pointer_t<decltype(type)>;
    using Index = std::remove_pointer_t<decltype(index)>;
    swiglu_backward_kernel<T, Index>
        <<<blocks_for(g.elements()), kThreads, 0, cudaStream_t(stream)>>>(
            g, static_cast<const T*>(packed), static_cast<const T*>(dy), static_cast<T*>(d_packed));
  });
  return launched();
}

}  // namespace normlab::kernels
