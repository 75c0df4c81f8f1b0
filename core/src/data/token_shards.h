// Pre-tokenized language-model corpora, memory-mapped: a run's memory does not grow with the corpus
// and it starts at once whatever its size (issue 44). Formats users already have:
//   nanogpt   flat little-endian uint16 tokens, no header (nanoGPT's prepare.py: arr.tofile)
//   npy       a NumPy .npy 1-D array of <u2, <u4 or <i4 (format versions 1-3)
//   megatron  Megatron-LM's indexed dataset: PREFIX.bin (tokens) + PREFIX.idx ("MMIDIDX" header,
//             dtype code, sequence sizes and byte pointers, document index); uint16 or int32
//   normlab   flat uint16/uint32 shards written by `normlab data tokenize`, described by the
//             shards.json beside them (dtype, vocab_size, eos_id, tokens and SHA-256 per shard)
// The shards of one split are read as one token stream, in the order given (a glob sorted by name).
// No LibTorch here.
#pragma once

#include <atomic>
#include <cstdint>
#include <filesystem>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "normlab/data/dataset.h"

namespace normlab::data {

enum class ShardFormat { NanoGpt, Npy, Megatron, Normlab };
// "nanogpt" | "npy" | "megatron" | "normlab"; nullopt for anything else ("text" included).
std::optional<ShardFormat> parse_shard_format(const std::string& name);
const char* to_string(ShardFormat f);

// The files a split names: a path, or a glob (*, ?, [..]) expanded and sorted. DataError naming
// `role` when nothing matches. For megatron, PREFIX or PREFIX.bin names the pair.
std::vector<std::filesystem::path> expand_shard_paths(const std::string& role,
                                                      const std::string& pattern);

// The bytes of `file` into `bytes` when it is a regular file of at most `max_bytes` (a symbolic
// link to one included): "" then, else what it is ("is a FIFO (a named pipe)", "cannot be opened:
// …"). Never waits for a FIFO's writer, never reads a device.
std::string read_regular_file(const std::filesystem::path& file, int64_t max_bytes,
                              std::string& bytes);

// shards.json of the normlab format: what `normlab data tokenize` wrote.
struct ShardSet {
  struct Shard {
    std::string file;  // relative to the folder of shards.json
    int64_t tokens = 0;
    std::string sha256;
    int64_t max_token = -1;
  };
  int bytes_per_token = 2;  // 2 (uint16) or 4 (uint32)
  int64_t vocab_size = 0, eos_id = -1;
  std::string tokenizer;  // the SentencePiece model it was tokenized with, if any
  // That model's SHA-256 (hex), checked where the shards are loaded; "" in an older shards.json.
  std::string tokenizer_sha256;
  std::vector<Shard> shards;
};
// Reads DIR/shards.json. DataError naming the file and the key.
ShardSet read_shard_set(const std::filesystem::path& dir);
std::string shard_set_json(const ShardSet& set);

// One token array in a file, mapped read-only.
class MappedShard {
 public:
  // `offset` bytes from the start, `count` tokens of `bytes_per_token` (2 unsigned, 4 unsigned or
  // signed as `is_signed`).
  MappedShard(const std::filesystem::path& path, int64_t offset, int64_t count, int bytes_per_token,
              bool is_signed);
  ~MappedShard();
  MappedShard(const MappedShard&) = delete;
  MappedShard& operator=(const MappedShard&) = delete;
  const std::filesystem::path& path() const { return path_; }
  int64_t size() const { return count_; }
  // Tokens [begin, begin + n) as int32. DataError when the file shrank under the mapping.
  void read(int64_t begin, int64_t n, int32_t* out) const;

 private:
  void copy_tokens(int64_t begin, int64_t n, int32_t* out) const;
  std::filesystem::path path_;
  // Bytes read since the mapping's pages were last dropped from this process (read()).
  mutable std::atomic<int64_t> read_since_drop_{0};
  const unsigned char* map_ = nullptr;
  size_t map_size_ = 0;
  int64_t offset_ = 0, count_ = 0;
  int bytes_ = 2;
  bool signed_ = false;
};

// The tokens of several shards as one stream.
class TokenStream {
 public:
  // Opens `files` in `format` (mapping only: nothing is read). DataError naming the file and what
  // is wrong (size not a multiple of the token size, a bad header, a dtype normlab cannot take).
  static std::shared_ptr<TokenStream> open(const std::string& role,
                                           const std::vector<std::filesystem::path>& files,
                                           ShardFormat format);
  int64_t size() const { return total_; }
  // Tokens [begin, begin + n), across shards.
  void read(int64_t begin, int64_t n, int32_t* out) const;
  // "FILE (token N of it)" for the stream position `pos`.
  std::string where(int64_t pos) const;
  const std::vector<std::shared_ptr<MappedShard>>& shards() const { return shards_; }

 private:
  std::vector<std::shared_ptr<MappedShard>> shards_;
  std::vector<int64_t> starts_;  // stream position of each shard's first token
  int64_t total_ = 0;
};

// LM blocks of a token range [first, first + tokens) of a stream: block k is the `block + 1` tokens
// from first + k·block (inputs and shifted targets), so consecutive blocks share one token and the
// last partial block is dropped (every batch is full: no padding).
class StreamBlocks : public BlockSource {
 public:
  StreamBlocks(std::shared_ptr<const TokenStream> stream, int64_t first, int64_t tokens,
               int64_t block, int64_t vocab_size);
  int64_t count() const override { return count_; }
  int64_t block_tokens() const override { return block_ + 1; }
  // DataError naming the shard and position when a token is not below the vocabulary size.
  void read(int64_t index, int32_t* out) const override;

 private:
  std::shared_ptr<const TokenStream> stream_;
  int64_t first_, block_, count_, vocab_;
};

// A bijection of [0, n) drawn from `seed` (a 4-round Feistel network with cycle-walking): the
// epoch's block order without a table (O(1) memory for any corpus).
class SeededPermutation {
 public:
  SeededPermutation(uint64_t n, uint64_t seed);
  uint64_t at(uint64_t i) const;  // the position of i in the order

 private:
  uint64_t n_ = 0, half_bits_ = 0, mask_ = 0;
  uint64_t keys_[4] = {0, 0, 0, 0};
};

}  // namespace normlab::data
