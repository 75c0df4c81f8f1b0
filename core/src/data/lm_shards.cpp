// LM data from token shards (data.format = nanogpt | npy | megatron | normlab): the training split
// is the shards' blocks, read through the mapping as batches are made; validation and test are at
// most data.valid_tokens tokens (default 2^20) held in memory, the same blocks every time.
#include <fmt/format.h>

#include <atomic>
#include <mutex>
#include <ostream>
#include <thread>

#include "internal.h"
#include "token_shards.h"
#include "util/atomic_file.h"

namespace fs = std::filesystem;

namespace normlab::data::detail {
namespace {

constexpr int64_t kDefaultValidTokens = int64_t(1) << 20;

// Shards carry ids of a tokenizer normlab did not make: shown as <id>, never encoded here.
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
// remembered in the cache (path, size, mtime and hash) and not hashed again.
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
      const auto size = fs::file_size(path, ec);
      const auto mtime = fs::last_write_time(path, ec).time_since_epoch().count();
      const fs::path stamp =
          stamps_ /
          (hash_bytes(fmt::format("{}|{}|{}|{}", fs::absolute(path).string(), size, mtime, want))
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

Opened open_split(const std::string& role, const std::string& pattern, ShardFormat format) {
  Opened o;
  o.files = expand_shard_paths(role, pattern);
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

std::string count_text(int64_t n) {
  std::string s = std::to_string(n);
  for (int i = int(s.size()) - 3; i > 0; i -= 3) s.insert(size_t(i), ",");
  return s;
}

}  // namespace

Dataset load_lm_shards(const DataConfig& cfg, std::ostream& log) {
  const auto format = parse_shard_format(cfg.format);
  if (!format)
    throw DataError(fmt::format(
        "data.format: expected text, nanogpt, npy, megatron or normlab, got '{}'", cfg.format));
  if (cfg.train.empty())
    throw DataError(
        fmt::format("data.train: required with data.format = \"{}\" (a shard or a glob "
                    "of shards, e.g. \"tokens/train_*.bin\")",
                    cfg.format));
  if (cfg.lm_block < 1)
    throw DataError(fmt::format("data.lm_block must be positive, got {}", cfg.lm_block));
  Opened train = open_split("data.train", cfg.train, *format);

  // Vocabulary and EOS: the manifest's, else normlab's shards.json; both must agree.
  int64_t vocab = cfg.vocab_size, eos = cfg.eos_id;
  std::vector<std::pair<fs::path, std::string>> hashes;
  if (*format == ShardFormat::Normlab) {
    const fs::path dir = train.files.front().parent_path();
    const ShardSet set = read_shard_set(dir.empty() ? "." : dir);
    if (vocab > 0 && vocab != set.vocab_size)
      throw DataError(
          fmt::format("data.vocab_size = {}: {} says {} (the tokenizer the shards were "
                      "made with)",
                      vocab, (dir / "shards.json").string(), set.vocab_size));
    vocab = set.vocab_size;
    if (eos < 0) eos = set.eos_id;
    for (const fs::path& f : train.files)
      for (const auto& sh : set.shards)
        if (sh.file == f.filename().string()) {
          if (sh.max_token >= vocab)
            throw DataError(fmt::format("{}: its largest token {} is not below vocab_size {}",
                                        f.string(), sh.max_token, vocab));
          if (!sh.sha256.empty()) hashes.emplace_back(f, sh.sha256);
        }
  }
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
  d.src_tokenizer = d.tgt_tokenizer = std::make_shared<IdTokenizer>(vocab);
  d.src_vocab = d.tgt_vocab = vocab;
  int64_t train_tokens = train.stream->size();
  std::string valid_text;
  if (!cfg.valid.empty()) {
    Opened valid = open_split("data.valid", cfg.valid, *format);
    const int64_t n = std::min(budget, valid.stream->size());
    d.valid.examples = blocks_in_memory(valid.stream, 0, n, block, vocab);
    valid_text = fmt::format("valid {} blocks ({} tokens of {})", d.valid.examples.size(),
                             count_text(n), cfg.valid);
  } else {
    // The last `budget` tokens of the train stream, never trained on.
    const int64_t n = std::min(budget, train_tokens / 10);
    train_tokens -= n;
    d.valid.examples = blocks_in_memory(train.stream, train_tokens, n, block, vocab);
    valid_text = fmt::format("valid {} blocks (the last {} tokens of the train stream, held out)",
                             d.valid.examples.size(), count_text(n));
  }
  if (!cfg.test.empty()) {
    Opened test = open_split("data.test", cfg.test, *format);
    d.test.examples =
        blocks_in_memory(test.stream, 0, std::min(budget, test.stream->size()), block, vocab);
  }
  d.train.blocks = std::make_shared<StreamBlocks>(train.stream, 0, train_tokens, block, vocab);
  for (Split* s : {&d.train, &d.valid, &d.test}) s->pad_id = d.pad_id;
  if (d.train.blocks->count() == 0)
    throw DataError(fmt::format("data.train: '{}' holds {} tokens, not one block of {} + 1",
                                cfg.train, train.stream->size(), block));
  if (!hashes.empty())
    d.integrity = std::make_shared<ShardHashes>(std::move(hashes),
                                                resolve_cache_dir(cfg.cache_dir) / "shard-checks");
  d.summary = fmt::format(
      "{} ({} shards, mapped): train {} file(s), {} tokens = {} blocks of {} ({}), {}, vocab {}{}",
      cfg.train, to_string(*format), train.files.size(), count_text(train_tokens),
      count_text(d.train.blocks->count()), block, cfg.sampling, valid_text, vocab,
      eos >= 0 ? fmt::format(", eos {}", eos) : std::string());
  log.flush();
  return d;
}

}  // namespace normlab::data::detail
