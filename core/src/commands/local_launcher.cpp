#include "local_launcher.h"

#include <arpa/inet.h>
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <netinet/in.h>
#include <signal.h>
#include <sys/prctl.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <ostream>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "normlab/runtime_env.h"
#include "normlab/train/trainer.h"
#include "train/run_directory.h"

extern char** environ;

namespace normlab {
namespace {

std::atomic<int> g_forward{0};
extern "C" void remember_launcher_signal(int sig) { g_forward = sig; }

// A TCP port on loopback that is free now (the kernel's choice).
int free_port() {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  socklen_t len = sizeof a;
  if (fd < 0 || ::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a) != 0 ||
      ::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len) != 0) {
    if (fd >= 0) ::close(fd);
    throw std::runtime_error(
        fmt::format("no free TCP port on 127.0.0.1: {}", std::strerror(errno)));
  }
  ::close(fd);
  return ntohs(a.sin_port);
}

std::vector<std::string> rank_environment(int rank, int nproc, int port) {
  static const char* kOwn[] = {
      "RANK=",        "LOCAL_RANK=",  "WORLD_SIZE=",          "LOCAL_WORLD_SIZE=",
      "MASTER_ADDR=", "MASTER_PORT=", "NORMLAB_LAUNCHER_PID="};
  std::vector<std::string> env;
  for (char** e = environ; *e; ++e) {
    bool own = false;
    for (const char* k : kOwn) own = own || std::strncmp(*e, k, std::strlen(k)) == 0;
    if (!own) env.emplace_back(*e);
  }
  for (const std::string& kv :
       {fmt::format("RANK={}", rank), fmt::format("LOCAL_RANK={}", rank),
        fmt::format("WORLD_SIZE={}", nproc), fmt::format("LOCAL_WORLD_SIZE={}", nproc),
        std::string("MASTER_ADDR=127.0.0.1"), fmt::format("MASTER_PORT={}", port),
        fmt::format("{}={}", kLauncherPidVariable, ::getpid())})
    env.push_back(kv);
  return env;
}

pid_t start_rank(std::vector<std::string> args, std::vector<std::string> env) {
  std::vector<char*> argv, envp;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  for (auto& e : env) envp.push_back(e.data());
  envp.push_back(nullptr);
  const pid_t parent = ::getpid();
  const pid_t pid = ::fork();
  if (pid ==
      0) {  // async-signal-safe calls only until exec; a launcher killed outright stops its ranks
    ::prctl(PR_SET_PDEATHSIG, SIGTERM);
    if (::getppid() != parent) ::_exit(130);
    ::execve(argv[0], argv.data(), envp.data());
    ::_exit(127);
  }
  if (pid < 0) throw std::runtime_error(fmt::format("fork failed: {}", std::strerror(errno)));
  return pid;
}

std::string describe(int status) {
  return WIFSIGNALED(status) ? fmt::format("was killed by signal {} ({})", WTERMSIG(status),
                                           strsignal(WTERMSIG(status)))
                             : fmt::format("exited with code {}", WEXITSTATUS(status));
}

}  // namespace

bool started_by_local_launcher() {
  const char* v = std::getenv(kLauncherPidVariable);
  return v && std::to_string(::getppid()) == v;
}

int launch_local_ranks(int nproc, double grace_s, const std::filesystem::path& run_dir,
                       std::ostream& err) {
  // Each rank is this command again, through the dynamic loader too (issue 66.16).
  const std::vector<std::string> args = self_command_line();
  const int port = free_port();
  struct sigaction sa {
  }, old_int{}, old_term{};
  sa.sa_handler = remember_launcher_signal;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGINT, &sa, &old_int);
  sigaction(SIGTERM, &sa, &old_term);
  using Clock = std::chrono::steady_clock;
  std::vector<pid_t> pids;
  std::vector<int> status(size_t(nproc), 0);
  std::vector<bool> running(size_t(nproc), true);
  for (int r = 0; r < nproc; ++r)
    pids.push_back(start_rank(args, rank_environment(r, nproc, port)));
  int alive = nproc;
  std::optional<Clock::time_point> stop_at, kill_at;
  while (alive > 0) {
    if (const int sig = g_forward.exchange(0))  // the launcher's signal is every rank's
      for (int r = 0; r < nproc; ++r)
        if (running[size_t(r)]) ::kill(pids[size_t(r)], sig);
    int st = 0;
    const pid_t pid = ::waitpid(-1, &st, WNOHANG);
    for (int r = 0; pid > 0 && r < nproc; ++r) {
      if (pids[size_t(r)] != pid) continue;
      running[size_t(r)] = false, status[size_t(r)] = st, --alive;
      const bool failed = !(WIFEXITED(st) && WEXITSTATUS(st) == 0);
      if (failed && !stop_at && alive > 0) {
        fmt::print(err, "normlab: rank {} (pid {}) {}; the other ranks stop (within {:g} s)\n", r,
                   pid, describe(st), grace_s);
        stop_at = Clock::now() + std::chrono::milliseconds(int64_t(grace_s * 1000));
      }
    }
    if (stop_at && !kill_at && Clock::now() > *stop_at) {
      for (int r = 0; r < nproc; ++r)
        if (running[size_t(r)]) ::kill(pids[size_t(r)], SIGTERM);
      kill_at = Clock::now() + std::chrono::seconds(10);
    }
    if (kill_at && Clock::now() > *kill_at)
      for (int r = 0; r < nproc; ++r)
        if (running[size_t(r)]) ::kill(pids[size_t(r)], SIGKILL);
    if (pid <= 0) std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  sigaction(SIGINT, &old_int, nullptr);
  sigaction(SIGTERM, &old_term, nullptr);
  const int s0 = status[0];
  if (!WIFSIGNALED(s0)) return WEXITSTATUS(s0);
  const std::string note =
      fmt::format("rank 0 (pid {}) {}; run the same command to resume", pids[0], describe(s0));
  if (mark_interrupted_if_running(run_dir, pids[0], note))
    fmt::print(err, "normlab: {} (status.json: interrupted)\n", note);
  return kExitInterrupted;
}

}  // namespace normlab
