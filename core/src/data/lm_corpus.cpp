// LM corpora: text files tokenized into one stream (each line + EOS), cut into blocks; cached.
//
// Split: without data.valid, the last lm_valid_fraction of the train file's lines (rounded, at
// least one line, leaving at least one) is validation and the tokenizer is trained on the rest
// only; the summary says so. Empty lines are kept as a lone EOS (paragraph breaks carry signal).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ostream>

#include "internal.h"

namespace fs = std::filesystem;

namespace normlab::data::detail {

std::vector<Example> cut_blocks(const std::vector<int32_t>& stream, int block) {
  std::vector<Example> out;
  if (block < 1) return out;
  for (size_t start = 0; start + 1 < stream.size(); start += size_t(block)) {
    const size_t end = std::min(stream.size(), start + size_t(block) + 1);
    Example ex;
    ex.tgt.assign(stream.begin() + start, stream.begin() + end);
    out.push_back(std::move(ex));
  }
  return out;
}

namespace {

enum class Part { Whole, Head, Tail };  // the whole file, or all but / only the held-out tail

struct LmFile {
  bool present = false;
  TextFile file;
  bool parsed = false;
  std::vector<std::string> lines;
  void parse() {
    if (!parsed) lines = split_lines(file);
    parsed = true;
  }
};

LmFile open_file(const std::string& role, const std::string& path) {
  LmFile f;
  if (path.empty()) return f;
  f.present = true;
  f.file = read_text_file(role, path);
  return f;
}

// Lines [begin, end) of the part.
std::pair<size_t, size_t> part_range(LmFile& f, Part part, double fraction) {
  f.parse();
  const size_t n = f.lines.size();
  if (part == Part::Whole) return {0, n};
  if (n < 2)
    throw DataError(
        fmt::format("{}: '{}' has {} line(s), too few to hold out the last {}% for validation; set "
                    "data.valid",
                    f.file.role, f.file.path, n, fraction * 100));
  const size_t held = std::clamp<size_t>(size_t(std::llround(double(n) * fraction)), 1, n - 1);
  return part == Part::Head ? std::make_pair(size_t(0), n - held) : std::make_pair(n - held, n);
}

// Text tokenized here is held whole in memory (~40 bytes a token on the first run): a corpus above
// data.text_max_mb goes through token shards instead (issue 44).
void check_text_sizes(const DataConfig& cfg) {
  for (const auto& [role, path] :
       {std::pair{"data.train", &cfg.train}, std::pair{"data.valid", &cfg.valid},
        std::pair{"data.test", &cfg.test}}) {
    std::error_code ec;
    const auto bytes = path->empty() ? 0 : fs::file_size(*path, ec);
    if (!ec && cfg.text_max_mb > 0 && double(bytes) > double(cfg.text_max_mb) * 1e6)
      throw DataError(fmt::format(
          "{}: '{}' is {:.0f} MB of text, above data.text_max_mb = {}: tokenized here it would be "
          "held in memory whole; make token shards once with `normlab data tokenize {} --out "
          "tokens --jobs N` and train with data.format = \"normlab\", data.train = "
          "\"tokens/shard_*.bin\" (docs/data.md), or raise data.text_max_mb",
          role, *path, double(bytes) / 1e6, cfg.text_max_mb, *path));
  }
}

}  // namespace

Dataset load_lm(const DataConfig& cfg, std::ostream& log) {
  if (cfg.format != "text") return load_lm_shards(cfg, log);
  if (cfg.lm_block < 1)
    throw DataError(fmt::format("data.lm_block must be positive, got {}", cfg.lm_block));
  if (!(cfg.lm_valid_fraction >= 0 && cfg.lm_valid_fraction < 1))
    throw DataError(
        fmt::format("data.lm_valid_fraction must be in [0, 1), got {}", cfg.lm_valid_fraction));
  check_text_sizes(cfg);
  LmFile train = open_file("data.train", cfg.train);
  LmFile valid = open_file("data.valid", cfg.valid);
  LmFile test = open_file("data.test", cfg.test);
  if (!train.present && cfg.tokenizer.model.empty())
    throw DataError(
        "data: task lm needs data.train (to train the model and, unless tokenizer.model is given, "
        "the "
        "tokenizer)");
  if (!train.present && !valid.present && !test.present)
    throw DataError("data: task lm needs at least one of data.train, data.valid, data.test");
  const bool held_out = train.present && !valid.present && cfg.lm_valid_fraction > 0;
  const double fraction = held_out ? cfg.lm_valid_fraction : 0.0;
  const fs::path cache_dir = resolve_cache_dir(cfg.cache_dir);

  // The tokenizer key: the train file's content and which part of it is training text.
  const Digest text_key = Hasher().field("lm").field(train.file.digest).field(fraction).digest();
  TokenizerOutcome tok = obtain_sentencepiece(
      cfg.tokenizer, text_key,
      [&] {
        auto [begin, end] = part_range(train, held_out ? Part::Head : Part::Whole, fraction);
        std::vector<const std::string*> text;
        for (size_t i = begin; i < end; ++i)
          if (!train.lines[i].empty()) text.push_back(&train.lines[i]);
        return text;
      },
      cache_dir, "lm", log);

  Dataset d;
  d.src_tokenizer = d.tgt_tokenizer = tok.tokenizer;
  d.src_vocab = d.tgt_vocab = tok.tokenizer->vocab_size();

  struct Job {
    const char* name;
    LmFile* file;
    Part part;
    Split* out;
  };
  std::vector<Job> jobs;
  if (train.present)
    jobs.push_back({"train", &train, held_out ? Part::Head : Part::Whole, &d.train});
  if (held_out) jobs.push_back({"valid", &train, Part::Tail, &d.valid});
  if (valid.present) jobs.push_back({"valid", &valid, Part::Whole, &d.valid});
  if (test.present) jobs.push_back({"test", &test, Part::Whole, &d.test});

  std::vector<SplitLoad> loads;
  std::vector<std::string> parts;
  uint64_t train_lines = 0, valid_lines = 0;
  for (const Job& job : jobs) {
    const Digest key = Hasher()
                           .field("normlab-corpus-v1")
                           .field("lm")
                           .field(int64_t(job.part))
                           .field(job.part == Part::Whole ? 0.0 : fraction)
                           .field(int64_t(cfg.lm_block))
                           .field(job.file->file.digest)
                           .field(tok.tokenizer->digest())
                           .digest();
    const fs::path file = cache_file(cache_dir, "corpora", key, ".bin");
    SplitLoad load{job.name};
    CachedSplit c;
    load.hit = read_split_cache(file, key, c);
    if (!load.hit) {
      const auto t0 = std::chrono::steady_clock::now();
      auto [begin, end] = part_range(*job.file, job.part, fraction);
      std::vector<const std::string*> lines;
      for (size_t i = begin; i < end; ++i) lines.push_back(&job.file->lines[i]);
      std::vector<int32_t> stream;
      for (auto& ids : encode_all(*tok.tokenizer, lines)) {
        stream.insert(stream.end(), ids.begin(), ids.end());
        stream.push_back(kEos);
      }
      c.stats.lines = lines.size();
      c.stats.tokens = stream.size();
      c.split.examples = cut_blocks(stream, cfg.lm_block);
      load.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      log << fmt::format("data: tokenized {} ({} lines, {} tokens) in {:.2f} s\n", job.name,
                         c.stats.lines, c.stats.tokens, load.seconds);
      write_split_cache(file, key, c, log);
    }
    if (job.part == Part::Head) train_lines = c.stats.lines;
    if (job.part == Part::Tail) valid_lines = c.stats.lines;
    std::string text = fmt::format("{} {}", job.name, c.split.examples.size());
    if (job.out == &d.train) text += fmt::format(" blocks of {}", cfg.lm_block);
    text += fmt::format(" ({} tokens", c.stats.tokens);
    if (job.part == Part::Tail)
      text += fmt::format("; the last {}% of the train file's lines: {} of {}", fraction * 100,
                          valid_lines, train_lines + valid_lines);
    text += ")";
    parts.push_back(text);
    *job.out = std::move(c.split);
    loads.push_back(load);
  }
  // eval.valid_tokens: the first blocks of validation and test, the same ones every time.
  if (cfg.valid_tokens > 0)
    for (Split* s : {&d.valid, &d.test}) {
      const size_t keep = size_t((cfg.valid_tokens + cfg.lm_block - 1) / cfg.lm_block);
      s->available_blocks = int64_t(s->examples.size());
      if (s->examples.size() > keep) s->examples.resize(keep);
    }
  if (train.present && d.train.examples.empty())
    throw DataError(
        fmt::format("data.train: '{}' gives no block of at least 2 tokens", train.file.path));

  const std::string vocab = cfg.tokenizer.model.empty()
                                ? fmt::format("vocab {} {}", d.tgt_vocab, cfg.tokenizer.model_type)
                                : fmt::format("vocab {} from tokenizer.model", d.tgt_vocab);
  const LmFile& first = train.present ? train : (valid.present ? valid : test);
  d.summary =
      fmt::format("{} (lm): {}, {}, {}, {}", dataset_name(first.file.path), fmt::join(parts, ", "),
                  vocab, tokenizer_status(tok, nullptr), corpus_status(loads));
  return d;
}

}  // namespace normlab::data::detail
