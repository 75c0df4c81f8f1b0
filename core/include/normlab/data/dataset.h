// Data for training: corpora read and validated, tokenized with SentencePiece (cached), or
// built-in synthetic tasks; token-budget batches. No LibTorch here: the trainer makes tensors.
#pragma once

#include <cstdint>
#include <iosfwd>
#include <memory>
#include <mutex>
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

// The largest data.mixture weight: their sum stays far below 2^64 (the draw is a 64-bit hash
// modulo the sum).
constexpr int64_t kMaxMixtureWeight = 1'000'000'000;

struct DataConfig {
  std::string task = "copy";  // translation | lm | copy | reverse | synthetic-lm
  // A named dataset (`normlab data list`), fetched on first use; it sets the task and the paths.
  std::string dataset;
  std::string pair;  // translation: "en-de" …; empty: the dataset's default
  // translation: parallel files, one sentence per line, line i of src ↔ line i of tgt
  std::string train_src, train_tgt, valid_src, valid_tgt, test_src, test_tgt;
  // lm: text files; without `valid`, the last lm_valid_fraction of `train`'s lines is validation.
  // With a token-shard `format`: a file or a glob of shards each.
  std::string train, valid, test;
  // lm, token shards: a weighted mixture of shard sets (each a file or a glob) instead of `train`:
  // every training block is drawn from set i with probability mixture_weights[i] / their sum.
  std::vector<std::string> mixture;
  std::vector<int64_t> mixture_weights;  // each 1 … kMaxMixtureWeight
  // lm: "text" (files tokenized here, cached) or pre-tokenized shards, memory-mapped: "nanogpt",
  // "npy", "megatron", "normlab" (data/token_shards.h).
  std::string format = "text";
  int64_t vocab_size = 0;  // shards: the tokenizer's vocabulary (0: from normlab's shards.json)
  int64_t eos_id = -1;     // shards: the end-of-document id, if any (-1: from shards.json / none)
  std::string sampling = "random";  // shards: blocks in a seeded order per epoch, or "sequential"
  int64_t text_max_mb = 256;  // text files above this go through token shards instead (0: any)
  // Tokens of validation (and test) text to evaluate: 0 = all for text files, 2^20 for shards.
  // Without data.valid, shards hold out the last this many tokens of the train stream.
  int64_t valid_tokens = 0;
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

// LM blocks read on demand (memory-mapped token shards): a split's examples without holding them.
class BlockSource {
 public:
  virtual ~BlockSource() = default;
  virtual int64_t count() const = 0;
  virtual int64_t block_tokens() const = 0;  // tokens per block: the inputs and one more
  // Block `index` into out[0 .. block_tokens()). Throws DataError naming the file for a bad token.
  virtual void read(int64_t index, int32_t* out) const = 0;
  // The block that place `place` of an epoch reads; `epoch_key` is drawn from run.seed and the
  // epoch. The place itself, but for a source that draws its blocks anew each epoch (a mixture).
  virtual int64_t block_at(int64_t place, uint64_t /*epoch_key*/) const { return place; }
};

// A check that runs beside training (shard SHA-256s): "" while running or passed, else what failed.
class BackgroundCheck {
 public:
  virtual ~BackgroundCheck() = default;
  virtual std::string problem() const = 0;  // does not wait
  virtual std::string wait() = 0;           // waits for the end
};

struct Split {
  // Examples in memory, or (token shards' training split) `blocks`, read as batches are made.
  std::shared_ptr<const BlockSource> blocks;
  std::vector<Example> examples;
  int64_t pad_id = kPad;                // Dataset::pad_id: what batches of this split pad with
  std::vector<std::string> references;  // translation: raw target lines (for BLEU), else empty
  std::vector<std::string> sources;     // translation: raw source lines, else empty
  // A language model's validation or test split: its blocks before eval.valid_tokens kept the first
  // (-1: not cut, or not known).
  int64_t available_blocks = -1;
};

struct Dataset {
  std::shared_ptr<const Tokenizer> src_tokenizer, tgt_tokenizer;  // the same object when joint
  Split train, valid, test;
  int64_t src_vocab = 0, tgt_vocab = 0;  // including the specials
  std::string summary;                   // one line for logs: sizes, vocab, cache hit/miss
  // The id batches pad with and the loss ignores: kPad for text tokenized here; -1 (none) for token
  // shards, whose every id is a token of their tokenizer (GPT-2's id 0 is "!").
  int64_t pad_id = kPad;
  // The id that ends each document: kEos for text tokenized here; token shards: shards.json's or
  // data.eos_id, -1 when neither says.
  int64_t eos_id = kEos;
  std::shared_ptr<BackgroundCheck> integrity;  // shards' SHA-256s, checked while training starts
  // What identifies the data a run trains and validates on (token shards: each file's size and a
  // fingerprint, in order), as JSON; empty where not recorded. Kept in checkpoints: a resume on
  // other data is refused (issue 56.4).
  std::string identity;
};

// How the data `now` (a Dataset::identity) differ from `saved`, the first difference in words
// naming the file; empty when they are the same data (or either is empty: not recorded).
// Resume also compares the order of the blocks (run.seed, data.lm_block, data.sampling, a
// mixture's draws), which a resumed position depends on; Read (eval, export, forward, ablate) not.
enum class DataUse { Resume, Read };
std::string data_identity_change(const std::string& saved, const std::string& now,
                                 DataUse use = DataUse::Resume);

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
// A split of `blocks` (token shards): every batch has max(1, max_tokens / block) blocks, in a
// seeded permutation of all blocks per epoch (or in order with `sequential`), computed per batch
// without a table: memory and start time do not grow with the corpus.
class BatchPlan {
 public:
  BatchPlan(const Split& split, int64_t max_tokens, uint64_t seed, bool shuffle,
            bool sequential = false);
  // The batches of one epoch, each a list of example indices (examples in memory only).
  std::vector<std::vector<int32_t>> epoch(int64_t epoch) const;
  Batch make(const std::vector<int32_t>& indices) const;
  // Any split: the number of batches of an epoch, batch i of epoch e, and its batch.
  int64_t batches_per_epoch() const;
  std::vector<int64_t> batch(int64_t epoch, int64_t i) const;
  Batch make_batch(const std::vector<int64_t>& indices) const;
  // What the batches are made of, short of the order: blocks a batch (a split of blocks) or a hash
  // of the length buckets (examples in memory). Two plans of one fingerprint and seed batch alike.
  std::string fingerprint() const;

 private:
  const Split* split_;
  int64_t max_tokens_;
  uint64_t seed_;
  bool shuffle_;
  bool sequential_ = false;
  int64_t per_batch_ = 0;                      // blocks per batch (a split of blocks)
  bool lm_ = false;                            // every example has an empty src: LM shift in make()
  std::vector<std::vector<int32_t>> buckets_;  // fixed; only their order changes per epoch
  std::vector<size_t> bucket_order(int64_t epoch) const;
  mutable std::mutex order_mutex_;  // batch(): the last epoch's bucket order, cached
  mutable std::vector<size_t> order_;
  mutable int64_t order_epoch_ = -1;
};

}  // namespace normlab::data
