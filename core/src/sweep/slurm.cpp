#include "normlab/sweep/slurm.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <poll.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <chrono>
#include <cstring>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>

#include "normlab/runtime_env.h"

namespace normlab {
namespace {

void require_one_line(const std::string& what, const std::string& text) {
  if (text.find_first_of("\n\r") != std::string::npos)
    throw std::invalid_argument(what + " must not contain a line break: '" + text + "'");
}

// A value on an #SBATCH line: sbatch splits at blanks unless double-quoted, with \ escaping.
std::string sbatch_value(const std::string& v) {
  if (v.find_first_of(" \t\"\\'#$") == std::string::npos) return v;
  std::string q = "\"";
  for (char c : v) {
    if (c == '"' || c == '\\') q += '\\';
    q += c;
  }
  return q + "\"";
}

// Slurm expands %A, %a, ... in --output; a literal % in the directory is written %%.
std::string escape_filename_pattern(const std::string& path) {
  std::string out;
  for (char c : path) {
    if (c == '%') out += '%';
    out += c;
  }
  return out;
}

std::string timestamp() {
  std::time_t now = std::time(nullptr);
  std::tm tm{};
  localtime_r(&now, &tm);
  char buf[32];
  std::strftime(buf, sizeof buf, "%Y%m%d-%H%M%S", &tm);
  return buf;
}

struct ProcessResult {
  int exit_code = -1;
  std::string out, err;
};

// Runs argv (PATH searched) with stdout and stderr captured; throws when it cannot start. Its
// environment is this one without the choices normlab made for this machine: sbatch hands its
// environment to the job, whose tasks run on other machines and choose for those.
ProcessResult run_process(const std::vector<std::string>& argv) {
  const std::vector<std::string> env_text = environment_for_other_machines();
  std::vector<char*> envp;
  for (const auto& e : env_text) envp.push_back(const_cast<char*>(e.c_str()));
  envp.push_back(nullptr);
  int out_pipe[2], err_pipe[2];
  if (pipe(out_pipe) != 0) throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  if (pipe(err_pipe) != 0) {
    close(out_pipe[0]);
    close(out_pipe[1]);
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  }
  // Reports a failed exec through a close-on-exec pipe, so "sbatch not found" is an error here.
  int exec_pipe[2];
  if (pipe2(exec_pipe, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  std::vector<char*> args;
  for (const auto& a : argv) args.push_back(const_cast<char*>(a.c_str()));
  args.push_back(nullptr);
  pid_t pid = fork();
  if (pid < 0) throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  if (pid == 0) {
    dup2(out_pipe[1], 1);
    dup2(err_pipe[1], 2);
    close(out_pipe[0]);
    close(err_pipe[0]);
    close(out_pipe[1]);
    close(err_pipe[1]);
    close(exec_pipe[0]);
    execvpe(args[0], args.data(), envp.data());
    int e = errno;
    ssize_t ignored = write(exec_pipe[1], &e, sizeof e);
    (void)ignored;
    _exit(127);
  }
  close(out_pipe[1]);
  close(err_pipe[1]);
  close(exec_pipe[1]);
  int exec_errno = 0;
  bool exec_failed = read(exec_pipe[0], &exec_errno, sizeof exec_errno) == sizeof exec_errno;
  close(exec_pipe[0]);

  ProcessResult r;
  pollfd fds[2] = {{out_pipe[0], POLLIN, 0}, {err_pipe[0], POLLIN, 0}};
  std::string* sinks[2] = {&r.out, &r.err};
  int open_fds = 2;
  char buf[4096];
  while (open_fds > 0) {
    if (poll(fds, 2, -1) < 0) {
      if (errno == EINTR) continue;
      break;
    }
    for (int i = 0; i < 2; ++i) {
      if (fds[i].fd < 0 || !(fds[i].revents & (POLLIN | POLLHUP | POLLERR))) continue;
      ssize_t n = read(fds[i].fd, buf, sizeof buf);
      if (n > 0) {
        sinks[i]->append(buf, static_cast<size_t>(n));
      } else if (n == 0 || errno != EINTR) {
        close(fds[i].fd);
        fds[i].fd = -1;
        --open_fds;
      }
    }
  }
  for (auto& f : fds)
    if (f.fd >= 0) close(f.fd);
  int status = 0;
  while (waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (exec_failed)
    throw std::runtime_error(fmt::format("cannot run {}: {}", argv[0], std::strerror(exec_errno)));
  r.exit_code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
  return r;
}

std::string trim(std::string s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.pop_back();
  size_t b = 0;
  while (b < s.size() && std::isspace(static_cast<unsigned char>(s[b]))) ++b;
  return s.substr(b);
}

}  // namespace

std::string slurm_array_spec(const std::vector<int>& indices, int max_parallel) {
  if (indices.empty()) throw std::invalid_argument("no run indices to submit");
  std::vector<int> sorted(indices);
  std::sort(sorted.begin(), sorted.end());
  sorted.erase(std::unique(sorted.begin(), sorted.end()), sorted.end());
  if (sorted.front() < 0)
    throw std::invalid_argument(fmt::format("negative run index {}", sorted.front()));
  std::string spec;
  for (size_t i = 0; i < sorted.size();) {
    size_t j = i;
    while (j + 1 < sorted.size() && sorted[j + 1] == sorted[j] + 1) ++j;
    if (!spec.empty()) spec += ',';
    spec += std::to_string(sorted[i]);
    if (j > i) spec += fmt::format("-{}", sorted[j]);
    i = j + 1;
  }
  if (max_parallel > 0) spec += fmt::format("%{}", max_parallel);
  return spec;
}

std::string shell_quote(const std::string& word) {
  const bool safe = !word.empty() && std::all_of(word.begin(), word.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || std::strchr("_-./=:,+@%", c) != nullptr;
  });
  if (safe) return word;
  std::string q = "'";
  for (char c : word) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

namespace {

// stop_run(): how the script asks the trainer to save and stop. srun answers a SIGTERM of its own
// by killing its tasks at once, so the ranks of a data-parallel run get theirs from Slurm.
std::string stop_function(const SlurmOptions& opt) {
  return opt.ntasks_per_run > 1
             ? "stop_run() { scancel --signal=TERM \"${SLURM_JOB_ID}.0\" 2>/dev/null; }\n"
             : "stop_run() { kill -TERM \"$child\" 2>/dev/null; }\n";
}

// The trainer, in the background: one process, or one srun step of the run's ranks (rank 0, on the
// first node, hosts the rendezvous; every rank stops after the same update, saves and exits 130).
std::string launch_line(const SlurmOptions& opt) {
  if (opt.ntasks_per_run <= 1) return "\"$NORMLAB\" \"${args[@]}\" &\n";
  return R"SH(export MASTER_ADDR=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))
echo "normlab-slurm: $SLURM_NTASKS ranks on $SLURM_JOB_NODELIST, rendezvous $MASTER_ADDR:$MASTER_PORT"
srun --ntasks="$SLURM_NTASKS" "$NORMLAB" "${args[@]}" &
)SH";
}

}  // namespace

std::string sbatch_script(const SlurmOptions& opt, const std::string& normlab_exe,
                          const std::string& manifest_abs,
                          const std::vector<std::string>& overrides,
                          const std::vector<int>& indices, const std::string& sweep_dir_abs) {
  require_one_line("the normlab executable path", normlab_exe);
  require_one_line("the manifest path", manifest_abs);
  require_one_line("the sweep directory", sweep_dir_abs);
  for (const auto& o : overrides) require_one_line("an override", o);
  for (const auto& e : opt.sbatch_extra) require_one_line("an sbatch option", e);
  for (const auto* v : {&opt.partition, &opt.time, &opt.account, &opt.qos, &opt.mem})
    require_one_line("a Slurm option", *v);

  const std::string log_dir =
      sweep_dir_abs + (!sweep_dir_abs.empty() && sweep_dir_abs.back() == '/' ? "" : "/") + "slurm";
  std::string base = sweep_dir_abs;
  while (base.size() > 1 && base.back() == '/') base.pop_back();
  const std::string name = "normlab-" + std::filesystem::path(base).filename().string();
  std::ostringstream s;
  s << "#!/bin/bash\n";
  s << "#SBATCH --job-name=" << sbatch_value(name) << "\n";
  s << "#SBATCH --array=" << slurm_array_spec(indices, opt.max_parallel) << "\n";
  s << "#SBATCH --output=" << sbatch_value(escape_filename_pattern(log_dir) + "/%A_%a.out") << "\n";
  s << "#SBATCH --open-mode=append\n";  // a requeued task adds to its log
  if (opt.ntasks_per_run < 1 || opt.nodes_per_run < 1 || opt.nodes_per_run > opt.ntasks_per_run)
    throw std::invalid_argument(
        fmt::format("--ntasks-per-run {} over --nodes-per-run {}: expected 1 ≤ nodes ≤ tasks",
                    opt.ntasks_per_run, opt.nodes_per_run));
  s << "#SBATCH --nodes=" << opt.nodes_per_run << "\n#SBATCH --ntasks=" << opt.ntasks_per_run
    << "\n";
  if (opt.cpus_per_run > 0) s << "#SBATCH --cpus-per-task=" << opt.cpus_per_run << "\n";
  if (opt.gpus_per_run > 0) s << "#SBATCH --gres=gpu:" << opt.gpus_per_run << "\n";
  if (!opt.mem.empty()) s << "#SBATCH --mem=" << sbatch_value(opt.mem) << "\n";
  if (!opt.time.empty()) s << "#SBATCH --time=" << sbatch_value(opt.time) << "\n";
  if (!opt.partition.empty()) s << "#SBATCH --partition=" << sbatch_value(opt.partition) << "\n";
  if (!opt.account.empty()) s << "#SBATCH --account=" << sbatch_value(opt.account) << "\n";
  if (!opt.qos.empty()) s << "#SBATCH --qos=" << sbatch_value(opt.qos) << "\n";
  if (opt.signal_lead_s > 0) s << "#SBATCH --signal=B:USR1@" << opt.signal_lead_s << "\n";
  s << "#SBATCH --requeue\n";
  for (const auto& e : opt.sbatch_extra) s << "#SBATCH " << e << "\n";

  s << R"SH(
# Written by `normlab sweep --slurm`. One array task trains one run of the sweep:
#   normlab run-one MANIFEST --index $SLURM_ARRAY_TASK_ID
# which resumes from the run's checkpoint when there is one. USR1 (sent by Slurm before the time
# limit, see --signal above) is passed to the trainer as SIGTERM: it saves a checkpoint and exits
# 130, and this task is requeued, so the next attempt resumes where this one stopped. A plain
# SIGTERM (scancel, or the time limit itself) is passed on without a requeue.

requeue_wanted=0
child=
)SH";
  s << stop_function(opt);
  s << R"SH(on_usr1() {
  requeue_wanted=1
  echo "normlab-slurm: USR1 at $(date '+%F %T'): saving a checkpoint, then requeueing"
  if [ -n "$child" ]; then stop_run; fi
}
on_term() {
  echo "normlab-slurm: SIGTERM at $(date '+%F %T'): stopping the run (no requeue)"
  if [ -n "$child" ]; then stop_run; fi
}
trap on_usr1 USR1
trap on_term TERM INT

)SH";
  s << "NORMLAB=" << shell_quote(normlab_exe) << "\n";
  s << "MANIFEST=" << shell_quote(manifest_abs) << "\n";
  s << "args=(run-one \"$MANIFEST\" --index \"$SLURM_ARRAY_TASK_ID\")\n";
  if (opt.gpus_per_run > 0) s << "args+=(--set " << shell_quote("run.device=\"cuda\"") << ")\n";
  s << R"SH(# LibTorch threads = the CPUs Slurm gave this task.
threads=${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-}}
if [ -n "$threads" ]; then
  args+=(--set "run.threads=$threads")
  export NORMLAB_THREADS_SET_BY="normlab sweep --slurm (SLURM_CPUS_PER_TASK=$threads)"
fi
)SH";
  if (!overrides.empty()) {
    s << "args+=(";
    for (size_t i = 0; i < overrides.size(); ++i)
      s << (i ? " " : "") << "--set " << shell_quote(overrides[i]);
    s << ")\n";
  }
  s << R"SH(
task="${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}"
echo "normlab-slurm: task $task (job $SLURM_JOB_ID), attempt $(( ${SLURM_RESTART_COUNT:-0} + 1 )), on $(hostname) at $(date '+%F %T')"
)SH";
  s << launch_line(opt);
  s << R"SH(child=$!
# A USR1 that came before the trainer started.
if [ "$requeue_wanted" = 1 ]; then stop_run; fi
# wait returns early when a trap runs; wait again until the trainer has really exited.
wait "$child"
while kill -0 "$child" 2>/dev/null; do wait "$child"; done
wait "$child"
rc=$?
echo "normlab-slurm: run-one exited with $rc at $(date '+%F %T')"
# 130: the trainer saved and stopped; 143: SIGTERM came before it could (it resumes from its last
# checkpoint, if any). Other codes (0 completed, 3 diverged, errors) are final.
if [ "$requeue_wanted" = 1 ] && { [ "$rc" = 130 ] || [ "$rc" = 143 ]; }; then
  # Said first: a successful requeue ends this shell at once.
  echo "normlab-slurm: requeueing $task; the next attempt resumes from the checkpoint"
  if scontrol requeue "$task"; then
    exit 0
  fi
  echo "normlab-slurm: scontrol requeue $task failed; resubmit the sweep to resume" >&2
fi
exit "$rc"
)SH";
  return s.str();
}

std::string submit_slurm(const SlurmOptions& opt, const std::string& normlab_exe,
                         const std::string& manifest_abs, const std::vector<std::string>& overrides,
                         const std::vector<int>& indices, const std::string& sweep_dir_abs,
                         std::string* script_path) {
  namespace fs = std::filesystem;
  const std::string text =
      sbatch_script(opt, normlab_exe, manifest_abs, overrides, indices, sweep_dir_abs);
  const fs::path dir = fs::path(sweep_dir_abs) / "slurm";
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec) throw std::runtime_error(fmt::format("cannot create {}: {}", dir.string(), ec.message()));
  const std::string stamp = timestamp();
  fs::path path = dir / ("sweep-" + stamp + ".sbatch");
  for (int n = 2; fs::exists(path); ++n) path = dir / fmt::format("sweep-{}-{}.sbatch", stamp, n);
  {
    std::ofstream f(path);
    f << text;
    if (!f) throw std::runtime_error("cannot write " + path.string());
  }
  fs::permissions(path, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add, ec);
  if (script_path) *script_path = path.string();
  if (!opt.submit) return "";

  ProcessResult r = run_process({"sbatch", "--parsable", path.string()});
  if (r.exit_code != 0)
    throw std::runtime_error(fmt::format("sbatch {} failed (exit {}): {}", path.string(),
                                         r.exit_code, trim(r.err.empty() ? r.out : r.err)));
  // --parsable prints "jobid" or "jobid;cluster".
  std::string id = trim(r.out);
  if (auto nl = id.rfind('\n'); nl != std::string::npos) id = id.substr(nl + 1);
  id = id.substr(0, id.find(';'));
  if (id.empty()) throw std::runtime_error("sbatch printed no job id: " + trim(r.err));
  return id;
}

std::string slurm_watch_hint(const std::string& job_id, const std::string& manifest,
                             const std::string& sweep_dir_abs, const std::string& script_path,
                             const std::vector<std::string>& overrides) {
  std::ostringstream s;
  s << "script:   " << script_path << "\n";
  if (!job_id.empty()) {
    s << "job:      " << job_id << " (array; task = run index)\n";
    s << "queue:    squeue -u $USER   (or squeue -j " << job_id << ")\n";
  } else {
    s << "submit:   sbatch " << shell_quote(script_path) << "\n";
  }
  s << "progress: normlab sweep " << shell_quote(manifest);
  for (const auto& o : overrides) s << " --set " << shell_quote(o);
  s << " --status\n";
  s << "logs:     " << sweep_dir_abs << "/slurm/" << (job_id.empty() ? "<job>" : job_id)
    << "_<index>.out\n";
  if (!job_id.empty()) s << "cancel:   scancel " << job_id << "\n";
  return s.str();
}

// normlab's own path, not the dynamic loader it may have been started through (issue 66.16): the
// script runs on other machines, whose loader normlab's PT_INTERP names, and loader options such as
// --library-path name this machine's folders.
std::string current_executable() { return self_executable(); }

}  // namespace normlab
