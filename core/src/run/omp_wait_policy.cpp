// How LibTorch's idle OpenMP threads wait (choose_omp_wait_policy) and how many a run takes
// (usable_threads). No LibTorch, no OpenBLAS: the `normlab` executable decides before it loads
// libnormlab_cli (runner/main.cpp), so libgomp reads the choice when it loads, with no re-exec.
#include <sched.h>
#include <stdlib.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

#include "normlab/runtime_env.h"

namespace normlab {
namespace {

// The cores this process may use: its affinity mask, and a cgroup v2 CPU quota below it.
double usable_cores(int* affinity) {
  cpu_set_t set;
  *affinity = sched_getaffinity(0, sizeof(set), &set) == 0 ? CPU_COUNT(&set) : 1;
  double cores = *affinity;
  if (FILE* f = std::fopen("/sys/fs/cgroup/cpu.max", "r")) {
    char quota[32] = {0};
    long period = 0;
    if (std::fscanf(f, "%31s %ld", quota, &period) == 2 && std::strcmp(quota, "max") != 0 &&
        period > 0)
      cores = std::min(cores, std::atof(quota) / double(period));
    std::fclose(f);
  }
  return cores;
}
// Threads runnable right now besides this one: /proc/loadavg's "R/T" field minus this thread,
// the median of three looks 5 ms apart (one look can catch a passing burst).
int others_runnable() {
  std::vector<int> seen;
  for (int i = 0; i < 3; ++i) {
    if (i) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    FILE* f = std::fopen("/proc/loadavg", "r");
    if (!f) return 0;
    double a, b, c;
    int running = 0, total = 0;
    const int got = std::fscanf(f, "%lf %lf %lf %d/%d", &a, &b, &c, &running, &total);
    std::fclose(f);
    if (got != 5) return 0;
    seen.push_back(std::max(0, running - 1));
  }
  std::sort(seen.begin(), seen.end());
  return seen[seen.size() / 2];
}
std::string fmt_threads(int threads) {
  return "; run.threads = 0 takes " + std::to_string(threads) + " thread" +
         (threads > 1 ? "s" : "");
}
}  // namespace

std::string omp_choice_for(int64_t run_threads) {
  const char* chosen = std::getenv("NORMLAB_OMP_CHOICE");
  std::string text = chosen ? chosen : "";
  // choose_omp_wait_policy runs before the manifest is read: its count is run.threads = 0's.
  const std::string zero = "; run.threads = 0 takes ";
  const size_t at = text.find(zero);
  if (run_threads > 0 && at != std::string::npos)
    text = text.substr(0, at) + "; run.threads = " + std::to_string(run_threads) +
           " sets the threads (0 would have taken " + text.substr(at + zero.size()) + ")";
  return text;
}

int usable_threads() {
  // A busy machine at the start (choose_omp_wait_policy): what the others leave.
  if (const char* chosen = std::getenv("NORMLAB_THREADS_CHOICE"); chosen && std::atoi(chosen) > 0)
    return std::atoi(chosen);
  int affinity = 1;
  return std::max(1, int(std::floor(usable_cores(&affinity) + 1e-9)));
}

bool choose_omp_wait_policy() {
  constexpr const char* kChoice = "NORMLAB_OMP_CHOICE";
  if (std::getenv("OMP_WAIT_POLICY") || std::getenv(kChoice)) return false;  // set, or re-executed
  try {
    if (!automatic_choice_on("NORMLAB_OMP_AUTO")) return false;
  } catch (const std::invalid_argument&) {
    return false;  // the CLI refuses the value once the verb is parsed (runner/cli.cpp)
  }
  double load = 0;
  int runnable = 0;  // others' threads runnable now: the load average lags a minute behind
  if (const char* forced = std::getenv("NORMLAB_OMP_LOAD")) {
    load = std::atof(forced);
    runnable = int(load);
  } else if (getloadavg(&load, 1) != 1) {
    return false;
  } else {
    runnable = others_runnable();
  }
  int affinity = 1;
  const double cores = usable_cores(&affinity);
  // The load average lags a minute: alone it called a machine busy right after a build ended,
  // so it counts only while some other thread is runnable now.
  const bool busy = double(runnable) >= cores - 0.5 || (load >= cores - 0.5 && runnable >= 1) ||
                    cores < double(affinity) - 0.5;
  char why[200];
  std::snprintf(why, sizeof why,
                "%s: load %.2f, %d other threads runnable, on %.3g usable cores (%d in the "
                "affinity mask)",
                busy ? "PASSIVE, the machine was busy" : "libgomp's default, the machine was quiet",
                load, runnable, cores, affinity);
  // What the machine can give this run (run.threads = 0): the usable cores the others leave
  // free, at least one. Measured beside 4 busy processes on 2 cores: 2 passive threads took
  // 1.4-1.6x the time of 1 (bench/busy_machine.py).
  const int threads = std::max(1, int(std::floor(cores - double(runnable) + 1e-9)));
  std::string text = why;
  if (busy) text += fmt_threads(threads);
  setenv(kChoice, text.c_str(), 1);
  if (busy) {
    setenv("OMP_WAIT_POLICY", "PASSIVE", 1);
    setenv("NORMLAB_THREADS_CHOICE", std::to_string(threads).c_str(), 1);
  }
  return busy;
}
}  // namespace normlab
