// Text files: read whole, checked (exists, non-empty, strict UTF-8) and split into lines.
#include <fmt/format.h>

#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <sstream>
#include <system_error>

#include "internal.h"
#include "text_pieces.h"

namespace fs = std::filesystem;

namespace normlab::data::detail {

TextFile read_text_file(const std::string& role, const std::string& path) {
  TextFile f;
  f.role = role;
  f.path = path;
  std::error_code ec;
  auto status = fs::status(path, ec);
  if (!fs::exists(status))
    throw DataError(
        fmt::format("{}: file not found: '{}' (expected a UTF-8 text file, one sentence per line)",
                    role, path));
  if (!fs::is_regular_file(status))
    throw DataError(
        fmt::format("{}: '{}' is not a regular file (expected a UTF-8 text file)", role, path));
  std::ifstream in(path, std::ios::binary);
  if (!in)
    throw DataError(fmt::format("{}: cannot open '{}': {}", role, path, std::strerror(errno)));
  std::ostringstream ss;
  ss << in.rdbuf();
  if (in.bad()) throw DataError(fmt::format("{}: error reading '{}'", role, path));
  f.bytes = std::move(ss).str();
  const std::string_view all(f.bytes);
  if (const std::string what = unsupported_format(
          all.substr(0, 512), all.substr(all.size() - std::min<size_t>(all.size(), 12)),
          int64_t(all.size()));
      !what.empty())
    throw DataError(fmt::format("{}: '{}': {}", role, path, what));
  if (f.bytes.empty())
    throw DataError(
        fmt::format("{}: file '{}' is empty (expected one sentence per line)", role, path));
  f.digest = hash_bytes(f.bytes);
  return f;
}

std::vector<std::string> split_lines(const TextFile& file) {
  std::vector<std::string> lines;
  std::string_view all = file.bytes;
  size_t start = 0;
  if (all.substr(0, 3) == "\xEF\xBB\xBF") start = 3;  // UTF-8 byte order mark
  size_t line_no = 0;
  while (start < all.size()) {
    size_t end = all.find('\n', start);
    if (end == std::string_view::npos) end = all.size();
    std::string_view line = all.substr(start, end - start);
    ++line_no;
    if (!line.empty() && line.back() == '\r') line.remove_suffix(1);
    size_t bad = find_invalid_utf8(line);
    if (bad != std::string_view::npos)
      throw DataError(
          fmt::format("{}: {}:{}: invalid UTF-8 at byte {} of the line (file offset {}, byte "
                      "0x{:02X}); expected UTF-8 text",
                      file.role, file.path, line_no, bad + 1, start + bad,
                      static_cast<unsigned char>(line[bad])));
    lines.emplace_back(line);
    start = end + 1;
  }
  return lines;
}

void check_parallel(const TextFile& src, size_t src_lines, const TextFile& tgt, size_t tgt_lines) {
  if (src_lines != tgt_lines)
    throw DataError(
        fmt::format("{}/{}: parallel files differ in length: '{}' has {} lines, '{}' has {} lines "
                    "(line i of one must "
                    "translate line i of the other)",
                    src.role, tgt.role.substr(tgt.role.rfind('.') + 1), src.path, src_lines,
                    tgt.path, tgt_lines));
}

}  // namespace normlab::data::detail
