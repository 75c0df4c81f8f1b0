// Shared fixtures for the doctest suites: the build tree's plugins and small models.
#pragma once

#include <doctest/doctest.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <sys/wait.h>
#include <torch/torch.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <functional>
#include <limits>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "normlab/model/transformer_model.h"
#include "normlab/plugins/registry.h"

namespace normlab::test {

// The built-in plugins of this build tree, nothing else.
inline PluginRegistry& builtin_registry() {
  static PluginRegistry reg({NORMLAB_TEST_PLUGIN_DIR}, /*use_default_paths=*/false);
  return reg;
}

inline ModelConfig small_config(Arch arch, int N, int M, int d = 16, int heads = 2, int ffn = 32) {
  ModelConfig cfg;
  cfg.arch = arch;
  cfg.d_model = d;
  cfg.heads = heads;
  cfg.ffn_dim = ffn;
  cfg.enc_layers = arch == Arch::EncDec ? N : 0;
  cfg.dec_layers = M;
  cfg.src_vocab = cfg.tgt_vocab = 50;
  cfg.dropout = 0.0;
  return cfg;
}

inline TransformerModel make_model(const std::string& scheme, const ModelConfig& cfg,
                                   const std::map<std::string, ParamValue>& params = {}) {
  return TransformerModel(cfg, builtin_registry().create(scheme, params, cfg.geometry()));
}

// The manifests in experiments/ name the dataset multi30k (fetched on first use); tests read the
// shared corpus instead: data.dataset cleared and one `data.KEY=path` override per file, for
// load_manifest or `--set`.
inline std::vector<std::string> shared_multi30k_overrides() {
  const std::string dir =
      std::filesystem::absolute(std::filesystem::path(NORMLAB_TEST_SHARED_DATA) / "multi30k")
          .lexically_normal()
          .string();
  std::vector<std::string> sets = {"data.dataset=\"\"", "data.task=\"translation\""};
  for (const auto& [key, file] :
       std::vector<std::pair<const char*, const char*>>{{"train_src", "train.en"},
                                                        {"train_tgt", "train.de"},
                                                        {"valid_src", "val.en"},
                                                        {"valid_tgt", "val.de"},
                                                        {"test_src", "test_2016_flickr.en"},
                                                        {"test_tgt", "test_2016_flickr.de"}})
    sets.push_back(std::string("data.") + key + "=\"" + dir + "/" + file + "\"");
  return sets;
}

// The inputs of one layer for the equation tests: a padding mask (row 0: last 2 of T keys padded),
// causal too unless `encoder`; with `memory` an encoder output [B,S,D] whose row 1 has its last key
// padded. Drawn from the current torch seed, in this order.
inline normlab::LayerInputs layer_test_inputs(bool encoder, bool memory, int64_t B, int64_t T,
                                              int64_t S, int64_t D) {
  const float neg_inf = -std::numeric_limits<float>::infinity();
  normlab::LayerInputs in;
  auto pad = torch::zeros({B, 1, 1, T});
  pad.index_put_({0, 0, 0, torch::indexing::Slice(3, T)}, neg_inf);
  auto causal = torch::zeros({1, 1, T, T});
  for (int64_t i = 0; i < T; ++i)
    for (int64_t j = i + 1; j < T; ++j) causal[0][0][i][j] = neg_inf;
  in.self_mask = encoder ? pad : causal + pad;
  if (memory) {
    in.memory = torch::randn({B, S, D});
    in.memory_mask = torch::zeros({B, 1, 1, S});
    in.memory_mask.index_put_({1, 0, 0, S - 1}, neg_inf);
  }
  return in;
}

// A new empty folder under the temporary directory, unique to this process: <prefix>_<name>_<pid>.
inline std::filesystem::path fresh_dir(const std::string& prefix, const std::string& name) {
  std::filesystem::path d = std::filesystem::temp_directory_path() /
                            (prefix + "_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(d);
  std::filesystem::create_directories(d);
  return d;
}

// A tiny llama LM on the built-in Markov-chain task, its manifest written to d/m.toml and its run
// in d/run (a few updates of one core: a second or two).
inline std::filesystem::path tiny_llama_manifest(const std::filesystem::path& d,
                                                 const std::string& scheme, int layers, int updates,
                                                 double weight_decay) {
  std::ofstream(d / "m.toml") << fmt::format(
      R"([model]
arch = "lm"
family = "llama"
d_model = 16
heads = 2
dec_layers = {layers}
ffn_multiple_of = 8
dropout = 0.0
[scheme]
name = "{scheme}"
[data]
task = "synthetic-lm"
synthetic_vocab = 16
lm_block = 8
synthetic_train = 40
synthetic_valid = 8
cache_dir = "{dir}/cache"
[optim]
lr = 0.01
warmup_updates = 0
weight_decay = {wd}
max_tokens = 64
max_updates = {updates}
[eval]
interval = 0
test_beam = 0
[run]
out_dir = "{dir}/run"
threads = 1
)",
      fmt::arg("layers", layers), fmt::arg("scheme", scheme), fmt::arg("dir", d.string()),
      fmt::arg("wd", weight_decay), fmt::arg("updates", updates));
  return d / "m.toml";
}

// A file's bytes ("" when it cannot be read).
inline std::string slurp(const std::filesystem::path& p) {
  std::ifstream f(p, std::ios::binary);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

// Starts the normlab CLI (this build's, with its plugins) with `args`, stdout and stderr appended
// to `out`, and `env` ("NAME=value") added to this process's environment.
inline pid_t start_normlab(const std::vector<std::string>& args, const std::filesystem::path& out,
                           const std::vector<std::string>& env = {}) {
  std::vector<std::string> all = {NORMLAB_TEST_CLI};
  all.insert(all.end(), args.begin(), args.end());
  all.insert(all.end(), {"--plugin-path", NORMLAB_TEST_PLUGIN_DIR});
  const pid_t pid = ::fork();
  if (pid == 0) {
    const int fd = ::open(out.c_str(), O_WRONLY | O_CREAT | O_APPEND, 0644);
    ::dup2(fd, 1);
    ::dup2(fd, 2);
    for (const auto& e : env) ::putenv(const_cast<char*>(e.c_str()));
    std::vector<char*> argv;
    for (auto& a : all) argv.push_back(a.data());
    argv.push_back(nullptr);
    ::execv(argv[0], argv.data());
    ::_exit(127);
  }
  return pid;
}

// Its exit code (128 + signal when a signal ended it).
inline int wait_normlab(pid_t pid) {
  int status = 0;
  ::waitpid(pid, &status, 0);
  return WIFEXITED(status) ? WEXITSTATUS(status) : 128 + WTERMSIG(status);
}

// Polls `done` every 20 ms until it holds (true) or `seconds` pass (false).
inline bool wait_until(const std::function<bool()>& done, double seconds = 120) {
  const auto deadline =
      std::chrono::steady_clock::now() + std::chrono::milliseconds(int64_t(seconds * 1000));
  while (std::chrono::steady_clock::now() < deadline) {
    if (done()) return true;
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  return false;
}

// Largest absolute difference, for readable failure messages.
inline double max_abs_diff(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

}  // namespace normlab::test
