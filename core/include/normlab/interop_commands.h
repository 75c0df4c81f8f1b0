// `normlab data` (named datasets) and `normlab export` (a run for plain PyTorch). No LibTorch
// include here: the runner compiles in a second.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

namespace normlab {

struct DataOptions {
  std::string action;  // list | fetch | path | tokenize
  std::string name;
  // tokenize: text files → normlab token shards (docs/data.md)
  std::vector<std::string> inputs;
  std::string out, model, model_type = "bpe", jsonl_field, cache_dir;
  int vocab_size = 32000, jobs = 1;
  int64_t sample_lines = 200000;  // a uniform sample over all inputs, seeded by sample_seed
  uint64_t sample_seed = 0;
  bool word_cache = true;  // false: SentencePiece on whole lines (the reference path)
  int64_t max_line_bytes = int64_t(8) << 20;  // tokenize: a longer line is refused
  int64_t piece_mb = 64;  // tokenize: inputs cut into pieces (and shards) of about this much text
  std::string documents = "lines";  // tokenize: lines | paragraphs | files (plain inputs)
  bool keep_newlines = false;       // tokenize: a trained tokenizer keeps newlines, indentation
};
// `normlab data list | fetch NAME | path NAME`: the named datasets, their download (resumable,
// SHA-256 checked, $NORMLAB_DATA_MIRROR) and their folder. Returns the exit code (2: bad name or a
// failed download, one line on `err`; path: 1 when not fetched yet; tokenize: 75 when another
// tokenize holds --out's tokenize.lock).
int data_command(const DataOptions& opt, std::ostream& out, std::ostream& err);

struct ExportOptions {
  std::string run_dir, to;
  std::string checkpoint;  // best | last | step_N; empty: best.safetensors when it exists, else
                           // last.safetensors
  bool reference_logits =
      false;  // also DIR/reference.pt: a fixed input and normlab's logits for it
  std::string format =
      "torch";  // torch: model.pt; hf: model.safetensors (a HuggingFace-style folder)
  std::vector<std::string> plugin_paths;
  bool allow_unverified = false;  // export a checkpoint SHA256SUMS does not vouch for
};
// `normlab export RUN --to DIR`: DIR/model.pt (a state_dict `torch.load` opens; with format hf
// DIR/model.safetensors instead), DIR/config.json
// (geometry, scheme, tokenizer) and the tokenizer model(s), for python/normlab_torch.py. Reads the
// run's manifest.resolved.toml and its data (for the vocabulary). Returns the exit code.
int export_command(const ExportOptions& opt, std::ostream& out, std::ostream& err);

}  // namespace normlab
