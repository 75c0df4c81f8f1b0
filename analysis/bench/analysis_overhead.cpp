// Step-time cost of the analysis probes: the same model and batches trained in alternating blocks
// without and with full analysis (every probe, every `interval` updates), in one process, so both
// see the same machine state. Prints per-step times and the ratio (target ≤ 1.10 at interval 10).
#include <fmt/format.h>
#include <torch/nn/utils/clip_grad.h>
#include <unistd.h>

#include <CLI/CLI.hpp>
#include <algorithm>
#include <chrono>
#include <filesystem>
#include <thread>
#include <vector>

#include "normlab/analysis/probes.h"
#include "normlab/manifest/experiment.h"
#include "normlab/model/transformer_model.h"
#include "normlab/plugins/registry.h"
#include "torch_api.h"

using namespace normlab;
namespace fs = std::filesystem;
using Clock = std::chrono::steady_clock;

int main(int argc, char** argv) {
  CLI::App app{"analysis probe overhead: step time with and without full analysis"};
  std::string scheme = "pre-ln", plugin_dir;
  int layers = 6, d = 256, ffn = 1024, heads = 4, batch = 32, len = 32, block = 50, rounds = 3,
      threads = 0;
  int64_t interval = 10;
  app.add_option("--scheme", scheme);
  app.add_option("--layers", layers, "encoder and decoder layers");
  app.add_option("--d-model", d);
  app.add_option("--ffn-dim", ffn);
  app.add_option("--heads", heads);
  app.add_option("--batch", batch, "sentences per batch");
  app.add_option("--len", len, "tokens per sentence");
  app.add_option("--block", block, "updates per timed block");
  app.add_option("--rounds", rounds, "off/on block pairs");
  app.add_option("--interval", interval, "probe every N updates");
  app.add_option("--threads", threads, "LibTorch threads (0: all cores)");
  app.add_option("--plugin-dir", plugin_dir, "scheme plugins")->required();
  CLI11_PARSE(app, argc, argv);
  if (threads > 0)
    at::set_num_threads(threads);
  else
    at::set_num_threads(int(std::max(1u, std::thread::hardware_concurrency())));

  PluginRegistry registry({plugin_dir}, /*use_default_paths=*/false);
  ModelConfig cfg;
  cfg.arch = Arch::EncDec;
  cfg.d_model = d;
  cfg.ffn_dim = ffn;
  cfg.heads = heads;
  cfg.enc_layers = cfg.dec_layers = layers;
  cfg.src_vocab = cfg.tgt_vocab = 8000;
  cfg.dropout = 0.1;
  torch::manual_seed(1);
  TransformerModel model(cfg, registry.create(scheme, {}, cfg.geometry()));
  torch::optim::AdamW opt(model->parameters(), torch::optim::AdamWOptions(1e-4));
  auto tokens = [&] { return torch::randint(4, cfg.tgt_vocab, {batch, len}, torch::kLong); };
  const torch::Tensor src = tokens(), tgt = tokens(), gold = tokens();

  AnalysisSection a;
  a.probes = {"all"};
  a.interval = interval;
  a.dense_until = 0;
  a.cosine_at = {};  // the default: 0 and the last update only
  a.formats = {"csv", "jsonl", "tensorboard"};
  const fs::path dir =
      fs::temp_directory_path() / fmt::format("normlab_bench_analysis_{}", ::getpid());
  fs::remove_all(dir);
  const int64_t total = int64_t(rounds) * block * 2;
  analysis::ProbeSession probes(a, total + 1, *model, {src.slice(0, 0, 16), tgt.slice(0, 0, 16), 1},
                                dir, 0);

  int64_t update = 0;
  auto step = [&](bool analysed) {
    const int64_t u = ++update;
    opt.zero_grad();
    if (analysed) probes.before_forward(u);
    auto logits = model->forward(src, tgt);
    torch::nn::functional::cross_entropy(logits.reshape({-1, logits.size(-1)}), gold.reshape({-1}))
        .backward();
    if (analysed) probes.after_backward(u);
    const double gnorm = torch::nn::utils::clip_grad_norm_(model->parameters(), 1.0);
    if (analysed) {
      probes.record_total_grad_norm(u, gnorm);
      probes.before_step(u);
    }
    opt.step();
    if (analysed) probes.after_step(u);
  };
  for (int i = 0; i < 5; ++i) step(false);  // warm-up
  // Probe steps fall on multiples of `interval`: align blocks so each "on" block has
  // block/interval.
  update = 0;
  std::vector<double> off_ms, on_ms;
  for (int r = 0; r < rounds; ++r)
    for (bool analysed : {false, true}) {
      const auto t0 = Clock::now();
      for (int i = 0; i < block; ++i) step(analysed);
      const double ms =
          std::chrono::duration<double, std::milli>(Clock::now() - t0).count() / block;
      (analysed ? on_ms : off_ms).push_back(ms);
      fmt::print("round {} {:<13} {:8.2f} ms/update\n", r + 1,
                 analysed ? "with analysis" : "without", ms);
    }
  std::sort(off_ms.begin(), off_ms.end());
  std::sort(on_ms.begin(), on_ms.end());
  const double off = off_ms[off_ms.size() / 2], on = on_ms[on_ms.size() / 2];
  fmt::print(
      "{} {}L-{}L d={} ffn={} batch {}x{}, {} threads, probes every {} updates (all probes, "
      "TensorBoard on)\n",
      scheme, layers, layers, d, ffn, batch, len, at::get_num_threads(), interval);
  fmt::print("median step time: without {:.2f} ms, with {:.2f} ms, ratio {:.3f} (target <= 1.10)\n",
             off, on, on / off);
  fs::remove_all(dir);
  return 0;
}
