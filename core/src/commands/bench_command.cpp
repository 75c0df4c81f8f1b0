#include <sys/resource.h>
#include <time.h>
#include <torch/csrc/autograd/profiler_legacy.h>
#include <torch/version.h>

#include <chrono>
#include <istream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "commands/commands.h"
#include "normlab/model/transformer_model.h"
#include "normlab/runtime_env.h"
#include "run/label_smoothing.h"
#include "run/model_assembly.h"
#include "run/optimizer.h"
#include "speed_levers.h"
#include "torch_api.h"
#include "train/update_step.h"

namespace normlab {
namespace {

using json = nlohmann::json;

// Multiply-adds of one forward pass counted as 2 FLOPs; a training step is 3 forward passes
// (the backward pass computes two GEMMs per forward GEMM). Padded positions count: they are
// computed.
double step_flops(const ModelGeometry& g, int64_t B, int64_t T, int64_t V) {
  const double d = g.d_model, f = g.ffn_dim, tok = double(B * T);
  const double proj = 2 * tok * 4 * d * d, ffn = 2 * tok * 2 * d * f,
               attn = 2 * 2 * double(B) * T * T * d;
  double fwd = double(g.dec_layers) * (proj + ffn + attn) + 2 * tok * d * double(V);
  if (g.arch == Arch::EncDec)
    fwd += double(g.enc_layers) * (proj + ffn + attn) + double(g.dec_layers) * (proj + attn);
  return 3 * fwd;
}

double peak_rss_mib() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return double(u.ru_maxrss) / 1024.0;
}

void disable_levers(const std::vector<std::string>& levers) {
  for (const auto& lever : levers) {
    if (lever == "dropout") speed_levers().counter_dropout = false;
    if (lever == "adamw") speed_levers().flat_adamw = false;
    if (lever == "loss") speed_levers().fused_loss = false;
    if (lever == "attention") speed_levers().fused_attention = false;
    if (lever == "ffn") speed_levers().fused_ffn = false;
    if (lever == "projection") speed_levers().fused_projection = false;
    if (lever == "onednn") speed_levers().onednn_gemm = false;
    if (lever == "openblas") speed_levers().system_openblas = false;
    if (lever == "linear") speed_levers().fused_linear = false;
    if (lever == "norm") speed_levers().fused_residual_norm = false;
    if (lever == "bf16") speed_levers().bf16_gemm = false;
    if (lever == "cuda") speed_levers().cuda_fused = false;
  }
}

// The benchmark's fixed batch: tokens in [1, vocab); the last quarter of every other row is
// padding (pad id 0), as bench/eager_reference.py builds it.
DeviceBatch random_batch(const BenchOptions& opt) {
  auto tokens = [&](int64_t len) {
    auto t = torch::randint(1, opt.vocab, {opt.batch, len}, torch::kLong);
    t.index_put_({torch::indexing::Slice(0, torch::indexing::None, 2),
                  torch::indexing::Slice(len * 3 / 4, torch::indexing::None)},
                 0);
    return t;
  };
  const torch::Tensor src = tokens(opt.length), tgt = tokens(opt.length + 1);
  DeviceBatch batch;
  if (opt.geometry.arch != Arch::LM) batch.src = src;
  batch.tgt_in = tgt.narrow(1, 0, opt.length);
  batch.tgt_out = tgt.narrow(1, 1, opt.length);
  batch.tokens = batch.tgt_out.ne(0).sum().item<int64_t>();
  return batch;
}

}  // namespace

int bench(const PluginRegistry& reg, const BenchOptions& opt, std::istream& in, std::ostream& out) {
  disable_levers(opt.disable);
  const int threads = opt.threads > 0 ? opt.threads : usable_threads();
  at::set_num_threads(threads);
  const ModelGeometry& g = opt.geometry;
  ModelSpec spec = model_spec(g, opt.scheme, opt.vocab, opt.dropout);
  spec.config.attention_dropout = opt.attention_dropout;
  spec.config.activation_dropout = opt.activation_dropout;
  const ModelConfig& cfg = spec.config;
  torch::manual_seed(opt.seed);
  const AssembledModel assembled = assemble_model(spec, reg);
  TransformerModel model = assembled.model;

  const DeviceBatch batch = random_batch(opt);
  const torch::Tensor &src = batch.src, &tgt_in = batch.tgt_in;
  const double ntok = double(batch.tokens);
  UpdateOptions update;  // the trainer's gradient pass (run.dtype: fp32, or bf16 autocast)
  update.dtype = opt.dtype;
  update.label_smoothing = opt.label_smoothing;
  update.pad_id = cfg.pad_id;

  // The trainer's optimizer and settings (manifest defaults).
  FlatAdamW optimizer(
      model->parameters(),
      torch::optim::AdamWOptions(5e-4).betas({0.9, 0.98}).eps(1e-8).weight_decay(0));
  model->run_setup_pass(
      [&] { g.arch == Arch::LM ? model->forward_lm(tgt_in) : model->forward(src, tgt_in); });
  double last_loss = 0, last_gnorm = 0;
  // CPU time of the process too: on a busy machine it moves much less than wall time.
  auto cpu_ms = [] {
    timespec ts{};
    clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &ts);
    return double(ts.tv_sec) * 1e3 + double(ts.tv_nsec) * 1e-6;
  };
  double last_cpu_ms = 0;
  auto step = [&] {
    const double c0 = cpu_ms();
    const auto t0 = std::chrono::steady_clock::now();
    optimizer.zero_grad();
    const UpdateLoss s = accumulate_gradients(*model, {batch}, update);
    last_gnorm = optimizer.clip_grad_norm(std::numeric_limits<double>::infinity());
    last_loss = s.loss / ntok;
    optimizer.step();
    last_cpu_ms = cpu_ms() - c0;
    return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
  };
  auto run_steps = [&](int n) {
    std::vector<double> ms, cpu;
    for (int i = 0; i < n; ++i) {
      ms.push_back(step());
      cpu.push_back(last_cpu_ms);
    }
    return json{{"ms", ms}, {"cpu_ms", cpu}, {"loss", last_loss}, {"gnorm", last_gnorm}};
  };
  auto info = [&] {
    const BlasInfo b = blas_info();
    int64_t n_params = 0;
    for (const auto& p : model->parameters()) n_params += p.numel();
    return json{{"impl", "normlab"},
                {"torch", TORCH_VERSION},
                {"dtype", opt.dtype},
                {"threads", at::get_num_threads()},
                {"blas_library", b.library},
                {"blas_core", b.corename},
                {"blas_parallel", b.parallel},
                {"blas_threads", b.threads},
                {"coretype_env", b.coretype_env},
                {"coretype_chosen_by", b.chosen_by},
                {"layer_gemm", b.layer_gemm},
                {"bf16_gemm", b.bf16_gemm},
                {"small_gemm", b.small_gemm},
                {"cpu_kernels", kernel_isa_name(kernel_isa())},
                {"parameters", n_params},
                {"target_tokens", ntok},
                {"tokens_per_step", double(opt.batch * opt.length)},
                {"flops_per_step", step_flops(g, opt.batch, opt.length, opt.vocab)},
                {"peak_rss_mib", peak_rss_mib()},
                {"dropout",
                 {{"residual", opt.dropout},
                  {"attention", opt.attention_dropout},
                  {"activation", opt.activation_dropout}}},
                {"disabled", opt.disable}};
  };

  for (int i = 0; i < opt.warmup; ++i) step();
  if (!opt.serve) {
    // NORMLAB_BENCH_PROFILE=FILE: LibTorch's operator trace of the timed steps (chrome://tracing).
    std::unique_ptr<torch::autograd::profiler::RecordProfile> profile;
    if (const char* file = std::getenv("NORMLAB_BENCH_PROFILE"))
      profile = std::make_unique<torch::autograd::profiler::RecordProfile>(std::string(file));
    json r = run_steps(opt.steps);
    profile.reset();
    r["info"] = info();
    out << r.dump() << std::endl;
    return 0;
  }
  out << json{{"ready", true}}.dump() << std::endl;
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream words(line);
    std::string cmd;
    words >> cmd;
    if (cmd == "steps") {
      int n = 1;
      words >> n;
      out << run_steps(n).dump() << std::endl;
    } else if (cmd == "info") {
      out << info().dump() << std::endl;
    } else if (cmd == "quit") {
      break;
    }
  }
  return 0;
}

}  // namespace normlab
