// Checkpoint checksums: sha256sum's SHA256SUMS beside the files, checked wherever a checkpoint is
// used (resume, eval, translate, forward, export), and the old format's hint. No LibTorch here.
#pragma once

#include <filesystem>
#include <map>
#include <stdexcept>
#include <string>

namespace normlab {

// A checkpoint that cannot be used: fails its checksum, unreadable, of another format or of
// another model (one line naming the file and what to do).
class CheckpointError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// sha256sum's format: "<64 hex>  <name>" per line; file name → SHA-256 hex (a name may repeat).
std::multimap<std::string, std::string> read_sums_file(const std::filesystem::path& path);

// "" when `file` is a regular file (or a link to one); else what it is: no such file, a folder, a
// FIFO, a device, … (never opened: a FIFO would block).
std::string file_kind_problem(const std::filesystem::path& file);
// "" when `file`'s SHA-256 is one that the SHA256SUMS beside it lists (a step_N.safetensors copied
// over last.safetensors is good); else what is wrong: no such file, no SHA256SUMS, not listed, or
// another checksum (truncated or damaged).
std::string checksum_problem(const std::filesystem::path& file);
// Throws CheckpointError naming `file` and its checksum problem, with how to override it; nothing
// when the checksum matches or `allow_unverified`.
void verify_checksum(const std::filesystem::path& file, bool allow_unverified);
// " (…convert…)" when checkpoints/ holds *.pt files of the old TorchScript format, else "".
std::string legacy_checkpoint_hint(const std::filesystem::path& run_dir);

}  // namespace normlab
