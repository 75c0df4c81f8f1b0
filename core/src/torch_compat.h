// Every LibTorch API that differs between Debian's 1.13 and the 2.x wheels lives here.
#pragma once

#include <ATen/ATen.h>
#include <ATen/CPUGeneratorImpl.h>
#include <ATen/autocast_mode.h>
#include <torch/version.h>

#include <cmath>
#include <mutex>

#define NORMLAB_TORCH_2 (TORCH_VERSION_MAJOR >= 2)
// at::rms_norm (2.4); in the 2.15 wheel it dispatches to _fused_rms_norm, a CUDA kernel on a GPU.
#define NORMLAB_TORCH_RMS_NORM \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 4))

// scaled_dot_product_attention(…, enable_gqa) (2.5): grouped k/v heads without repeating them.
#define NORMLAB_TORCH_SDPA_GQA \
  (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 5))

#include <optional>

namespace normlab::compat {

#if NORMLAB_TORCH_SDPA_GQA
// Causal attention with k/v of fewer heads than q: q head i reads k/v head i / (Hq/Hkv), as
// repeat_interleave (HF's repeat_kv) would arrange them; flash attention on a GPU.
inline at::Tensor causal_grouped_attention(const at::Tensor& q, const at::Tensor& k,
                                           const at::Tensor& v, double dropout_p) {
  return at::scaled_dot_product_attention(q, k, v, std::nullopt, dropout_p, /*is_causal=*/true,
                                          std::nullopt, /*enable_gqa=*/true);
}
#endif

// softmax(q·kᵀ/√dh + mask)·v with dropout on the probabilities; q,k,v [B,H,T,dh]. `causal`: the
// mask is exactly the causal one (no padding), so 2.x gives SDPA is_causal instead of the tensor:
// flash attention on a GPU, which takes no mask tensor. 1.13 uses the mask.
inline at::Tensor attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v,
                            const at::Tensor& mask, double dropout_p, bool training,
                            bool causal = false) {
#if NORMLAB_TORCH_2
  if (causal)
    return at::scaled_dot_product_attention(q, k, v, std::nullopt, training ? dropout_p : 0.0,
                                            /*is_causal=*/true);
  // Fused kernels (flash / memory-efficient on CUDA, the fused CPU path otherwise).
  // No mask is an empty optional: an undefined tensor inside one is refused.
  return at::scaled_dot_product_attention(
      q, k, v, mask.defined() ? std::optional<at::Tensor>(mask) : std::nullopt,
      training ? dropout_p : 0.0);
#else
  (void)causal;
  const double scale = 1.0 / std::sqrt(double(q.size(-1)));
  at::Tensor scores = mask.defined()
                          ? at::baddbmm(mask.expand({q.size(0), q.size(1), q.size(2), k.size(2)})
                                            .reshape({-1, q.size(2), k.size(2)}),
                                        q.reshape({-1, q.size(2), q.size(3)}),
                                        k.reshape({-1, k.size(2), k.size(3)}).transpose(1, 2),
                                        /*beta=*/1.0, /*alpha=*/scale)
                          : at::bmm(q.reshape({-1, q.size(2), q.size(3)}) * scale,
                                    k.reshape({-1, k.size(2), k.size(3)}).transpose(1, 2));
  at::Tensor probs = at::softmax(scores, -1);
  if (training && dropout_p > 0) probs = at::dropout(probs, dropout_p, true);
  at::Tensor out = at::bmm(probs, v.reshape({-1, v.size(2), v.size(3)}));
  return out.view({q.size(0), q.size(1), q.size(2), v.size(3)});
#endif
}

// A generator state as set_state() takes it: a contiguous CPU uint8 tensor, whatever device an
// archive was loaded onto ("RNG state must be a torch.ByteTensor" otherwise).
inline at::Tensor as_rng_state(const at::Tensor& t) {
  return t.to(at::kCPU).to(at::kByte).contiguous();
}

// Key of a parameter in torch::optim::Optimizer::state(): a string in 1.13, the TensorImpl* in 2.x.
inline auto optimizer_state_key(const at::Tensor& p) {
#if NORMLAB_TORCH_2
  return static_cast<void*>(p.unsafeGetTensorImpl());
#else
  return c10::guts::to_string(p.unsafeGetTensorImpl());
#endif
}

// State of the default CPU generator (dropout masks on the CPU).
inline at::Tensor cpu_rng_state() {
  auto& gen = const_cast<at::Generator&>(at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

inline void set_cpu_rng_state(const at::Tensor& state) {
  auto& gen = const_cast<at::Generator&>(at::detail::getDefaultCPUGenerator());
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(as_rng_state(state));
}

// State of the CUDA generator of `device` (dropout on that GPU: each GPU has its own, and the
// thread's current device need not be the model's); undefined for a CPU device, so a CPU run never
// opens a CUDA context.
inline at::Tensor cuda_rng_state(const at::Device& device) {
  if (!device.is_cuda() || !at::hasCUDA() || at::getNumGPUs() == 0) return {};
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get_state();
}

inline void set_cuda_rng_state(const at::Device& device, const at::Tensor& state) {
  if (!device.is_cuda() || !at::hasCUDA() || at::getNumGPUs() == 0 || !state.defined()) return;
  auto gen = at::globalContext().defaultGenerator(device);
  std::lock_guard<std::mutex> lock(gen.mutex());
  gen.set_state(as_rng_state(state));
}

// Autocast (mixed precision) of one device type. 1.13 has per-device functions (set_cpu_enabled,
// set_autocast_cpu_dtype, set_enabled/set_autocast_gpu_dtype for CUDA); 2.x takes the device type
// and deprecates those.
struct AutocastState {
  bool cpu = false, cuda = false;
  at::ScalarType cpu_dtype = at::kBFloat16, cuda_dtype = at::kHalf;
};

inline AutocastState autocast_state() {
  AutocastState s;
#if NORMLAB_TORCH_2
  s.cpu = at::autocast::is_autocast_enabled(at::kCPU);
  s.cuda = at::autocast::is_autocast_enabled(at::kCUDA);
  s.cpu_dtype = at::autocast::get_autocast_dtype(at::kCPU);
  s.cuda_dtype = at::autocast::get_autocast_dtype(at::kCUDA);
#else
  s.cpu = at::autocast::is_cpu_enabled();
  s.cuda = at::autocast::is_enabled();
  s.cpu_dtype = at::autocast::get_autocast_cpu_dtype();
  s.cuda_dtype = at::autocast::get_autocast_gpu_dtype();
#endif
  return s;
}

inline void set_autocast_state(const AutocastState& s) {
#if NORMLAB_TORCH_2
  at::autocast::set_autocast_enabled(at::kCPU, s.cpu);
  at::autocast::set_autocast_enabled(at::kCUDA, s.cuda);
  at::autocast::set_autocast_dtype(at::kCPU, s.cpu_dtype);
  at::autocast::set_autocast_dtype(at::kCUDA, s.cuda_dtype);
#else
  at::autocast::set_cpu_enabled(s.cpu);
  at::autocast::set_enabled(s.cuda);
  at::autocast::set_autocast_cpu_dtype(s.cpu_dtype);
  at::autocast::set_autocast_gpu_dtype(s.cuda_dtype);
#endif
}

// The current state with autocast to `dtype` on CUDA or the CPU switched on.
inline AutocastState autocast_to(bool cuda, at::ScalarType dtype) {
  AutocastState s = autocast_state();
  (cuda ? s.cuda : s.cpu) = true;
  (cuda ? s.cuda_dtype : s.cpu_dtype) = dtype;
  return s;
}

// `with torch.autocast(...)`: `state` inside the scope; the cast cache is cleared when the
// outermost autocast scope ends, as Python does.
class AutocastGuard {
 public:
  explicit AutocastGuard(const AutocastState& state)
      : before_(autocast_state()), active_(state.cpu || state.cuda) {
    set_autocast_state(state);
    if (active_) at::autocast::increment_nesting();
  }
  ~AutocastGuard() {
    if (active_ && at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    set_autocast_state(before_);
  }
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState before_;
  bool active_;
};

}  // namespace normlab::compat
