#include "counter_dropout.h"

#include <ATen/CPUGeneratorImpl.h>
#include <ATen/Parallel.h>
#include <torch/autograd.h>

#include <cstdint>
#include <cstring>
#include <mutex>

#include "cpu_isa.h"
#include "speed_levers.h"
#include "torch_api.h"

namespace normlab {
namespace {

// Chris Wellons' "lowbias32" integer hash; two rounds keyed by the seed's halves.
inline uint32_t mix32(uint32_t x) {
  x ^= x >> 16;
  x *= 0x7feb352dU;
  x ^= x >> 15;
  x *= 0x846ca68bU;
  x ^= x >> 16;
  return x;
}

// out[i] = keep(i) ? in[i]·scale : +0 over elements [begin, begin + n) of the tensor. Cloned per
// instruction set: the loop vectorizes to 16 lanes with AVX-512, 8 with AVX2. The dropped lanes are
// cleared with a bit mask, not a select: GCC 12 left a select (`keep ? x : 0.0f`) scalar and
// branchy in the AVX2 and default clones ("control flow in loop"; 21 % of a d64 50L step on an
// AVX2-only CPU). Same bits: a kept lane is in·scale, a dropped one +0 (NaN and Inf too).
NORMLAB_ISA_KERNEL((), void, masked_scale,
                   (const float* in, float* out, int64_t begin, int64_t n, uint32_t k0, uint32_t k1,
                    uint32_t threshold, float scale),
                   (in, out, begin, n, k0, k1, threshold, scale)) {
  const uint32_t base = uint32_t(begin);
  for (int64_t j = 0; j < n; ++j) {
    const uint32_t h = mix32(mix32((base + uint32_t(j)) ^ k0) + k1);
    const float scaled = in[j] * scale;
    uint32_t bits;
    std::memcpy(&bits, &scaled, sizeof bits);
    bits &= 0u - uint32_t(h >= threshold);
    std::memcpy(out + j, &bits, sizeof bits);
  }
}

at::Tensor apply_mask(const at::Tensor& x, uint64_t seed, double p) {
  at::Tensor in = x.contiguous();
  at::Tensor out = at::empty_like(in);
  const float* src = in.data_ptr<float>();
  float* dst = out.data_ptr<float>();
  at::parallel_for(0, in.numel(), 1 << 15, [&](int64_t b, int64_t e) {
    counter_dropout_span(src + b, dst + b, b, e - b, seed, p);
  });
  return out;
}

}  // namespace

void counter_dropout_span(const float* in, float* out, int64_t begin, int64_t n, uint64_t seed,
                          double p) {
  // Elements past 2^32 get other keys, so the 32-bit counter never repeats inside one tensor.
  const uint32_t threshold = uint32_t(std::min(p * 4294967296.0, 4294967295.0));
  const float scale = float(1.0 / (1.0 - p));
  for (int64_t b = begin, e = begin + n; b < e;) {
    const int64_t block = b >> 32, stop = std::min(e, (block + 1) << 32);
    const uint32_t k0 = uint32_t(seed), k1 = uint32_t(seed >> 32) + uint32_t(block) * 0x9e3779b9U;
    masked_scale(in + (b - begin), out + (b - begin), b, stop - b, k0, k1, threshold, scale);
    b = stop;
  }
}

uint64_t draw_dropout_seed() {
  auto gen = at::detail::getDefaultCPUGenerator();
  std::lock_guard<std::mutex> lock(gen.mutex());
  return gen.get<at::CPUGeneratorImpl>()->random64();
}

namespace {

struct CounterDropoutFn : public torch::autograd::Function<CounterDropoutFn> {
  static at::Tensor forward(torch::autograd::AutogradContext* ctx, const at::Tensor& x, double p) {
    const uint64_t seed = draw_dropout_seed();
    ctx->saved_data["seed"] = int64_t(seed);
    ctx->saved_data["p"] = p;
    return apply_mask(x, seed, p);
  }
  static torch::autograd::variable_list backward(torch::autograd::AutogradContext* ctx,
                                                 torch::autograd::variable_list grad) {
    const auto seed = uint64_t(ctx->saved_data["seed"].toInt());
    return {apply_mask(grad[0], seed, ctx->saved_data["p"].toDouble()), at::Tensor()};
  }
};

}  // namespace

torch::Tensor counter_dropout(const torch::Tensor& x, double p, bool training) {
  if (!training || p <= 0) return x;
  if (p >= 1 || !speed_levers().counter_dropout || !x.device().is_cpu() ||
      x.scalar_type() != at::kFloat)
    return torch::dropout(x, p, training);
  return CounterDropoutFn::apply(x, p);
}

}  // namespace normlab
