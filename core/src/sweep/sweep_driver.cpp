// `normlab sweep`: runs the unfinished runs of a plan as `normlab run-one` worker processes, N at
// a time, with a progress line; a worker's crash fails its run only.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <sched.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/prctl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <filesystem>
#include <fstream>
#include <iostream>
#include <map>
#include <optional>
#include <ostream>
#include <thread>

#include "normlab/runtime_env.h"
#include "normlab/sweep/sweep.h"
#include "train/run_directory.h"
#include "util/file_lock.h"

extern char** environ;

namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

namespace normlab {
namespace {

volatile sig_atomic_t g_stop_signal = 0;
extern "C" void remember_stop(int sig) { g_stop_signal = sig; }

// SIGINT/SIGTERM handlers for the driver's lifetime (not restarting, so sleeps wake up).
struct StopSignals {
  struct sigaction old_int {
  }, old_term{};
  StopSignals() {
    g_stop_signal = 0;
    struct sigaction sa {};
    sa.sa_handler = remember_stop;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }
  ~StopSignals() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
  }
};

// `normlab sweep … | head` closes the driver's stdout early. A write to it must not kill the
// driver (SIGPIPE's default action) and with it the sweep, so SIGPIPE is ignored: such writes fail
// quietly (the stream goes bad) while the runs go on. Not restored afterwards: stdout's buffer is
// still flushed at exit. Workers get the default back before exec.
void ignore_broken_pipe() {
  struct sigaction sa {};
  sa.sa_handler = SIG_IGN;
  sigemptyset(&sa.sa_mask);
  sigaction(SIGPIPE, &sa, nullptr);
}

int usable_cores() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof set, &set) == 0 && CPU_COUNT(&set) > 0) return CPU_COUNT(&set);
  return int(std::max(1u, std::thread::hardware_concurrency()));
}

std::string clock_text(double s) {
  const int64_t t = int64_t(s);
  return t >= 3600 ? fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60)
                   : fmt::format("{:02}:{:02}", t / 60, t % 60);
}

std::string log_time_now() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%d %H:%M:%S", std::localtime(&t));
  return buf;
}

// The last non-empty line of a worker's log (its error message when it failed).
std::string last_line(const fs::path& log) {
  std::ifstream f(log, std::ios::binary);
  if (!f) return "";
  f.seekg(0, std::ios::end);
  const std::streamoff size = f.tellg();
  f.seekg(std::max<std::streamoff>(0, size - 4096));
  std::string tail((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  while (!tail.empty() && (tail.back() == '\n' || tail.back() == '\r' || tail.back() == ' '))
    tail.pop_back();
  const auto nl = tail.find_last_of("\r\n");
  std::string line = nl == std::string::npos ? tail : tail.substr(nl + 1);
  if (line.size() > 300) line = line.substr(0, 300) + "…";
  return line;
}

enum class Phase { Queued, Running, Completed, Diverged, Failed, Interrupted };

struct Slot {
  Phase phase = Phase::Queued;
  pid_t pid = 0;
  Clock::time_point started, not_before;
  int64_t work = 0;  // updates done (max_updates when finished)
  std::string note;
};

class Driver {
 public:
  Driver(const SweepPlan& plan, const SweepDriverOptions& opt, std::ostream& out)
      : plan_(plan), opt_(opt), out_(out), slots_(plan.runs.size()) {}
  Driver(const Driver&) = delete;
  Driver& operator=(const Driver&) = delete;

  int run() {
    ignore_broken_pipe();
    if (!opt_.worker_args) claim_sweep_directory(plan_);  // a frontier claims its own folder
    lock_sweep_dir();
    if (!opt_.worker_args)
      if (const std::string line = sync_sweep_json(plan_); !line.empty())
        fmt::print(out_, "[sweep] {}\n", line);
    supervise(announce());
    return summary();
  }

 private:
  // Queues the unfinished runs and prints the header (runs, jobs, threads); returns the jobs.
  int announce() {
    const int cores = opt_.cores > 0 ? opt_.cores : usable_cores();
    const int jobs = std::max(1, opt_.jobs);
    // Threads come from each run's manifest unless --threads-per-run says otherwise: a result
    // must not depend on how many runs share the machine (issue 12.8).
    threads_ = opt_.threads_per_run;
    set_threads_ = threads_ > 0;
    // "2" or "1-2 (run.threads)": the threads the runs will use (0 in a manifest: every core).
    auto thread_range = [](const std::vector<int64_t>& threads, int cores) {
      int64_t lo = INT64_MAX, hi = 0;
      for (const int64_t t : threads)
        lo = std::min<int64_t>(lo, t > 0 ? t : cores),
        hi = std::max<int64_t>(hi, t > 0 ? t : cores);
      return lo == hi ? fmt::format("{}", lo) : fmt::format("{}-{}", lo, hi);
    };
    int64_t most_threads = threads_;
    if (!set_threads_)
      for (const int64_t t : plan_.threads)
        most_threads = std::max<int64_t>(most_threads, t > 0 ? t : cores);
    // Workers start as this normlab was started: through the dynamic loader too (issue 66.16).
    command_prefix_ =
        opt_.executable.empty() ? self_command_prefix() : std::vector<std::string>{opt_.executable};
    manifest_ = fs::absolute(plan_.manifest).lexically_normal().string();

    int already_done = 0, already_failed = 0, to_run = 0;
    for (const auto& run : plan_.runs) {
      Slot& s = slots_[size_t(run.index)];
      const RunState st = read_run_state(run_directory(plan_, run));
      s.work = st.updates;
      if (finished(run, st, &s)) {
        ++(s.phase == Phase::Failed ? already_failed : already_done);
        continue;
      }
      queue_.push_back(run.index);
      ++to_run;
    }
    work_at_start_ = current_work();
    fmt::print(out_,
               "[sweep] {}: {} runs in {} | {} finished before, {} failed before{} | {} to run | "
               "{} job(s) x {} thread(s) on {} core(s)\n",
               plan_.name, plan_.runs.size(), plan_.dir, already_done, already_failed,
               already_failed > 0 && !opt_.retry_failed ? " (--retry-failed retries them)" : "",
               to_run, jobs,
               set_threads_            ? fmt::format("{} (--threads-per-run)", threads_)
               : plan_.threads.empty() ? std::string("each run's run.threads")
                                       : thread_range(plan_.threads, cores),
               cores);
    if (jobs * most_threads > cores) {
      // OpenMP threads that spin while they wait (libgomp's default) crawl when they share cores:
      // measured 7x slower training, 10x slower decoding, on 2 cores. Passive waiting changes no
      // result, only how idle threads wait.
      passive_wait_ = std::getenv("OMP_WAIT_POLICY") == nullptr;
      fmt::print(out_,
                 "[sweep] note: {} jobs x up to {} threads on {} cores oversubscribes the CPU "
                 "(slower{}); set run.threads in the manifest or --threads-per-run so that jobs x "
                 "threads <= cores\n",
                 jobs, most_threads, cores,
                 passive_wait_ ? "; the workers' idle threads sleep: OMP_WAIT_POLICY=PASSIVE"
                               : fmt::format("; OMP_WAIT_POLICY={} is yours",
                                             std::getenv("OMP_WAIT_POLICY")));
    }
    out_.flush();
    return jobs;
  }

  // Starts workers, reaps them and prints progress until every queued run has ended or a stop
  // signal has been forwarded to the running ones.
  void supervise(int jobs) {
    StopSignals signals;
    start_ = Clock::now();
    bool forwarded = false;
    auto last_print = Clock::now() - std::chrono::hours(1);
    std::string last_counts;
    while (!queue_.empty() || !running_.empty()) {
      if (g_stop_signal && !forwarded) {
        forwarded = true;
        fmt::print(out_, "{}[sweep] signal {}: stopping {} worker(s); each saves a checkpoint\n",
                   clear(), int(g_stop_signal), running_.size());
        for (const auto& [pid, index] : running_) ::kill(pid, int(g_stop_signal));
        queue_.clear();
      }
      if (!g_stop_signal) start_workers(jobs);
      bool reaped = false;
      for (auto it = running_.begin(); it != running_.end();) {
        int status = 0;
        const pid_t r = ::waitpid(it->first, &status, WNOHANG);
        if (r == it->first) {
          const int index = it->second;
          it = running_.erase(it);
          finish(index, status);
          reaped = true;
        } else {
          ++it;
        }
      }
      const std::string counts = counts_text();
      const auto now = Clock::now();
      const bool tty = ::isatty(STDOUT_FILENO) && &out_ == &std::cout;
      if (counts != last_counts || now - last_print > std::chrono::seconds(tty ? 1 : 30)) {
        fmt::print(out_, "{}{}{}", tty ? "\r" : "", progress_line(), tty ? "\033[K" : "\n");
        out_.flush();
        last_counts = counts;
        last_print = now;
      }
      if (!reaped) std::this_thread::sleep_for(std::chrono::milliseconds(100));
    }
    if (::isatty(STDOUT_FILENO) && &out_ == &std::cout)
      fmt::print(out_, "\r{}\033[K\n", progress_line());
  }

  // The last line and the exit code: 130 interrupted, 1 some run failed, 0 all finished.
  int summary() {
    int failed = 0, interrupted = 0;
    for (const auto& s : slots_) {
      failed += s.phase == Phase::Failed;
      interrupted += s.phase == Phase::Interrupted || s.phase == Phase::Queued;
    }
    if (g_stop_signal || interrupted > 0) {
      fmt::print(
          out_,
          "[sweep] interrupted: {} run(s) not finished; run the same command to resume them\n",
          interrupted);
      return 130;
    }
    if (failed > 0) {
      fmt::print(out_, "[sweep] {} run(s) failed (see their worker.log; {} retries them)\n", failed,
                 opt_.worker_args
                     ? "the same command with --retry-failed"
                     : fmt::format("`normlab sweep {} --retry-failed`", plan_.manifest));
      return 1;
    }
    if (opt_.worker_args)
      fmt::print(out_, "[sweep] all {} runs finished\n", plan_.runs.size());
    else
      fmt::print(out_,
                 "[sweep] all {} runs finished (`normlab sweep {} --status` for the table); "
                 "figures and report: normlab report {}\n",
                 plan_.runs.size(), plan_.manifest, plan_.dir);
    return 0;
  }

  // One driver per sweep directory: a second one would start the same runs.
  void lock_sweep_dir() {
    int holder = 0;
    sweep_lock_ = util::FileLock::try_acquire(fs::path(plan_.dir) / "sweep.lock", &holder);
    if (!sweep_lock_)
      throw ManifestError(
          fmt::format("{}: another `normlab sweep` (pid {}) is running this sweep directory; "
                      "watch it with --status",
                      plan_.dir, holder));
  }

  // Whether a run needs no worker: completed (up to its max_updates), diverged, or failed
  // without --retry-failed.
  bool finished(const SweepRun& run, const RunState& st, Slot* s) {
    const int64_t max_updates = plan_.max_updates[size_t(run.index)];
    if ((st.status == "completed" && st.updates >= max_updates) || st.status == "stopped_early") {
      s->phase = Phase::Completed;
    } else if (st.status == "diverged") {
      s->phase = Phase::Diverged;
      s->note = st.note;
    } else if (st.status == "failed" && !opt_.retry_failed && !st.locked) {
      s->phase = Phase::Failed;
      s->note = st.note;
    } else {
      return false;
    }
    s->work = max_updates;
    return true;
  }

  void start_workers(int jobs) {
    const auto now = Clock::now();
    for (size_t tries = queue_.size(); tries > 0 && int(running_.size()) < jobs && !queue_.empty();
         --tries) {
      const int index = queue_.front();
      queue_.pop_front();
      const SweepRun& run = plan_.runs[size_t(index)];
      Slot& s = slots_[size_t(index)];
      if (s.not_before > now) {
        queue_.push_back(index);
        continue;
      }
      // Another process (a Slurm task, a previous worker still saving) may hold the run.
      const RunState st = read_run_state(run_directory(plan_, run));
      if (finished(run, st, &s)) continue;
      if (st.locked) {
        s.not_before = now + std::chrono::seconds(2);
        queue_.push_back(index);
        continue;
      }
      spawn(run, s);
    }
  }

  void spawn(const SweepRun& run, Slot& s) {
    const fs::path dir = run_directory(plan_, run);
    // Marked as a run before worker.log goes in: the worker's `normlab train` then takes it.
    claim_run_directory(dir, fmt::format("{}: run {} of the sweep", plan_.manifest, run.id));
    std::vector<std::string> args = command_prefix_;
    if (opt_.worker_args) {
      const auto own = opt_.worker_args(run);
      args.insert(args.end(), own.begin(), own.end());
    } else {
      args.insert(args.end(), {"run-one", manifest_, "--index", std::to_string(run.index)});
    }
    for (const auto& p : opt_.plugin_paths) args.insert(args.end(), {"--plugin-path", p});
    if (!opt_.worker_args)
      for (const auto& o : plan_.sets) args.insert(args.end(), {"--set", o});
    if (set_threads_) args.insert(args.end(), {"--set", fmt::format("run.threads={}", threads_)});
    std::vector<char*> argv;
    for (auto& a : args) argv.push_back(a.data());
    argv.push_back(nullptr);
    std::vector<std::string> env_text;
    for (char** e = environ; *e; ++e)
      if (std::strncmp(*e, "OMP_NUM_THREADS=", 16) != 0 &&
          std::strncmp(*e, "NORMLAB_THREADS_SET_BY=", 23) != 0 &&
          std::strncmp(*e, "NORMLAB_THREADS_CHOICE=", 23) != 0)  // a lone run's, not a worker's
        env_text.emplace_back(*e);
    if (passive_wait_) env_text.push_back("OMP_WAIT_POLICY=PASSIVE");
    // The sweep decided for its workers (from jobs × threads against the cores): a worker does not
    // decide again from a load its siblings make (issue 59.13's choice is for a lone run).
    else if (!std::getenv("OMP_WAIT_POLICY"))
      env_text.push_back("NORMLAB_OMP_AUTO=0");
    if (set_threads_) {
      env_text.push_back(fmt::format("OMP_NUM_THREADS={}", threads_));
      env_text.push_back(
          fmt::format("NORMLAB_THREADS_SET_BY=normlab sweep --threads-per-run {}", threads_));
    }
    std::vector<char*> envp;
    for (auto& e : env_text) envp.push_back(e.data());
    envp.push_back(nullptr);

    // worker.log: appended, never truncated; a header line per attempt.
    const fs::path log = dir / "worker.log";
    const int log_fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
    if (log_fd < 0)
      throw std::runtime_error(
          fmt::format("cannot open {}: {}", log.string(), std::strerror(errno)));
    std::string cmd;
    for (const auto& a : args) cmd += (cmd.empty() ? "" : " ") + a;
    const std::string header =
        fmt::format("==== {} normlab sweep (pid {}) starts: {}\n", log_time_now(), ::getpid(), cmd);
    (void)!::write(log_fd, header.data(), header.size());
    const int null_fd = ::open("/dev/null", O_RDONLY | O_CLOEXEC);
    const pid_t parent = ::getpid();
    const pid_t pid = ::fork();
    if (pid == 0) {
      // Only async-signal-safe calls until exec. A driver killed outright (SIGKILL) takes its
      // workers down gracefully: they get SIGTERM, save a checkpoint and exit 130.
      ::prctl(PR_SET_PDEATHSIG, SIGTERM);
      if (::getppid() != parent) ::_exit(130);
      ::signal(SIGPIPE, SIG_DFL);  // an ignored signal stays ignored across exec
      ::dup2(null_fd, STDIN_FILENO);
      ::dup2(log_fd, STDOUT_FILENO);
      ::dup2(log_fd, STDERR_FILENO);
      ::execve(argv[0], argv.data(), envp.data());
      const char msg[] = "normlab sweep: exec of the worker failed\n";
      (void)!::write(STDERR_FILENO, msg, sizeof msg - 1);
      ::_exit(127);
    }
    ::close(log_fd);
    if (null_fd >= 0) ::close(null_fd);
    if (pid < 0) throw std::runtime_error(fmt::format("fork failed: {}", std::strerror(errno)));
    s.phase = Phase::Running;
    s.pid = pid;
    s.started = Clock::now();
    running_[pid] = run.index;
    fmt::print(out_, "{}[sweep] start  {:>3} {} (pid {})\n", clear(), run.index, run.id, pid);
  }

  void finish(int index, int status) {
    const SweepRun& run = plan_.runs[size_t(index)];
    Slot& s = slots_[size_t(index)];
    const std::string dir = run_directory(plan_, run);
    const RunState st = read_run_state(dir);
    const double secs = std::chrono::duration<double>(Clock::now() - s.started).count();
    const int64_t max_updates = plan_.max_updates[size_t(index)];
    std::string what;
    if (WIFEXITED(status) && WEXITSTATUS(status) == 0) {
      s.phase = Phase::Completed;
      s.work = max_updates;
      what = st.status == "stopped_early" ? st.note
                                          : fmt::format("completed at update {}", st.updates);
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 3) {
      s.phase = Phase::Diverged;
      s.work = max_updates;
      s.note = st.note;
      what = st.note.empty() ? fmt::format("diverged at update {}", st.updates) : st.note;
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == 130) {
      s.phase = Phase::Interrupted;
      s.work = last_logged_update(dir);
      what = fmt::format("interrupted at update {} (checkpoint saved)", st.updates);
    } else if (WIFEXITED(status) && WEXITSTATUS(status) == kExitRunBusy) {
      // Another process trains this run; look again later.
      s.phase = Phase::Queued;
      s.not_before = Clock::now() + std::chrono::seconds(2);
      if (!g_stop_signal) queue_.push_back(index);
      what = "busy: another process holds its run.lock; retrying later";
    } else if (g_stop_signal && WIFSIGNALED(status) &&
               (WTERMSIG(status) == SIGINT || WTERMSIG(status) == SIGTERM)) {
      // Stopped by the forwarded signal before its trainer could catch it: nothing to save yet.
      s.phase = Phase::Interrupted;
      s.work = last_logged_update(dir);
      what = fmt::format("stopped by signal {} while starting", WTERMSIG(status));
    } else {
      s.phase = Phase::Failed;
      s.work = max_updates;
      const int64_t updates = std::max(st.updates, last_logged_update(dir));
      const std::string line = last_line(fs::path(dir) / "worker.log");
      if (WIFSIGNALED(status)) {
        s.note = fmt::format("worker killed by signal {} ({}) after update {}", WTERMSIG(status),
                             strsignal(WTERMSIG(status)), updates);
      } else {
        s.note = fmt::format("worker exited with code {}: {}", WEXITSTATUS(status), line);
      }
      // Exit code 2 is bad input, e.g. a run directory of another experiment: leave its files
      // alone.
      if (!(WIFEXITED(status) && WEXITSTATUS(status) == 2))
        write_failed_status(dir, updates, s.note);
      what = "FAILED: " + s.note + fmt::format(" (log: {}/worker.log)", dir);
    }
    fmt::print(out_, "{}[sweep] finish {:>3} {} after {}: {}\n", clear(), run.index, run.id,
               clock_text(secs), what);
  }

  int64_t current_work() {
    int64_t w = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
      Slot& s = slots_[i];
      if (s.phase == Phase::Running)
        s.work = std::max(s.work, last_logged_update(run_directory(plan_, plan_.runs[i])));
      w += std::min(s.work, plan_.max_updates[i]);
    }
    return w;
  }

  std::string counts_text() const {
    int done = 0, running = 0, diverged = 0, failed = 0, interrupted = 0;
    for (const auto& s : slots_) {
      done += s.phase == Phase::Completed || s.phase == Phase::Diverged || s.phase == Phase::Failed;
      running += s.phase == Phase::Running;
      diverged += s.phase == Phase::Diverged;
      failed += s.phase == Phase::Failed;
      interrupted += s.phase == Phase::Interrupted;
    }
    return fmt::format("{}/{} done | {} running | {} diverged | {} failed{}", done, slots_.size(),
                       running, diverged, failed,
                       interrupted ? fmt::format(" | {} interrupted", interrupted) : "");
  }

  std::string progress_line() {
    const double elapsed = std::chrono::duration<double>(Clock::now() - start_).count();
    const int64_t work = current_work();
    total_work_ = 0;
    for (size_t i = 0; i < slots_.size(); ++i) total_work_ += plan_.max_updates[i];
    std::string left = "~--:-- left";
    // The rate of the last 5 minutes once there are 60 s of them: the rate since the start counted
    // the workers' start-up (data, tokenizer) and a busier machine earlier (~44:38 said for 28 min:
    // issue 59.12).
    recent_.emplace_back(elapsed, work);
    while (recent_.size() > 2 && recent_.front().first < elapsed - 300) recent_.pop_front();
    const double span = elapsed - recent_.front().first;
    const double rate = span >= 60 && work > recent_.front().second
                            ? double(work - recent_.front().second) / span
                        : elapsed > 0 ? double(work - work_at_start_) / elapsed
                                      : 0;
    if (work >= total_work_)
      left = "~00:00 left";
    else if (rate > 0)
      left = "~" + clock_text(double(total_work_ - work) / rate) + " left";
    // Each running run's position (from its train.jsonl), a few at most on one line.
    std::string positions;
    int shown = 0;
    for (size_t i = 0; i < slots_.size(); ++i) {
      if (slots_[i].phase != Phase::Running) continue;
      if (++shown > 4) {
        positions += " …";
        break;
      }
      positions += fmt::format(" #{} {}/{}", i, slots_[i].work, plan_.max_updates[i]);
    }
    return fmt::format("[sweep] {}{} | {} elapsed | {}", counts_text(),
                       positions.empty() ? "" : " |" + positions, clock_text(elapsed), left);
  }

  std::string clear() { return ::isatty(STDOUT_FILENO) && &out_ == &std::cout ? "\r\033[K" : ""; }

  const SweepPlan& plan_;
  const SweepDriverOptions& opt_;
  std::ostream& out_;
  std::vector<Slot> slots_;
  std::deque<int> queue_;
  std::map<pid_t, int> running_;
  int threads_ = 0;
  bool set_threads_ = false;
  bool passive_wait_ = false;                // oversubscribed: workers get OMP_WAIT_POLICY=PASSIVE
  std::vector<std::string> command_prefix_;  // the worker's program and arguments before its verb
  std::string manifest_;
  std::optional<util::FileLock> sweep_lock_;
  int64_t total_work_ = 0, work_at_start_ = 0;
  std::deque<std::pair<double, int64_t>> recent_;  // (seconds since start, updates done)
  Clock::time_point start_;
};

}  // namespace

int run_sweep(const SweepPlan& plan, const SweepDriverOptions& opt, std::ostream& out) {
  Driver d(plan, opt, out);
  return d.run();
}

}  // namespace normlab
