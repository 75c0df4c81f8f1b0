// An exclusive lock on a directory's lock file (flock): the kernel releases it when the process
// exits, crashes or is killed, so a stale lock file never blocks anyone. The file holds the
// holder's pid, for messages. No LibTorch here.
#pragma once

#include <filesystem>
#include <optional>
#include <string>

namespace normlab::util {

class FileLock {
 public:
  // Takes the lock on `file` (created with its directory), or returns nullopt with `holder` set
  // to the pid written by the process that holds it. A lock this process already holds is taken
  // again (counted): `normlab run-one` holds run.lock while the trainer takes it as well.
  // Throws FileError when the file cannot be created.
  static std::optional<FileLock> try_acquire(const std::filesystem::path& file, int* holder);
  FileLock(FileLock&& other) noexcept : key_(std::move(other.key_)) { other.key_.clear(); }
  FileLock& operator=(FileLock&& other) noexcept;
  FileLock(const FileLock&) = delete;
  ~FileLock();

 private:
  explicit FileLock(std::string key) : key_(std::move(key)) {}
  void release() noexcept;
  std::string key_;  // the lock file's absolute path; empty when moved from
};

// Whether some process holds the lock on `file` (probed without keeping it), and its pid.
int lock_holder(const std::filesystem::path& file, bool* held);

}  // namespace normlab::util
