// A validated experiment manifest (`normlab train MANIFEST.toml`). No LibTorch, no toml++ here.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>
#include <vector>

#include "normlab/data/dataset.h"
#include "normlab/sdk/params.h"

namespace normlab {

// One-line manifest error: "file:line:column: [section] key: expected …, got …".
class ManifestError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ModelSection {
  std::string arch = "encdec";  // encdec | lm
  std::string family =
      "transformer";  // transformer (fairseq) | llama (RMSNorm, SwiGLU, RoPE, no biases)
  int64_t d_model = 512, ffn_dim = 2048, heads = 8, enc_layers = 6, dec_layers = 6;
  double dropout = 0.1, attention_dropout = 0.0, activation_dropout = 0.0;
  std::string share_embeddings = "none";  // none | decoder | all
  // llama family (ModelConfig): ffn_dim, when not given, is int(8d/3) rounded up to
  // ffn_multiple_of.
  int64_t kv_heads = 0, ffn_multiple_of = 256;
  double rope_theta = 10000, init_std = 0.02;
  bool scaled_init = false;
  // Either family (issue 67.1; ModelConfig): q/k norm none | rms | layer, its scope head | all,
  // and Gemma 2's soft-caps (0 = off).
  std::string qk_norm = "none", qk_norm_scope = "head";
  double attn_logit_softcap = 0.0, final_logit_softcap = 0.0;
};

struct SchemeSection {
  std::string name = "post-ln";
  std::string norm = "layernorm";  // the norm kind of every norm the scheme places (NormKind names)
  double norm_eps = 1e-5;
  std::map<std::string, ParamValue> params;      // every other key of [scheme]
  std::map<std::string, std::string> params_at;  // key → "file:line:col", for errors
};

struct OptimSection {
  double lr = 5e-4, beta1 = 0.9, beta2 = 0.98, eps = 1e-8;
  int64_t warmup_updates = 4000;
  std::string lr_schedule = "inverse_sqrt";  // inverse_sqrt | constant | cosine | wsd
  double min_lr_ratio = 0.1;  // cosine, wsd: the lr at max_updates, as a fraction of lr
  // wsd (warmup-stable-decay): the decay's length in updates, ending at max_updates (0: a fifth of
  // max_updates), and its shape: 1-sqrt (Hägele et al. 2024, Sec. 3) or linear.
  int64_t decay_updates = 0;
  std::string decay_shape = "1-sqrt";
  double weight_decay = 0.0, clip_norm = 0.0, label_smoothing = 0.1;
  double z_loss = 0.0;  // PaLM's auxiliary z_loss·log²Z per target token (0 = off)
  // Which parameters weight decay skips: auto (the family's default) | nothing | vectors |
  // vectors+scheme (run/weight_decay.h).
  std::string no_decay = "auto";
  int64_t max_tokens = 4096, max_updates = 10000, max_epochs = 0;
  int64_t update_freq = 1;  // batches accumulated per update (fairseq's --update-freq)
};

struct EvalSection {
  int64_t interval = 1000;  // validate every N updates (and at the end); 0: only at the end
  bool bleu = true;         // translation: greedy decoding + sacreBLEU-compatible corpus BLEU
  int64_t bleu_max_sentences = 0;  // 0: the whole validation set
  int64_t bleu_after_updates = 0;  // no BLEU before this update (the loss is validated throughout)
  int64_t bleu_every = 1;          // BLEU on every k-th validation (and the final one)
  int64_t patience = 0;    // stop after this many validations without a better nll; 0: never
  double max_len_a = 1.2;  // decoding stops at a·src_len + b tokens
  int64_t max_len_b = 10;
  int64_t test_beam = 5;  // at the end of training: test score with this beam (0: none)
  // lm: tokens of validation (and test) to evaluate, the same blocks every time; 0: all of a text
  // file, 2^20 of token shards (data.valid_tokens takes it).
  int64_t valid_tokens = 0;
  // Downstream tasks in the loop (language models; docs/downstream.md): task JSONL files scored
  // every tasks_interval updates (0: at each validation) and at the end, on the first tasks_limit
  // items of each (0: all), tasks_shots examples each.
  std::vector<std::string> tasks;
  int64_t tasks_interval = 0;
  int64_t tasks_limit = 500;
  int64_t tasks_shots = 0;
};

struct RunSection {
  std::string out_dir;  // default: runs/<manifest stem>
  int64_t seed = 1;
  std::string device = "cpu";
  int64_t threads = 0;  // 0: all cores
  int64_t log_interval = 100, checkpoint_interval = 1000;
  int64_t checkpoint_keep_last = 2;  // step_N.safetensors kept (last.safetensors always)
  bool save_initial =
      false;  // checkpoints/step_0.safetensors: the initialization (after the scheme's setup pass)
  std::string checkpoint_save_best =
      "valid_nll";              // valid_nll | bleu | none: best.safetensors by this metric
  bool allow_oversize = false;  // train even when the memory estimate exceeds what is available
  bool init_on_cpu = false;     // draw the initial weights on the CPU (a CPU run's), then move them
  double divergence_loss = 0.0;  // training nll above this is divergence; 0: 3·ln(vocab)
  std::string dtype = "fp32";    // fp32 | bf16 | fp16: autocast precision of the training forward
  bool tf32 = false;             // on a GPU, fp32 matrix products on tensor cores with TF32 inputs
  bool cuda_graph = false;       // on a GPU, each update replayed from a CUDA graph (per shape)
  bool activation_checkpointing = false;  // recompute each layer in backward (less memory)
  std::vector<std::string> plugin_path;
  // Data-parallel jobs (torchrun, srun, normlab train --nproc): the c10d backend (auto: nccl on
  // CUDA, gloo on CPU) and the longest wait for another rank (joining, or any collective).
  std::string dist_backend = "auto";
  double dist_timeout_s = 1800;
  bool shard_optimizer =
      false;  // ZeRO stage 1: each rank keeps and updates 1/world of AdamW's moments
};

// Probes of the analysis module (docs/analysis.md); off unless `probes` is set.
struct AnalysisSection {
  std::vector<std::string> probes;  // "all" or names: grad_norm act_grad_norm update_norm …
  int64_t interval = 10;            // probe every N updates …
  int64_t dense_until = 200;        // … and at every update up to this one
  std::string layers = "auto";      // auto | all | "0,1,-2,-1" (negative: from the top)
  std::vector<int64_t>
      cosine_at;  // updates with the layer-similarity matrix (default: 0 and the last)
  int64_t probe_sentences = 16;  // the fixed probe batch: first N validation examples
  // Record files: csv = analysis.csv (the canonical table), jsonl = analysis.jsonl, tensorboard =
  // <run>/tensorboard events (with the training curves).
  std::vector<std::string> formats = {"csv"};
  bool tensorboard = false;  // old spelling of "tensorboard" in formats (true adds it)

  bool writes(const std::string& format) const {
    for (const auto& f : formats)
      if (f == format) return true;
    return format == "tensorboard" && tensorboard;
  }
};

struct ExperimentSpec {
  std::string source;  // the manifest file
  ModelSection model;
  SchemeSection scheme;
  data::DataConfig data;
  OptimSection optim;
  EvalSection eval;
  RunSection run;
  AnalysisSection analysis;
};

class PluginRegistry;

// Parses and validates a manifest: TOML syntax, unknown keys, types, ranges, choices, files that
// must exist, the scheme and its parameters (through `registry`, unless null). `overrides` are
// "section.key=value" (value in TOML syntax; bare words are strings). Throws ManifestError.
ExperimentSpec load_manifest(const std::string& path, const std::vector<std::string>& overrides,
                             const PluginRegistry* registry);

struct ManifestLoadOptions {
  // Top-level tables another reader owns (`normlab sweep` reads [sweep]); skipped, not rejected.
  std::vector<std::string> ignore_tables;
  // Per override (same order; shorter is fine): "file:line:column" it came from, used in error
  // messages instead of "--set key"; such an override's relative paths are taken from the
  // manifest's folder like the manifest's own. "" = from the command line.
  std::vector<std::string> override_origins;
};
ExperimentSpec load_manifest(const std::string& path, const std::vector<std::string>& overrides,
                             const PluginRegistry* registry, const ManifestLoadOptions& options);

// "" when `dotted` ("model.enc_layers", "scheme.T", "data.tokenizer.vocab_size") names a manifest
// key (any key of [scheme] is a scheme parameter, checked later against the scheme), else what
// is wrong with it ("unknown key 'x' of [model] (known: …)").
std::string check_manifest_key(const std::string& dotted);
// The manifest's tables: model, scheme, data, data.tokenizer, optim, eval, run.
const std::vector<std::string>& manifest_sections();

// The fully resolved manifest (defaults filled, overrides applied) as TOML text.
std::string dump_manifest(const ExperimentSpec& spec);

// Where [analysis] probes takes its choices from: the analysis module registers its probe
// registry here (at static initialization), so a probe added in one file is selectable by name.
using ProbeNameSource = std::vector<std::string> (*)();
void set_probe_name_source(ProbeNameSource names);

// The reference table of every key (markdown), generated from the schema.
std::string manifest_reference_markdown();

}  // namespace normlab
