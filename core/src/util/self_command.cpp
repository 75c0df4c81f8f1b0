// How this normlab was started, to start it again (runtime_env.h: self_command_prefix): through the
// dynamic loader, the loader with its options and normlab (issue 66.16). No LibTorch: the Slurm
// script tool links this file alone.
#include <cstdio>
#include <filesystem>
#include <stdexcept>
#include <string>
#include <vector>

#include "normlab/runtime_env.h"

namespace normlab {

namespace {
// main's argc and argv as glibc passes them to .init_array functions: after the dynamic loader took
// its own arguments away, as main sees them, also where main does not pass argv on (library users).
int g_main_argc = 0;
char** g_main_argv = nullptr;
void remember_main_arguments(int argc, char** argv, char**) {
  g_main_argc = argc;
  g_main_argv = argv;
}
using InitFunction = void (*)(int, char**, char**);
__attribute__((section(".init_array"), used)) InitFunction remember_main_arguments_entry =
    remember_main_arguments;

// The kernel's copy of the command line: through the loader it still has the loader's arguments.
std::vector<std::string> started_command_line() {
  std::vector<std::string> started;
  if (FILE* f = std::fopen("/proc/self/cmdline", "rb")) {
    std::string arg;
    for (int c; (c = std::fgetc(f)) != EOF;)
      if (c == 0) {
        started.push_back(arg);
        arg.clear();
      } else {
        arg += char(c);
      }
    std::fclose(f);
  }
  return started;
}

std::string own_exe_path() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  if (ec) throw std::runtime_error("cannot read /proc/self/exe: " + ec.message());
  return exe.string();
}
}  // namespace

std::vector<std::string> self_command_prefix() {
  std::vector<std::string> prefix = {own_exe_path()};
  const std::vector<std::string> started = started_command_line();
  const size_t argc = size_t(g_main_argc);
  // Through the loader main's argv (its argv[0] may be the loader's --argv0) ends the original
  // command line, which is longer: what comes before main's argv[1] is the loader, its options
  // and normlab's path.
  if (argc == 0 || !g_main_argv || started.size() <= argc) return prefix;
  for (size_t i = 1; i < argc; ++i)
    if (started[started.size() - argc + i] != g_main_argv[i]) return prefix;
  prefix.insert(prefix.end(), started.begin() + 1, started.end() - std::ptrdiff_t(argc) + 1);
  // The loader opens a path with a slash from the current folder: absolute, it still works after
  // a chdir (a bare name the loader looks up again the same way).
  if (std::string& normlab = prefix.back(); normlab.find('/') != std::string::npos)
    normlab = std::filesystem::absolute(normlab).lexically_normal().string();
  return prefix;
}

std::string self_executable() { return self_command_prefix().back(); }

std::vector<std::string> self_command_line() {
  if (!g_main_argv || g_main_argc < 1)
    throw std::runtime_error("this program's arguments are unknown (no .init_array arguments)");
  std::vector<std::string> args = self_command_prefix();
  args.insert(args.end(), g_main_argv + 1, g_main_argv + g_main_argc);
  return args;
}

}  // namespace normlab
