#include "text_pieces.h"

#include <archive.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstring>
#include <fstream>
#include <memory>

#include "internal.h"

namespace fs = std::filesystem;

namespace normlab::data {
namespace {

bool ends_with(const std::string& s, const std::string& tail) {
  return s.size() >= tail.size() && s.compare(s.size() - tail.size(), tail.size(), tail) == 0;
}

// Plain bytes [begin, end) in blocks of up to 1 MiB.
void read_plain(const fs::path& path, int64_t begin, int64_t end,
                const std::function<void(const char*, size_t)>& sink) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw DataError(fmt::format("{}: cannot be read", path.string()));
  in.seekg(begin);
  std::vector<char> buf(size_t(1) << 20);
  int64_t left = end < 0 ? INT64_MAX : end - begin;
  while (left > 0 && in) {
    in.read(buf.data(), std::streamsize(std::min<int64_t>(left, int64_t(buf.size()))));
    const auto got = in.gcount();
    if (got <= 0) break;
    sink(buf.data(), size_t(got));
    left -= got;
  }
}

// Bytes no UTF-8 text holds: a NUL, or a byte breaking UTF-8 before the last 3 (a character may be
// cut at the end of `head`).
bool looks_binary(std::string_view head) {
  if (head.find('\0') != std::string_view::npos) return true;
  const size_t bad = util::find_invalid_utf8(head);
  return bad != std::string_view::npos && bad + 3 < head.size();
}

// A Parquet file ends with its footer (Thrift, whose last byte is a struct's stop byte, 0), the
// footer's length (little-endian, 4 bytes) and "PAR1".
bool parquet_footer(std::string_view tail, int64_t size) {
  if (size < 12 || tail.size() < 9 || tail.substr(tail.size() - 4) != "PAR1") return false;
  const auto* t = reinterpret_cast<const unsigned char*>(tail.data() + tail.size() - 8);
  const uint32_t length =
      uint32_t(t[0]) | uint32_t(t[1]) << 8 | uint32_t(t[2]) << 16 | uint32_t(t[3]) << 24;
  return tail[tail.size() - 9] == '\0' && int64_t(length) <= size - 12;
}

// A POSIX or GNU tar header: "ustar" at 257 and the checksum at 148 (octal) equal to the sum of the
// header's 512 bytes with the checksum's 8 counted as spaces (unsigned, or signed as old tars did).
bool tar_header(std::string_view head) {
  if (head.size() < 512 || head.substr(257, 5) != "ustar") return false;
  int64_t sum_unsigned = 0, sum_signed = 0;
  for (size_t i = 0; i < 512; ++i) {
    const char c = i >= 148 && i < 156 ? ' ' : head[i];
    sum_unsigned += static_cast<unsigned char>(c);
    sum_signed += static_cast<signed char>(c);
  }
  size_t i = 148;
  while (i < 156 && head[i] == ' ') ++i;
  int64_t stored = 0;
  size_t digits = 0;
  for (; i < 156 && head[i] >= '0' && head[i] <= '7'; ++i, ++digits)
    stored = stored * 8 + (head[i] - '0');
  if (digits == 0 || (i < 156 && head[i] != ' ' && head[i] != '\0')) return false;
  return stored == sum_unsigned || stored == sum_signed;
}

}  // namespace

std::string unsupported_format(std::string_view head, std::string_view tail, int64_t size) {
  const auto starts = [&](std::string_view magic) { return head.substr(0, magic.size()) == magic; };
  constexpr const char* kTo = "; normlab reads plain text, .gz/.zst and JSONL";
  // Where the end is known, the footer decides: text with a NUL or bad UTF-8 after "PAR1" got
  // "a Parquet file" rather than its own error (issue 66, D). A stream's head alone otherwise.
  if (starts("PAR1") && (size >= 0 ? parquet_footer(tail, size) : looks_binary(head)))
    return fmt::format(
        "a Parquet file, not text{}: convert it, e.g. "
        "pandas.read_parquet(IN).to_json(OUT, orient=\"records\", lines=True)",
        kTo);
  if (starts("ARROW1"))
    return fmt::format("an Arrow IPC file, not text{}: convert it to JSONL", kTo);
  if (starts("PK\x03\x04")) return fmt::format("a ZIP archive, not text{}: unpack it", kTo);
  if (starts("BZh") && head.size() >= 10 && head.substr(4, 6) == "1AY&SY")  // + block magic
    return fmt::format("bzip2 data{}: recompress it (bunzip2; zstd)", kTo);
  if (starts(std::string_view("\xFD"
                              "7zXZ\0",
                              6)))
    return fmt::format("xz data{}: recompress it (unxz; zstd)", kTo);
  if (starts("7z\xBC\xAF\x27\x1C")) return fmt::format("a 7-Zip archive, not text{}", kTo);
  if (starts("\x1F\x8B")) return "gzip data in a file not named .gz: name it FILE.gz";
  if (starts("\x28\xB5\x2F\xFD")) return "zstd data in a file not named .zst: name it FILE.zst";
  if (starts("\x93NUMPY"))
    return "a NumPy array, not text: token ids train with data.format = \"npy\"";
  if (starts("%PDF-")) return fmt::format("a PDF document, not text{}", kTo);
  if (tar_header(head))
    return "a tar archive, not text: unpack it (tar -xf) and tokenize its files";
  return {};
}

bool is_compressed(const fs::path& p) {
  const std::string s = p.string();
  return ends_with(s, ".gz") || ends_with(s, ".zst");
}

bool is_jsonl(const fs::path& p) {
  std::string s = p.string();
  for (const char* z : {".gz", ".zst"})
    if (ends_with(s, z)) s.resize(s.size() - std::string(z).size());
  return ends_with(s, ".jsonl") || ends_with(s, ".json");
}

LineSplitter::LineSplitter(std::string where, int64_t max_line_bytes, LineFn line)
    : where_(std::move(where)), max_line_bytes_(max_line_bytes), line_(std::move(line)) {}

void LineSplitter::too_long(int64_t bytes, bool whole) const {
  throw DataError(fmt::format(
      "{}:{}: a line of {}{} bytes, over --max-line-bytes {} (tokenizing it would take ~{} MiB); "
      "split the text into lines, or raise --max-line-bytes",
      where_, number_ + 1, whole ? "" : "more than ", bytes, max_line_bytes_, bytes / 10000));
}

void LineSplitter::feed(const char* data, size_t n) {
  pending_.append(data, n);
  size_t start = 0;
  for (size_t nl; (nl = pending_.find('\n', start)) != std::string::npos; start = nl + 1) {
    std::string_view l(pending_.data() + start, nl - start);
    if (!l.empty() && l.back() == '\r') l.remove_suffix(1);
    if (int64_t(l.size()) > max_line_bytes_) too_long(int64_t(l.size()), true);
    line_(l, ++number_);
  }
  pending_.erase(0, start);
  if (int64_t(pending_.size()) > max_line_bytes_ + 1) too_long(int64_t(pending_.size()), false);
}

void LineSplitter::finish() {
  if (pending_.empty()) return;
  if (int64_t(pending_.size()) > max_line_bytes_) too_long(int64_t(pending_.size()), true);
  line_(std::string_view(pending_), ++number_);
  pending_.clear();
}

void decompress(const fs::path& path, const std::function<void(const char*, size_t)>& sink) {
  std::unique_ptr<struct archive, int (*)(struct archive*)> a(archive_read_new(),
                                                              archive_read_free);
  archive_read_support_filter_gzip(a.get());
  archive_read_support_filter_zstd(a.get());
  archive_read_support_format_raw(a.get());
  struct archive_entry* entry = nullptr;
  if (archive_read_open_filename(a.get(), path.c_str(), 1 << 16) != ARCHIVE_OK ||
      archive_read_next_header(a.get(), &entry) != ARCHIVE_OK)
    throw DataError(
        fmt::format("{}: cannot be read ({})", path.string(),
                    archive_error_string(a.get()) ? archive_error_string(a.get()) : "unreadable"));
  std::vector<char> buf(size_t(1) << 20);
  la_ssize_t n;
  bool first = true;
  while ((n = archive_read_data(a.get(), buf.data(), buf.size())) > 0) {
    // A .tar.gz would be tokenized with its tar headers ("ustar" at byte 257, POSIX tar), a
    // .parquet.gz as bytes.
    if (first)
      if (const std::string what = unsupported_format(std::string_view(buf.data(), size_t(n)));
          !what.empty())
        throw DataError(fmt::format("{}: {}", path.string(), what));
    first = false;
    sink(buf.data(), size_t(n));
  }
  if (n < 0)
    throw DataError(fmt::format(
        "{}: truncated or corrupt ({})", path.string(),
        archive_error_string(a.get()) ? archive_error_string(a.get()) : "no reason given"));
}

void read_text(const fs::path& path, int64_t begin, int64_t end,
               const std::function<void(const char*, size_t)>& sink) {
  if (!is_compressed(path)) {
    if (begin == 0) {
      std::ifstream in(path, std::ios::binary);
      std::string head(512, '\0'), tail(12, '\0');
      in.read(head.data(), std::streamsize(head.size()));
      head.resize(size_t(std::max<std::streamsize>(in.gcount(), 0)));
      in.clear();
      in.seekg(0, std::ios::end);
      const int64_t size = int64_t(in.tellg());
      in.seekg(std::max<int64_t>(size - int64_t(tail.size()), 0));
      in.read(tail.data(), std::streamsize(tail.size()));
      tail.resize(size_t(std::max<std::streamsize>(in.gcount(), 0)));
      if (const std::string what = unsupported_format(head, tail, size); !what.empty())
        throw DataError(fmt::format("{}: {}", path.string(), what));
    }
    read_plain(path, begin, end, sink);
    return;
  }
  int64_t at = 0;  // decompressed bytes seen
  decompress(path, [&](const char* data, size_t n) {
    const int64_t from = std::max<int64_t>(begin - at, 0);
    const int64_t to = end < 0 ? int64_t(n) : std::min<int64_t>(end - at, int64_t(n));
    if (from < to) sink(data + from, size_t(to - from));
    at += int64_t(n);
  });
}

void for_each_line(const fs::path& path, int64_t begin, int64_t end, int64_t max_line_bytes,
                   const LineFn& line, std::atomic<int64_t>* bytes_read) {
  LineSplitter lines(
      begin > 0 ? fmt::format("{} (from byte {})", path.string(), begin) : path.string(),
      max_line_bytes, line);
  read_text(path, begin, end, [&](const char* data, size_t n) {
    lines.feed(data, n);
    if (bytes_read) *bytes_read += int64_t(n);
  });
  lines.finish();
}

std::vector<std::pair<int64_t, int64_t>> cut_into_pieces(const fs::path& path, int64_t piece_bytes,
                                                         bool paragraphs) {
  std::vector<std::pair<int64_t, int64_t>> pieces;
  int64_t begin = 0, at = 0;  // the current piece's start; bytes seen
  char previous = 0;          // the byte before the block (paragraphs: "\n" then "\n")
  auto scan = [&](const char* data, size_t n) {
    // Cut after the first "\n" (paragraphs: "\n\n") ending at or past begin + piece_bytes.
    for (int64_t target = begin + piece_bytes; target < at + int64_t(n);) {
      int64_t k = std::max(target, at) - at;
      for (; k < int64_t(n); ++k) {
        if (data[k] != '\n') continue;
        const char before = k > 0 ? data[k - 1] : previous;
        if (!paragraphs || (before == '\n' && at + k > begin)) break;
      }
      if (k == int64_t(n)) break;
      const int64_t cut = at + k + 1;
      pieces.emplace_back(begin, cut);
      begin = cut;
      target = begin + piece_bytes;
    }
    if (n) previous = data[n - 1];
    at += int64_t(n);
  };
  if (is_compressed(path) || paragraphs) {
    if (is_compressed(path))
      decompress(path, scan);
    else
      read_plain(path, 0, -1, scan);
  } else {  // a plain file is not read: from each target, to the next "\n"
    at = int64_t(fs::file_size(path));
    std::ifstream in(path, std::ios::binary);
    while (begin + piece_bytes < at) {
      int64_t cut = begin + piece_bytes;
      in.seekg(cut);
      char c;
      while (in.get(c) && c != '\n') ++cut;
      cut = std::min(at, cut + 1);
      pieces.emplace_back(begin, cut);
      begin = cut;
    }
  }
  if (begin < at || pieces.empty()) pieces.emplace_back(begin, at);
  return pieces;
}

}  // namespace normlab::data
