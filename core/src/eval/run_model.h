// A finished (or running) run's model rebuilt from its directory: the resolved manifest, the data
// (tokenizers through the cache), the scheme, and the weights of one checkpoint or the average of
// the newest K step_N.safetensors. Reads only: no run.lock, so it works beside a training process.
#pragma once

#include <filesystem>
#include <iosfwd>
#include <stdexcept>
#include <string>
#include <vector>

#include "beam_search.h"
#include "normlab/data/dataset.h"
#include "normlab/eval/bleu.h"
#include "normlab/eval/chrf.h"
#include "normlab/manifest/experiment.h"
#include "normlab/model/transformer_model.h"
#include "torch_api.h"

namespace normlab::eval {

// A run directory, checkpoint or split that does not exist or cannot be used (one line naming it).
class RunInputError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct OpenRunOptions {
  std::string dir;
  std::string checkpoint;  // best | last | step_N | avg:K | a checkpoint file; "":
                           // best.safetensors, else last.safetensors
  std::string device;      // "": the manifest's run.device
  std::vector<std::string> plugin_paths;
  bool allow_unverified = false;  // skip the SHA256SUMS check
  bool all_tokens = false;  // a language model's whole valid/test split, not eval.valid_tokens
  int threads = 0;          // > 0: LibTorch's intra-op threads; 0: the run's run.threads (0 there:
                            // what the machine can give, usable_threads)
};

struct OpenedRun {
  std::filesystem::path dir;
  ExperimentSpec spec;
  data::Dataset ds;
  TransformerModel model{nullptr};
  torch::Device device{torch::kCPU};
  std::string
      checkpoint;  // what was loaded, for humans ("checkpoints/best.safetensors", "average of …")
  std::string
      tag;  // for file names: best, last, step_800, avg3; OTHERRUN.best.u300 for another run's file
};

OpenedRun open_run(const OpenRunOptions& opt, std::ostream& log);

// The run's data as loaded now against what `checkpoints` trained on (issues 66.6, 66.7), as
// training checks them: every normlab shard's SHA-256 against its shards.json (waited for), and
// each checkpoint's data identity (files, sizes, fingerprints, the tokenizer's SHA-256). A
// checkpoint of another run (`other_run`) is checked for its tokenizer alone (it is scored on this
// run's data). `all_tokens`: a held-out end of the train stream longer than the run's is refused
// (it was trained on). Throws RunInputError naming the file; a checkpoint that records no identity
// or no tokenizer (an older normlab's) is taken as it is, with a note on `log`.
void check_run_data(const std::vector<std::filesystem::path>& checkpoints, const data::Dataset& ds,
                    bool other_run, bool all_tokens, std::ostream& log);

// The run's resolved manifest read back: relative data paths (as `normlab train` saw them, from
// its working directory) and run.out_dir = run_dir as --set overrides. Throws RunInputError.
std::vector<std::string> resolved_manifest_overrides(const std::filesystem::path& resolved,
                                                     const std::filesystem::path& run_dir);

// Where a run's scheme plugin is looked for: `cli` (the command line's --plugin-path) and the run's
// own run.plugin_path from its resolved manifest, as `normlab train` found it. Throws
// RunInputError.
std::vector<std::filesystem::path> run_plugin_paths(const std::filesystem::path& run_dir,
                                                    const std::vector<std::string>& cli);

// Parameters and buffers of `model` set to the element-wise mean of the checkpoints' (in float64);
// the scheme state is the last checkpoint's. Throws RunInputError for fewer than one file.
void load_average(const std::vector<std::filesystem::path>& checkpoints,
                  TransformerModelImpl& model);

struct SplitEvaluation {
  std::string split;
  int64_t sentences = 0, target_tokens = 0;
  double nll = 0;           // per target token (EOS included), teacher forced; ppl = exp(nll)
  bool translated = false;  // translation: beam search, BLEU and chrF below
  BleuScore bleu;
  ChrfScore chrf;
  std::vector<std::string> hypotheses;  // detokenized, in the split's order
  double decode_seconds = 0;
};

// Teacher-forced NLL per target token of the split (eval mode, batches of batch_tokens).
double split_nll(TransformerModelImpl& model, const data::Split& split, const torch::Device& device,
                 int64_t batch_tokens, int64_t* target_tokens = nullptr);

// Teacher-forced NLL of the split and, for a translation split with references, beam-search
// hypotheses scored with sacreBLEU-compatible BLEU and chrF.
SplitEvaluation evaluate_split(TransformerModelImpl& model, const data::Dataset& ds,
                               const data::Split& split, const std::string& name,
                               const torch::Device& device, const BeamOptions& beam);

// "BLEU|nrefs:1|…|version:2.6.0 = 35.12 66.1/41.2/28.0/19.3 (BP = …)" and "chrF2|…|version:…
// = 60.12"
std::string bleu_line(const BleuScore& s);
std::string chrf_line(const ChrfScore& s);

}  // namespace normlab::eval
