// Python's random.Random, as far as lm-evaluation-harness's few-shot sampler uses it: seeded with
// an integer, then sample(population, k). With it normlab draws the harness's few-shot examples
// item by item (lm_eval/api/samplers.py ContextSampler.sample: one Random(fewshot seed) per task,
// drawn in the scored items' order). CPython: Modules/_randommodule.c (init_by_array,
// genrand_uint32, getrandbits), Lib/random.py (_randbelow_with_getrandbits, sample).
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <vector>

namespace normlab::eval {

class PythonRandom {
 public:
  explicit PythonRandom(uint64_t seed);
  uint32_t genrand_uint32();
  uint32_t getrandbits(int k);  // 1 ≤ k ≤ 32
  uint64_t randbelow(uint64_t n);
  // random.random(): 53 bits from two draws (genrand_res53), in [0, 1).
  double random();
  // The indices random.sample(range(n), k) returns, in selection order.
  std::vector<size_t> sample(size_t n, size_t k);

 private:
  static constexpr int kN = 624;
  std::array<uint32_t, kN> mt_{};
  int mti_ = kN;
};

}  // namespace normlab::eval
