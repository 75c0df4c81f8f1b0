#include "token_shards.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <glob.h>
#include <setjmp.h>
#include <signal.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>

#include "internal.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace normlab::data {
namespace {

std::string read_prefix(const fs::path& p, size_t n) {
  std::ifstream f(p, std::ios::binary);
  std::string s(n, '\0');
  f.read(s.data(), std::streamsize(n));
  s.resize(size_t(f.gcount()));
  return s;
}

template <class T>
T little(const std::string& bytes, size_t at) {
  T v{};
  std::memcpy(&v, bytes.data() + at, sizeof v);  // the formats are little-endian, as x86/ARM
  return v;
}

int64_t file_size(const std::string& role, const fs::path& p) {
  std::error_code ec;
  if (!fs::is_regular_file(p, ec))
    throw DataError(fmt::format("{}: {}: not a regular file", role, p.string()));
  return int64_t(fs::file_size(p, ec));
}

std::shared_ptr<MappedShard> flat(const std::string& role, const fs::path& p, int bytes,
                                  bool is_signed, int64_t offset = 0) {
  const int64_t size = file_size(role, p) - offset;
  if (size < 0 || size % bytes != 0)
    throw DataError(
        fmt::format("{}: {}: {} bytes of tokens are not a whole number of {}-byte "
                    "tokens (a truncated file, or another dtype)",
                    role, p.string(), size, bytes));
  return std::make_shared<MappedShard>(p, offset, size / bytes, bytes, is_signed);
}

// NumPy's format (numpy.lib.format): "\x93NUMPY", version 1.0, 2.0 or 3.0, the header's length
// (u16 in 1.0, u32 in 2.0 and 3.0), then the header: a Python dict literal of exactly the keys
// 'descr', 'fortran_order' and 'shape', e.g. {'descr': '<u2', 'fortran_order': False,
// 'shape': (N,), } padded with spaces and '\n'. numpy reads it with ast.literal_eval and refuses
// any other key, a fortran_order that is not a bool, a shape that is not a tuple of ints; read
// here as strictly (issue 66.18: a planted extra key made an int32 array train as uint16). What a
// Python literal may also be but numpy never writes (escapes, joined strings, 0x…) is refused too,
// and a key twice (literal_eval would keep the last silently). Read by hand, not with a regex:
// std::regex recursed per character and overflowed the stack on 30 kB of spaces (issue 56.8).
constexpr size_t kMaxNpyHeader = size_t(1)
                                 << 16;  // numpy writes ~128 bytes; its own limit is 10 kB
constexpr int kMaxNpyNesting = 32;       // parentheses in a value: no deep recursion

struct NpyHeader {
  std::string descr;
  std::vector<int64_t> shape;
  std::string shape_source;  // as written, for messages
};

// The header's Python literal, read as ast.literal_eval reads the part of it numpy's headers use.
// Errors are the reason alone; npy() adds the file.
class NpyHeaderReader {
 public:
  NpyHeaderReader(std::string_view text, int major) : s_(text), major_(major) {}

  NpyHeader read() {
    skip();
    if (peek() != '{')
      throw std::runtime_error(at_ >= s_.size()
                                   ? std::string("the header is empty")
                                   : "the header is not a dict: it starts with " + near());
    ++at_;
    std::optional<Value> descr, order, shape;
    while (true) {
      skip();
      if (peek() == '}') break;
      if (peek() != '\'' && peek() != '"')
        throw std::runtime_error(fmt::format("a key: expected a quoted string, found {}", near()));
      const std::string key = read_value("a key", 0).text;
      std::optional<Value>* slot = key == "descr"           ? &descr
                                   : key == "fortran_order" ? &order
                                   : key == "shape"         ? &shape
                                                            : nullptr;
      if (!slot)
        throw std::runtime_error(
            fmt::format("key '{}': numpy's header holds only 'descr', 'fortran_order' and 'shape'",
                        printable(std::string_view(key).substr(0, 40))));
      if (*slot) throw std::runtime_error(fmt::format("'{}' twice", key));  // one of the three
      skip();
      if (peek() != ':')
        throw std::runtime_error(fmt::format("'{}': expected ':', found {}", key, near()));
      ++at_;
      skip();
      *slot = read_value("'" + key + "'", 0);
      skip();
      if (peek() == ',') {
        ++at_;
        continue;
      }
      if (peek() != '}')
        throw std::runtime_error(
            fmt::format("after '{}': expected ',' or the closing '}}', found {}", key, near()));
    }
    ++at_;  // the '}'
    skip();
    if (at_ < s_.size())
      throw std::runtime_error(fmt::format("after the dict's closing '}}': {}", near()));
    if (!descr) throw std::runtime_error("no 'descr'");
    if (!order) throw std::runtime_error("no 'fortran_order'");
    if (!shape) throw std::runtime_error("no 'shape'");
    if (order->kind != Value::Bool)  // fortran_order itself does not matter for one dimension
      throw std::runtime_error(
          fmt::format("'fortran_order': {}: expected True or False", order->source));
    if (descr->kind != Value::Str)
      throw std::runtime_error(
          fmt::format("'descr': {}: expected '<u2', '<u4' or '<i4'", descr->source));
    if (shape->kind != Value::Tuple)
      throw std::runtime_error(
          fmt::format("'shape': {}: expected a tuple of whole numbers", shape->source));
    NpyHeader h;
    h.descr = descr->text;
    h.shape_source = shape->source;
    for (const Value& v : shape->items) {
      const std::optional<int64_t> n = v.kind == Value::Int ? count(v.text) : std::nullopt;
      if (!n)
        throw std::runtime_error(
            fmt::format("'shape': {}: expected non-negative whole numbers", shape->source));
      h.shape.push_back(*n);
      if (h.shape.size() > 32) throw std::runtime_error("'shape': more than 32 dimensions");
    }
    return h;
  }

  // Header text for a message: ASCII, control and other bytes as '?' (the message may end up in
  // JSON, which takes UTF-8 only).
  static std::string printable(std::string_view text) {
    std::string out(text);
    for (char& c : out)
      if (static_cast<unsigned char>(c) < 0x20 || static_cast<unsigned char>(c) >= 0x7f) c = '?';
    return out;
  }

  // A decimal integer of at most 18 digits (no sign, no stoll): nullopt for anything else.
  static std::optional<int64_t> count(std::string_view digits) {
    if (digits.empty() || digits.size() > 18) return std::nullopt;
    int64_t v = 0;
    for (char c : digits) {
      if (c < '0' || c > '9') return std::nullopt;
      v = v * 10 + (c - '0');
    }
    return v;
  }

 private:
  struct Value {
    enum Kind { Str, Int, Bool, None, Tuple, Signed } kind = None;
    std::string text;          // Str: the string; Int: the digits
    std::vector<Value> items;  // Tuple
    std::string source;        // as written (cut), for messages
  };

  char peek() const { return at_ < s_.size() ? s_[at_] : '\0'; }
  std::string near() const {
    if (at_ >= s_.size()) return "the header's end (no closing '}')";
    return "'" + printable(s_.substr(at_, 20)) + "'";
  }
  std::string source_from(size_t begin) const {
    const std::string t = printable(s_.substr(begin, std::min<size_t>(at_ - begin, 60)));
    return at_ - begin > 60 ? t + "…" : t;
  }
  // Python's whitespace between tokens inside brackets: spaces, tabs, form feeds, line ends,
  // comments and backslash line continuations.
  void skip() {
    while (at_ < s_.size()) {
      const char c = s_[at_];
      if (c == ' ' || c == '\t' || c == '\f' || c == '\n' || c == '\r') {
        ++at_;
      } else if (c == '#') {
        while (at_ < s_.size() && s_[at_] != '\n' && s_[at_] != '\r') ++at_;
      } else if (c == '\\' && at_ + 1 < s_.size() && (s_[at_ + 1] == '\n' || s_[at_ + 1] == '\r')) {
        at_ += 2;
      } else {
        return;
      }
    }
  }
  static bool word_char(char c) {
    return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_';
  }

  Value read_value(const std::string& what, int depth) {
    if (depth >= kMaxNpyNesting) throw std::runtime_error(fmt::format("{}: nested too deep", what));
    const size_t begin = at_;
    const char c = peek();
    Value v;
    if (c == '\'' || c == '"') {
      ++at_;
      while (at_ < s_.size() && s_[at_] != c) {
        if (s_[at_] == '\\' || s_[at_] == '\n' || s_[at_] == '\r')
          throw std::runtime_error(
              fmt::format("{}: a string with an escape or a line break (numpy writes none)", what));
        v.text += s_[at_++];
      }
      if (at_ >= s_.size())
        throw std::runtime_error(fmt::format("{}: a string never closed", what));
      ++at_;
      const size_t after = at_;
      skip();
      if (peek() == '\'' || peek() == '"')  // Python would join 'a' 'b' into 'ab'
        throw std::runtime_error(fmt::format("{}: two strings in a row", what));
      at_ = after;
      v.kind = Value::Str;
    } else if (c >= '0' && c <= '9') {
      // Decimal digits, '_' between them; Python 2's 'L' suffix in versions 1.0 and 2.0 (numpy's
      // _filter_header drops it). Anything else ("4.0", "0x4", "4j", "007") is not an int here.
      while (at_ < s_.size() && (word_char(s_[at_]) || s_[at_] == '.')) ++at_;
      std::string digits(s_.substr(begin, at_ - begin));
      if (major_ <= 2 && (digits.back() == 'L' || digits.back() == 'l')) digits.pop_back();
      bool ok = !digits.empty() && digits.front() != '_' && digits.back() != '_' &&
                digits.find("__") == std::string::npos;
      for (char d : digits) ok = ok && ((d >= '0' && d <= '9') || d == '_');
      digits.erase(std::remove(digits.begin(), digits.end(), '_'), digits.end());
      if (ok && digits.size() > 1 && digits.front() == '0')
        ok = digits.find_first_not_of('0') == std::string::npos;  // Python refuses 007
      if (!ok)
        throw std::runtime_error(
            fmt::format("{}: {}: not a whole number", what, source_from(begin)));
      v.text = digits.find_first_not_of('0') == std::string::npos
                   ? "0"
                   : digits.substr(digits.find_first_not_of('0'));
      v.kind = Value::Int;
    } else if (c == '-' || c == '+') {
      ++at_;
      skip();
      Value inner = read_value(what, depth + 1);
      if (inner.kind != Value::Int)
        throw std::runtime_error(fmt::format("{}: {}: not a number", what, source_from(begin)));
      v.kind = Value::Signed;
    } else if (word_char(c)) {
      while (at_ < s_.size() && word_char(s_[at_])) ++at_;
      const std::string_view word = s_.substr(begin, at_ - begin);
      if (word == "True" || word == "False")
        v.kind = Value::Bool;
      else if (word == "None")
        v.kind = Value::None;
      else
        throw std::runtime_error(fmt::format(
            "{}: {}: not a literal numpy writes (a string, a number, True, False or a tuple)", what,
            source_from(begin)));
    } else if (c == '(') {
      ++at_;
      skip();
      bool tuple = false;
      while (peek() != ')') {
        v.items.push_back(read_value(what, depth + 1));
        skip();
        if (peek() == ',') {
          tuple = true;
          ++at_;
          skip();
        } else if (peek() != ')') {
          throw std::runtime_error(
              fmt::format("{}: expected ',' or ')' in a tuple, found {}", what, near()));
        }
      }
      ++at_;
      if (v.items.size() == 1 && !tuple) {
        Value inner = std::move(v.items.front());  // (x) is x, not a tuple
        inner.source = source_from(begin);
        return inner;
      }
      v.kind = Value::Tuple;
    } else {
      throw std::runtime_error(
          fmt::format("{}: {}{}: expected a string, a number, True, False or a tuple", what,
                      c == '['   ? "a list, "
                      : c == '{' ? "a dict, "
                                 : "",
                      near()));
    }
    v.source = source_from(begin);
    return v;
  }

  std::string_view s_;
  size_t at_ = 0;
  int major_;
};

std::shared_ptr<MappedShard> npy(const std::string& role, const fs::path& p) {
  const int64_t size = file_size(role, p);
  const std::string head = read_prefix(p, 12);
  auto bad = [&](const std::string& what) {
    return DataError(fmt::format("{}: {}: not a NumPy token array ({})", role, p.string(), what));
  };
  if (head.size() < 6 || head.compare(0, 6, "\x93NUMPY") != 0) throw bad("no \\x93NUMPY magic");
  if (head.size() < 10) throw bad(fmt::format("a {}-byte file: the header is cut", size));
  const int major = static_cast<unsigned char>(head[6]),
            minor = static_cast<unsigned char>(head[7]);
  if (major < 1 || major > 3 || minor != 0)
    throw bad(fmt::format("format version {}.{}: numpy reads 1.0, 2.0 and 3.0", major, minor));
  const size_t len_bytes = major == 1 ? 2 : 4;
  if (head.size() < 8 + len_bytes) throw bad("truncated header");
  const uint64_t header_len = major == 1 ? little<uint16_t>(head, 8) : little<uint32_t>(head, 8);
  // Checked before anything is read: a forged length allocated 4.2 GiB (issue 56.9).
  if (header_len > kMaxNpyHeader || 8 + len_bytes + header_len > uint64_t(size))
    throw bad(fmt::format("header length {} in a {}-byte file (at most {} expected)", header_len,
                          size, kMaxNpyHeader));
  const int64_t offset = int64_t(8 + len_bytes + header_len);
  const std::string header = read_prefix(p, size_t(offset)).substr(8 + len_bytes);
  NpyHeader h;
  try {
    h = NpyHeaderReader(header, major).read();
  } catch (const std::runtime_error& e) {
    throw bad(e.what());
  }
  const std::string_view d = h.descr;
  const std::optional<int64_t> width =
      d.size() >= 3 && d.size() <= 20 ? NpyHeaderReader::count(d.substr(2)) : std::nullopt;
  if (!width || std::string_view("<>|=").find(d[0]) == std::string_view::npos)
    throw bad(fmt::format("'descr': '{}': expected '<u2', '<u4' or '<i4'",
                          NpyHeaderReader::printable(d.substr(0, 40))));
  const char order = d[0], kind = d[1];
  const int64_t bytes = *width;
  if (order == '>' || !((kind == 'u' && (bytes == 2 || bytes == 4)) || (kind == 'i' && bytes == 4)))
    throw bad(fmt::format("dtype '{}': expected <u2, <u4 or <i4",
                          NpyHeaderReader::printable(d.substr(0, 40))));
  const std::vector<int64_t>& dims = h.shape;
  // One dimension exactly: numpy reads (N, 1) or (1, N) as a 2-D array, which no loader takes.
  if (dims.size() != 1)
    throw bad(fmt::format("shape {}: expected one dimension of tokens, (N,)", h.shape_source));
  const int64_t n = dims.front();
  auto shard = flat(role, p, int(bytes), kind == 'i', offset);
  if (shard->size() != n)
    throw bad(fmt::format("shape says {} tokens, the file holds {}", n, shard->size()));
  return shard;
}

// Megatron-LM's MMapIndexedDataset index (megatron/core/datasets/indexed_dataset.py):
// "MMIDIDX\0\0", u64 version 1, u8 dtype code, u64 sequence count, u64 document count, then int32
// sizes[seqs], int64 pointers[seqs] (byte offsets into .bin), int64 document_indices[docs].
std::shared_ptr<MappedShard> megatron(const std::string& role, const fs::path& given) {
  fs::path bin = given, idx = given;
  if (given.extension() == ".bin" || given.extension() == ".idx") {
    bin.replace_extension(".bin");
    idx.replace_extension(".idx");
  } else {
    bin += ".bin";
    idx += ".idx";
  }
  auto bad = [&](const std::string& what) {
    return DataError(
        fmt::format("{}: {}: not a Megatron-LM indexed dataset ({})", role, idx.string(), what));
  };
  const int64_t idx_size = file_size(role, idx);
  const std::string head = read_prefix(idx, 34);
  if (head.size() < 34 || head.compare(0, 9, std::string("MMIDIDX\0\0", 9)) != 0)
    throw bad("no MMIDIDX magic");
  if (little<uint64_t>(head, 9) != 1)
    throw bad(fmt::format("version {}", little<uint64_t>(head, 9)));
  const int code = static_cast<unsigned char>(head[17]);
  // Megatron's DType codes: 1 uint8, 2 int8, 3 int16, 4 int32, 5 int64, 6 float64, 7 float32,
  // 8 uint16.
  if (code != 8 && code != 4)
    throw bad(fmt::format("dtype code {}: expected 8 (uint16) or 4 (int32)", code));
  const int bytes = code == 8 ? 2 : 4;
  const uint64_t seqs = little<uint64_t>(head, 18), docs = little<uint64_t>(head, 26);
  if (seqs > uint64_t(idx_size) / 12 || docs > uint64_t(idx_size) / 8 ||
      34 + seqs * 12 + docs * 8 != uint64_t(idx_size))
    throw bad(
        fmt::format("{} sequences and {} documents do not fit its {} bytes", seqs, docs, idx_size));
  // The sequences must lie one after the other in .bin (as the builder writes them): then the
  // .bin is the token stream.
  std::ifstream f(idx, std::ios::binary);
  f.seekg(34);
  std::vector<int32_t> sizes(seqs);
  std::vector<int64_t> pointers(seqs);
  f.read(reinterpret_cast<char*>(sizes.data()), std::streamsize(seqs * 4));
  f.read(reinterpret_cast<char*>(pointers.data()), std::streamsize(seqs * 8));
  int64_t at = 0;
  for (uint64_t i = 0; i < seqs; ++i) {
    if (sizes[i] < 0)
      throw bad(
          fmt::format("sequence {} has size {}: expected a token count of 0 or more", i, sizes[i]));
    if (pointers[i] != at)
      throw bad(fmt::format("sequence {} is not where the previous one ends (byte {}, expected {})",
                            i, pointers[i], at));
    at += int64_t(sizes[i]) * bytes;
  }
  auto shard = flat(role, bin, bytes, code == 4);
  if (shard->size() * bytes != at)
    throw bad(fmt::format("its sequences hold {} bytes, {} has {}", at, bin.string(),
                          shard->size() * bytes));
  return shard;
}

}  // namespace

std::optional<ShardFormat> parse_shard_format(const std::string& name) {
  if (name == "nanogpt") return ShardFormat::NanoGpt;
  if (name == "npy") return ShardFormat::Npy;
  if (name == "megatron") return ShardFormat::Megatron;
  if (name == "normlab") return ShardFormat::Normlab;
  return std::nullopt;
}

const char* to_string(ShardFormat f) {
  switch (f) {
    case ShardFormat::NanoGpt:
      return "nanogpt";
    case ShardFormat::Npy:
      return "npy";
    case ShardFormat::Megatron:
      return "megatron";
    case ShardFormat::Normlab:
      return "normlab";
  }
  return "?";
}

std::vector<fs::path> expand_shard_paths(const std::string& role, const std::string& pattern) {
  std::vector<fs::path> out;
  if (pattern.find_first_of("*?[") == std::string::npos) {
    out.emplace_back(pattern);
    return out;
  }
  glob_t g{};
  const int rc = ::glob(pattern.c_str(), 0, nullptr, &g);
  for (size_t i = 0; rc == 0 && i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  if (out.empty()) throw DataError(fmt::format("{}: '{}' matches no file", role, pattern));
  std::sort(out.begin(), out.end());  // glob sorts by the locale; the order must not depend on it
  return out;
}

std::string read_regular_file(const fs::path& file, int64_t max_bytes, std::string& bytes) {
  // O_NONBLOCK: opening a FIFO does not wait for a writer; fstat then says what was opened.
  const int fd = ::open(file.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) return fmt::format("cannot be opened: {}", std::strerror(errno));
  struct stat st {};
  std::string problem;
  if (::fstat(fd, &st) != 0)
    problem = fmt::format("cannot be examined: {}", std::strerror(errno));
  else if (S_ISDIR(st.st_mode))
    problem = "is a folder";
  else if (S_ISFIFO(st.st_mode))
    problem = "is a FIFO (a named pipe)";
  else if (S_ISCHR(st.st_mode) || S_ISBLK(st.st_mode))
    problem = "is a device";
  else if (!S_ISREG(st.st_mode))
    problem = "is not a regular file";
  else if (st.st_size > max_bytes)
    problem = fmt::format("holds {} bytes (at most {} expected)", int64_t(st.st_size), max_bytes);
  bytes.assign(problem.empty() ? size_t(st.st_size) : 0, '\0');
  for (size_t got = 0; problem.empty() && got < bytes.size();) {
    const ssize_t n = ::read(fd, bytes.data() + got, bytes.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) problem = fmt::format("cannot be read: {}", std::strerror(errno));
    if (n == 0) bytes.resize(got);  // shrank meanwhile: what is left
    got += size_t(std::max<ssize_t>(n, 0));
  }
  ::close(fd);
  return problem;
}

namespace {
// A value of shards.json for a message: printable ASCII, at most 80 characters.
std::string printable_json(const json& v) {
  std::string text = v.dump(-1, ' ', true, json::error_handler_t::replace);
  for (char& c : text)
    if (c < 0x20 || c > 0x7e) c = '?';
  return text.size() > 80 ? text.substr(0, 77) + "..." : text;
}
}  // namespace

ShardSet read_shard_set(const fs::path& dir) {
  const fs::path file = dir / "shards.json";
  std::string text;
  // A regular file, as the shards: a FIFO in its place hung the run (issue 66.14).
  if (const std::string problem = read_regular_file(file, int64_t(1) << 30, text); !problem.empty())
    throw DataError(fmt::format(
        "{}: {} (normlab's shard format keeps it beside the shards, a regular file; "
        "`normlab data tokenize` writes it)",
        file.string(),
        problem.rfind("cannot be opened: No such", 0) == 0 ? std::string("not found") : problem));
  json j;
  try {
    j = json::parse(text);
  } catch (const json::parse_error& e) {  // truncated, trailing bytes, empty: say where
    throw DataError(
        fmt::format("{}: not valid JSON at byte {} ({})", file.string(), e.byte, e.what()));
  }
  auto bad = [&](const std::string& key, const std::string& what) {
    return DataError(fmt::format("{}: {}: expected {}", file.string(), key, what));
  };
  if (!j.is_object() || j.value("format", "") != "normlab.shards")
    throw bad("format", "\"normlab.shards\"");
  ShardSet s;
  const std::string dtype = j.value("dtype", "");
  if (dtype != "uint16" && dtype != "uint32") throw bad("dtype", "\"uint16\" or \"uint32\"");
  s.bytes_per_token = dtype == "uint16" ? 2 : 4;
  if (!j.contains("vocab_size") || !j["vocab_size"].is_number_integer() ||
      j["vocab_size"].get<int64_t>() < 1)
    throw bad("vocab_size", "a positive integer");
  s.vocab_size = j["vocab_size"].get<int64_t>();
  s.eos_id = j.value("eos_id", int64_t(-1));
  // Like a shard: a file in this folder (issue 66.14: any path was read, a FIFO hung the run).
  if (j.contains("tokenizer")) {
    const std::string name = j["tokenizer"].is_string() ? j["tokenizer"].get<std::string>() : "/";
    if (name.find_first_of(std::string("/\0", 2)) != std::string::npos || name == "." ||
        name == "..")
      throw bad("tokenizer", fmt::format("the file name of a SentencePiece model in the same "
                                         "folder, got {}",
                                         printable_json(j["tokenizer"])));
    s.tokenizer = name;
  }
  if (j.contains("tokenizer_sha256")) {
    std::string hex =
        j["tokenizer_sha256"].is_string() ? j["tokenizer_sha256"].get<std::string>() : "";
    std::transform(hex.begin(), hex.end(), hex.begin(),
                   [](unsigned char c) { return char(std::tolower(c)); });
    if (hex.size() != 64 || hex.find_first_not_of("0123456789abcdef") != std::string::npos)
      throw bad("tokenizer_sha256", "the SHA-256 of the tokenizer file, 64 hex digits");
    s.tokenizer_sha256 = hex;
  }
  if (!j.contains("shards") || !j["shards"].is_array()) throw bad("shards", "a list");
  for (const auto& e : j["shards"]) {
    if (!e.is_object() || !e.contains("file") || !e["file"].is_string() || !e.contains("tokens") ||
        !e["tokens"].is_number_integer())
      throw bad("shards[]", "objects with file, tokens, sha256");
    ShardSet::Shard sh;
    sh.file = e["file"].get<std::string>();
    sh.tokens = e["tokens"].get<int64_t>();
    sh.sha256 = e.value("sha256", "");
    sh.max_token = e.value("max_token", int64_t(-1));
    if (sh.file.find('/') != std::string::npos || sh.file == "..")
      throw bad("shards[].file", "a file name in the same folder");
    s.shards.push_back(sh);
  }
  return s;
}

std::string shard_set_json(const ShardSet& s) {
  json shards = json::array();
  for (const auto& sh : s.shards)
    shards.push_back({{"file", sh.file},
                      {"tokens", sh.tokens},
                      {"sha256", sh.sha256},
                      {"max_token", sh.max_token}});
  json j{{"format", "normlab.shards"}, {"dtype", s.bytes_per_token == 2 ? "uint16" : "uint32"},
         {"vocab_size", s.vocab_size}, {"eos_id", s.eos_id},
         {"tokenizer", s.tokenizer},   {"shards", shards}};
  if (!s.tokenizer_sha256.empty()) j["tokenizer_sha256"] = s.tokenizer_sha256;
  return j.dump(2) + "\n";
}

namespace {
// A mapped file that shrinks under a run (nanoGPT's prepare.py rewriting train.bin in place) makes
// a read of the lost pages raise SIGBUS, which killed the run with status.json left "running"
// (issue 56.10). While MappedShard::read copies, a SIGBUS jumps back to it and becomes a DataError.
thread_local sigjmp_buf* t_reading = nullptr;
struct sigaction g_previous_sigbus;

void on_sigbus(int sig, siginfo_t* info, void* context) {
  if (t_reading) siglongjmp(*t_reading, 1);
  // Not a shard read: what would have happened without this handler.
  if ((g_previous_sigbus.sa_flags & SA_SIGINFO) && g_previous_sigbus.sa_sigaction) {
    g_previous_sigbus.sa_sigaction(sig, info, context);
    return;
  }
  ::sigaction(SIGBUS, &g_previous_sigbus, nullptr);  // the fault repeats under it on return
}

void catch_sigbus_in_reads() {
  static std::once_flag once;
  std::call_once(once, [] {
    struct sigaction sa {};
    sa.sa_sigaction = on_sigbus;
    sa.sa_flags = SA_SIGINFO | SA_NODEFER;  // not blocked after the jump: the next one is caught
    sigemptyset(&sa.sa_mask);
    ::sigaction(SIGBUS, &sa, &g_previous_sigbus);
  });
}
}  // namespace

MappedShard::MappedShard(const fs::path& path, int64_t offset, int64_t count, int bytes_per_token,
                         bool is_signed)
    : path_(path), offset_(offset), count_(count), bytes_(bytes_per_token), signed_(is_signed) {
  if (count_ == 0) return;
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw DataError(fmt::format("{}: cannot open: {}", path.string(), std::strerror(errno)));
  map_size_ = size_t(offset_ + count_ * bytes_);
  void* m = ::mmap(nullptr, map_size_, PROT_READ, MAP_SHARED, fd, 0);
  ::close(fd);
  if (m == MAP_FAILED)
    throw DataError(fmt::format("{}: cannot map: {}", path.string(), std::strerror(errno)));
  // Blocks are read at random places: no read-ahead of whole shards into the page cache.
  ::madvise(m, map_size_, MADV_RANDOM);
  map_ = static_cast<const unsigned char*>(m);
  catch_sigbus_in_reads();
}

MappedShard::~MappedShard() {
  if (map_) ::munmap(const_cast<unsigned char*>(map_), map_size_);
}

void MappedShard::read(int64_t begin, int64_t n, int32_t* out) const {
  sigjmp_buf reading;
  if (sigsetjmp(reading, 0)) {
    t_reading = nullptr;
    struct stat st {};
    const bool gone = ::stat(path_.c_str(), &st) != 0;
    throw DataError(fmt::format(
        "{}: {} while this run read it (tokens {} to {} are no longer there: {} bytes now, {} when "
        "the run started): rewritten in place? Let the run finish on a copy, or restart it",
        path_.string(), gone ? "removed" : "shrank", begin, begin + n,
        gone ? int64_t(0) : int64_t(st.st_size), int64_t(map_size_)));
  }
  t_reading = &reading;
  copy_tokens(begin, n, out);
  t_reading = nullptr;
  // Every page a run reads stays mapped into it: peak RSS grew with run length (1.05 → 1.47 GB at
  // 100 → 300 updates, issue 59.12) though nothing is kept. Past kDropBytes read, the pages leave
  // this process (they stay in the page cache; a later read maps them again, same bytes).
  constexpr int64_t kDropBytes = int64_t(64) << 20;
  if ((read_since_drop_ += n * bytes_) >= kDropBytes) {
    read_since_drop_ = 0;
    ::madvise(const_cast<unsigned char*>(map_), map_size_, MADV_DONTNEED);
  }
}

void MappedShard::copy_tokens(int64_t begin, int64_t n, int32_t* out) const {
  const unsigned char* p = map_ + offset_ + begin * bytes_;
  if (bytes_ == 2) {
    for (int64_t i = 0; i < n; ++i) {
      uint16_t v;
      std::memcpy(&v, p + 2 * i, 2);
      out[i] = int32_t(v);
    }
  } else {
    for (int64_t i = 0; i < n; ++i) {
      uint32_t v;
      std::memcpy(&v, p + 4 * i, 4);
      // uint32 above INT32_MAX and negative int32 both come out negative: refused by the block
      // reader's vocabulary check.
      out[i] = signed_ ? int32_t(v) : (v > uint32_t(INT32_MAX) ? -1 : int32_t(v));
    }
  }
}

std::shared_ptr<TokenStream> TokenStream::open(const std::string& role,
                                               const std::vector<fs::path>& files,
                                               ShardFormat format) {
  auto s = std::make_shared<TokenStream>();
  // shards.json once per folder: once per shard made opening 4,000 shards take 138 s (issue 56.12).
  std::map<fs::path, ShardSet> sets;
  for (const fs::path& p : files) {
    std::shared_ptr<MappedShard> shard;
    switch (format) {
      case ShardFormat::NanoGpt:
        shard = flat(role, p, 2, false);
        break;
      case ShardFormat::Npy:
        shard = npy(role, p);
        break;
      case ShardFormat::Megatron:
        shard = megatron(role, p);
        break;
      case ShardFormat::Normlab: {
        const fs::path dir = p.parent_path().empty() ? fs::path(".") : p.parent_path();
        auto found = sets.find(dir);
        if (found == sets.end()) found = sets.emplace(dir, read_shard_set(dir)).first;
        const ShardSet& here = found->second;
        const auto it = std::find_if(here.shards.begin(), here.shards.end(), [&](const auto& sh) {
          return sh.file == p.filename().string();
        });
        if (it == here.shards.end())
          throw DataError(fmt::format("{}: {} is not listed in {}", role, p.string(),
                                      (p.parent_path() / "shards.json").string()));
        shard = flat(role, p, here.bytes_per_token, false);
        if (shard->size() != it->tokens)
          throw DataError(
              fmt::format("{}: {} holds {} tokens, shards.json says {} (truncated or "
                          "rewritten: tokenize again)",
                          role, p.string(), shard->size(), it->tokens));
        break;
      }
    }
    s->starts_.push_back(s->total_);
    s->total_ += shard->size();
    s->shards_.push_back(std::move(shard));
  }
  return s;
}

void TokenStream::read(int64_t begin, int64_t n, int32_t* out) const {
  auto it = std::upper_bound(starts_.begin(), starts_.end(), begin);
  size_t k = size_t(it - starts_.begin()) - 1;
  while (n > 0) {
    const int64_t local = begin - starts_[k];
    const int64_t take = std::min(n, shards_[k]->size() - local);
    shards_[k]->read(local, take, out);
    out += take, begin += take, n -= take;
    ++k;
  }
}

std::string TokenStream::where(int64_t pos) const {
  auto it = std::upper_bound(starts_.begin(), starts_.end(), pos);
  const size_t k = size_t(it - starts_.begin()) - 1;
  return fmt::format("{} (token {} of it)", shards_[k]->path().string(), pos - starts_[k]);
}

StreamBlocks::StreamBlocks(std::shared_ptr<const TokenStream> stream, int64_t first, int64_t tokens,
                           int64_t block, int64_t vocab_size)
    : stream_(std::move(stream)), first_(first), block_(block), vocab_(vocab_size) {
  count_ = tokens > block_ ? (tokens - 1) / block_ : 0;
}

void StreamBlocks::read(int64_t index, int32_t* out) const {
  const int64_t at = first_ + index * block_;
  stream_->read(at, block_ + 1, out);
  for (int64_t i = 0; i <= block_; ++i)
    if (out[i] < 0 || out[i] >= vocab_)
      throw DataError(
          fmt::format("token {} at {} is not below data.vocab_size = {} (another "
                      "tokenizer's shards, or the wrong dtype)",
                      out[i] < 0 ? std::string("out of range") : std::to_string(out[i]),
                      stream_->where(at + i), vocab_));
}

namespace {
uint64_t splitmix(uint64_t z) {
  z += 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}
}  // namespace

SeededPermutation::SeededPermutation(uint64_t n, uint64_t seed) : n_(n) {
  uint64_t bits = 2;
  while (bits < 64 && (uint64_t(1) << bits) < n) bits += 2;  // an even number: two equal halves
  half_bits_ = bits / 2;
  mask_ = (uint64_t(1) << half_bits_) - 1;
  for (int r = 0; r < 4; ++r) keys_[r] = splitmix(seed ^ (0xA5A5A5A5ULL * uint64_t(r + 1)));
}

uint64_t SeededPermutation::at(uint64_t i) const {
  // A Feistel network permutes [0, 2^bits); values ≥ n walk on until they land inside (on average
  // fewer than 4 steps: 2^bits < 4n).
  uint64_t x = i;
  do {
    uint64_t left = x >> half_bits_, right = x & mask_;
    for (uint64_t key : keys_) {
      const uint64_t next = left ^ (splitmix(right ^ key) & mask_);
      left = right;
      right = next;
    }
    x = (left << half_bits_) | right;
  } while (x >= n_);
  return x;
}

}  // namespace normlab::data
