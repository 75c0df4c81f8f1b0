// normlab's own CUDA kernels as autograd operations (issue 43.5). Each replaces an ATen
// composition that stays its reference and fallback:
//   rope    attention.cpp's apply_rope(x, cos, sin), returning the result contiguous [B, H, T, dh]
//   swiglu  FeedForwardImpl's silu(gate)·up on the packed [.., 2F] projection (up first)
// On CPU tensors they run the kernels' per-element functions in a host loop (the tests' twin of
// the GPU launch); the model calls them only where *_applies() says so: CUDA tensors and the
// `cuda_fused` lever on (CPU tensors too under the tests' `gpu_paths_on_cpu`).
#pragma once

#include <ATen/core/Tensor.h>

#include <atomic>
#include <cstdint>
#include <string>
#include <vector>

namespace normlab {

// Whether t takes the GPU path's fused operations: a CUDA tensor with the `cuda_fused` lever on.
bool on_gpu_path(const at::Tensor& t);

// Where an operation on the GPU path falls back to its ATen composition (issue 43.1: per operation,
// said once): recorded once per text where it happens; the trainer prints the new ones after its
// first update.
void note_gpu_fallback(const std::string& what);
std::vector<std::string> take_gpu_fallback_notes();
void forget_gpu_fallback_notes();  // tests: as in a new process

// A call site of a fallback on the hot path: once its note of a variant (say, the dtype) is
// recorded, later calls return after two atomic loads instead of building the text again.
struct FallbackSite {
  std::atomic<uint64_t> said{~uint64_t(0)};
};
uint32_t gpu_fallback_generation();  // advanced by forget_gpu_fallback_notes
template <class MakeNote>
void note_gpu_fallback(FallbackSite& site, uint32_t variant, MakeNote&& make_note) {
  const uint64_t key = (uint64_t(gpu_fallback_generation()) << 32) | variant;
  if (site.said.load(std::memory_order_relaxed) == key) return;
  note_gpu_fallback(make_note());
  site.said.store(key, std::memory_order_relaxed);
}

bool cuda_rope_applies(const at::Tensor& x, const at::Tensor& cos);
// x [B, H, T, dh] (any strides); cos and sin [T, dh], x's dtype.
at::Tensor fused_rope(const at::Tensor& x, const at::Tensor& cos, const at::Tensor& sin);

// Whether SDPA can attend to grouped k/v heads in place (enable_gqa) for q [B, H, T, dh]: its
// flash kernel is the only one that takes them (PyTorch 2.5–2.11; the others fall to the math
// kernel): fp16 or bf16, dh a multiple of 8 up to 256, a GPU of compute capability 8.0 or later.
// CPU tensors (the tests' lever): any.
bool sdpa_grouped_heads_apply(const at::Tensor& q);

bool cuda_swiglu_applies(const at::Tensor& packed);
// packed [.., 2F], contiguous; returns [.., F].
at::Tensor fused_swiglu(const at::Tensor& packed);

}  // namespace normlab
