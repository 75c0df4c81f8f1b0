// Reading `normlab data tokenize`'s inputs: plain files in blocks, .gz/.zst decompressed through
// libarchive (zlib, libzstd: no external programs), split into lines, and cut at line starts into
// pieces of about a given size — a compressed input too, its pieces being ranges of its
// decompressed text (issue 59.6: one piece per compressed file capped --jobs at the file count and
// made 130 MB+ shards). No LibTorch.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace normlab::data {

bool is_compressed(const std::filesystem::path& p);  // .gz or .zst
bool is_jsonl(const std::filesystem::path& p);       // .jsonl or .json, compressed or not

// What a file whose text starts with `head` (its first bytes, 512 are enough) is, when it is a
// format normlab does not read as text ("a Parquet file", "a ZIP archive", gzip data not named
// .gz …) and how to go on, for an error message; empty for anything else. Issue 59.11: a Parquet
// file failed as "invalid UTF-8 at byte 24". `tail` (its last bytes, 12 are enough) and `size`,
// when known (size -1: a stream), decide Parquet by its footer. Issue 66.20: text beginning
// "PAR1" or with "ustar" at byte 257 is text: Parquet needs its footer ("\0", a length, "PAR1")
// where the end is known, else binary bytes in its head; tar a header whose checksum is right.
std::string unsupported_format(std::string_view head, std::string_view tail = {},
                               int64_t size = -1);

// Line `number` (from 1) of the bytes fed, without its "\n" or "\r\n".
using LineFn = std::function<void(std::string_view line, int64_t number)>;

// Splits bytes fed in blocks into lines. A line longer than `max_line_bytes` is refused as soon as
// it is seen (DataError naming `where` and the line): SentencePiece needs ~100 bytes per byte of a
// line, so one 20 MB line took 2.6 GiB (issue 56.11).
class LineSplitter {
 public:
  LineSplitter(std::string where, int64_t max_line_bytes, LineFn line);
  void feed(const char* data, size_t n);
  void finish();  // the last line when it has no "\n"

 private:
  [[noreturn]] void too_long(int64_t bytes, bool whole) const;
  std::string where_, pending_;
  int64_t max_line_bytes_, number_ = 0;
  LineFn line_;
};

// The decompressed bytes of a .gz/.zst file, in blocks of up to 1 MiB. DataError when it cannot be
// read, is truncated or corrupt, or is a tar archive.
void decompress(const std::filesystem::path& path,
                const std::function<void(const char* data, size_t n)>& sink);

// Bytes [begin, end) of `path`'s text (end -1: to its end) in blocks of up to 1 MiB; a compressed
// file is decompressed from its start. Read from its start, a file of another format is refused
// (unsupported_format).
void read_text(const std::filesystem::path& path, int64_t begin, int64_t end,
               const std::function<void(const char* data, size_t n)>& sink);

// The lines of bytes [begin, end) of `path`'s text (read_text). `bytes_read` (optional) counts the
// text bytes read.
void for_each_line(const std::filesystem::path& path, int64_t begin, int64_t end,
                   int64_t max_line_bytes, const LineFn& line,
                   std::atomic<int64_t>* bytes_read = nullptr);

// `path`'s text (decompressed for .gz/.zst: one pass) cut at the first line start after every
// `piece_bytes` — with `paragraphs`, at the first line after an empty line ("\n\n"), so that no
// paragraph is cut: the [begin, end) ranges, covering it all, in order (one, maybe empty, at
// least).
std::vector<std::pair<int64_t, int64_t>> cut_into_pieces(const std::filesystem::path& path,
                                                         int64_t piece_bytes,
                                                         bool paragraphs = false);

}  // namespace normlab::data
