#include "run/checksums.h"

#include <fmt/format.h>

#include <fstream>

#include "util/atomic_file.h"

namespace fs = std::filesystem;

namespace normlab {

// sha256sum's format: "<64 hex>  <name>" per line.
std::multimap<std::string, std::string> read_sums_file(const fs::path& path) {
  std::multimap<std::string, std::string> sums;
  std::ifstream f(path);
  std::string line;
  while (std::getline(f, line))
    if (line.size() >= 67 && line.compare(64, 2, "  ") == 0)
      sums.emplace(line.substr(66), line.substr(0, 64));
  return sums;
}

std::string checksum_problem(const fs::path& file) {
  std::error_code ec;
  if (!fs::is_regular_file(file, ec)) return "no such file";
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
