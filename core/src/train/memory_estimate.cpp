#include "memory_estimate.h"

#include <dlfcn.h>
#include <fmt/format.h>

#include <algorithm>
#include <cstdlib>
#include <fstream>
#include <sstream>

namespace normlab {

// Each attention keeps, per query token, heads x len scores, probabilities and (dropout or the
// softmax backward) one more such tensor: 3 x heads x len elements, fp32 in every dtype here.
double attention_activation_bytes(const ModelConfig& c, int64_t max_tokens,
                                  const TrainingMemoryOptions& o) {
  if (o.max_len <= 0) return 0;
  const double len = double(std::min(o.max_len, max_tokens));
  const bool encdec = c.arch == Arch::EncDec;
  const double per_layer = 3.0 * 4.0 * double(c.heads) * len;
  const double enc = encdec ? double(c.enc_layers) : 0.0,
               dec = double(c.dec_layers) * (encdec ? 2.0 : 1.0);
  const double attentions =
      o.activation_checkpointing ? (c.dec_layers > 0 ? (encdec ? 2.0 : 1.0) : 1.0) : enc + dec;
  return double(max_tokens) * per_layer * attentions;
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
  const double enc_per_token = 16 * d + 3 * f, dec_per_token = 24 * d + (llama ? 5 : 3) * f;
  const double layers = double(encdec ? c.enc_layers : 0) + double(c.dec_layers);
  double per_token_bytes = 4.0 * 3 * double(c.tgt_vocab);
  if (o.activation_checkpointing)  // every layer's fp32 input, and one layer's tensors while it is
                                   // recomputed
    per_token_bytes +=
        4.0 * layers * d + activation_size * (c.dec_layers > 0 ? dec_per_token : enc_per_token);
  else
    per_token_bytes += activation_size * (double(encdec ? c.enc_layers : 0) * enc_per_token +
                                          double(c.dec_layers) * dec_per_token);
  e.activation_bytes =
      double(max_tokens) * per_token_bytes + attention_activation_bytes(c, max_tokens, o);
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

double available_memory_bytes(const std::string& device) {
  if (device.rfind("cuda", 0) == 0) return cuda_free_bytes(device);
  double avail = meminfo_available();
  const double cg = cgroup_available();
  if (cg >= 0 && (avail < 0 || cg < avail)) avail = cg;
  return avail;
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
      "Adam state {}; activations of optim.max_tokens = {}: {}), but {} has {} available; lower "
      "{}, or set "
      "run.allow_oversize = true to try anyway",
      manifest, cfg.d_model,
      cfg.arch == Arch::EncDec ? fmt::format("{}+{}", cfg.enc_layers, cfg.dec_layers)
                               : fmt::format("{}", cfg.dec_layers),
      gib(e.total()), e.parameters, gib(e.state_bytes), max_tokens, gib(e.activation_bytes),
      device.rfind("cuda", 0) == 0 ? device : std::string("this machine"), gib(available_bytes),
      activations && attention ? fmt::format("data.max_len (sentences up to {} tokens: attention "
                                             "keeps heads x len x len per layer), "
                                             "model.heads or optim.max_tokens",
                                             options.max_len)
      : activations            ? (options.activation_checkpointing
                                      ? "optim.max_tokens (raise optim.update_freq to keep the batch)"
                                      : "optim.max_tokens (raise optim.update_freq to keep the batch), or set "
                                        "run.activation_checkpointing = true")
                               : "model.d_model (or model.ffn_dim, model.enc_layers/dec_layers)");
}

}  // namespace normlab
