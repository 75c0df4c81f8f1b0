#include "fused_ops.h"

#include <ATen/Dispatch.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#ifdef NORMLAB_WITH_CUDA
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>
#endif

#include <array>
#include <atomic>
#include <mutex>
#include <set>
#include <utility>

#include "launchers.h"
#include "speed_levers.h"

namespace normlab {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

bool kernel_dtype(const at::Tensor& t) {
  const auto s = t.scalar_type();
  return s == at::kFloat || s == at::kHalf || s == at::kBFloat16;
}

kernels::Dtype dtype_of(const at::Tensor& t) {
  switch (t.scalar_type()) {
    case at::kHalf:
      return kernels::Dtype::Half;
    case at::kBFloat16:
      return kernels::Dtype::BFloat16;
    default:
      return kernels::Dtype::Float;
  }
}

// Runs a launcher on t's device and stream, or fails with CUDA's message.
template <class Launch>
void on_device(const at::Tensor& t, const char* what, Launch launch) {
#ifdef NORMLAB_WITH_CUDA
  const c10::cuda::CUDAGuard guard(t.device());
  const char* error = launch(static_cast<void*>(c10::cuda::getCurrentCUDAStream().stream()));
  TORCH_CHECK(error == nullptr, what, ": CUDA kernel launch failed: ", error);
#else
  (void)launch;
  TORCH_CHECK(false, what, ": tensor on ", t.device(), ", and this normlab has no CUDA path");
#endif
}

// The host twin of a launch: f(i) for every index, in parallel, i of the kernel's index type
// (uint32_t where n fits, as the launch chooses).
template <class F>
void each_index(int64_t n, F f) {
  auto run = [&](auto index_type) {
    using Index = decltype(index_type);
    at::parallel_for(0, n, 1 << 12, [&](int64_t b, int64_t e) {
      for (int64_t i = b; i < e; ++i) f(Index(i));
    });
  };
  if (kernels::fits_u32(n))
    run(uint32_t{});
  else
    run(int64_t{});
}

void rope_into(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin, at::Tensor& y,
               bool backward) {
  kernels::RopeGeometry g{x.size(0), x.size(1), x.size(2), x.size(3), {}, {}};
  for (int d = 0; d < 4; ++d) {
    g.in_stride[d] = x.stride(d);
    g.out_stride[d] = y.stride(d);
  }
  if (x.is_cuda()) {
    on_device(x, "rope", [&](void* stream) {
      return kernels::launch_rope(dtype_of(x), g, x.data_ptr(), cos.data_ptr(), sin.data_ptr(),
                                  y.data_ptr(), backward, stream);
    });
    return;
  }
  const float fault = speed_levers().test_fault == "rope" ? 1 + 1.0f / 64 : 1;
  AT_DISPATCH_FLOATING_TYPES_AND2(at::kHalf, at::kBFloat16, x.scalar_type(), "rope", [&] {
    const scalar_t *px = x.data_ptr<scalar_t>(), *pc = cos.data_ptr<scalar_t>(),
                   *ps = sin.data_ptr<scalar_t>();
    scalar_t* py = y.data_ptr<scalar_t>();
    each_index(g.pairs(), [&](auto i) {
      const kernels::RopeOffsets o = kernels::rope_offsets(g, i);
      float y1, y2;
      kernels::rope_rotate(float(px[o.in1]), float(px[o.in2]), float(pc[o.table1]),
                           float(pc[o.table2]), float(ps[o.table1]), float(ps[o.table2]), backward,
                           &y1, &y2);
      py[o.out1] = scalar_t(y1 * fault);
      py[o.out2] = scalar_t(y2 * fault);
    });
  });
}

struct RopeFn : public torch::autograd::Function<RopeFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& cos,
                            const at::Tensor& sin) {
    at::Tensor y = at::empty(x.sizes(), x.options());
    rope_into(x, cos, sin, y, /*backward=*/false);
    ctx->saved_data["cos"] = cos;
    ctx->saved_data["sin"] = sin;
    return y;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const at::Tensor& dy = grad[0];
    // In the [B, T, H, dh] layout the packed projection has: its transpose back is free.
    at::Tensor dx =
        at::empty({dy.size(0), dy.size(2), dy.size(1), dy.size(3)}, dy.options()).transpose(1, 2);
    rope_into(dy, ctx->saved_data["cos"].toTensor(), ctx->saved_data["sin"].toTensor(), dx,
              /*backward=*/true);
    return {dx, at::Tensor(), at::Tensor()};
  }
};

kernels::SwigluGeometry swiglu_geometry(const at::Tensor& packed) {
  const int64_t width = packed.size(-1) / 2;
  return {packed.numel() / std::max<int64_t>(1, 2 * width), width, 2 * width};
}

std::vector<int64_t> half_width(const at::Tensor& packed) {
  std::vector<int64_t> sizes = packed.sizes().vec();
  sizes.back() /= 2;
  return sizes;
}

struct SwigluFn : public torch::autograd::Function<SwigluFn> {
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& packed) {
    const kernels::SwigluGeometry g = swiglu_geometry(packed);
    at::Tensor out = at::empty(half_width(packed), packed.options());
    if (packed.is_cuda()) {
      on_device(packed, "swiglu", [&](void* stream) {
        return kernels::launch_swiglu_forward(dtype_of(packed), g, packed.data_ptr(),
                                              out.data_ptr(), stream);
      });
    } else {
      const float fault = speed_levers().test_fault == "swiglu" ? 1 + 1.0f / 64 : 1;
      AT_DISPATCH_FLOATING_TYPES_AND2(
          at::kHalf, at::kBFloat16, packed.scalar_type(), "swiglu", [&] {
            const scalar_t* pin = packed.data_ptr<scalar_t>();
            scalar_t* po = out.data_ptr<scalar_t>();
            each_index(g.elements(), [&](auto i) {
              const kernels::SwigluOffsets o = kernels::swiglu_offsets(g, i);
              po[o.out] =
                  scalar_t(kernels::swiglu_forward(float(pin[o.up]), float(pin[o.gate])) * fault);
            });
          });
    }
    ctx->save_for_backward({packed});
    return out;
  }
  static variable_list backward(AutogradContext* ctx, variable_list grad) {
    const at::Tensor packed = ctx->get_saved_variables()[0];
    const at::Tensor dy = grad[0].contiguous();
    const kernels::SwigluGeometry g = swiglu_geometry(packed);
    at::Tensor d_packed = at::empty(packed.sizes(), packed.options());
    if (packed.is_cuda()) {
      on_device(packed, "swiglu", [&](void* stream) {
        return kernels::launch_swiglu_backward(dtype_of(packed), g, packed.data_ptr(),
                                               dy.data_ptr(), d_packed.data_ptr(), stream);
      });
    } else {
      AT_DISPATCH_FLOATING_TYPES_AND2(
          at::kHalf, at::kBFloat16, packed.scalar_type(), "swiglu", [&] {
            const scalar_t *pin = packed.data_ptr<scalar_t>(), *pdy = dy.data_ptr<scalar_t>();
            scalar_t* pd = d_packed.data_ptr<scalar_t>();
            each_index(g.elements(), [&](auto i) {
              const kernels::SwigluOffsets o = kernels::swiglu_offsets(g, i);
              float du, dg;
              kernels::swiglu_backward(float(pin[o.up]), float(pin[o.gate]), float(pdy[o.out]), &du,
                                       &dg);
              pd[o.up] = scalar_t(du);  // d_packed is contiguous: the input's offsets
              pd[o.gate] = scalar_t(dg);
            });
          });
    }
    return {d_packed};
  }
};

struct FallbackNotes {
  std::mutex mutex;
  std::set<std::string> seen;
  std::vector<std::string> pending;
};

FallbackNotes& fallback_notes() {
  static FallbackNotes notes;
  return notes;
}

std::atomic<uint32_t> fallback_generation{0};

}  // namespace

// CUDA tensors (CPU ones too under the tests' lever).
bool on_gpu_path(const at::Tensor& t) {
  const SpeedLevers& l = speed_levers();
#ifdef NORMLAB_WITH_CUDA
  if (t.is_cuda()) return l.cuda_fused;
#endif
  return t.is_cpu() && l.cuda_fused && l.gpu_paths_on_cpu;
}

void note_gpu_fallback(const std::string& what) {
  FallbackNotes& n = fallback_notes();
  const std::lock_guard<std::mutex> lock(n.mutex);
  if (n.seen.insert(what).second) n.pending.push_back(what);
}

std::vector<std::string> take_gpu_fallback_notes() {
  FallbackNotes& n = fallback_notes();
  const std::lock_guard<std::mutex> lock(n.mutex);
  return std::exchange(n.pending, {});
}

void forget_gpu_fallback_notes() {
  FallbackNotes& n = fallback_notes();
  const std::lock_guard<std::mutex> lock(n.mutex);
  n.seen.clear();
  n.pending.clear();
  fallback_generation.fetch_add(1, std::memory_order_relaxed);
}

uint32_t gpu_fallback_generation() { return fallback_generation.load(std::memory_order_relaxed); }

bool cuda_rope_applies(const at::Tensor& x, const at::Tensor& cos) {
  return speed_levers().cuda_rope && on_gpu_path(x) && x.dim() == 4 && x.size(3) % 2 == 0 &&
         kernel_dtype(x) && cos.scalar_type() == x.scalar_type() && cos.device() == x.device();
}

at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin) {
  TORCH_CHECK(x.dim() == 4 && x.size(3) % 2 == 0 && cos.dim() == 2 && cos.size(0) == x.size(2) &&
                  cos.size(1) == x.size(3) && sin.sizes() == cos.sizes() &&
                  cos.scalar_type() == x.scalar_type() && sin.scalar_type() == x.scalar_type() &&
                  kernel_dtype(x),
              "rope: x [B, H, T, dh] with even dh and cos, sin [T, dh] of its dtype; got x ",
              x.sizes(), " ", x.scalar_type(), ", cos ", cos.sizes(), " ", cos.scalar_type());
  return RopeFn::apply(x, cos.contiguous(), sin.contiguous());
}

bool sdpa_grouped_heads_apply(const at::Tensor& q) {
  if (!speed_levers().sdpa_grouped_heads) return false;
  if (!q.is_cuda()) return true;
  const at::ScalarType t = q.scalar_type();
  const int64_t dh = q.size(-1);
  if ((t != at::kHalf && t != at::kBFloat16) || dh % 8 != 0 || dh > 256) return false;
#ifdef NORMLAB_WITH_CUDA
  // The compute capability, asked once per device (not per layer and step): 0 not asked yet,
  // -1 the query failed.
  static std::array<std::atomic<int>, 64> majors{};
  const int device = q.get_device();
  if (device < 0 || device >= int(majors.size())) return false;
  int major = majors[size_t(device)].load(std::memory_order_relaxed);
  if (major == 0) {
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess)
      major = -1;
    majors[size_t(device)].store(major, std::memory_order_relaxed);
  }
  return major >= 8;
#else
  return false;
#endif
}

bool cuda_swiglu_applies(const at::Tensor& packed) {
  return speed_levers().cuda_swiglu && on_gpu_path(packed) && packed.dim() >= 1 &&
         packed.size(-1) % 2 == 0 && kernel_dtype(packed) && packed.is_contiguous();
}

at::Tensor fused_swiglu(const at::Tensor& packed) {
  TORCH_CHECK(packed.dim() >= 1 && packed.size(-1) % 2 == 0 && kernel_dtype(packed) &&
                  packed.is_contiguous(),
              "swiglu: a contiguous [.., 2F] float, half or bfloat16 tensor; got ", packed.sizes(),
              " ", packed.scalar_type());
  return SwigluFn::apply(packed);
}

}  // namespace normlab
