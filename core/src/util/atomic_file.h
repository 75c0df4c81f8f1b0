// Files that readers see whole or not at all, durable once written: data goes to a temporary file
// in the target's directory, which is fsync'ed, renamed over the target, and the directory
// fsync'ed. No LibTorch here.
#pragma once

#include <cstddef>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <string_view>

struct evp_md_ctx_st;  // OpenSSL's EVP_MD_CTX

namespace normlab::util {

// One line: "cannot write PATH: <cause>" (ENOSPC, EIO, EFBIG, …).
class FileError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// Incremental SHA-256 (OpenSSL); hex() finishes it.
class Sha256 {
 public:
  Sha256();
  ~Sha256();
  Sha256(const Sha256&) = delete;
  Sha256& operator=(const Sha256&) = delete;
  void update(const void* data, size_t size);
  std::string hex();

 private:
  evp_md_ctx_st* ctx_;
};
// SHA-256 of a file's bytes as hex; throws FileError when it cannot be read.
std::string sha256_file(const std::filesystem::path& path);

class AtomicFile {
 public:
  // Creates the target's directory and a fresh temporary next to the target.
  explicit AtomicFile(std::filesystem::path target);
  // Removes the temporary unless publish() succeeded.
  ~AtomicFile();
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;

  // Never throws (it is called from inside LibTorch's archive writer, where an exception would
  // abort the process): the first error is remembered and reported by finish().
  void append(const void* data, size_t size);
  void append(std::string_view text) { append(text.data(), text.size()); }
  // Flushes and fsyncs the temporary; returns the SHA-256 of the bytes. Throws FileError.
  std::string finish();
  // Renames the temporary over the target and fsyncs the directory. Throws FileError.
  void publish();
  // finish() + publish(); returns the SHA-256.
  std::string commit();

  const std::filesystem::path& target() const { return target_; }

 private:
  [[noreturn]] void fail(int err);
  std::filesystem::path target_, tmp_;
  int fd_ = -1;
  int error_ = 0;
  bool published_ = false;
  Sha256 hash_;
};

// Replaces `path` by `text` atomically and durably (AtomicFile). Throws FileError.
void write_file_atomically(const std::filesystem::path& path, std::string_view text);

// Removes the temporaries (NAME.tmp.PID.N) directly inside `dir` that a process now dead left
// behind (kill -9 in the middle of a write); a live process's are left alone. Returns how many
// went.
int remove_stale_temporaries(const std::filesystem::path& dir);

// fsync of a directory, so that a rename or unlink inside it survives a crash. Throws FileError.
void sync_directory(const std::filesystem::path& dir);

}  // namespace normlab::util
