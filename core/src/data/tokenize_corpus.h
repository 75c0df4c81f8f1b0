// `normlab data tokenize`: text files (plain, .gz, .zst; JSONL with a text field) → normlab token
// shards (data/token_shards.h), with a SentencePiece model given (a LLaMA/Mistral tokenizer.model
// too) or trained on a bounded sample; in parallel over input pieces, resumable after a kill, and
// ending with shards.json (tokens, SHA-256 and largest id per shard), which training checks. No
// LibTorch here.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <string>
#include <vector>

#include "normlab/data/dataset.h"

namespace normlab::data {

// Another `data tokenize` is writing into the same --out (it holds its tokenize.lock): exit 75, as
// `normlab train` for a run directory's run.lock.
class TokenizeBusyError : public DataError {
 public:
  using DataError::DataError;
};

struct TokenizeOptions {
  std::vector<std::string> inputs;
  std::string out;         // the shards' folder (claimed as kind "shards")
  std::string model;       // a SentencePiece .model; empty: train one on a sample
  int vocab_size = 32000;  // when training
  std::string model_type = "bpe";
  int64_t sample_lines = 200000;  // lines (or records) of the inputs the tokenizer is trained on
  uint64_t sample_seed = 0;       // which lines: a uniform sample over all inputs
  std::string jsonl_field;        // the text field of JSONL inputs ("" : "text" for .jsonl files)
  int jobs = 1;
  bool word_cache = true;  // false: every line encoded whole (the result is the same)
  int64_t piece_bytes = int64_t(64) << 20;  // inputs are cut into pieces of about this much text
  // What a document of a plain input is (each ends with EOS): "lines", "paragraphs" (lines up to a
  // blank line, their newlines kept), "files". A JSONL record is a document whatever this says.
  std::string documents = "lines";
  // A trained tokenizer keeps newlines ("\n" a piece of its own) and runs of spaces (indentation):
  // NFKC without NMT's whitespace rules, no whitespace collapsing, byte fallback.
  bool keep_newlines = false;
  // A longer line (or JSONL record) is refused: SentencePiece needs ~100 bytes per byte of a line.
  int64_t max_line_bytes = int64_t(8) << 20;
  std::string cache_dir;
};

// Writes the shards and shards.json into opts.out and returns the number of tokens. Progress goes
// to `log` (a line that rewrites itself on a terminal). DataError naming the input and line on bad
// input (not UTF-8, a JSONL record without the field, an unreadable file, one file given twice);
// TokenizeBusyError when another process holds opts.out's tokenize.lock. The tokenizer.model in
// opts.out changes only together with shards.json, which records its SHA-256.
int64_t tokenize_to_shards(const TokenizeOptions& opts, std::ostream& log, bool tty);

// The tokenizer's training sample (no --model): `sample_lines` non-empty lines (JSONL records of
// non-empty text) drawn uniformly over all inputs in one pass (reservoir sampling, seeded by
// `sample_seed`), all of them when fewer; says on `log` what it drew.
std::vector<std::string> tokenizer_sample(const TokenizeOptions& opts, std::ostream& log);

}  // namespace normlab::data
