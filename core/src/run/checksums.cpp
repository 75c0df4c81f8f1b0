#include "run/checksums.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <fstream>

#include "util/atomic_file.h"

namespace fs = std::filesystem;

namespace normlab {

// sha256sum's format: "<64 hex> <mode><name>" per line, mode ' ' (text) or '*' (binary, `-b`);
// `sha256sum -c` takes either case of hex digits, so do we.
std::multimap<std::string, std::string> read_sums_file(const fs::path& path) {
  std::multimap<std::string, std::string> sums;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line)) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    if (line.size() < 67 || line[64] != ' ' || (line[65] != ' ' && line[65] != '*')) continue;
    std::string hash = line.substr(0, 64);
    if (!std::all_of(hash.begin(), hash.end(), [](unsigned char c) { return std::isxdigit(c); }))
      continue;
    std::transform(hash.begin(), hash.end(), hash.begin(),
                   [](unsigned char c) { return char(std::tolower(c)); });
    sums.emplace(line.substr(66), hash);
  }
  return sums;
}

std::string file_kind_problem(const fs::path& file) {
  std::error_code ec;
  const fs::file_status st =
      fs::status(file, ec);  // follows links: a link to /dev/zero is a device
  if (fs::is_regular_file(st)) return "";
  if (st.type() == fs::file_type::not_found || ec) {
    if (fs::is_symlink(fs::symlink_status(file, ec))) return "a symbolic link to nothing";
    return "no such file";
  }
  if (fs::is_directory(st)) return "a folder, not a checkpoint file";
  const char* what = fs::is_fifo(st)             ? "a FIFO"
                     : fs::is_socket(st)         ? "a socket"
                     : fs::is_character_file(st) ? "a character device"
                     : fs::is_block_file(st)     ? "a block device"
                                                 : "not a regular file";
  return fmt::format("{}, not a checkpoint file (reading it could block or never end)", what);
}

std::string checksum_problem(const fs::path& file) {
  std::error_code ec;
  if (const std::string kind = file_kind_problem(file); !kind.empty()) return kind;
  // A checkpoint given by path may live elsewhere: its own folder's SHA256SUMS.
  const fs::path sums_file = file.parent_path() / "SHA256SUMS";
  if (!fs::exists(sums_file, ec))
    return fmt::format(
        "no {} beside it to check it against (normlab writes one with every checkpoint)",
        sums_file.string());
  const auto sums = read_sums_file(sums_file);
  if (sums.find(file.filename().string()) == sums.end())
    return fmt::format("{} does not list it", sums_file.string());
  std::string actual;
  try {
    actual = util::sha256_file(file);
  } catch (const util::FileError& e) {
    return e.what();
  }
  // Any checkpoint this run wrote is good under any name (step_N copied over last to roll back).
  for (const auto& [name, hash] : sums)
    if (hash == actual) return "";
  return fmt::format("its SHA-256 {}… is not the one recorded in {} (truncated or damaged)",
                     actual.substr(0, 12), sums_file.string());
}

void verify_checksum(const fs::path& file, bool allow_unverified) {
  // --allow-unverified skips the checksum, never this: a FIFO would block the reader forever.
  if (const std::string kind = file_kind_problem(file); !kind.empty())
    throw CheckpointError(fmt::format("checkpoint {}: {}", file.string(), kind));
  if (allow_unverified) return;
  const std::string problem = checksum_problem(file);
  if (!problem.empty())
    throw CheckpointError(fmt::format(
        "checkpoint {}: {}; to use it anyway, pass --allow-unverified", file.string(), problem));
}

std::string legacy_checkpoint_hint(const fs::path& run_dir) {
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(run_dir / "checkpoints", ec))
    if (e.path().extension() == ".pt")
      return fmt::format(
          " ({} holds checkpoints of the old TorchScript format, which normlab no longer reads: "
          "loading one can run code stored in it; if you trust them, convert them with "
          "`normlab checkpoint convert {} --trust-code`)",
          (run_dir / "checkpoints").string(), run_dir.string());
  return "";
}

}  // namespace normlab
