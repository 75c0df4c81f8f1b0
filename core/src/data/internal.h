// Helpers shared by the data sources in core/src/data (not installed; tests may include it).
#pragma once

#include <cstdint>
#include <deque>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <memory>
#include <random>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "normlab/data/dataset.h"
#include "util/utf8.h"

namespace normlab::data::detail {

// ---- content hash (content_hash.cpp): 128 bits, for cache keys, not for security ----------------

struct Digest {
  uint64_t hi = 0, lo = 0;
  std::string hex() const;  // 32 hex digits
  bool operator==(const Digest& o) const { return hi == o.hi && lo == o.lo; }
  bool operator!=(const Digest& o) const { return !(*this == o); }
};

class Hasher {
 public:
  Hasher& bytes(const void* data, size_t size);  // raw stream
  // Framed fields: each is preceded by its kind and length, so field boundaries are unambiguous.
  Hasher& field(std::string_view s);
  Hasher& field(int64_t v);
  Hasher& field(double v);
  Hasher& field(const Digest& d);
  Digest digest() const;

 private:
  void word(uint64_t w);
  uint64_t a_ = 0x243f6a8885a308d3ULL, b_ = 0x13198a2e03707344ULL;
  uint64_t pending_ = 0, length_ = 0;
  int npending_ = 0;
};

Digest hash_bytes(std::string_view data);

// ---- portable randomness: std::mt19937_64 is specified exactly; the std distributions are not --

uint64_t mix_seed(uint64_t seed, uint64_t stream);         // splitmix64 of both
uint64_t uniform_below(std::mt19937_64& rng, uint64_t n);  // uniform in [0, n), n > 0, unbiased
double uniform01(std::mt19937_64& rng);                    // uniform in [0, 1), 53 bits

// ---- text files (corpus_reader.cpp) ----------------------------------------------------------

struct TextFile {
  std::string role;  // the config key, e.g. "data.train_src"
  std::string path;
  std::string bytes;  // the whole file
  Digest digest;      // of bytes
};

// Reads the whole file. DataError when it is missing, not a regular file, unreadable or empty.
TextFile read_text_file(const std::string& role, const std::string& path);

using util::find_invalid_utf8;  // util/utf8.h

// The lines of the file, without "\n" or a trailing "\r"; a UTF-8 BOM at the start is dropped.
// A final line without "\n" counts; the empty string after a final "\n" does not.
// DataError "path:line: invalid UTF-8 at byte N of the line (file offset M, byte 0xXX)".
std::vector<std::string> split_lines(const TextFile& file);

// DataError naming both files and both counts unless they are equal.
void check_parallel(const TextFile& src, size_t src_lines, const TextFile& tgt, size_t tgt_lines);

// ---- SentencePiece (sentencepiece_tokenizer.cpp) --------------------------------------------

class SentencePieceTokenizer : public Tokenizer {
 public:
  // Loads a serialized model; DataError (naming `origin`) when it does not parse or its special
  // ids are not pad=0 unk=1 bos=2 eos=3.
  // `normlab_ids` false: any special ids (a LLaMA/Mistral model, for `normlab data tokenize`).
  SentencePieceTokenizer(std::string model_bytes, std::string origin, bool normlab_ids = true);
  ~SentencePieceTokenizer() override;
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  std::vector<int32_t> encode(const std::string& text) const override;
  // The same into `ids`, reusing its storage (no allocation per line: `normlab data tokenize`).
  void encode_into(std::string_view text, std::vector<int32_t>& ids) const;
  // One word (no ASCII space) into `ids`; false when it would not encode alone as it does between
  // two spaces of a line (spm_api.h, encode_word).
  bool encode_word(std::string_view word, std::vector<int32_t>& ids) const;
  // One segment (spaces, then no space or "\n") as it encodes after a line start or a non-space;
  // false when it would not (spm_api.h, encode_segment).
  bool encode_segment(std::string_view segment, std::vector<int32_t>& ids) const;
  std::string decode(const std::vector<int32_t>& ids) const override;  // skips ids < 4 and ≥ vocab
  int32_t vocab_size() const override { return pieces_; }
  int32_t eos_id() const { return eos_; }  // -1: none

  const std::string& model_bytes() const { return model_; }
  const std::string& origin() const { return origin_; }  // the file (or name) it was read from
  const Digest& digest() const { return digest_; }
  // Empty when lines may be encoded word by word (WordCacheEncoder), else why not.
  const std::string& word_split_refusal() const { return word_split_refusal_; }
  // " " and the ASCII whitespace the model turns into collapsing spaces ("\t\n…"): a line may be
  // split at runs of these, its ends dropped; empty when only at single spaces (spm_api.h).
  const std::string& whitespace_split() const { return whitespace_split_; }
  // Empty when a document of a model that keeps spaces and newlines may be encoded line by line,
  // segment by segment (spm_api.h, newline_split), else why not; then the ids of "\n" and whether
  // the first segment takes the dummy prefix's space.
  const std::string& newline_split_refusal() const { return newline_split_refusal_; }
  const std::vector<int32_t>& newline_ids() const { return newline_ids_; }
  bool dummy_prefix() const { return dummy_prefix_; }

 private:
  std::string model_, origin_;
  Digest digest_;
  void* processor_ = nullptr;
  int32_t pieces_ = 0, eos_ = -1;
  std::string word_split_refusal_, whitespace_split_, newline_split_refusal_;
  std::vector<int32_t> newline_ids_;
  bool dummy_prefix_ = false;
};

// Encodes lines as SentencePieceTokenizer::encode_into does, with the same result, through a cache
// of words: a line of words separated by single spaces is its words' encodings one after the
// other when the model allows it (word_split_refusal()) and each word does (encode_word; why it is
// exact: spm_module.cpp), and most words of a corpus repeat. When the model collapses whitespace
// (whitespace_split()), a line is split at runs of spaces, tabs, newlines…, ends dropped: a JSONL
// document with newlines goes through the cache too (issue 59.5: such records were encoded whole,
// 2.3–2.8× slower, 2.0 GB peak). When the model keeps spaces and newlines
// (newline_split_refusal() empty: `--keep-newlines`, LLaMA-like), a document is split into lines
// and each line into segments, a run of spaces with the non-spaces after it ("    return"), which
// are cached (issue 59.2: indented code was encoded whole, 2.3× slower). Any other line (spaces at
// an end or doubled where they do not collapse, a word refused), or any line of a model that does
// not allow it, is encoded whole. One per thread. Issue 44.3: SentencePiece's own encoder builds a
// protobuf per line and ran at 1.4 M tokens/s per core.
class WordCacheEncoder {
 public:
  // At most `max_words` distinct words are kept; then the cache starts over (bounded memory).
  // `enabled` false: every line encoded whole (the reference path).
  explicit WordCacheEncoder(const SentencePieceTokenizer& tok, bool enabled = true,
                            size_t max_words = size_t(1) << 18);
  void encode_into(std::string_view line, std::vector<int32_t>& ids);

  uint64_t words_cached() const { return hits_; }     // words found in the cache
  uint64_t words_encoded() const { return misses_; }  // words encoded (then cached)
  uint64_t whole_lines() const { return whole_; }     // lines (documents) encoded whole
  // Newlines separate words as spaces do (the model collapses them): a text's encoding is then its
  // lines' encodings one after the other.
  bool newline_separates() const {
    return split_ && runs_ && separators_.find('\n') != std::string::npos;
  }

 private:
  struct Span {
    uint32_t begin, size;  // size kRefused: the word makes its line be encoded whole
  };
  static constexpr uint32_t kRefused = ~uint32_t(0);
  // Appends the cached ids of `word` (a segment when segments_); false when it is refused.
  bool append_word(std::string_view word, std::vector<int32_t>& ids);
  // A document split into lines and segments (segments_); false when one was refused.
  bool append_segments(std::string_view text, std::vector<int32_t>& ids);

  const SentencePieceTokenizer& tok_;
  const bool split_;
  const bool segments_;           // documents split at "\n" and before runs of spaces
  const bool runs_;               // runs of separators collapse, leading and trailing ones dropped
  const std::string separators_;  // what separates words: " ", or whitespace_split()
  const size_t max_words_;
  std::unordered_map<std::string_view, Span> cache_;
  std::deque<std::string> keys_;  // what cache_'s keys point into
  std::vector<int32_t> ids_;      // the cached words' ids, one span per word
  std::vector<int32_t> word_;     // scratch: one word's ids
  std::string first_;             // scratch: a document's first segment after the dummy's space
  uint64_t hits_ = 0, misses_ = 0, whole_ = 0;
};

// The trainer options of a model that keeps newlines and indentation (`normlab data tokenize
// --keep-newlines`).
std::vector<std::pair<std::string, std::string>> keep_newlines_trainer_options();

// Trains a model on `sentences` with SentencePiece trainer options (key, value); returns the
// serialized model. DataError with SentencePiece's message on failure.
std::string train_sentencepiece(const std::vector<std::pair<std::string, std::string>>& options,
                                const std::vector<const std::string*>& sentences);

// `sentences` with each one longer than `max_bytes` replaced by consecutive pieces of at most
// `max_bytes`, cut at a space (which is dropped) or, inside a longer word, at a UTF-8 character
// boundary. The pieces live in `storage`.
std::vector<const std::string*> split_long_sentences(
    const std::vector<const std::string*>& sentences, size_t max_bytes,
    std::deque<std::string>& storage);

// A SentencePiece tokenizer from the config: the given .model file, else one trained on
// `training_text()` with the config's settings and our special ids, cached under
// <cache_dir>/tokenizers/<key>.model where key hashes `text_key` (identifies the training text)
// and the settings.
struct TokenizerOutcome {
  std::shared_ptr<const SentencePieceTokenizer> tokenizer;
  enum Source { Given, CacheHit, Trained } source = Trained;
  double seconds = 0;
};
// `extra`: more SentencePiece trainer options (key, value), part of the cache key.
TokenizerOutcome obtain_sentencepiece(
    const TokenizerConfig& cfg, const Digest& text_key,
    const std::function<std::vector<const std::string*>()>& training_text,
    const std::filesystem::path& cache_dir, const std::string& what, std::ostream& log,
    const std::vector<std::pair<std::string, std::string>>& extra = {});

// Encodes lines on a few threads: out[i] = tok.encode(lines[i]).
std::vector<std::vector<int32_t>> encode_all(const Tokenizer& tok,
                                             const std::vector<const std::string*>& lines);

// ---- tokenized corpus cache (token_cache.cpp) -----------------------------------------------

struct SplitStats {
  uint64_t lines = 0;          // input lines (pairs) considered
  uint64_t empty_skipped = 0;  // translation: pairs with an empty side
  uint64_t too_long = 0;       // translation (train): pairs with a side longer than max_len
  uint64_t tokens = 0;         // lm: tokens in the stream
};

struct CachedSplit {
  Split split;
  SplitStats stats;
};

// The binary format (little-endian): magic "NLTOKCAC", u32 version, the 16-byte key, u64 payload
// size, u64 payload checksum, payload. Anything unexpected (missing, short, other version or key,
// bad checksum, inconsistent lengths) is a miss: false.
bool read_split_cache(const std::filesystem::path& file, const Digest& key, CachedSplit& out);
// Written atomically (temp file + rename). A failure is logged, not thrown: the cache is optional.
void write_split_cache(const std::filesystem::path& file, const Digest& key,
                       const CachedSplit& data, std::ostream& log);

// Temp file in the same directory + rename; creates the directory. Throws std::runtime_error.
void write_file_atomic(const std::filesystem::path& file, std::string_view data);

std::filesystem::path resolve_cache_dir(const std::string& configured);

// ---- synthetic tasks (synthetic_tasks.cpp) --------------------------------------------------

// Ids 4 … 4+V-1 are the symbols "w0" … "w{V-1}"; decode skips specials, encode maps anything else
// to kUnk.
class SyntheticTokenizer : public Tokenizer {
 public:
  explicit SyntheticTokenizer(int symbols) : symbols_(symbols) {}
  std::vector<int32_t> encode(const std::string& text) const override;
  std::string decode(const std::vector<int32_t>& ids) const override;
  int32_t vocab_size() const override { return 4 + symbols_; }

 private:
  int symbols_;
};

Dataset make_synthetic(const DataConfig& cfg, std::ostream& log);

// ---- corpora from files (translation_corpus.cpp, lm_corpus.cpp) ------------------------------

Dataset load_translation(const DataConfig& cfg, std::ostream& log);
Dataset load_lm(const DataConfig& cfg, std::ostream& log);
// data.format other than "text": memory-mapped token shards (lm_shards.cpp).
Dataset load_lm_shards(const DataConfig& cfg, std::ostream& log);

// Summary pieces shared by both (load_dataset.cpp).
std::string dataset_name(const std::string& path);  // the file's folder name, else its stem
// "tokenizer cache hit" / "tokenizer trained (3.1 s)" / "tokenizer from tokenizer.model"; per side
// when the sides differ.
std::string tokenizer_status(const TokenizerOutcome& src, const TokenizerOutcome* tgt);
struct SplitLoad {
  std::string name;
  bool hit = false;
  double seconds = 0;  // tokenization time on a miss
};
// "corpus cache hit" / "corpus cache miss (tokenized in 0.8 s)" / "corpus cache hit train, miss
// valid"
std::string corpus_status(const std::vector<SplitLoad>& loads);
std::filesystem::path cache_file(const std::filesystem::path& cache_dir, const char* kind,
                                 const Digest& key, const char* ext);

// Stream → blocks of block+1 tokens with stride `block` (consecutive blocks share one token, so
// every token after the first is a target exactly once); a final shorter block is kept when it
// has at least 2 tokens.
std::vector<Example> cut_blocks(const std::vector<int32_t>& stream, int block);

}  // namespace normlab::data::detail
