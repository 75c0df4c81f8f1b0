// LM data from token shards (data.format = nanogpt | npy | megatron | normlab): the training split
// is the shards' blocks, read through the mapping as batches are made; validation and test are at
// most data.valid_tokens tokens (default 2^20) held in memory, the same blocks every time.
#include <fmt/format.h>
#include <sys/stat.h>

#include <algorithm>
#include <atomic>
#include <fstream>
#include <map>
#include <mutex>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <thread>

#include "internal.h"
#include "token_shards.h"
#include "util/atomic_file.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace normlab::data::detail {
namespace {

constexpr int64_t kDefaultValidTokens = int64_t(1) << 20;

// Shards whose tokenizer is not recorded (nanoGPT, NumPy, Megatron; normlab shards.json without
// "tokenizer"): ids shown as <id>, never encoded here.
class IdTokenizer : public Tokenizer {
 public:
  explicit IdTokenizer(int64_t vocab) : vocab_(vocab) {}
  std::vector<int32_t> encode(const std::string&) const override {
    throw DataError(
        "data.format: token shards have no tokenizer here; text cannot be encoded (tokenize it "
        "with the shards' tokenizer)");
  }
  std::string decode(const std::vector<int32_t>& ids) const override {
    std::string out;
    for (int32_t id : ids) out += fmt::format("{}<{}>", out.empty() ? "" : " ", id);
    return out;
  }
  int32_t vocab_size() const override { return int32_t(vocab_); }

 private:
  int64_t vocab_;
};

// The SHA-256 of each normlab shard against shards.json, on a thread of its own while training
// starts (hashing 20 GB takes minutes; the first update must not wait). A shard that passed is
// remembered in the cache (path, size, mtime, device, inode, ctime and hash) and not hashed again.
class ShardHashes : public BackgroundCheck {
 public:
  ShardHashes(std::vector<std::pair<fs::path, std::string>> files, fs::path stamps)
      : files_(std::move(files)), stamps_(std::move(stamps)), thread_([this] { run(); }) {}
  ~ShardHashes() override {
    stop_ = true;
    if (thread_.joinable()) thread_.join();
  }
  std::string problem() const override {
    std::lock_guard<std::mutex> lock(mutex_);
    return problem_;
  }
  std::string wait() override {
    if (thread_.joinable()) thread_.join();
    return problem();
  }

 private:
  void run() {
    for (const auto& [path, want] : files_) {
      if (stop_) return;
      std::error_code ec;
      // The inode and its change time too: mtime survives `cp -p`, `rsync -a` and `touch -r`, so
      // a shard replaced by a copy with its time restored kept its stamp; ctime cannot be set.
      struct stat st {};
      if (::stat(path.c_str(), &st) != 0) st = {};
      const fs::path stamp =
          stamps_ / (hash_bytes(fmt::format("{}|{}|{}.{}|{}|{}.{}|{}|{}",
                                            fs::absolute(path).string(), int64_t(st.st_size),
                                            int64_t(st.st_mtim.tv_sec), int64_t(st.st_mtim.tv_nsec),
                                            uint64_t(st.st_ino), int64_t(st.st_ctim.tv_sec),
                                            int64_t(st.st_ctim.tv_nsec), uint64_t(st.st_dev), want))
                         .hex() +
                     ".ok");
      if (fs::exists(stamp, ec)) continue;
      std::string got;
      try {
        got = util::sha256_file(path);
      } catch (const std::exception& e) {
        set(e.what());
        return;
      }
      if (got != want) {
        set(
            fmt::format("{}: SHA-256 {}… is not the {}… of shards.json (damaged or replaced: "
                        "tokenize again)",
                        path.string(), got.substr(0, 12), want.substr(0, 12)));
        return;
      }
      try {
        util::write_file_atomically(stamp, "");
      } catch (const std::exception&) {
        // The stamp only saves time.
      }
    }
  }
  void set(std::string p) {
    std::lock_guard<std::mutex> lock(mutex_);
    problem_ = std::move(p);
  }
  std::vector<std::pair<fs::path, std::string>> files_;
  fs::path stamps_;
  mutable std::mutex mutex_;
  std::string problem_;
  std::atomic<bool> stop_{false};
  std::thread thread_;
};

struct Opened {
  std::vector<fs::path> files;
  std::shared_ptr<TokenStream> stream;
};

// Megatron's PREFIX.bin and PREFIX.idx are one dataset: a glob over a folder matches both, which
// opened the pair twice (every document read twice, the held-out tail trained on: issue 56.2).
std::vector<fs::path> megatron_prefixes(std::vector<fs::path> files) {
  std::vector<fs::path> out;
  for (fs::path f : files) {
    if (f.extension() == ".bin" || f.extension() == ".idx") f.replace_extension();
    if (std::find(out.begin(), out.end(), f) == out.end()) out.push_back(f);
  }
  return out;
}

Opened open_split(const std::string& role, const std::string& pattern, ShardFormat format) {
  Opened o;
  o.files = expand_shard_paths(role, pattern);
  if (format == ShardFormat::Megatron) o.files = megatron_prefixes(o.files);
  o.stream = TokenStream::open(role, o.files, format);
  return o;
}

// `tokens` tokens from `first` as blocks in memory (validation, test).
std::vector<Example> blocks_in_memory(const std::shared_ptr<TokenStream>& stream, int64_t first,
                                      int64_t tokens, int64_t block, int64_t vocab) {
  const StreamBlocks blocks(stream, first, tokens, block, vocab);
  std::vector<Example> out(size_t(blocks.count()));
  for (int64_t i = 0; i < blocks.count(); ++i) {
    out[size_t(i)].tgt.resize(size_t(block + 1));
    blocks.read(i, out[size_t(i)].tgt.data());
  }
  return out;
}

// 1234567 → "1,234,567" (appended digit by digit: GCC 12's -Wstringop-overflow misreads insert).
std::string count_text(int64_t n) {
  const std::string digits = std::to_string(n);
  const size_t sign = digits[0] == '-' ? 1 : 0;
  std::string s = digits.substr(0, sign);
  for (size_t i = sign; i < digits.size(); ++i) {
    if (i > sign && (digits.size() - i) % 3 == 0) s += ',';
    s += digits[i];
  }
  return s;
}

// A split evaluated on no block would be scored nll 0 / ppl 1 and chosen as best (issue 56.1).
void require_blocks(const std::string& role, const std::string& what, size_t blocks, int64_t tokens,
                    int64_t block) {
  if (blocks > 0) return;
  throw DataError(fmt::format(
      "{}: {} holds {} tokens, not one whole block of data.lm_block + 1 = {}: there would be "
      "nothing to evaluate; give it more tokens{}",
      role, what, count_text(tokens), block + 1,
      role == "data.valid" || role == "data.test" ? " (eval.valid_tokens, or a longer split)"
                                                  : " (a longer train stream, or data.valid)"));
}

// The normlab-format entries of each file (its own folder's shards.json, read once per folder).
struct NormlabShards {
  std::map<fs::path, ShardSet> sets;
  std::pair<const ShardSet*, const ShardSet::Shard*> entry(const fs::path& f) {
    const fs::path dir = f.parent_path().empty() ? fs::path(".") : f.parent_path();
    auto it = sets.find(dir);
    if (it == sets.end()) it = sets.emplace(dir, read_shard_set(dir)).first;
    for (const auto& sh : it->second.shards)
      if (sh.file == f.filename().string()) return {&it->second, &sh};
    return {&it->second, nullptr};  // TokenStream::open refused it already
  }
};

// A file's fingerprint without reading it all: its size and 4 KiB at 17 evenly spaced places
// (the first and last included). Enough to tell a replaced or re-tokenized shard (issue 56.4).
std::string sampled_fingerprint(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  std::error_code ec;
  const int64_t size = int64_t(fs::file_size(p, ec));
  Hasher h;
  h.field("sampled-v1");
  h.field(std::to_string(size));
  constexpr int64_t kPiece = 4096, kPlaces = 17;
  std::string buf(size_t(kPiece), '\0');
  for (int64_t k = 0; k < kPlaces && size > 0; ++k) {
    const int64_t at = std::max<int64_t>(0, (size - kPiece) * k / (kPlaces - 1));
    in.seekg(at);
    in.read(buf.data(), kPiece);
    h.bytes(buf.data(), size_t(in.gcount()));
    in.clear();
    if (size <= kPiece) break;
  }
  return h.digest().hex();
}

// The identity of a split's files, in order: path (as given), bytes and a fingerprint (the
// SHA-256 of shards.json where there is one).
json split_identity(const Opened& o, ShardFormat format, NormlabShards& normlab) {
  json files = json::array();
  for (size_t i = 0; i < o.files.size(); ++i) {
    const fs::path& f = o.files[i];
    std::vector<fs::path> parts = {f};
    if (format == ShardFormat::Megatron)
      parts = {fs::path(f.string() + ".bin"), fs::path(f.string() + ".idx")};
    for (const fs::path& part : parts) {
      std::error_code ec;
      json e = {{"file", part.string()}, {"bytes", int64_t(fs::file_size(part, ec))}};
      const ShardSet::Shard* sh =
          format == ShardFormat::Normlab ? normlab.entry(part).second : nullptr;
      if (sh && !sh->sha256.empty())
        e["sha256"] = sh->sha256;  // checked against the file beside training
      else
        e["sample"] = sampled_fingerprint(part);
      files.push_back(std::move(e));
    }
  }
  return files;
}

constexpr int64_t kMaxTokenizerBytes = int64_t(256) << 20;  // SentencePiece models: ~0.5-5 MB

// The bytes of the tokenizer a normlab shards.json names: like a shard, a regular file in its
// folder (issue 66.14: a FIFO there hung train, eval and export; /dev/zero was read until memory
// ran out; a folder failed without a name).
std::string read_tokenizer_file(const fs::path& json_file, const fs::path& file) {
  std::string bytes;
  if (const std::string problem = read_regular_file(file, kMaxTokenizerBytes, bytes);
      !problem.empty())
    throw DataError(fmt::format(
        "{}: \"tokenizer\": {} {} (expected the shards' SentencePiece model, a regular file "
        "beside shards.json)",
        json_file.string(), file.string(), problem));
  return bytes;
}

std::string sha256_hex(const std::string& bytes) {
  util::Sha256 h;
  h.update(bytes.data(), bytes.size());
  return h.hex();
}

// The SentencePiece model a normlab shards.json names ("tokenizer"), checked against the SHA-256
// recorded there (issue 66: a failed rerun left another tokenizer of the same size and EOS beside
// the old shards), its vocabulary and EOS; null when it names none (issue 59.3: a shard-trained
// model could not meet text again). An older shards.json records no SHA-256.
std::shared_ptr<const SentencePieceTokenizer> recorded_tokenizer(const fs::path& json_file,
                                                                 const ShardSet& set) {
  if (set.tokenizer.empty()) return nullptr;
  const fs::path file = json_file.parent_path() / set.tokenizer;
  std::string bytes = read_tokenizer_file(json_file, file);
  if (!set.tokenizer_sha256.empty())
    if (const std::string got = sha256_hex(bytes); got != set.tokenizer_sha256)
      throw DataError(fmt::format(
          "{}: tokenizer_sha256 {}, but its tokenizer {} has SHA-256 {}: not the tokenizer these "
          "shards were made with (tokenize again, or put that one back)",
          json_file.string(), set.tokenizer_sha256, file.string(), got));
  auto tok = std::make_shared<const SentencePieceTokenizer>(std::move(bytes), file.string(),
                                                            /*normlab_ids=*/false);
  if (tok->vocab_size() != set.vocab_size || tok->eos_id() != set.eos_id)
    throw DataError(fmt::format(
        "{}: vocab_size {}, eos_id {}, but its tokenizer {} has {} pieces, eos {} (another "
        "tokenizer's shards)",
        json_file.string(), set.vocab_size, set.eos_id, file.string(), tok->vocab_size(),
        tok->eos_id()));
  return tok;
}

// "the tokenizer FILE (SHA-256 HEX)", or that a shards.json names none.
std::string tokenizer_text(const fs::path& json_file, const ShardSet& set,
                           const std::shared_ptr<const SentencePieceTokenizer>& tok) {
  return tok ? fmt::format("the tokenizer {} (SHA-256 {})",
                           (json_file.parent_path() / set.tokenizer).string(),
                           sha256_hex(tok->model_bytes()))
             : "no tokenizer";
}

// normlab shards: every folder's shards.json agrees (vocab_size, eos_id, the tokenizer file by
// content), and with the manifest's data.vocab_size / data.eos_id where set (which take
// shards.json's values otherwise); each shard's largest token fits; `hashes` gets each shard's
// SHA-256 to check, validation and test first.
void check_normlab_sets(const Opened& train, const Opened* valid, const Opened* test,
                        NormlabShards& normlab, int64_t& vocab, int64_t& eos,
                        std::vector<std::pair<fs::path, std::string>>& hashes,
                        std::shared_ptr<const SentencePieceTokenizer>& tokenizer) {
  std::optional<std::pair<fs::path, ShardSet>> first;  // the first folder: what the others match
  std::map<fs::path, bool> tokenizer_checked;          // folders whose tokenizer was compared
  auto take = [&](const Opened& o) {
    for (const fs::path& f : o.files) {
      const auto [set, sh] = normlab.entry(f);
      const fs::path json_file =
          (f.parent_path().empty() ? fs::path(".") : f.parent_path()) / "shards.json";
      if (!first) {
        first.emplace(json_file, *set);
        tokenizer = recorded_tokenizer(json_file, *set);
        tokenizer_checked[json_file] = true;
      }
      if (set->vocab_size != first->second.vocab_size || set->eos_id != first->second.eos_id)
        throw DataError(
            fmt::format("{}: vocab_size {}, eos_id {}; {} says vocab_size {}, eos_id {} (shards of "
                        "another tokenizer)",
                        json_file.string(), set->vocab_size, set->eos_id, first->first.string(),
                        first->second.vocab_size, first->second.eos_id));
      if (!tokenizer_checked[json_file]) {  // another folder's tokenizer file, by content
        tokenizer_checked[json_file] = true;
        const auto t = recorded_tokenizer(json_file, *set);
        if ((t == nullptr) != (tokenizer == nullptr) ||
            (t && t->model_bytes() != tokenizer->model_bytes()))
          throw DataError(fmt::format(
              "{} names {}; {} names {}: shards of another tokenizer (the same vocab_size {} and "
              "eos_id {})",
              json_file.string(), tokenizer_text(json_file, *set, t), first->first.string(),
              tokenizer_text(first->first, first->second, tokenizer), set->vocab_size,
              set->eos_id));
      }
      if (sh && sh->max_token >= set->vocab_size)
        throw DataError(fmt::format("{}: its largest token {} is not below vocab_size {}",
                                    f.string(), sh->max_token, set->vocab_size));
      // Valid and test too (issue 56.3): a split rewritten in place gave scores from other data.
      if (sh && !sh->sha256.empty()) hashes.emplace_back(f, sh->sha256);
    }
  };
  // Validation and test first: their few shards are checked before the first validation.
  if (valid) take(*valid);
  if (test) take(*test);
  take(train);
  const ShardSet& set = first->second;
  if (vocab > 0 && vocab != set.vocab_size)
    throw DataError(
        fmt::format("data.vocab_size = {}: {} says {} (the tokenizer the shards were "
                    "made with)",
                    vocab, first->first.string(), set.vocab_size));
  // An EOS the tokenizer does not have would be exported, and generation would stop on it
  // (issue 56.22).
  if (eos >= 0 && eos != set.eos_id)
    throw DataError(
        fmt::format("data.eos_id = {}: {} says {} (the tokenizer the shards were "
                    "made with; leave data.eos_id out to take it)",
                    eos, first->first.string(), set.eos_id));
  vocab = set.vocab_size;
  eos = set.eos_id;
}

// data.mixture: the sets' blocks one after the other (block i of set s is offset_s + i). Place p
// of an epoch reads a block drawn from set s with probability w_s / Σw, uniformly within the set,
// both from a hash (splitmix64) of p and the epoch's key (run.seed and the epoch): every epoch and
// seed draws afresh, so every block is trained on in time (issue 66.1: a hash of p alone drew the
// same blocks every epoch, ~1/e of them never), and a batch is still the same whatever came before
// it — exact on resume, the same on every rank — without a table. An epoch is as many draws as
// the sets hold blocks, with replacement.
class MixtureBlocks : public BlockSource {
 public:
  MixtureBlocks(std::vector<std::shared_ptr<const StreamBlocks>> sets, std::vector<int64_t> weights)
      : sets_(std::move(sets)), weights_(std::move(weights)) {
    for (const auto& s : sets_) {
      offsets_.push_back(count_);
      count_ += s->count();
    }
    for (int64_t w : weights_) total_ += uint64_t(w);
  }
  int64_t count() const override { return count_; }
  int64_t block_tokens() const override { return sets_.front()->block_tokens(); }
  void read(int64_t index, int32_t* out) const override {
    const size_t s =
        size_t(std::upper_bound(offsets_.begin(), offsets_.end(), index) - offsets_.begin()) - 1;
    sets_[s]->read(index - offsets_[s], out);
  }
  int64_t block_at(int64_t place, uint64_t epoch_key) const override {
    const uint64_t key = mix_seed(epoch_key ^ 0x6d697874ULL, uint64_t(place));
    uint64_t r = mix_seed(key, 0) % total_;  // 2^64 ≫ Σw: no visible bias
    size_t s = 0;
    while (r >= uint64_t(weights_[s])) r -= uint64_t(weights_[s++]);
    return offsets_[s] + int64_t(mix_seed(key, 1 + s) % uint64_t(sets_[s]->count()));
  }

 private:
  std::vector<std::shared_ptr<const StreamBlocks>> sets_;
  std::vector<int64_t> weights_, offsets_;
  int64_t count_ = 0;
  uint64_t total_ = 0;
};

// data.train opened, or data.mixture's sets (into `sets`, each alone) and all their files as one
// split, for the checks that every file passes (vocabulary, EOS, tokenizer, SHA-256, identity).
Opened open_train(const DataConfig& cfg, ShardFormat format, std::vector<Opened>& sets) {
  if (cfg.mixture.empty()) return open_split("data.train", cfg.train, format);
  if (cfg.valid.empty())
    throw DataError(
        "data.mixture: needs data.valid (no single train stream to hold out the end of)");
  // A mixture's blocks are seeded random draws, never a sequential read.
  if (cfg.sampling == "sequential")
    throw DataError(
        "data.sampling = \"sequential\" with data.mixture: a mixture's blocks are drawn at "
        "random (by run.seed and the epoch) from its sets; leave data.sampling out, or train on "
        "one stream (data.train)");
  if (cfg.mixture_weights.size() != cfg.mixture.size())
    throw DataError(fmt::format("data.mixture_weights: {} weights for {} mixture sets: one per set",
                                cfg.mixture_weights.size(), cfg.mixture.size()));
  for (size_t i = 0; i < cfg.mixture.size(); ++i)
    if (cfg.mixture_weights[i] < 1 || cfg.mixture_weights[i] > kMaxMixtureWeight)
      throw DataError(fmt::format("data.mixture_weights: weight {} is {}: expected 1 to {}", i + 1,
                                  cfg.mixture_weights[i], kMaxMixtureWeight));
  for (size_t i = 0; i < cfg.mixture.size(); ++i)
    sets.push_back(open_split(fmt::format("data.mixture[{}]", i + 1), cfg.mixture[i], format));
  Opened train;
  for (const Opened& o : sets)
    train.files.insert(train.files.end(), o.files.begin(), o.files.end());
  train.stream = TokenStream::open("data.mixture", train.files, format);
  return train;
}

// The file of a split's entry that holds its tokens (a Megatron prefix names PREFIX.bin).
fs::path token_file(const fs::path& f, ShardFormat format) {
  return format == ShardFormat::Megatron ? fs::path(f.string() + ".bin") : f;
}

// Whether two files hold the same data: the same file (st_dev and st_ino: another path, a hard or
// symbolic link), or the same bytes (a copy). Bytes are compared only between files of one size:
// by the SHA-256s shards.json records (normlab; the background check holds each file to its own),
// else by a sampled fingerprint and, where that agrees too, the whole file's SHA-256 (issue 66.8:
// paths alone let a hard link or a copy of a training shard be validated on).
class SameData {
 public:
  SameData(ShardFormat format, NormlabShards& normlab) : format_(format), normlab_(normlab) {}
  struct Facts {
    dev_t dev = 0;
    ino_t ino = 0;
    int64_t size = -1;
    std::string sha256;  // recorded in shards.json, or computed here; empty: not yet known
    std::string sample;  // sampled_fingerprint, once needed
  };
  Facts& facts(const fs::path& file) {
    auto it = facts_.find(file);
    if (it != facts_.end()) return it->second;
    Facts f;
    struct stat st {};
    if (::stat(file.c_str(), &st) == 0) {  // opened already: it exists
      f.dev = st.st_dev, f.ino = st.st_ino, f.size = int64_t(st.st_size);
    }
    if (format_ == ShardFormat::Normlab)
      if (const ShardSet::Shard* sh = normlab_.entry(file).second) f.sha256 = sh->sha256;
    return facts_.emplace(file, std::move(f)).first->second;
  }
  // "" when different data, else how `a` and `b` are the same.
  std::string same(const fs::path& a, const fs::path& b) {
    Facts &x = facts(a), &y = facts(b);
    if (x.size < 0 || y.size < 0) return "";
    if (x.dev == y.dev && x.ino == y.ino)
      return fs::absolute(a).lexically_normal() == fs::absolute(b).lexically_normal()
                 ? "the same path"
                 : "the same file (a link)";
    if (x.size != y.size || x.size == 0) return "";
    if (x.sha256.empty() || y.sha256.empty()) {
      const std::pair<const fs::path*, Facts*> both[] = {{&a, &x}, {&b, &y}};
      for (const auto& [file, f] : both)
        if (f->sample.empty()) f->sample = sampled_fingerprint(*file);
      if (x.sample != y.sample) return "";
      for (const auto& [file, f] : both)
        if (f->sha256.empty()) f->sha256 = util::sha256_file(*file);
    }
    return x.sha256 == y.sha256 ? fmt::format("a copy: SHA-256 {}…", x.sha256.substr(0, 12)) : "";
  }

 private:
  ShardFormat format_;
  NormlabShards& normlab_;
  std::map<fs::path, Facts> facts_;
};

// A shard trained on from two mixture sets is drawn with both weights, and one also held out
// (data.valid, data.test) is validated on after being trained on: refused, naming both places,
// whether the two are one path, one file under two names, or two copies of the same bytes.
// valid and test may share files (a run without a separate test split).
void refuse_shared_files(const Opened& train, const std::vector<Opened>& sets,
                         const std::string& train_pattern, const std::optional<Opened>& valid,
                         const std::optional<Opened>& test, ShardFormat format,
                         NormlabShards& normlab) {
  struct Seen {
    std::string role;
    fs::path file;  // as given
    bool trained;
  };
  std::vector<Seen> seen;
  // Only files of one size can be one file or copies: only those are compared.
  std::map<int64_t, std::vector<size_t>> by_size;
  SameData same(format, normlab);
  auto add = [&](const std::string& role, const Opened& o, bool trained) {
    for (const fs::path& f : o.files) {
      const fs::path file = token_file(f, format);
      std::vector<size_t>& candidates = by_size[same.facts(file).size];
      for (size_t k : candidates) {
        const Seen& other = seen[k];
        // Within one held-out split a duplicate is harmless; within one trained set (a glob
        // matching a link or a copy) it would be trained on twice as often.
        if (!trained && !other.trained) continue;
        const std::string how = same.same(token_file(other.file, format), file);
        if (how.empty()) continue;
        const std::string where =
            how == "the same path"
                ? other.role
                : fmt::format("{}, as '{}': {}", other.role, other.file.string(), how);
        if (trained && other.role == role)
          throw DataError(fmt::format(
              "{}: '{}' is the same data as '{}' in it ({}): a shard may be in a training set "
              "once",
              role, f.string(), other.file.string(), how));
        if (trained)
          throw DataError(
              fmt::format("{}: '{}' is also in {}: a shard may be in one mixture set only", role,
                          f.string(), where));
        throw DataError(fmt::format(
            "{}: '{}' is also trained on ({}): held-out data must not be in the training files",
            role, f.string(), where));
      }
      candidates.push_back(seen.size());
      seen.push_back({role, f, trained});
    }
  };
  if (sets.empty()) add("data.train '" + train_pattern + "'", train, true);
  for (size_t i = 0; i < sets.size(); ++i)
    add(fmt::format("data.mixture[{}]", i + 1), sets[i], true);
  if (valid) add("data.valid", *valid, false);
  if (test) add("data.test", *test, false);
}

std::shared_ptr<const BlockSource> mixture_blocks(const DataConfig& cfg,
                                                  const std::vector<Opened>& sets, int64_t block,
                                                  int64_t vocab) {
  std::vector<std::shared_ptr<const StreamBlocks>> blocks;
  for (size_t i = 0; i < sets.size(); ++i) {
    blocks.push_back(
        std::make_shared<StreamBlocks>(sets[i].stream, 0, sets[i].stream->size(), block, vocab));
    if (blocks.back()->count() == 0)
      throw DataError(fmt::format("data.mixture[{}]: '{}' holds {} tokens, not one block of {} + 1",
                                  i + 1, cfg.mixture[i], sets[i].stream->size(), block));
  }
  return std::make_shared<MixtureBlocks>(std::move(blocks), cfg.mixture_weights);
}

std::string mixture_text(const DataConfig& cfg, const std::vector<Opened>& sets) {
  std::string text;
  for (size_t i = 0; i < sets.size(); ++i)
    text += fmt::format("{}{} ({} tokens, weight {})", i ? ", " : "mixture of ", cfg.mixture[i],
                        count_text(sets[i].stream->size()), cfg.mixture_weights[i]);
  return text;
}

}  // namespace

Dataset load_lm_shards(const DataConfig& cfg, std::ostream& log) {
  const auto format = parse_shard_format(cfg.format);
  if (!format)
    throw DataError(fmt::format(
        "data.format: expected text, nanogpt, npy, megatron or normlab, got '{}'", cfg.format));
  if (cfg.train.empty() && cfg.mixture.empty())
    throw DataError(
        fmt::format("data.train: required with data.format = \"{}\" (a shard or a glob "
                    "of shards, e.g. \"tokens/train_*.bin\"; or data.mixture)",
                    cfg.format));
  if (cfg.lm_block < 1)
    throw DataError(fmt::format("data.lm_block must be positive, got {}", cfg.lm_block));
  std::vector<Opened> sets;  // data.mixture's, each opened alone
  Opened train = open_train(cfg, *format, sets);
  std::optional<Opened> valid, test;
  if (!cfg.valid.empty()) valid = open_split("data.valid", cfg.valid, *format);
  if (!cfg.test.empty()) test = open_split("data.test", cfg.test, *format);
  NormlabShards normlab;
  refuse_shared_files(train, sets, cfg.train, valid, test, *format, normlab);

  // Vocabulary and EOS: the manifest's, else normlab's shards.json; all must agree.
  int64_t vocab = cfg.vocab_size, eos = cfg.eos_id;
  std::vector<std::pair<fs::path, std::string>> hashes;
  std::shared_ptr<const SentencePieceTokenizer> recorded;
  if (*format == ShardFormat::Normlab)
    check_normlab_sets(train, valid ? &*valid : nullptr, test ? &*test : nullptr, normlab, vocab,
                       eos, hashes, recorded);
  if (vocab < 1)
    throw DataError(
        fmt::format("data.vocab_size: required with data.format = \"{}\" (the "
                    "tokenizer's vocabulary size, e.g. 50304 for GPT-2's padded)",
                    cfg.format));
  if (eos >= vocab)
    throw DataError(fmt::format("data.eos_id = {}: not below data.vocab_size = {}", eos, vocab));
  const int64_t block = cfg.lm_block;
  const int64_t budget = cfg.valid_tokens > 0 ? cfg.valid_tokens : kDefaultValidTokens;

  Dataset d;
  d.pad_id = -1;
  d.src_tokenizer = d.tgt_tokenizer =
      recorded ? std::shared_ptr<const Tokenizer>(recorded) : std::make_shared<IdTokenizer>(vocab);
  d.eos_id = eos;
  d.src_vocab = d.tgt_vocab = vocab;
  int64_t train_tokens = train.stream->size();
  std::string valid_text;
  const std::string budget_text =
      cfg.valid_tokens > 0 ? fmt::format("eval.valid_tokens = {}", cfg.valid_tokens) : "";
  // Validation or test: the first `budget` tokens of their split, in memory.
  auto first_blocks = [&](const char* role, const Opened& o, const std::string& pattern,
                          Split& split) {
    const int64_t n = std::min(budget, o.stream->size());
    split.examples = blocks_in_memory(o.stream, 0, n, block, vocab);
    split.available_blocks = (o.stream->size() - 1) / block;
    require_blocks(
        role, fmt::format("'{}'{}", pattern, n < o.stream->size() ? " within " + budget_text : ""),
        split.examples.size(), n, block);
    return n;
  };
  if (valid) {
    const int64_t n = first_blocks("data.valid", *valid, cfg.valid, d.valid);
    valid_text = fmt::format("valid {} blocks ({} tokens of {})", d.valid.examples.size(),
                             count_text(n), cfg.valid);
  } else {
    // The last `budget` tokens of the train stream, never trained on.
    const int64_t n = std::min(budget, train_tokens / 10);
    train_tokens -= n;
    d.valid.examples = blocks_in_memory(train.stream, train_tokens, n, block, vocab);
    require_blocks("data.valid",
                   fmt::format("the held-out end of data.train '{}' (without data.valid: the "
                               "last tenth of its {} tokens{})",
                               cfg.train, count_text(train.stream->size()),
                               budget_text.empty() ? "" : ", at most " + budget_text),
                   d.valid.examples.size(), n, block);
    valid_text = fmt::format("valid {} blocks (the last {} tokens of the train stream, held out)",
                             d.valid.examples.size(), count_text(n));
  }
  if (test) first_blocks("data.test", *test, cfg.test, d.test);
  d.train.blocks = sets.empty()
                       ? std::make_shared<StreamBlocks>(train.stream, 0, train_tokens, block, vocab)
                       : mixture_blocks(cfg, sets, block, vocab);
  for (Split* s : {&d.train, &d.valid, &d.test}) s->pad_id = d.pad_id;
  if (d.train.blocks->count() == 0)
    throw DataError(fmt::format("data.train: '{}' holds {} tokens, not one block of {} + 1",
                                cfg.train, train.stream->size(), block));
  json identity = {{"format", to_string(*format)},
                   {"train", split_identity(train, *format, normlab)},
                   {"train_tokens", train_tokens}};
  if (!sets.empty()) {
    json sizes = json::array();
    for (const Opened& o : sets) sizes.push_back(o.files.size());
    identity["mixture_files"] = sizes;  // how train's files fall into the sets
    identity["mixture_weights"] = cfg.mixture_weights;
    identity["mixture_draws"] = "per-epoch";  // checkpoints before issue 66.1 have none
  }
  // What orders the blocks: a resumed position means nothing in another order.
  identity["order"] = {{"seed", cfg.seed}, {"lm_block", cfg.lm_block}, {"sampling", cfg.sampling}};
  if (valid) identity["valid"] = split_identity(*valid, *format, normlab);
  if (test) identity["test"] = split_identity(*test, *format, normlab);
  if (recorded) {  // the SentencePiece model text is encoded with (issue 66.7)
    util::Sha256 h;
    h.update(recorded->model_bytes().data(), recorded->model_bytes().size());
    identity["tokenizer"] = {{"file", recorded->origin()}, {"sha256", h.hex()}};
  }
  d.identity = identity.dump();
  if (!hashes.empty())
    d.integrity = std::make_shared<ShardHashes>(std::move(hashes),
                                                resolve_cache_dir(cfg.cache_dir) / "shard-checks");
  d.summary = fmt::format(
      "{} ({} shards, mapped): train {} file(s), {} tokens = {} blocks of {} ({}), {}, vocab "
      "{}{}{}",
      sets.empty() ? cfg.train : mixture_text(cfg, sets), to_string(*format), train.files.size(),
      count_text(train_tokens), count_text(d.train.blocks->count()), block, cfg.sampling,
      valid_text, vocab, eos >= 0 ? fmt::format(", eos {}", eos) : std::string(),
      recorded ? ", its tokenizer from shards.json" : "");
  log.flush();
  return d;
}

}  // namespace normlab::data::detail

namespace normlab::data {

namespace {
// A recorded value for a message: printable ASCII, at most 60 characters.
std::string sanitized_value(const json& v) {
  std::string text = v.dump(-1, ' ', true, json::error_handler_t::replace);
  for (char& c : text)
    if (c < 0x20 || c > 0x7e) c = '?';
  return text.size() > 60 ? text.substr(0, 57) + "..." : text;
}
}  // namespace

std::string data_identity_change(const std::string& saved_text, const std::string& now_text,
                                 DataUse use) {
  if (saved_text.empty() || now_text.empty()) return {};
  const json saved = json::parse(saved_text, nullptr, false),
             now = json::parse(now_text, nullptr, false);
  if (!saved.is_object() || !now.is_object()) return {};
  if (saved == now) return {};
  if (saved.value("format", "") != now.value("format", ""))
    return fmt::format("data.format was {}, now {}", saved.value("format", "?"),
                       now.value("format", "?"));
  // Another tokenizer of the same size and EOS re-numbers every text (issue 66.7). A checkpoint
  // from before the record has none: not a change (the callers say so).
  const json was_tok = saved.value("tokenizer", json()), is_tok = now.value("tokenizer", json());
  if (was_tok.is_object()) {
    const std::string was = was_tok.value("sha256", ""),
                      is = is_tok.is_object() ? is_tok.value("sha256", "") : "";
    if (was != is)
      return is_tok.is_object()
                 ? fmt::format(
                       "the shards' tokenizer {} (SHA-256 {}…) is not the run's {} (SHA-256 {}…)",
                       is_tok.value("file", "?"), is.substr(0, 12), was_tok.value("file", "?"),
                       was.substr(0, 12))
                 : fmt::format("shards.json names no tokenizer now; the run's was {} (SHA-256 {}…)",
                               was_tok.value("file", "?"), was.substr(0, 12));
  }
  for (const char* split : {"train", "valid", "test"}) {
    const std::string role = std::string("data.") + split;
    const json a = saved.value(split, json::array()), b = now.value(split, json::array());
    for (size_t i = 0; i < std::max(a.size(), b.size()); ++i) {
      if (i >= a.size())
        return fmt::format("{}: {} is new (the run had {} file(s))", role, b[i].value("file", "?"),
                           a.size());
      if (i >= b.size())
        return fmt::format("{}: {} (file {} of the run's) is no longer in it", role,
                           a[i].value("file", "?"), i + 1);
      const json& x = a[i];
      const json& y = b[i];
      const std::string was = x.value("file", "?"), is = y.value("file", "?");
      const std::string named = was == is ? is : fmt::format("{} (the run's {})", is, was);
      if (x.value("bytes", int64_t(-1)) != y.value("bytes", int64_t(-2)))
        return fmt::format("{}: {} holds {} bytes, the run's {} held {}", role, named,
                           y.value("bytes", int64_t(-1)), was, x.value("bytes", int64_t(-1)));
      if (x != y && (x.value("sha256", "") != y.value("sha256", "") ||
                     x.value("sample", "") != y.value("sample", "")))
        return fmt::format(
            "{}: {} has other content than the run's {} (replaced, rewritten or "
            "reordered)",
            role, named, was);
    }
  }
  if (saved.value("mixture_weights", json()) != now.value("mixture_weights", json()) ||
      saved.value("mixture_files", json()) != now.value("mixture_files", json()))
    return fmt::format(
        "data.mixture: sets {} with weights {}, the run's {} with weights {}",
        now.value("mixture_files", json()).dump(), now.value("mixture_weights", json()).dump(),
        saved.value("mixture_files", json()).dump(), saved.value("mixture_weights", json()).dump());
  if (use == DataUse::Resume) {  // the order of the blocks: only a resumed position depends on it
    const json was_draws = saved.value("mixture_draws", json()),
               is_draws = now.value("mixture_draws", json());
    if (was_draws != is_draws) {
      if (was_draws.is_null())
        return "data.mixture: the run drew the same blocks every epoch (an older normlab); blocks "
               "are drawn anew each epoch now, so its position would read other blocks than it "
               "would have";
      return fmt::format(
          "data.mixture: the run's checkpoint records mixture_draws {}, unknown here (this "
          "normlab draws {}): its position would mean nothing",
          sanitized_value(was_draws), is_draws.dump());
    }
    // Recorded since the order's keys were checked; an older checkpoint has none to compare.
    const json was_order = saved.value("order", json()), is_order = now.value("order", json());
    if (was_order.is_object() && is_order.is_object() && was_order != is_order) {
      std::string keys;
      for (const auto& [key, name] : {std::pair{"seed", "run.seed"},
                                      {"lm_block", "data.lm_block"},
                                      {"sampling", "data.sampling"}})
        if (was_order.value(key, json()) != is_order.value(key, json()))
          keys += fmt::format("{}{} was {}, now {}", keys.empty() ? "" : ", ", name,
                              sanitized_value(was_order.value(key, json())),
                              sanitized_value(is_order.value(key, json())));
      if (keys.empty())
        keys =
            fmt::format("{}, the run's {}", sanitized_value(is_order), sanitized_value(was_order));
      return fmt::format(
          "the order of the blocks changed ({}): the run's position would mean nothing in it",
          keys);
    }
  }
  if (saved.value("train_tokens", int64_t(-1)) != now.value("train_tokens", int64_t(-2)))
    return fmt::format(
        "data.train: {} tokens are trained on, the run trained on {} (another "
        "held-out tail: eval.valid_tokens or data.valid changed)",
        now.value("train_tokens", int64_t(-1)), saved.value("train_tokens", int64_t(-1)));
  return {};
}

}  // namespace normlab::data
