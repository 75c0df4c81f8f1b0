// `normlab eval`, `normlab translate` and `normlab forward`: a trained run's model rebuilt from
// its directory, then scored, used or inspected. No LibTorch here (the runner includes it).
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace normlab {

struct RunModelOptions {
  std::string run;         // the run directory
  std::string checkpoint;  // best | last | step_N | avg:K | FILE.safetensors; "": best.safetensors
                           // if present, else last.safetensors
  std::string device;      // "": the manifest's run.device
  std::vector<std::string> plugin_paths;
  bool allow_unverified = false;  // use a checkpoint whose SHA-256 SHA256SUMS does not vouch for
  bool all_tokens = false;        // a language model's whole valid/test split (eval --all-tokens)
  int threads = 0;                // > 0: LibTorch's intra-op threads (eval --threads); 0: the
                                  // run's run.threads, as training took them
};

struct DecodeOptions {
  int64_t beam = 5;
  double lenpen = 1.0;
  // Output length limit a·src_len + b; negative: the run's eval.max_len_a/b, as its test decode
  // used.
  double max_len_a = -1;
  int64_t max_len_b = -1;
  int64_t batch_tokens = 8000;  // sentences × beam × (source + output limit) per batch
};

struct EvalOptions {
  RunModelOptions model;
  DecodeOptions decode;
  std::string split = "test";  // valid | test
  bool json = false;           // the summary as one JSON object instead of text
  // Downstream tasks instead of the split (issue 58, eval/task_eval.h): JSONL files, each scored.
  std::vector<std::string> tasks;
  int shots = 0;                  // few-shot examples per item, from each file's pool
  int64_t limit = 0;              // > 0: the first N items of each task
  uint64_t seed = 1234;           // the few-shot draw
  bool separate_choices = false;  // every choice its own sequence, its context not shared
  int nproc = 1;  // > 1: the items split across this many local processes (c10d, gloo)
};
// Exit codes: 0, 2 bad input (a missing run, checkpoint or split: one line naming it).
int eval_command(const EvalOptions& opt, std::ostream& out, std::ostream& err);

struct AblateOptions {
  RunModelOptions model;
  std::string drop_layer = "each";  // each | a comma list of layer indices (negative from the top)
  std::string split = "valid";      // valid | test
  int64_t batch_tokens = 4096;
  bool json = false;
  int jobs = 1;  // a sweep directory: runs ablated at a time
};
// `normlab ablate RUN --drop-layer each`: the split's NLL with each layer of each stack skipped
// (its residual branches removed: the layer passes its input on), one row per layer, written to
// RUN/eval/ablate.<split>.<checkpoint>.csv (`normlab plot` draws it). Exit codes as eval.
// RUN may be a sweep directory (sweep.json): every run with a checkpoint, opt.jobs at a time, then
// the sweep's ablation figure in SWEEP/ablation (commands/ablate_sweep.cpp). Layers are numbered
// from 0 (as --drop-layer takes them; the figures number them from 1).
int ablate_command(const AblateOptions& opt, std::ostream& out, std::ostream& err);

struct TranslateOptions {
  RunModelOptions model;
  DecodeOptions decode;
};
// Source sentences (raw text, one a line) from `in`, detokenized translations to `out` in order.
int translate_command(const TranslateOptions& opt, std::istream& in, std::ostream& out,
                      std::ostream& err);

struct ForwardOptions {
  RunModelOptions model;
  std::string input;  // encdec: "SOURCE<TAB>TARGET PREFIX" lines (prefix optional); lm: text lines
  bool ids = false;   // lm: each line is token ids separated by spaces (runs on any token shards)
  int64_t top_k = 5;
  bool hidden = false;  // also every layer's output vectors
};
// One JSON object on `out` (docs/evaluate.md has the layout).
int forward_command(const ForwardOptions& opt, std::ostream& out, std::ostream& err);

}  // namespace normlab
