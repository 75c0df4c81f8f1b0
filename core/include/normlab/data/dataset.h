// Data for training: corpora read and validated, tokenized with SentencePiece (cached), or
// built-in synthetic tasks; token-budget batches. No LibTorch here: the trainer makes tensors.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace normlab::data {

// Special ids, identical for every tokenizer (SentencePiece is trained with these).
constexpr int32_t kPad = 0, kUnk = 1, kBos = 2, kEos = 3;

// A bad input file or setting; the message names the file (and line) and what was expected.
class DataError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct TokenizerConfig {
  std::string model;  // an existing SentencePiece .model; empty: train one
  int vocab_size = 8000;
  std::string model_type = "unigram";  // unigram | bpe | char | word
  bool joint = true;                   // translation: one model for source and target
  double character_coverage = 1.0;
};

struct DataConfig {
  std::string task = "copy";  // translation | lm | copy | reverse | synthetic-lm
  // A named dataset (`normlab data list`), fetched on first use; it sets the task and the paths.
  std::string dataset;
  std::string pair;  // translation: "en-de" …; empty: the dataset's default
  // translation: parallel files, one sentence per line, line i of src ↔ line i of tgt
  std::string train_src, train_tgt, valid_src, valid_tgt, test_src, test_tgt;
  // lm: text files; without `valid`, the last lm_valid_fraction of `train`'s lines is validation
  std::string train, valid, test;
  double lm_valid_fraction = 0.1;
  int lm_block = 128;  // tokens per LM example (the stream is cut into blocks)
  TokenizerConfig tokenizer;
  std::string cache_dir;  // tokenizers and tokenized corpora; empty: $HOME/.cache/normlab/data
  int max_len = 256;      // training pairs with a side longer than this (tokens) are dropped
  // synthetic tasks (copy, reverse: seq2seq; synthetic-lm): deterministic from `seed`
  int synthetic_vocab = 32, synthetic_min_len = 4, synthetic_max_len = 16;
  int synthetic_train = 20000, synthetic_valid = 500;
  double synthetic_noise = 0.0;  // share of source tokens replaced at random (copy/reverse)
  uint64_t seed = 1;
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;
  virtual std::vector<int32_t> encode(const std::string& text) const = 0;  // no BOS/EOS
  virtual std::string decode(
      const std::vector<int32_t>& ids) const = 0;  // stops at nothing; skips specials
  virtual int32_t vocab_size() const = 0;
};

// One training example. Translation: src and tgt, each ending with kEos. LM: src empty, tgt a
// block.
struct Example {
  std::vector<int32_t> src, tgt;
};

struct Split {
  std::vector<Example> examples;
  std::vector<std::string> references;  // translation: raw target lines (for BLEU), else empty
  std::vector<std::string> sources;     // translation: raw source lines, else empty
};

struct Dataset {
  std::shared_ptr<const Tokenizer> src_tokenizer, tgt_tokenizer;  // the same object when joint
  Split train, valid, test;
  int64_t src_vocab = 0, tgt_vocab = 0;  // including the specials
  std::string summary;                   // one line for logs: sizes, vocab, cache hit/miss
};

// Reads, validates and tokenizes (through the cache) or generates the data. Throws DataError.
Dataset load_dataset(const DataConfig& cfg, std::ostream& log);

// A padded batch, row-major [size × len]. Translation: tgt_in = BOS + tgt[:-1], tgt_out = tgt.
// LM: tgt_in = block[:-1], tgt_out = block[1:] (src empty).
struct Batch {
  int64_t size = 0, src_len = 0, tgt_len = 0;
  std::vector<int64_t> src, tgt_in, tgt_out;
  int64_t target_tokens = 0;  // non-pad entries of tgt_out
};

// Token-budget batches: examples sorted by length (bucketed), cut so that padded size ≤ max_tokens,
// the batch order shuffled per epoch from (seed, epoch). Same seed, same batches.
class BatchPlan {
 public:
  BatchPlan(const Split& split, int64_t max_tokens, uint64_t seed, bool shuffle);
  // The batches of one epoch, each a list of example indices.
  std::vector<std::vector<int32_t>> epoch(int64_t epoch) const;
  Batch make(const std::vector<int32_t>& indices) const;

 private:
  const Split* split_;
  int64_t max_tokens_;
  uint64_t seed_;
  bool shuffle_;
  bool lm_ = false;                            // every example has an empty src: LM shift in make()
  std::vector<std::vector<int32_t>> buckets_;  // fixed; only their order changes per epoch
};

}  // namespace normlab::data
