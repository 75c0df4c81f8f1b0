#include "util/atomic_file.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <openssl/evp.h>
#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstring>
#include <regex>

namespace fs = std::filesystem;

namespace normlab::util {

namespace {

std::string cannot_write(const fs::path& path, int err) {
  return fmt::format("cannot write {}: {}", path.string(), std::strerror(err));
}

}  // namespace

Sha256::Sha256() : ctx_(EVP_MD_CTX_new()) {
  if (!ctx_ || EVP_DigestInit_ex(ctx_, EVP_sha256(), nullptr) != 1)
    throw std::runtime_error("SHA-256: OpenSSL init failed");
}
Sha256::~Sha256() { EVP_MD_CTX_free(ctx_); }
void Sha256::update(const void* data, size_t size) { EVP_DigestUpdate(ctx_, data, size); }
std::string Sha256::hex() {
  unsigned char md[EVP_MAX_MD_SIZE];
  unsigned int n = 0;
  EVP_DigestFinal_ex(ctx_, md, &n);
  std::string out;
  for (unsigned int i = 0; i < n; ++i) out += fmt::format("{:02x}", md[i]);
  return out;
}

std::string sha256_file(const fs::path& path) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0)
    throw FileError(fmt::format("cannot read {}: {}", path.string(), std::strerror(errno)));
  Sha256 h;
  char buf[1 << 16];
  while (true) {
    const ssize_t n = ::read(fd, buf, sizeof buf);
    if (n == 0) break;
    if (n < 0) {
      if (errno == EINTR) continue;
      const int err = errno;
      ::close(fd);
      throw FileError(fmt::format("cannot read {}: {}", path.string(), std::strerror(err)));
    }
    h.update(buf, size_t(n));
  }
  ::close(fd);
  return h.hex();
}

void sync_directory(const fs::path& dir) {
  const int fd = ::open(dir.empty() ? "." : dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) throw FileError(cannot_write(dir, errno));
  const int rc = ::fsync(fd), err = errno;
  ::close(fd);
  // Some file systems cannot fsync a directory (EINVAL); the rename is still atomic there.
  if (rc != 0 && err != EINVAL) throw FileError(cannot_write(dir, err));
}

AtomicFile::AtomicFile(fs::path target) : target_(std::move(target)) {
  static std::atomic<uint64_t> counter{0};
  std::error_code ec;
  if (target_.has_parent_path()) fs::create_directories(target_.parent_path(), ec);
  if (ec) throw FileError(cannot_write(target_.parent_path(), ec.value()));
  // pid and counter: concurrent writers (threads, processes) never share a temporary.
  tmp_ = target_.string() + fmt::format(".tmp.{}.{}", ::getpid(), counter++);
  fd_ = ::open(tmp_.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd_ < 0) throw FileError(cannot_write(target_, errno));
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!published_) ::unlink(tmp_.c_str());
}

void AtomicFile::append(const void* data, size_t size) {
  if (error_) return;
  hash_.update(data, size);
  const char* p = static_cast<const char*>(data);
  while (size > 0) {
    const ssize_t n = ::write(fd_, p, size);
    if (n < 0) {
      if (errno == EINTR) continue;
      error_ = errno;
      return;
    }
    p += n;
    size -= size_t(n);
  }
}

void AtomicFile::fail(int err) {
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  ::unlink(tmp_.c_str());  // a full disk must not stay full because of us
  throw FileError(cannot_write(target_, err));
}

std::string AtomicFile::finish() {
  if (error_) fail(error_);
  if (fd_ < 0) throw FileError(cannot_write(target_, EBADF));
  if (::fsync(fd_) != 0) fail(errno);
  const int rc = ::close(fd_);
  fd_ = -1;
  if (rc != 0) fail(errno);
  return hash_.hex();
}

void AtomicFile::publish() {
  if (::rename(tmp_.c_str(), target_.c_str()) != 0) fail(errno);
  published_ = true;
  sync_directory(target_.parent_path());
}

std::string AtomicFile::commit() {
  std::string h = finish();
  publish();
  return h;
}

void write_file_atomically(const fs::path& path, std::string_view text) {
  AtomicFile f(path);
  f.append(text);
  f.commit();
}

int remove_stale_temporaries(const std::filesystem::path& dir) {
  static const std::regex temp_name(R"(.+\.tmp\.(\d+)\.\d+)");
  int removed = 0;
  std::error_code ec;
  for (const auto& e : std::filesystem::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (!std::regex_match(name, m, temp_name)) continue;
    const long pid = std::strtol(m[1].str().c_str(), nullptr, 10);
    if (pid <= 0 || pid == long(::getpid()) || !(::kill(pid_t(pid), 0) == -1 && errno == ESRCH))
      continue;
    std::error_code rm;
    if (std::filesystem::remove(e.path(), rm)) ++removed;
  }
  return removed;
}

}  // namespace normlab::util
