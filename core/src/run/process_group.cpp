#include "process_group.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <signal.h>
#include <unistd.h>

#include <cerrno>
#include <condition_variable>
#include <cstdlib>
#include <fstream>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>
#include <torch/csrc/distributed/c10d/PrefixStore.hpp>
#include <torch/csrc/distributed/c10d/ProcessGroupGloo.hpp>
#include <torch/csrc/distributed/c10d/TCPStore.hpp>
#if NORMLAB_WITH_NCCL
#include <torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp>
#endif

namespace normlab {
namespace {

// An integer environment variable; `fallback` when unset.
int env_int(const char* name, int fallback, int min) {
  const char* v = std::getenv(name);
  if (!v || !*v) return fallback;
  char* end = nullptr;
  errno = 0;
  const long n = std::strtol(v, &end, 10);
  if (*end || errno || n < min || n > 1 << 20)
    throw std::invalid_argument(
        fmt::format("environment variable {}={}: expected an integer ≥ {}", name, v, min));
  return int(n);
}

std::string env_str(const char* name, const std::string& fallback) {
  const char* v = std::getenv(name);
  return v && *v ? std::string(v) : fallback;
}

std::string first_line(const std::string& s) { return s.substr(0, s.find('\n')); }

std::string host_name() {
  char host[256] = {0};
  gethostname(host, sizeof host - 1);
  return host;
}

// Whether a process of this host is still running (a zombie, not yet reaped by its launcher, is
// not).
bool running(int pid) {
  std::ifstream stat(fmt::format("/proc/{}/stat", pid));
  std::string line;
  if (!std::getline(stat, line)) return ::kill(pid, 0) == 0 || errno != ESRCH;
  const size_t close = line.rfind(')');  // "pid (comm) S …": the state follows the command name
  const char state = close != std::string::npos && close + 2 < line.size() ? line[close + 2] : 'R';
  return state != 'Z' && state != 'X';
}

// c10d logs every failed connection attempt (about once a second until the timeout) on stderr; the
// rendezvous says what failed in one line of its own, so stderr is closed while c10d connects
// (issue 42.12). `saved()` is the real stderr, for the deadline's line.
class QuietStderr {
 public:
  QuietStderr() : saved_(::dup(STDERR_FILENO)) {
    const int null = ::open("/dev/null", O_WRONLY | O_CLOEXEC);
    if (saved_ >= 0 && null >= 0) ::dup2(null, STDERR_FILENO);
    if (null >= 0) ::close(null);
  }
  ~QuietStderr() {
    if (saved_ < 0) return;
    ::dup2(saved_, STDERR_FILENO);
    ::close(saved_);
  }
  QuietStderr(const QuietStderr&) = delete;
  QuietStderr& operator=(const QuietStderr&) = delete;
  int saved() const { return saved_ >= 0 ? saved_ : STDERR_FILENO; }

 private:
  int saved_;
};

// Ends the process with one line (exit 2, as a JoinError) when a step of the rendezvous outlives
// its deadline: c10d's TCPStore client waits without bound for an answer from whatever accepted
// its connection (a rank waited minutes on an HTTP server holding MASTER_PORT; issue 42.3).
class JoinDeadline {
 public:
  JoinDeadline(std::chrono::milliseconds limit, std::string line, int fd)
      : thread_([this, limit, line = std::move(line), fd] {
          std::unique_lock<std::mutex> lock(mutex_);
          if (cv_.wait_for(lock, limit, [this] { return done_; })) return;
          const std::string text = "normlab: error: " + line + "\n";
          [[maybe_unused]] const ssize_t n = ::write(fd, text.data(), text.size());
          ::_exit(2);
        }) {}
  ~JoinDeadline() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      done_ = true;
    }
    cv_.notify_all();
    thread_.join();
  }
  JoinDeadline(const JoinDeadline&) = delete;
  JoinDeadline& operator=(const JoinDeadline&) = delete;

 private:
  std::mutex mutex_;
  std::condition_variable cv_;
  bool done_ = false;
  std::thread thread_;
};

// The bound of one rendezvous step: the job's timeout, and a little for the answer after a
// connection made at its end.
std::chrono::milliseconds step_deadline(std::chrono::milliseconds timeout) {
  return timeout + std::chrono::milliseconds(3000);
}

}  // namespace

DistEnv dist_env_from_environment() {
  DistEnv e;
  if (std::getenv("WORLD_SIZE")) {  // torchrun, normlab train --nproc
    e.launcher = "env";
    e.world = env_int("WORLD_SIZE", 1, 1);
    e.rank = env_int("RANK", 0, 0);
    e.local_rank = env_int("LOCAL_RANK", e.rank, 0);
    e.local_world = env_int("LOCAL_WORLD_SIZE", e.world, 1);
    e.master_addr = env_str("MASTER_ADDR", "127.0.0.1");
    e.master_port = env_int("MASTER_PORT", 29500, 1);
  } else if (std::getenv("SLURM_PROCID") && std::getenv("SLURM_STEP_NUM_TASKS")) {  // one srun step
    e.launcher = "slurm";
    e.world = env_int("SLURM_STEP_NUM_TASKS", 1, 1);
    e.rank = env_int("SLURM_PROCID", 0, 0);
    e.local_rank = env_int("SLURM_LOCALID", 0, 0);
    // "2(x3)" or "2,1": this node's count is what matters for threads; the first is close enough.
    e.local_world = std::max(1, std::atoi(env_str("SLURM_STEP_TASKS_PER_NODE", "1").c_str()));
    e.master_addr = env_str("MASTER_ADDR", env_str("SLURM_LAUNCH_NODE_IPADDR", "127.0.0.1"));
    // A port per job, so array tasks sharing a node do not meet.
    e.master_port = env_int("MASTER_PORT", 20000 + env_int("SLURM_JOB_ID", 0, 0) % 20000, 1);
  }
  if (e.rank >= e.world)
    throw std::invalid_argument(
        fmt::format("rank {} is not below the world size {} (environment)", e.rank, e.world));
  if (e.master_port > 65535)
    throw std::invalid_argument(
        fmt::format("MASTER_PORT {}: expected a TCP port (1-65535)", e.master_port));
  return e;
}

struct ProcessGroup::C10d {
  c10::intrusive_ptr<c10d::Store> store;
  c10::intrusive_ptr<c10d::ProcessGroupGloo> gloo;
#if NORMLAB_WITH_NCCL
  c10::intrusive_ptr<c10d::ProcessGroupNCCL> nccl;
#endif
  template <class F>
  void run(F&& op) {
#if NORMLAB_WITH_NCCL
    if (nccl) return (void)op(*nccl)->wait();
#endif
    op(*gloo)->wait();
  }
};

std::unique_ptr<ProcessGroup> ProcessGroup::join(const DistEnv& env, const std::string& backend,
                                                 const std::string& device,
                                                 const std::string& fingerprint,
                                                 std::chrono::milliseconds timeout) {
  std::unique_ptr<ProcessGroup> g(new ProcessGroup());
  g->env_ = env;
  g->backend_ = backend;
  g->timeout_ = timeout;
  g->c10d_ = std::make_unique<C10d>();
  const std::string where = fmt::format("{}:{}", env.master_addr, env.master_port);
  const double seconds = double(timeout.count()) / 1000.0;
  try {
    c10d::TCPStoreOptions o;
    o.port = uint16_t(env.master_port);
    o.isServer = env.rank == 0;
    o.numWorkers = size_t(env.world);
    o.timeout = timeout;
    QuietStderr quiet;
    JoinDeadline deadline(
        step_deadline(timeout),
        fmt::format("rank {}: no answer from rank 0's c10d store at {} within {:g} s "
                    "(run.dist_timeout_s): something there {} but did not answer as a store; is "
                    "another program using MASTER_PORT {}?",
                    env.rank, where, seconds,
                    env.rank == 0 ? "held the port" : "accepted the connection", env.master_port),
        quiet.saved());
    g->c10d_->store = c10::make_intrusive<c10d::TCPStore>(env.master_addr, o);
  } catch (const std::exception& e) {
    throw JoinError(fmt::format(
        "rank {} could not join the job of {} ranks at {} within {:g} s (run.dist_timeout_s): {}{}",
        env.rank, env.world, where, seconds, first_line(e.what()),
        env.rank == 0 ? "; did every rank start? (for rank 0: is the port free?)"
                      : "; is rank 0 running there?"));
  }
  c10d::Store& store = *g->c10d_->store;
  // Reading what the others registered waits for them: bounded by the store's timeout, and by a
  // deadline in case the store stops answering.
  std::optional<JoinDeadline> registered;
  registered.emplace(step_deadline(timeout) * 2,
                     fmt::format("rank {}: the ranks did not all register at {} within {:g} s "
                                 "(run.dist_timeout_s): rank 0's store stopped answering",
                                 env.rank, where, seconds),
                     STDERR_FILENO);
  // Who is who (for fault messages and env.json), and whether every rank runs the same experiment.
  const std::string me =
      fmt::format("{}\n{}\n{}\n{}", ::getpid(), host_name(), device, fingerprint);
  store.set(fmt::format("rank/{}", env.rank), std::vector<uint8_t>(me.begin(), me.end()));
  std::string mismatch;
  for (int r = 0; r < env.world; ++r) {
    std::vector<uint8_t> v;
    try {
      v = store.get(fmt::format("rank/{}", r));
    } catch (const std::exception& e) {
      throw JoinError(fmt::format("rank {} did not join within {:g} s (run.dist_timeout_s): {}", r,
                                  seconds, first_line(e.what())));
    }
    std::istringstream in(std::string(v.begin(), v.end()));
    RankInfo info;
    std::string print;
    info.rank = r;
    in >> info.pid >> info.host >> info.device >> print;
    if (print != fingerprint && mismatch.empty())
      mismatch = fmt::format(
          "rank {} runs another experiment than rank {} (resolved manifest sha256 {}… vs {}…): "
          "every rank must be given the same manifest and --set overrides",
          r, env.rank, print.substr(0, 12), fingerprint.substr(0, 12));
    g->ranks_.push_back(info);
  }
  // Rank 0 hosts the store: it stays until every rank has read what it needs from it.
  g->wait_for_all("checked");
  registered.reset();
  if (!mismatch.empty()) throw JoinError(mismatch);
  try {
    QuietStderr quiet;
    JoinDeadline deadline(
        step_deadline(timeout),
        fmt::format("rank {}: the ranks did not connect to each other ({}) within "
                    "{:g} s (run.dist_timeout_s)",
                    env.rank, backend, seconds),
        quiet.saved());
    auto prefixed = c10::make_intrusive<c10d::PrefixStore>("group", g->c10d_->store);
    if (backend == "nccl") {
#if NORMLAB_WITH_NCCL
      auto opts = c10d::ProcessGroupNCCL::Options::create();
      opts->timeout = timeout;
      g->c10d_->nccl =
          c10::make_intrusive<c10d::ProcessGroupNCCL>(prefixed, env.rank, env.world, opts);
#else
      throw JoinError("run.dist_backend = \"nccl\": this build's LibTorch has no NCCL (use gloo)");
#endif
    } else {
      auto opts = c10d::ProcessGroupGloo::Options::create(timeout);
      // Loopback jobs talk over loopback; others over the interface GLOO_SOCKET_IFNAME names, else
      // the one this host's name resolves to.
      const char* ifname = std::getenv("GLOO_SOCKET_IFNAME");
      if (ifname && *ifname)
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForInterface(ifname));
      else if (env.master_addr == "127.0.0.1" || env.master_addr == "localhost")
        opts->devices.push_back(c10d::ProcessGroupGloo::createDeviceForHostname("127.0.0.1"));
      else
        opts->devices.push_back(c10d::ProcessGroupGloo::createDefaultDevice());
      g->c10d_->gloo =
          c10::make_intrusive<c10d::ProcessGroupGloo>(prefixed, env.rank, env.world, opts);
    }
  } catch (const JoinError&) {
    throw;
  } catch (const std::exception& e) {
    throw JoinError(fmt::format("rank {} could not connect to the other ranks ({}): {}", env.rank,
                                backend, first_line(e.what())));
  }
  return g;
}

ProcessGroup::~ProcessGroup() = default;

void ProcessGroup::lost(const std::exception& cause) const {
  const std::string host = host_name();
  std::vector<std::string> gone;
  // A closed connection may come a moment before its process is gone: look for up to a second.
  for (int attempt = 0; attempt < 20 && gone.empty(); ++attempt) {
    if (attempt) std::this_thread::sleep_for(std::chrono::milliseconds(50));
    for (const RankInfo& r : ranks_)
      if (r.rank != env_.rank && r.host == host && !running(r.pid))
        gone.push_back(fmt::format("rank {} (pid {} on {})", r.rank, r.pid, r.host));
  }
  const std::string what = first_line(cause.what());
  if (!gone.empty()) throw PeerLostError(fmt::format("{} exited", fmt::join(gone, ", ")));
  if (what.find("imed out") != std::string::npos)
    throw PeerLostError(
        fmt::format("no answer from the other ranks within {:g} s (run.dist_timeout_s): {}",
                    double(timeout_.count()) / 1000.0, what));
  throw PeerLostError(fmt::format("a collective with the other ranks failed: {}", what));
}

void ProcessGroup::sum(std::vector<torch::Tensor>& tensors) {
  try {
    // One call per tensor: c10d's list is one tensor per device, all of one shape.
    for (auto& t : tensors) {
      std::vector<torch::Tensor> one = {t};
      c10d_->run([&](auto& pg) { return pg.allreduce(one); });
    }
  } catch (const std::exception& e) {
    lost(e);
  }
}

std::vector<double> ProcessGroup::sum(const std::vector<double>& values) {
  std::vector<torch::Tensor> t = {torch::tensor(values, torch::kDouble)};
  if (backend_ == "nccl") t[0] = t[0].to(torch::Device(ranks_.at(size_t(env_.rank)).device));
  sum(t);
  const torch::Tensor c = t[0].cpu();
  return std::vector<double>(c.data_ptr<double>(), c.data_ptr<double>() + c.numel());
}

int64_t ProcessGroup::max(int64_t value) {
  std::vector<torch::Tensor> t = {torch::tensor({value}, torch::kLong)};
  if (backend_ == "nccl") t[0] = t[0].to(torch::Device(ranks_.at(size_t(env_.rank)).device));
  c10d::AllreduceOptions o;
  o.reduceOp = c10d::ReduceOp::MAX;
  try {
    c10d_->run([&](auto& pg) { return pg.allreduce(t, o); });
  } catch (const std::exception& e) {
    lost(e);
  }
  return t[0].cpu().item<int64_t>();
}

void ProcessGroup::broadcast(std::vector<torch::Tensor>& tensors) {
  try {
    for (auto& t : tensors) {
      std::vector<torch::Tensor> one = {t};
      c10d_->run([&](auto& pg) { return pg.broadcast(one); });
    }
  } catch (const std::exception& e) {
    lost(e);
  }
}

void ProcessGroup::wait_for_all(const std::string& key) {
  try {
    c10d_->store->add("count/" + key, 1);
    if (!leader()) return;
    const auto end = std::chrono::steady_clock::now() + timeout_;
    while (c10d_->store->add("count/" + key, 0) < env_.world &&
           std::chrono::steady_clock::now() < end)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
  } catch (const std::exception&) {
    // A rank that is gone cannot read any more: nothing to wait for.
  }
}

void ProcessGroup::all_gather_in_place(torch::Tensor& all, int64_t n) {
  try {
    // One broadcast per rank, in place: no world-sized temporary (c10d's allgather copies through
    // one).
    for (int r = 0; r < env_.world; ++r) {
      std::vector<torch::Tensor> one = {all.narrow(0, r * n, n)};
      c10d::BroadcastOptions o;
      o.rootRank = r;
      c10d_->run([&](auto& pg) { return pg.broadcast(one, o); });
    }
  } catch (const std::exception& e) {
    lost(e);
  }
}

void ProcessGroup::gather_to_leader(const torch::Tensor& mine, torch::Tensor* all) {
  const int64_t n = mine.numel();
  try {
    if (!leader()) {
      std::vector<torch::Tensor> one = {mine.contiguous()};
      c10d_->run([&](auto& pg) { return pg.send(one, 0, /*tag=*/0); });
      return;
    }
    all->narrow(0, 0, n).copy_(mine);
    for (int r = 1; r < env_.world; ++r) {
      std::vector<torch::Tensor> one = {all->narrow(0, r * n, n)};
      c10d_->run([&](auto& pg) { return pg.recv(one, r, /*tag=*/0); });
    }
  } catch (const std::exception& e) {
    lost(e);
  }
}

void ProcessGroup::post(const std::string& key, const std::string& message, bool last) {
  try {
    c10d_->store->set("post/" + key, std::vector<uint8_t>(message.begin(), message.end()));
  } catch (const std::exception& e) {
    lost(e);
  }
  if (last) wait_for_all("seen/" + key);
}

std::string ProcessGroup::await(const std::string& key) {
  try {
    const std::vector<uint8_t> v = c10d_->store->get("post/" + key);
    wait_for_all("seen/" + key);
    return std::string(v.begin(), v.end());
  } catch (const std::exception& e) {
    lost(e);
  }
}

uint64_t rank_stream_seed(uint64_t seed, int rank, int64_t update) {
  // splitmix64 of (seed, rank, update): distinct, well-mixed streams per rank and update.
  uint64_t z = seed ^ (uint64_t(rank) << 40) ^ uint64_t(update) * 0x9E3779B97F4A7C15ULL;
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return (z ^ (z >> 31)) & 0x7FFFFFFFFFFFFFFFULL;
}

}  // namespace normlab
