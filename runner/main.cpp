// The `normlab` executable. `plot` and `report` (Python draws, normlab only hands over the folders)
// and `data` (named datasets, tokenizing to shards: the core's normlab_light) run here, without
// LibTorch; every other verb runs in libnormlab_cli (cli.cpp), loaded when needed: LibTorch's
// start-up costs ~1 s of CPU per process with Debian's build (its static initializers and ~290
// libraries), which a plot, a report or a `data list` had paid for nothing.
#include <dlfcn.h>

#include <CLI/CLI.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <filesystem>
#include <iostream>
#include <string>

#include "normlab/runtime_env.h"
#include "verbs/verb.h"

namespace {

// The verb: the first argument that is neither a global option nor its value. Empty (e.g. --help
// alone) goes to the whole CLI, as does any command line asking for --version.
std::string verb_of(int argc, char** argv) {
  std::string verb;
  for (int i = 1; i < argc; ++i) {
    const char* a = argv[i];
    if (std::strcmp(a, "--version") == 0) return {};
    if (!verb.empty()) continue;
    if (std::strcmp(a, "--plugin-path") == 0) {
      ++i;  // its value
    } else if (std::strncmp(a, "--plugin-path=", 14) != 0 &&
               std::strcmp(a, "--allow-unsafe-plugin-path") != 0) {
      verb = a;
    }
  }
  return verb;
}

int run_light(int argc, char** argv) {
  using normlab::verbs::usage_exit;
  CLI::App app{normlab::verbs::kDescription};
  normlab::verbs::Globals g;
  normlab::verbs::add_global_options(app, g);
  const normlab::verbs::Verb verbs[] = {normlab::verbs::add_plot(app, g),
                                        normlab::verbs::add_report(app, g),
                                        normlab::verbs::add_data(app, g)};
  try {
    app.parse(argc, argv);
    for (const normlab::verbs::Verb& v : verbs)
      if (v.cmd->parsed()) {
        normlab::tune_malloc();  // as libnormlab_cli does for every verb that does not train
        return v.run();
      }
  } catch (const CLI::Error& e) {
    return usage_exit(app, e);
  } catch (const std::exception& e) {
    std::cerr << "normlab: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}

// libnormlab_cli beside this executable (bin/../lib, the RUNPATH of an installed normlab too), by
// its full path: a name alone would be looked up in LD_LIBRARY_PATH first, where an empty entry
// means the working folder (hostile review). Into the global scope like a linked library:
// OpenBLAS's symbols are looked up there (runtime_env.cpp).
int run_cli(int argc, char** argv) {
  std::string path = "libnormlab_cli.so";
  try {
    const std::filesystem::path bin =
        std::filesystem::path(normlab::self_executable()).parent_path();
    for (const char* libdir : {NORMLAB_INSTALL_LIBDIR, "lib"})
      if (std::filesystem::is_regular_file(bin / ".." / libdir / path)) {
        path = (bin / ".." / libdir / path).lexically_normal().string();
        break;
      }
  } catch (const std::exception&) {  // no /proc: the RUNPATH finds it
  }
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_GLOBAL);
  if (!lib) {
    std::cerr << "normlab: error: cannot load " << path << ": " << ::dlerror() << "\n";
    return 1;
  }
  auto cli_main = reinterpret_cast<int (*)(int, char**)>(::dlsym(lib, "normlab_cli_main"));
  if (!cli_main) {
    std::cerr << "normlab: error: libnormlab_cli.so has no normlab_cli_main: " << ::dlerror()
              << "\n";
    return 1;
  }
  const int rc = cli_main(argc, argv);
  // Every verb has returned, its files closed and its threads joined. What exit() would run next is
  // LibTorch's static destructors, which deregister its ~2,000 operators one by one: ~0.15 s of CPU
  // per process (perf, Debian's 1.13; 13 % of a `normlab --version`), paid by every training and
  // every sweep worker. Flushed, the process ends without them (issue 70.4).
  std::cout.flush();
  std::cerr.flush();
  std::fflush(nullptr);
  std::_Exit(rc);
}

}  // namespace

int main(int argc, char** argv) {
  // CLI11 would take the next argument (often the verb) as the value of an empty `--plugin-path=`.
  for (int i = 1; i < argc; ++i)
    if (std::strcmp(argv[i], "--plugin-path=") == 0) {
      std::cerr << "normlab: error: --plugin-path= names no folder or file (--plugin-path=DIR)\n";
      return 2;
    }
  const std::string verb = verb_of(argc, argv);
  if (verb == "plot" || verb == "report" || verb == "data") return run_light(argc, argv);
  // libgomp reads OMP_WAIT_POLICY and OpenBLAS reads OPENBLAS_CORETYPE when they load: chosen
  // here, before libnormlab_cli brings them, a busy machine's PASSIVE and the fastest BLAS kernels
  // cost no re-execution (~0.5 s of CPU each: LibTorch's start-up again). Not for the verbs that
  // only read and write files (Verb::uses_blas false), nor --help/--version.
  if (!verb.empty() && verb[0] != '-' && verb != "bleu" && verb != "manifest") {
    normlab::choose_omp_wait_policy();
    normlab::choose_blas_coretype();
  }
  return run_cli(argc, argv);
}
