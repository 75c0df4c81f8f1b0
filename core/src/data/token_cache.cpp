// The tokenized-corpus cache: one binary file per split, named by its key (see internal.h for the
// format). Reading is paranoid: a damaged file is a miss, never a crash or wrong tokens.
#include <fmt/format.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <ostream>
#include <sstream>

#include "internal.h"
#include "util/atomic_file.h"

namespace fs = std::filesystem;

namespace normlab::data::detail {

namespace {

constexpr char kMagic[8] = {'N', 'L', 'T', 'O', 'K', 'C', 'A', 'C'};
constexpr uint32_t kVersion = 1;
constexpr size_t kHeaderSize = 8 + 4 + 16 + 8 + 8;

class Writer {
 public:
  void u32(uint32_t v) {
    for (int i = 0; i < 4; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void u64(uint64_t v) {
    for (int i = 0; i < 8; ++i) out_.push_back(static_cast<char>(v >> (8 * i)));
  }
  void ids(const std::vector<int32_t>& v) {
    u32(static_cast<uint32_t>(v.size()));
    for (int32_t x : v) u32(static_cast<uint32_t>(x));
  }
  void str(const std::string& s) {
    u32(static_cast<uint32_t>(s.size()));
    out_ += s;
  }
  void strings(const std::vector<std::string>& v) {
    u64(v.size());
    for (const auto& s : v) str(s);
  }
  std::string& data() { return out_; }

 private:
  std::string out_;
};

// Bounds-checked reads; any overrun sets ok() false and yields zeros.
class Reader {
 public:
  explicit Reader(std::string_view in) : in_(in) {}
  bool ok() const { return ok_; }
  bool at_end() const { return pos_ == in_.size(); }
  size_t left() const { return in_.size() - pos_; }
  uint64_t le(int n) {
    if (!ok_ || left() < size_t(n)) return fail();
    uint64_t v = 0;
    for (int i = 0; i < n; ++i) v |= uint64_t(static_cast<unsigned char>(in_[pos_ + i])) << (8 * i);
    pos_ += n;
    return v;
  }
  uint32_t u32() { return static_cast<uint32_t>(le(4)); }
  uint64_t u64() { return le(8); }
  std::string_view raw(size_t n) {
    if (!ok_ || left() < n) {
      fail();
      return {};
    }
    auto s = in_.substr(pos_, n);
    pos_ += n;
    return s;
  }
  bool ids(std::vector<int32_t>& v) {
    uint64_t n = u32();
    if (!ok_ || n * 4 > left()) {
      fail();
      return false;
    }
    v.resize(n);
    for (auto& x : v) x = static_cast<int32_t>(u32());
    return ok_;
  }
  bool strings(std::vector<std::string>& v) {
    uint64_t n = u64();
    if (!ok_ || n > left() / 4) {  // every string takes at least its 4-byte length
      fail();
      return false;
    }
    v.resize(n);
    for (auto& s : v) {
      uint32_t len = u32();
      s = std::string(raw(len));
    }
    return ok_;
  }

 private:
  uint64_t fail() {
    ok_ = false;
    return 0;
  }
  std::string_view in_;
  size_t pos_ = 0;
  bool ok_ = true;
};

uint64_t checksum(std::string_view payload) {
  Digest d = hash_bytes(payload);
  return d.hi ^ d.lo;
}

}  // namespace

void write_file_atomic(const fs::path& file, std::string_view data) {
  util::write_file_atomically(file, data);
}

fs::path resolve_cache_dir(const std::string& configured) {
  if (!configured.empty()) return configured;
  if (const char* home = std::getenv("HOME"); home && *home)
    return fs::path(home) / ".cache" / "normlab" / "data";
  return fs::temp_directory_path() / "normlab-cache" / "data";
}

bool read_split_cache(const fs::path& file, const Digest& key, CachedSplit& out) {
  std::ifstream in(file, std::ios::binary);
  if (!in) return false;
  std::ostringstream ss;
  ss << in.rdbuf();
  const std::string bytes = std::move(ss).str();
  if (bytes.size() < kHeaderSize || std::memcmp(bytes.data(), kMagic, 8) != 0) return false;
  Reader header(std::string_view(bytes).substr(8, kHeaderSize - 8));
  if (header.u32() != kVersion) return false;
  Digest stored;
  stored.hi = header.u64();
  stored.lo = header.u64();
  const uint64_t size = header.u64(), sum = header.u64();
  if (!header.ok() || stored != key || size != bytes.size() - kHeaderSize) return false;
  const std::string_view payload = std::string_view(bytes).substr(kHeaderSize);
  if (checksum(payload) != sum) return false;

  Reader r(payload);
  CachedSplit c;
  c.stats.lines = r.u64();
  c.stats.empty_skipped = r.u64();
  c.stats.too_long = r.u64();
  c.stats.tokens = r.u64();
  const uint64_t n = r.u64();
  if (!r.ok() || n > r.left() / 8) return false;  // every example takes at least 8 bytes
  c.split.examples.resize(n);
  for (auto& ex : c.split.examples)
    if (!r.ids(ex.src) || !r.ids(ex.tgt)) return false;
  if (!r.strings(c.split.references) || !r.strings(c.split.sources) || !r.at_end()) return false;
  out = std::move(c);
  return true;
}

void write_split_cache(const fs::path& file, const Digest& key, const CachedSplit& data,
                       std::ostream& log) {
  Writer p;
  p.u64(data.stats.lines);
  p.u64(data.stats.empty_skipped);
  p.u64(data.stats.too_long);
  p.u64(data.stats.tokens);
  p.u64(data.split.examples.size());
  for (const auto& ex : data.split.examples) {
    p.ids(ex.src);
    p.ids(ex.tgt);
  }
  p.strings(data.split.references);
  p.strings(data.split.sources);

  Writer h;
  h.data().append(kMagic, 8);
  h.u32(kVersion);
  h.u64(key.hi);
  h.u64(key.lo);
  h.u64(p.data().size());
  h.u64(checksum(p.data()));
  h.data() += p.data();
  try {
    write_file_atomic(file, h.data());
  } catch (const std::exception& e) {
    log << "data: warning: could not write the corpus cache: " << e.what() << "\n";
  }
}

}  // namespace normlab::data::detail
