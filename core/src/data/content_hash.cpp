// A 128-bit content hash for cache keys: two independent 64-bit lanes over 8-byte words
// (multiply-rotate rounds), finalized with the splitmix64 mixer. Fast enough to hash a corpus on
// every load (a few ms for Multi30k); not cryptographic.
#include <cstring>

#include "internal.h"

namespace normlab::data::detail {

namespace {

constexpr uint64_t kP1 = 0x9e3779b185ebca87ULL, kP2 = 0xc2b2ae3d27d4eb4fULL;
constexpr uint64_t kP3 = 0x165667b19e3779f9ULL, kP4 = 0x85ebca77c2b2ae63ULL;

uint64_t rotl(uint64_t x, int r) { return (x << r) | (x >> (64 - r)); }

uint64_t fmix(uint64_t x) {
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return x;
}

}  // namespace

std::string Digest::hex() const {
  static const char* digits = "0123456789abcdef";
  std::string s(32, '0');
  for (int i = 0; i < 16; ++i) {
    s[15 - i] = digits[(hi >> (4 * i)) & 15];
    s[31 - i] = digits[(lo >> (4 * i)) & 15];
  }
  return s;
}

void Hasher::word(uint64_t w) {
  a_ = rotl(a_ + w * kP2, 31) * kP1;
  b_ = rotl(b_ ^ (rotl(w, 29) * kP4), 27) * kP3 + 0x52dce729;
}

Hasher& Hasher::bytes(const void* data, size_t size) {
  const auto* p = static_cast<const unsigned char*>(data);
  length_ += size;
  while (size > 0 && npending_ > 0) {  // finish a partial word first
    pending_ |= uint64_t(*p++) << (8 * npending_);
    --size;
    if (++npending_ == 8) {
      word(pending_);
      pending_ = 0;
      npending_ = 0;
    }
  }
  for (; size >= 8; size -= 8, p += 8) {
    uint64_t w = 0;
    for (int i = 0; i < 8; ++i) w |= uint64_t(p[i]) << (8 * i);  // little-endian on every host
    word(w);
  }
  for (; size > 0; --size) pending_ |= uint64_t(*p++) << (8 * npending_++);
  return *this;
}

Hasher& Hasher::field(std::string_view s) {
  field(int64_t(s.size()));
  return bytes(s.data(), s.size());
}

Hasher& Hasher::field(int64_t v) {
  unsigned char b[8];
  for (int i = 0; i < 8; ++i) b[i] = static_cast<unsigned char>(uint64_t(v) >> (8 * i));
  return bytes(b, 8);
}

Hasher& Hasher::field(double v) {
  uint64_t u;
  std::memcpy(&u, &v, sizeof u);
  return field(int64_t(u));
}

Hasher& Hasher::field(const Digest& d) {
  field(int64_t(d.hi));
  return field(int64_t(d.lo));
}

Digest Hasher::digest() const {
  uint64_t a = a_, b = b_;
  // the pending tail, tagged with its size so "ab" and "ab\0" differ
  uint64_t tail = pending_ ^ (uint64_t(npending_) << 59);
  a = rotl(a + tail * kP2, 31) * kP1;
  b = rotl(b ^ (rotl(tail, 29) * kP4), 27) * kP3;
  Digest d;
  d.hi = fmix(a ^ length_ ^ rotl(b, 17));
  d.lo = fmix(b + length_ * kP1 + rotl(a, 41));
  return d;
}

Digest hash_bytes(std::string_view data) {
  return Hasher().bytes(data.data(), data.size()).digest();
}

}  // namespace normlab::data::detail
