// Randomness that gives the same numbers with every standard library: std::mt19937_64's output is
// fixed by the standard, but uniform_int_distribution, shuffle etc. are implementation-defined.
#include "internal.h"

namespace normlab::data::detail {

uint64_t mix_seed(uint64_t seed, uint64_t stream) {
  auto splitmix = [](uint64_t x) {
    x += 0x9e3779b97f4a7c15ULL;
    x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
    x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
    return x ^ (x >> 31);
  };
  return splitmix(splitmix(seed) ^ (stream * 0xd1b54a32d192ed03ULL + 0x632be59bd9b4e019ULL));
}

uint64_t uniform_below(std::mt19937_64& rng, uint64_t n) {
  // rejection sampling: accept draws below the largest multiple of n
  const uint64_t limit = UINT64_MAX - (UINT64_MAX % n + 1) % n;
  uint64_t x;
  do x = rng();
  while (x > limit);
  return x % n;
}

double uniform01(std::mt19937_64& rng) { return double(rng() >> 11) * 0x1.0p-53; }

}  // namespace normlab::data::detail
