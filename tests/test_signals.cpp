// SIGTERM at any moment of a training run: the run saves, says interrupted and exits 130.
// Regression: the handler's frame was pushed onto the interrupted thread's stack, where oneDNN's
// JIT sgemm keeps data below the stack pointer; about one SIGTERM in four during a backward pass
// corrupted the heap
// ("corrupted size vs. prev_size while consolidating", or a segfault) before the handler got its
// own stack (trainer.cpp, SignalScope).
#include <fmt/format.h>
#include <signal.h>

#include <chrono>
#include <random>
#include <thread>

#include "test_support.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_signals {

using namespace normlab::test;
namespace fs = std::filesystem;

TEST_SUITE("signals") {
  TEST_CASE(
      "SIGTERM at random moments of training: always a clean stop (exit 130), never a corrupted "
      "heap") {
    const fs::path d = fresh_dir("normlab_signals", "term");
    // The quickstart's shape: big enough for oneDNN's JIT sgemm in every layer, probes on.
    const fs::path m = d / "m.toml";
    std::ofstream(m) << R"([model]
d_model = 64
ffn_dim = 256
heads = 4
enc_layers = 3
dec_layers = 3
dropout = 0.0

[scheme]
name = "pre-ln"

[data]
task = "reverse"
synthetic_vocab = 24
synthetic_min_len = 3
synthetic_max_len = 10
synthetic_train = 20000
synthetic_valid = 50

[optim]
lr = 1.5e-3
max_tokens = 1536
max_updates = 100000

[run]
log_interval = 5
checkpoint_interval = 100000
threads = 1

[analysis]
probes = ["grad_norm"]
interval = 20
)";
    std::mt19937 rng(12345);
    int clean = 0;
    const int tries = 12;
    for (int i = 0; i < tries; ++i) {
      const fs::path run = d / fmt::format("run{}", i), log = d / fmt::format("run{}.log", i);
      const pid_t pid =
          start_normlab({"train", m.string(), "--set", "run.out_dir=" + run.string()}, log);
      // Into the updates (the first log line, at update 5), then a random moment of an update.
      const auto end = std::chrono::steady_clock::now() + std::chrono::seconds(60);
      while (slurp(log).find("train  |") == std::string::npos &&
             std::chrono::steady_clock::now() < end)
        std::this_thread::sleep_for(std::chrono::milliseconds(20));
      std::this_thread::sleep_for(
          std::chrono::milliseconds(std::uniform_int_distribution<int>(0, 400)(rng)));
      ::kill(pid, SIGTERM);
      const int code = wait_normlab(pid);
      INFO(slurp(log));
      CHECK(code == 130);
      CHECK(slurp(log).find("corrupted") == std::string::npos);
      clean += code == 130;
    }
    CHECK(clean == tries);
    fs::remove_all(d);
  }
}

}  // namespace normlab_test_signals
