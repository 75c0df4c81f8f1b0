#include "python_random.h"

#include <cmath>
#include <stdexcept>
#include <unordered_set>

namespace normlab::eval {

PythonRandom::PythonRandom(uint64_t seed) {
  // random.seed(int): the integer's 32-bit words, least significant first, into init_by_array.
  std::vector<uint32_t> key;
  for (uint64_t s = seed; s > 0; s >>= 32) key.push_back(uint32_t(s));
  if (key.empty()) key.push_back(0);
  mt_[0] = 19650218U;  // init_genrand(19650218)
  for (int i = 1; i < kN; ++i)
    mt_[i] = 1812433253U * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + uint32_t(i);
  int i = 1;
  size_t j = 0;
  for (size_t k = std::max<size_t>(kN, key.size()); k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525U)) + key[j] + uint32_t(j);
    if (++i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
    if (++j >= key.size()) j = 0;
  }
  for (int k = kN - 1; k > 0; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941U)) - uint32_t(i);
    if (++i >= kN) {
      mt_[0] = mt_[kN - 1];
      i = 1;
    }
  }
  mt_[0] = 0x80000000U;
  mti_ = kN;
}

uint32_t PythonRandom::genrand_uint32() {
  constexpr int kM = 397;
  constexpr uint32_t kUpper = 0x80000000U, kLower = 0x7fffffffU, kMatrix = 0x9908b0dfU;
  if (mti_ >= kN) {
    for (int k = 0; k < kN; ++k) {
      const uint32_t y = (mt_[k] & kUpper) | (mt_[(k + 1) % kN] & kLower);
      mt_[k] = mt_[(k + kM) % kN] ^ (y >> 1) ^ ((y & 1U) ? kMatrix : 0U);
    }
    mti_ = 0;
  }
  uint32_t y = mt_[mti_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680U;
  y ^= (y << 15) & 0xefc60000U;
  y ^= y >> 18;
  return y;
}

uint32_t PythonRandom::getrandbits(int k) { return genrand_uint32() >> (32 - k); }

double PythonRandom::random() {
  const uint32_t a = genrand_uint32() >> 5, b = genrand_uint32() >> 6;
  return (double(a) * 67108864.0 + double(b)) * (1.0 / 9007199254740992.0);
}

uint64_t PythonRandom::randbelow(uint64_t n) {
  int k = 0;
  while (k < 64 && (n >> k) != 0) ++k;  // n.bit_length()
  if (k > 32) throw std::invalid_argument("PythonRandom::randbelow: more than 2^32 choices");
  uint64_t r = getrandbits(k);
  while (r >= n) r = getrandbits(k);
  return r;
}

std::vector<size_t> PythonRandom::sample(size_t n, size_t k) {
  if (k > n) throw std::invalid_argument("PythonRandom::sample: larger than the population");
  std::vector<size_t> result(k);
  size_t setsize = 21;  // random.py: a small set's size minus an empty list's
  if (k > 5) setsize += size_t(std::pow(4.0, std::ceil(std::log(double(k * 3)) / std::log(4.0))));
  if (n <= setsize) {
    std::vector<size_t> pool(n);
    for (size_t i = 0; i < n; ++i) pool[i] = i;
    for (size_t i = 0; i < k; ++i) {
      const size_t j = size_t(randbelow(n - i));
      result[i] = pool[j];
      pool[j] = pool[n - i - 1];
    }
  } else {
    std::unordered_set<size_t> selected;
    for (size_t i = 0; i < k; ++i) {
      size_t j = size_t(randbelow(n));
      while (selected.count(j)) j = size_t(randbelow(n));
      selected.insert(j);
      result[i] = j;
    }
  }
  return result;
}

}  // namespace normlab::eval
