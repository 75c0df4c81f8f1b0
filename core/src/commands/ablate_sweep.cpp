// `normlab ablate SWEEP_DIR --jobs N` (issue 46.10): `normlab ablate RUN` on every run of a sweep
// that has a checkpoint, N at a time, each a child process writing its output to
// RUN/eval/ablate.log, then the sweep's ablation figure (`normlab plot SWEEP --only
// layer_ablation --out SWEEP/ablation`), as `plot` and `report` take a sweep directory.
#include <fcntl.h>
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "commands/commands.h"
#include "eval/run_model.h"
#include "normlab/eval/eval_commands.h"
#include "normlab/runtime_env.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace normlab {
namespace {

// A new RUN/eval/ablate.log: the old one (a file, or a link someone planted) is unlinked, never
// truncated through, and the new one is made, never opened (O_EXCL | O_NOFOLLOW): a planted link
// truncated a user's file (issue 56.6).
int open_new_log(const fs::path& log) {
  if (::unlink(log.c_str()) != 0 && errno != ENOENT)
    throw std::runtime_error(
        fmt::format("cannot replace {}: {}", log.string(), std::strerror(errno)));
  const int fd = ::open(log.c_str(), O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW | O_CLOEXEC, 0644);
  if (fd < 0)
    throw std::runtime_error(
        fmt::format("cannot create {}: {}", log.string(), std::strerror(errno)));
  return fd;
}

// Starts `args` (self_command_prefix and a verb's arguments); its stdout and stderr go to `log_fd`
// (inherited when < 0).
pid_t start_child(std::vector<std::string> args, int log_fd) {
  std::vector<char*> argv;
  for (auto& a : args) argv.push_back(a.data());
  argv.push_back(nullptr);
  const pid_t pid = ::fork();
  if (pid == 0) {  // async-signal-safe calls only until exec
    if (log_fd >= 0) {
      ::dup2(log_fd, 1);
      ::dup2(log_fd, 2);
    }
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  if (log_fd >= 0) ::close(log_fd);
  if (pid < 0) throw std::runtime_error(fmt::format("fork failed: {}", std::strerror(errno)));
  return pid;
}

int wait_child(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

std::string last_nonempty_line(const fs::path& file) {
  std::ifstream in(file);
  std::string line, last;
  while (std::getline(in, line))
    if (!line.empty()) last = line;
  return last;
}

// The sweep's run folders, in sweep.json's order. Throws eval::RunInputError naming the file.
std::vector<fs::path> sweep_runs(const fs::path& sweep) {
  const fs::path file = sweep / "sweep.json";
  std::ifstream in(file);
  const json j = json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("runs") || !j["runs"].is_array())
    throw eval::RunInputError(
        fmt::format("{}: expected a sweep.json with a \"runs\" array", file.string()));
  std::vector<fs::path> out;
  for (const auto& r : j["runs"]) {
    if (!r.is_object() || !r.contains("dir") || !r["dir"].is_string())
      throw eval::RunInputError(fmt::format("{}: every run needs a \"dir\" string", file.string()));
    out.push_back(sweep / r["dir"].get<std::string>());
  }
  return out;
}

}  // namespace

int ablate_sweep(const AblateOptions& opt, std::ostream& out, std::ostream& err) {
  const fs::path sweep(opt.model.run);
  std::vector<fs::path> runs;
  std::error_code ec;
  const fs::path real_sweep = fs::canonical(sweep, ec);
  for (const fs::path& run : sweep_runs(sweep)) {
    // Only the sweep's own run folders (a run writes RUN/eval/): not one a crafted sweep.json
    // points outside the sweep, nor a folder without a run in it. Checked where the folders
    // really are, links resolved: a run folder (or RUN/eval) that is a link wrote into a run
    // outside the sweep (issue 56.6).
    const fs::path rel = run.lexically_normal().lexically_relative(sweep.lexically_normal());
    if (rel.empty() || *rel.begin() == ".." || rel.is_absolute())
      throw eval::RunInputError(fmt::format("{}: run folder {} is outside the sweep",
                                            (sweep / "sweep.json").string(), run.string()));
    for (const fs::path& p : {run, run / "eval"})
      if (fs::is_symlink(fs::symlink_status(p, ec)))
        throw eval::RunInputError(
            fmt::format("{}: {} is a symbolic link; a sweep's runs are folders of their own",
                        (sweep / "sweep.json").string(), p.string()));
    if (fs::exists(run, ec)) {
      const fs::path real = fs::canonical(run, ec);
      const fs::path inside = real.lexically_relative(real_sweep);
      if (ec || inside.empty() || *inside.begin() == "..")
        throw eval::RunInputError(fmt::format("{}: run folder {} is {}, outside the sweep",
                                              (sweep / "sweep.json").string(), run.string(),
                                              real.string()));
    }
    if (!fs::exists(run / "manifest.resolved.toml")) continue;  // not started yet
    if (!opt.model.checkpoint.empty() || fs::exists(run / "checkpoints" / "best.safetensors") ||
        fs::exists(run / "checkpoints" / "last.safetensors"))
      runs.push_back(run);
  }
  if (runs.empty())
    throw eval::RunInputError(
        fmt::format("{}: no run of the sweep has a checkpoint yet", sweep.string()));
  // Through the dynamic loader too (issue 66.16).
  const std::vector<std::string> self = self_command_prefix();
  auto child_args = [&](const fs::path& run) {
    std::vector<std::string> a = self;
    a.insert(a.end(), {"ablate", run.string(), "--drop-layer", opt.drop_layer, "--split", opt.split,
                       "--batch-tokens", std::to_string(opt.batch_tokens)});
    if (!opt.model.checkpoint.empty()) a.insert(a.end(), {"--checkpoint", opt.model.checkpoint});
    if (!opt.model.device.empty()) a.insert(a.end(), {"--device", opt.model.device});
    if (opt.model.allow_unverified) a.push_back("--allow-unverified");
    for (const auto& p : opt.model.plugin_paths) a.insert(a.end(), {"--plugin-path", p});
    return a;
  };
  fmt::print(out, "ablate {}: {} runs with a checkpoint, {} at a time (layers numbered from 0)\n",
             sweep.string(), runs.size(), opt.jobs);
  std::map<pid_t, fs::path> running;
  size_t next = 0, failed = 0;
  auto finish_one = [&] {
    int status = 0;
    pid_t pid = 0;
    while ((pid = ::waitpid(-1, &status, 0)) < 0 && errno == EINTR) {
    }
    const auto it = running.find(pid);
    if (it == running.end()) return;
    const int code = WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
    const fs::path log = it->second / "eval" / "ablate.log";
    if (code == 0)
      fmt::print(out, "{}: {}\n", it->second.filename().string(), last_nonempty_line(log));
    else
      ++failed, fmt::print(err, "normlab: ablate {} exited with code {} (see {})\n",
                           it->second.string(), code, log.string());
    running.erase(it);
  };
  while (next < runs.size() || !running.empty()) {
    while (next < runs.size() && int(running.size()) < std::max(opt.jobs, 1)) {
      const fs::path run = runs[next++];
      fs::create_directories(run / "eval");
      running[start_child(child_args(run), open_new_log(run / "eval" / "ablate.log"))] = run;
    }
    finish_one();
  }
  const fs::path figures = sweep / "ablation";
  std::vector<std::string> plot_args = self;
  plot_args.insert(plot_args.end(),
                   {"plot", sweep.string(), "--out", figures.string(), "--only", "layer_ablation"});
  const int plot = wait_child(start_child(plot_args, -1));
  fmt::print(out, "ablate {}: {} of {} runs ablated; figure in {}{}\n", sweep.string(),
             runs.size() - failed, runs.size(), figures.string(),
             plot == 0 ? "" : fmt::format(" (normlab plot exited with code {})", plot));
  return failed > 0 || plot != 0 ? kExitFailed : 0;
}

}  // namespace normlab
