#include "memory_estimate.h"

#include <dlfcn.h>
#include <fmt/format.h>
#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace normlab {

// With activation checkpointing, the layer being recomputed costs this many times its activations
// at the peak: the activations and their gradients in its backward.
constexpr double kRecomputedLayerFactor = 3.0;

// The attention being computed, forward or backward, holds per query token heads x len scores,
// probabilities and their gradient: 3 x heads x len elements, fp32 in every dtype here. The fused
// kernels keep none of them from layer to layer (they recompute in the backward; measured without
// checkpointing, d 16 and d 64: 16·d + 2·f floats per token and layer, no heads·len term), so one
// attention counts, two for a decoder layer with cross-attention.
// A batch holds at least one whole sequence, however long: an LM block or sentence above
// optim.max_tokens is a batch of its own (issue 42.7: lm_block = 100000 passed at 211 MiB, then
// asked for 40 GB).
int64_t batch_tokens(int64_t max_tokens, const TrainingMemoryOptions& o) {
  return std::max(max_tokens, o.max_len);
}

double attention_activation_bytes(const ModelConfig& c, int64_t max_tokens,
                                  const TrainingMemoryOptions& o) {
  if (o.max_len <= 0) return 0;
  max_tokens = batch_tokens(max_tokens, o);
  const double len = double(std::min(o.max_len, max_tokens));
  const double attentions = c.arch == Arch::EncDec && c.dec_layers > 0 ? 2.0 : 1.0;
  return double(max_tokens) * 3.0 * 4.0 * double(c.heads) * len * attentions;
}

MemoryEstimate estimate_training_memory(const ModelConfig& c, int64_t max_tokens,
                                        const TrainingMemoryOptions& o) {
  const double d = double(c.d_model), f = double(c.ffn_dim);
  // Llama family: no biases, k/v projections of kv_heads·d/heads rows, a third (gate) FFN matrix.
  const bool llama = c.family == Family::Llama;
  const double kv = d * double(c.kv_head_count()) / double(c.heads);
  const double attention = llama ? 2 * d * d + 2 * d * kv : 4 * (d * d + d);
  const double ffn = llama ? 3 * d * f : 2 * d * f + f + d, ln = 2 * d;
  const bool encdec = c.arch == Arch::EncDec;
  const double enc_layer = attention + ffn + 2 * ln,
               dec_layer = attention * (encdec ? 2 : 1) + ffn + 3 * ln;
  double p =
      double(encdec ? c.enc_layers : 0) * enc_layer + double(c.dec_layers) * dec_layer + 2 * ln;
  p += double(c.tgt_vocab) * d;  // target embedding
  if (encdec && c.sharing != EmbeddingSharing::All)
    p += double(c.src_vocab) * d;                                         // source embedding
  if (c.sharing == EmbeddingSharing::None) p += double(c.tgt_vocab) * d;  // output projection
  MemoryEstimate e;
  e.parameters = int64_t(p);
  // fp32 weights, gradients, Adam m and v (sharded: this rank's 1/N of m and v, and a 1/N copy of
  // its updated weights sent by the all-gather); autocast keeps a 2-byte copy of each weight.
  const double shards = double(std::max<int64_t>(o.moment_shards, 1));
  e.state_bytes = 4.0 * p * (shards > 1 ? 2 + 3 / shards : 4) + (o.mixed_precision ? 2.0 * p : 0.0);
  // Per token and layer, the tensors autograd keeps (projections, FFN, norms, dropout masks),
  // plus logits, log-probabilities and their gradient over the vocabulary (fp32 in any dtype).
  const double activation_size = o.mixed_precision ? 2.0 : 4.0;
  // A language model's layer has no cross-attention: it keeps what an encoder layer keeps (measured
  // without checkpointing, pre-ln, d 16 and d 64: 16·d + 2·f floats per token and layer).
  const double enc_per_token = 16 * d + 3 * f,
               dec_per_token = (encdec ? 24 : 16) * d + (llama ? 5 : 3) * f;
  const double layers = double(encdec ? c.enc_layers : 0) + double(c.dec_layers);
  double per_token_bytes = 4.0 * 3 * double(c.tgt_vocab);
  // Every layer's fp32 input, counted twice: each one stays beside a freed block of about its size
  // that the next layers' larger blocks cannot reuse (peak RSS, d 64, 2,048 tokens: 1.79 MiB per
  // layer against 1.3 of state and input; deepnet-1000L on an H200 peaked at 78.9 GiB, this
  // estimate 78.2); and the layer being recomputed.
  if (o.activation_checkpointing)
    per_token_bytes +=
        2 * 4.0 * layers * d + kRecomputedLayerFactor * activation_size *
                                   (c.dec_layers > 0 ? dec_per_token : enc_per_token);
  else
    per_token_bytes += activation_size * (double(encdec ? c.enc_layers : 0) * enc_per_token +
                                          double(c.dec_layers) * dec_per_token);
  e.activation_bytes = double(batch_tokens(max_tokens, o)) * per_token_bytes +
                       attention_activation_bytes(c, max_tokens, o);
  // Measured peak RSS (bench/checkpointing_rss.sh; issue 27.6): a 1-layer run peaks at 183 MiB,
  // LibTorch and OpenBLAS loaded; each layer costs ~72 KiB besides its tensors (its modules, the
  // parameters' TensorImpls, autograd metadata, gradient and moment views, Adam's state entries):
  // d 16 with checkpointing, 2,000 → 20,000 layers, 190 KiB per layer against 116 KiB of tensors.
  // The PyPI wheel's process is larger (its CUDA libraries: a 6-layer run peaked at 508-511 MiB),
  // so the resident set before the model, where it is larger, counts instead, with the ~30 MiB that
  // Debian's build adds by its peak.
  if (o.on_cpu) e.checkpoint_bytes = 3 * 4.0 * p;
  if (o.on_cpu)
    e.runtime_bytes =
        std::max(183.0 * (1 << 20), o.process_bytes + 30.0 * (1 << 20)) + 72.0 * 1024 * layers;
  return e;
}

namespace {

double meminfo_available() {
  std::ifstream f("/proc/meminfo");
  std::string key;
  double kb = 0;
  std::string unit;
  while (f >> key >> kb >> unit)
    if (key == "MemAvailable:") return kb * 1024;
  return -1;
}

// cgroup v2: memory.max minus memory.current ("max": no limit).
double cgroup_available() {
  std::ifstream cg("/proc/self/cgroup");
  std::string line, path;
  while (std::getline(cg, line))
    if (line.rfind("0::", 0) == 0) path = line.substr(3);
  if (path.empty()) return -1;
  std::ifstream mx("/sys/fs/cgroup" + path + "/memory.max"),
      cur("/sys/fs/cgroup" + path + "/memory.current");
  std::string max_text;
  double current = 0;
  if (!(mx >> max_text) || max_text == "max" || !(cur >> current)) return -1;
  return std::stod(max_text) - current;
}

// The CUDA runtime LibTorch loaded, looked up at run time: no CUDA headers or link dependency.
double cuda_free_bytes(const std::string& device) {
  using SetDevice = int (*)(int);
  using MemGetInfo = int (*)(size_t*, size_t*);
  auto set_device = reinterpret_cast<SetDevice>(dlsym(RTLD_DEFAULT, "cudaSetDevice"));
  auto mem_get_info = reinterpret_cast<MemGetInfo>(dlsym(RTLD_DEFAULT, "cudaMemGetInfo"));
  if (!set_device || !mem_get_info) return -1;
  const int index = device.size() > 5 ? std::atoi(device.c_str() + 5) : 0;
  size_t free_b = 0, total_b = 0;
  if (set_device(index) != 0 || mem_get_info(&free_b, &total_b) != 0) return -1;
  return double(free_b);
}

std::string gib(double bytes) { return fmt::format("{:.1f} GiB", bytes / double(1 << 30)); }

}  // namespace

double resident_bytes() {
  std::ifstream statm("/proc/self/statm");
  double size = 0, resident = 0;
  return statm >> size >> resident ? resident * double(sysconf(_SC_PAGESIZE)) : 0;
}

double available_memory_bytes(const std::string& device) {
  if (device.rfind("cuda", 0) == 0) return cuda_free_bytes(device);
  double avail = meminfo_available();
  const double cg = cgroup_available();
  if (cg >= 0 && (avail < 0 || cg < avail)) avail = cg;
  return avail;
}

std::string memory_summary(const ModelConfig& cfg, int64_t max_tokens, double available_bytes,
                           const TrainingMemoryOptions& options) {
  const auto size = [](double bytes) {
    return bytes < double(1 << 30) ? fmt::format("{:.0f} MiB", bytes / double(1 << 20))
                                   : gib(bytes);
  };
  const MemoryEstimate e = estimate_training_memory(cfg, max_tokens, options);
  return fmt::format(
      "estimated {} (weights, gradients and Adam state {}, activations {}, runtime {}{}); {} "
      "available",
      size(e.total()), size(e.state_bytes), size(e.activation_bytes), size(e.runtime_bytes),
      e.checkpoint_bytes > 0 ? ", checkpoint copy " + size(e.checkpoint_bytes) : std::string(),
      available_bytes < 0 ? std::string("unknown") : size(available_bytes));
}

std::string oversize_problem(const std::string& manifest, const ModelConfig& cfg,
                             int64_t max_tokens, double available_bytes, const std::string& device,
                             const TrainingMemoryOptions& options) {
  const MemoryEstimate e = estimate_training_memory(cfg, max_tokens, options);
  if (available_bytes < 0 || e.total() <= available_bytes) return "";
  const bool activations = e.activation_bytes > e.state_bytes;
  const bool attention =
      attention_activation_bytes(cfg, max_tokens, options) > e.activation_bytes / 2;
  return fmt::format(
      "{}: [model] d_model = {}, {} layers: training needs about {} ({} parameters: weights, "
      "gradients and "
      "Adam state {}; activations of optim.max_tokens = {}: {}{}), but {} has {} available; lower "
      "{}, or set "
      "run.allow_oversize = true to try anyway",
      manifest, cfg.d_model,
      cfg.arch == Arch::EncDec ? fmt::format("{}+{}", cfg.enc_layers, cfg.dec_layers)
                               : fmt::format("{}", cfg.dec_layers),
      gib(e.total()), e.parameters, gib(e.state_bytes), max_tokens, gib(e.activation_bytes),
      e.runtime_bytes > 0
          ? fmt::format("; LibTorch and per-layer bookkeeping {}; the copy a checkpoint is "
                        "written from {}",
                        gib(e.runtime_bytes), gib(e.checkpoint_bytes))
          : std::string(),
      device.rfind("cuda", 0) == 0 ? device : std::string("this machine"), gib(available_bytes),
      activations && attention && cfg.arch == Arch::LM
          ? fmt::format("data.lm_block (blocks of {} tokens: attention holds heads x len x len per "
                        "block, and a block longer than optim.max_tokens is a batch of its own), "
                        "model.heads or optim.max_tokens",
                        options.max_len)
      : activations && attention ? fmt::format("data.max_len (sentences up to {} tokens: attention "
                                               "holds heads x len x len per sentence), "
                                               "model.heads or optim.max_tokens",
                                               options.max_len)
      : activations              ? (options.activation_checkpointing
                                        ? "optim.max_tokens (raise optim.update_freq to keep the batch)"
                                        : "optim.max_tokens (raise optim.update_freq to keep the batch), or set "
                                          "run.activation_checkpointing = true")
                                 : "model.d_model (or model.ffn_dim, model.enc_layers/dec_layers)");
}

}  // namespace normlab
