#include "normlab/analysis/plot_command.h"

#include <fcntl.h>
#include <sys/wait.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <iostream>
#include <stdexcept>

#include "normlab/runtime_env.h"

#ifndef NORMLAB_PYTHON_SOURCE_DIR
#define NORMLAB_PYTHON_SOURCE_DIR ""
#endif
#ifndef NORMLAB_PYTHON_INSTALL_DIR
#define NORMLAB_PYTHON_INSTALL_DIR ""
#endif

namespace normlab::analysis {
namespace fs = std::filesystem;

namespace {

bool is_executable(const fs::path& p) {
  std::error_code ec;
  return fs::is_regular_file(p, ec) && ::access(p.c_str(), X_OK) == 0;
}

const char* env(const char* name) {
  const char* v = std::getenv(name);
  return v && *v ? v : nullptr;
}

}  // namespace

std::string find_python() {
  if (const char* p = env("NORMLAB_PYTHON")) {
    if (!is_executable(p))
      throw std::runtime_error(std::string("NORMLAB_PYTHON=") + p + " is not an executable file");
    return p;
  }
  if (is_executable("/usr/bin/python3")) return "/usr/bin/python3";
  return "python3";  // looked up on PATH by execvp
}

fs::path find_script(const std::string& script) {
  std::vector<fs::path> dirs;
  if (const char* d = env("NORMLAB_PYTHON_DIR")) dirs.emplace_back(d);
  std::error_code ec;
  // An installed normlab (bin/normlab beside share/normlab/python) uses its own copy.
  // normlab's own path, not the dynamic loader's when it was started through it (issue 66.16).
  try {
    const fs::path exe = fs::absolute(normlab::self_executable());
    dirs.push_back(exe.parent_path().parent_path() / "share" / "normlab" / "python");
  } catch (const std::exception&) {  // no /proc: the other places
  }
  if (*NORMLAB_PYTHON_SOURCE_DIR) dirs.emplace_back(NORMLAB_PYTHON_SOURCE_DIR);
  if (*NORMLAB_PYTHON_INSTALL_DIR) dirs.emplace_back(NORMLAB_PYTHON_INSTALL_DIR);
  std::string tried;
  for (const auto& d : dirs) {
    if (fs::is_regular_file(d / script, ec)) return d / script;
    tried += (tried.empty() ? "" : ", ") + d.string();
  }
  throw std::runtime_error("cannot find the script " + script + " (looked in " + tried +
                           "; set NORMLAB_PYTHON_DIR)");
}

int run_python_script(const std::string& script, const std::vector<std::string>& args) {
  const std::string python = find_python();
  const std::string path = find_script(script).string();
  std::vector<std::string> argv_s{python, path};
  argv_s.insert(argv_s.end(), args.begin(), args.end());
  std::vector<char*> argv;
  for (auto& a : argv_s) argv.push_back(a.data());
  argv.push_back(nullptr);

  std::cout.flush();
  std::cerr.flush();
  // The child reports a failed exec through a close-on-exec pipe: no bytes means exec succeeded.
  int fds[2];
  if (::pipe2(fds, O_CLOEXEC) != 0)
    throw std::runtime_error(std::string("pipe: ") + std::strerror(errno));
  pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    throw std::runtime_error(std::string("fork: ") + std::strerror(errno));
  }
  if (pid == 0) {
    ::close(fds[0]);
    ::execvp(argv[0], argv.data());
    int e = errno;
    [[maybe_unused]] auto n = ::write(fds[1], &e, sizeof e);
    ::_exit(127);
  }
  ::close(fds[1]);
  int exec_errno = 0;
  ssize_t got;
  do {
    got = ::read(fds[0], &exec_errno, sizeof exec_errno);
  } while (got < 0 && errno == EINTR);
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0) {
    if (errno != EINTR) throw std::runtime_error(std::string("waitpid: ") + std::strerror(errno));
  }
  if (got == static_cast<ssize_t>(sizeof exec_errno))
    throw std::runtime_error("cannot run the Python interpreter '" + python +
                             "': " + std::strerror(exec_errno) +
                             " (install Debian's python3-matplotlib or set NORMLAB_PYTHON)");
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  if (WIFSIGNALED(status)) return 128 + WTERMSIG(status);
  return 1;
}

// Options first, then "--", so a directory named like an option stays a directory.
int plot_command(const PlotOptions& opt) {
  std::vector<std::string> args{"--out", opt.out, "--format", opt.formats};
  if (!opt.updates.empty()) args.insert(args.end(), {"--update", opt.updates});
  if (!opt.only.empty()) args.insert(args.end(), {"--only", opt.only});
  args.push_back("--");
  args.insert(args.end(), opt.dirs.begin(), opt.dirs.end());
  return run_python_script("normlab_plots.py", args);
}

int report_command(const ReportOptions& opt) {
  std::vector<std::string> args;
  if (!opt.out.empty()) args.insert(args.end(), {"--out", opt.out});
  args.push_back("--");
  args.insert(args.end(), opt.dirs.begin(), opt.dirs.end());
  return run_python_script("normlab_report.py", args);
}

}  // namespace normlab::analysis
