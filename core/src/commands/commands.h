// What the `normlab` subcommands do; the runner only parses arguments and calls these.
// No LibTorch include here: the runner compiles in a second.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <map>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

#include "normlab/plugins/registry.h"
#include "normlab/sdk/geometry.h"
#include "normlab/sweep/slurm.h"
#include "normlab/train/trainer.h"
#include "run/build_info.h"

namespace normlab {

struct AblateOptions;
// `normlab ablate SWEEP_DIR`: ablate_command on each run of a sweep, then the sweep's figure.
int ablate_sweep(const AblateOptions& opt, std::ostream& out, std::ostream& err);

// `normlab plugins list`: one row per plugin; problems found while scanning go to `err`.
// Returns the exit code (1 when any problem was found).
int plugins_list(const PluginRegistry& reg, std::ostream& out, std::ostream& err);

struct PluginShowOptions {
  std::string name;
  ModelGeometry geometry;
  std::map<std::string, std::string> params;  // key → value text, typed by the declaration
  bool json = false;
};
// `normlab plugins show NAME`: parameters, equation and the values derived for the geometry.
int plugins_show(const PluginRegistry& reg, const PluginShowOptions& opt, std::ostream& out);

// `normlab plugins new NAME --dir D`: writes D/NAME/CMakeLists.txt and D/NAME/<name>.cpp, a
// commented Post-LN plugin with every SDK hook shown that builds against an installed normlab.
int plugins_new(const std::string& name, const std::string& dir, std::ostream& out);

// A scheme parameter's value as JSON (`plugins show --json`, export's config).
nlohmann::json param_json(const ParamValue& v);

// Converts "key=value" texts to typed scheme parameters using the plugin's declarations.
std::map<std::string, ParamValue> typed_params(const PluginInfo& info,
                                               const std::map<std::string, std::string>& text);

struct SmokeOptions {
  std::vector<std::string> schemes;  // empty: every scheme found
  ModelGeometry geometry{Arch::EncDec, 6, 6, 64, 2, 128};
  int batch = 16, length = 24, vocab = 256;
  std::string device = "cpu";
  int threads = 0;  // 0: LibTorch's default
  unsigned seed = 1;
};
// The built-in default job until training exists: per scheme, one forward and backward pass of a
// default model on a random batch, printing what it did. Returns the exit code.
int smoke(const PluginRegistry& reg, const SmokeOptions& opt, std::ostream& out);

struct BenchOptions {
  ModelGeometry geometry{Arch::EncDec, 6, 6, 64, 2, 128};
  int batch = 32, length = 24, vocab = 8000;  // sentences × tokens per side; LM: blocks × tokens
  double dropout = 0.1, label_smoothing = 0.1;
  double attention_dropout = 0.0, activation_dropout = 0.0;  // model.attention/activation_dropout
  std::string scheme = "post-ln";
  int threads = 0;  // 0: usable_threads(), as run.threads = 0
  int warmup = 2, steps = 5;
  bool serve = false;  // read "steps N" / "info" / "quit" lines on stdin (bench/run_bench.py)
  unsigned seed = 1;
  std::vector<std::string>
      disable;  // levers to turn off: dropout, adamw, loss, attention (to measure each)
  std::string dtype = "fp32";  // fp32 | bf16: the trainer's run.dtype (bf16 autocasts the forward)
};
// `normlab bench`: times training steps (forward, label-smoothed loss, backward, gradient norm,
// AdamW) of a model on a fixed random batch, as the trainer runs them. Prints JSON lines: one
// "info" object (threads, BLAS kernels, FLOPs per step), then the step times. Returns the exit
// code.
int bench(const PluginRegistry& reg, const BenchOptions& opt, std::istream& in, std::ostream& out);

struct TrainOptions {
  std::string manifest;
  std::vector<std::string> overrides;  // "section.key=value"
  std::vector<std::string> plugin_paths;
  bool dump_config = false;
  std::string resume_from;               // --resume-from CHECKPOINT
  bool allow_unverified = false;         // resume from a checkpoint SHA256SUMS does not vouch for
  int nproc = 0;                         // > 1: start this many data-parallel ranks on this machine
  bool allow_world_size_change = false;  // resume a checkpoint of another number of ranks
  bool allow_data_change = false;        // resume on data other than the checkpoint's run's
};
// `normlab train MANIFEST`: validate, then train (or resume) into the run directory. Returns the
// exit code (see normlab/train/trainer.h: 0 completed, 1 failed, 2 bad input, 3 diverged, 75
// another process trains in the run directory, 130 interrupted).
int train_command(const TrainOptions& opt, std::ostream& out, std::ostream& err);
// Trains `spec` as this process's part of a data-parallel job when its launcher's environment says
// it is one (torchrun, srun), as `nproc` local ranks when nproc > 1, else alone. Returns the exit
// code; errors of other ranks are reported on `err`, rank 0's thrown as a single process's.
int train_job(const ExperimentSpec& spec, const PluginRegistry& registry, TrainControl control,
              int nproc, std::ostream& out, std::ostream& err);

struct CheckpointConvertOptions {
  std::string run;
  bool trust_code = false;  // required: the old format's loader runs code stored in the file
  std::vector<std::string> plugin_paths;
};
// `normlab checkpoint convert RUN --trust-code`: RUN's checkpoints/*.pt (and scheme_setup.pt) of
// the old TorchScript format rewritten as .safetensors checkpoints, listed in SHA256SUMS.
int checkpoint_convert_command(const CheckpointConvertOptions& opt, std::ostream& out,
                               std::ostream& err);

struct SweepOptions {
  std::string manifest;
  std::vector<std::string> overrides;  // "section.key=value", applied to every run
  std::vector<std::string> plugin_paths;
  int jobs = 1;
  int threads_per_run = 0;  // > 0: overrides every run's run.threads (recorded in env.json)
  bool dry_run = false, status = false, retry_failed = false;
  bool json = false;   // with status: machine-readable
  double watch_s = 0;  // with status: refresh every watch_s seconds until every run has finished
  bool slurm = false;  // submit as a Slurm job array instead (with dry_run: write the script only)
  SlurmOptions slurm_opt;
};
// `normlab sweep MANIFEST`: expand [sweep] and validate every run, then --dry-run lists them,
// --status prints the table of the sweep directory, otherwise the runs are trained by `jobs`
// worker processes (see normlab/sweep/sweep.h). Exit code: 0 every run completed or diverged,
// 1 a run failed, 2 bad input, 130 interrupted.
int sweep_command(const SweepOptions& opt, std::ostream& out, std::ostream& err);

struct RunOneOptions {
  std::string manifest;
  int index = -1;
  std::vector<std::string> overrides;
  std::vector<std::string> plugin_paths;
};
// `normlab run-one MANIFEST --index I`: train (or resume) run I of the sweep into its directory.
// Exit codes as `normlab train`, plus 75 when another process holds the run's run.lock.
int run_one_command(const RunOneOptions& opt, std::ostream& out, std::ostream& err);

struct FrontierOptions {
  std::string manifest;
  std::vector<std::string> schemes;
  std::vector<int64_t> depths;
  std::string lr = "3e-4:3e-1";      // MIN:MAX of the half-decade grid
  std::vector<int64_t> seeds{1, 2};  // stable at an lr = stable for every seed
  int64_t updates = 100;             // K: each trial trains this many updates
  int bisect = 2;                    // bisection steps after the grid
  std::string out;                   // default: the manifest's [run] out_dir
  int jobs = 1;
  bool dry_run = false, retry_failed = false;
  std::vector<std::string> overrides;  // --set, applied to every trial
  std::vector<std::string> plugin_paths;
};
// `normlab frontier MANIFEST`: per scheme and depth, the largest peak lr that trains `updates`
// updates without divergence (half-decade grid, then bisection; see normlab/sweep/frontier.h).
// Every trial is a run directory under `out`; a rerun reuses finished trials and resumes the
// others. Writes frontier.json and frontier.csv. Exit codes as `normlab sweep`.
int frontier_command(const FrontierOptions& opt, std::ostream& out, std::ostream& err);

// `normlab manifest reference`: the markdown table of every manifest key.
int manifest_reference_command(std::ostream& out);

struct BleuOptions {
  std::string hyp, ref;      // one segment per line ('\n'; a trailing '\r' is dropped)
  std::string tokenize_13a;  // when set: print this file's lines through the 13a tokenizer instead
  bool json =
      false;  // {"score", "counts", "totals", "precisions", "bp", "sys_len", "ref_len", "text",
              //  "signature", "chrf", "chrf_stats", "chrf_signature"}
};
// `normlab bleu`: corpus BLEU as sacreBLEU computes it by default (see normlab/eval/bleu.h), or the
// 13a tokenization of a file. Throws std::runtime_error for unreadable files or a line-count
// mismatch. Returns the exit code.
int bleu(const BleuOptions& opt, std::ostream& out);

}  // namespace normlab
