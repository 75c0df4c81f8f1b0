#include "util/file_lock.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>

#include "util/atomic_file.h"

namespace fs = std::filesystem;

namespace normlab::util {

namespace {

struct Held {
  int fd = -1;
  int count = 0;
};
std::mutex g_mutex;
std::map<std::string, Held>& held_locks() {
  static std::map<std::string, Held> m;
  return m;
}

int read_pid(int fd) {
  char buf[32] = {0};
  const ssize_t n = ::pread(fd, buf, sizeof buf - 1, 0);
  return n > 0 ? std::atoi(buf) : 0;
}

}  // namespace

std::optional<FileLock> FileLock::try_acquire(const fs::path& file, int* holder) {
  std::error_code ec;
  fs::create_directories(file.parent_path(), ec);
  const std::string key = fs::absolute(file).lexically_normal().string();
  std::lock_guard<std::mutex> guard(g_mutex);
  auto& held = held_locks();
  if (auto it = held.find(key); it != held.end()) {
    // flock conflicts between two descriptors of one process too: reuse the one we hold.
    ++it->second.count;
    return FileLock(key);
  }
  const int fd = ::open(key.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd < 0) throw FileError(fmt::format("cannot open {}: {}", key, std::strerror(errno)));
  if (::flock(fd, LOCK_EX | LOCK_NB) != 0) {
    *holder = read_pid(fd);
    ::close(fd);
    return std::nullopt;
  }
  const std::string pid = fmt::format("{}\n", ::getpid());
  // The lock is what matters; the pid only makes messages better, so a failed write is ignored.
  if (::ftruncate(fd, 0) == 0) (void)!::pwrite(fd, pid.data(), pid.size(), 0);
  held[key] = {fd, 1};
  return FileLock(key);
}

FileLock& FileLock::operator=(FileLock&& other) noexcept {
  if (this != &other) {
    release();
    key_ = std::move(other.key_);
    other.key_.clear();
  }
  return *this;
}

FileLock::~FileLock() { release(); }

void FileLock::release() noexcept {
  const std::string key = std::move(key_);
  key_.clear();
  if (key.empty()) return;
  std::lock_guard<std::mutex> guard(g_mutex);
  auto& held = held_locks();
  auto it = held.find(key);
  if (it == held.end() || --it->second.count > 0) return;
  ::close(it->second.fd);  // releases the flock
  held.erase(it);
}

int lock_holder(const fs::path& file, bool* held) {
  *held = false;
  const int fd = ::open(file.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) return 0;
  int pid = 0;
  if (::flock(fd, LOCK_SH | LOCK_NB) != 0 && errno == EWOULDBLOCK) {
    *held = true;
    pid = read_pid(fd);
  }
  ::close(fd);
  return pid;
}

}  // namespace normlab::util
