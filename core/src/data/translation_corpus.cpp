// Translation corpora: parallel text files, validated, tokenized with SentencePiece, cached.
//
// Empty lines: a pair with an empty (or whitespace-only) line on either side is skipped and counted
// in the summary; it carries nothing to learn or score. Training pairs with a side longer than
// max_len tokens (EOS included) are dropped and counted; valid/test pairs are always kept, so BLEU
// is computed on the whole reference set.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <ostream>

#include "internal.h"

namespace fs = std::filesystem;

namespace normlab::data::detail {

namespace {

struct ParallelFiles {
  std::string name;  // train | valid | test
  bool present = false;
  TextFile src, tgt;
  bool parsed = false;
  std::vector<std::string> src_lines, tgt_lines;

  void parse() {
    if (parsed) return;
    src_lines = split_lines(src);
    tgt_lines = split_lines(tgt);
    check_parallel(src, src_lines.size(), tgt, tgt_lines.size());
    parsed = true;
  }
};

ParallelFiles open_files(const std::string& name, const std::string& src, const std::string& tgt) {
  ParallelFiles f;
  f.name = name;
  if (src.empty() && tgt.empty()) return f;
  if (src.empty() || tgt.empty())
    throw DataError(
        fmt::format("data.{0}_src and data.{0}_tgt go together, but only data.{0}_{1} is set", name,
                    src.empty() ? "tgt" : "src"));
  f.present = true;
  f.src = read_text_file("data." + name + "_src", src);
  f.tgt = read_text_file("data." + name + "_tgt", tgt);
  return f;
}

bool blank(const std::string& s) { return s.find_first_not_of(" \t\r\f\v") == std::string::npos; }

std::vector<const std::string*> non_blank(const std::vector<std::string>& lines) {
  std::vector<const std::string*> out;
  for (const auto& l : lines)
    if (!blank(l)) out.push_back(&l);
  return out;
}

CachedSplit tokenize(const ParallelFiles& f, const Tokenizer& src_tok, const Tokenizer& tgt_tok,
                     int max_len) {
  CachedSplit c;
  c.stats.lines = f.src_lines.size();
  std::vector<const std::string*> src, tgt;
  for (size_t i = 0; i < f.src_lines.size(); ++i) {
    if (blank(f.src_lines[i]) || blank(f.tgt_lines[i])) {
      ++c.stats.empty_skipped;
      continue;
    }
    src.push_back(&f.src_lines[i]);
    tgt.push_back(&f.tgt_lines[i]);
  }
  auto src_ids = encode_all(src_tok, src);
  auto tgt_ids = encode_all(tgt_tok, tgt);
  for (size_t k = 0; k < src.size(); ++k) {
    Example ex{std::move(src_ids[k]), std::move(tgt_ids[k])};
    ex.src.push_back(kEos);
    ex.tgt.push_back(kEos);
    if (max_len > 0 && (int64_t(ex.src.size()) > max_len || int64_t(ex.tgt.size()) > max_len)) {
      ++c.stats.too_long;
      continue;
    }
    c.stats.tokens += ex.src.size() + ex.tgt.size();
    c.split.examples.push_back(std::move(ex));
    c.split.sources.push_back(*src[k]);
    c.split.references.push_back(*tgt[k]);
  }
  return c;
}

std::string split_text(const std::string& name, const CachedSplit& c, bool train, int max_len) {
  std::string s = fmt::format("{} {}", name, c.split.examples.size());
  if (train) s += " pairs";
  std::vector<std::string> notes;
  if (c.stats.too_long)
    notes.push_back(fmt::format("{} dropped > max_len {}", c.stats.too_long, max_len));
  if (c.stats.empty_skipped)
    notes.push_back(fmt::format("{} with an empty side skipped", c.stats.empty_skipped));
  if (!notes.empty()) s += fmt::format(" ({})", fmt::join(notes, ", "));
  return s;
}

}  // namespace

Dataset load_translation(const DataConfig& cfg, std::ostream& log) {
  if (cfg.max_len < 1)
    throw DataError(fmt::format("data.max_len must be positive, got {}", cfg.max_len));
  ParallelFiles files[3] = {open_files("train", cfg.train_src, cfg.train_tgt),
                            open_files("valid", cfg.valid_src, cfg.valid_tgt),
                            open_files("test", cfg.test_src, cfg.test_tgt)};
  ParallelFiles& train = files[0];
  if (!train.present && cfg.tokenizer.model.empty())
    throw DataError(
        "data: task translation needs data.train_src and data.train_tgt (to train the model and, "
        "unless tokenizer.model is given, the tokenizer)");
  if (!train.present && !files[1].present && !files[2].present)
    throw DataError(
        "data: task translation needs at least one pair of files (data.train_src/train_tgt, …)");
  const fs::path cache_dir = resolve_cache_dir(cfg.cache_dir);

  // Tokenizers: a given model serves both sides; else one joint model on both training sides, or
  // one per side. The key of a trained model hashes the training files' content (not size+mtime:
  // a copied or touched corpus must still hit, an edited one of the same size must not).
  TokenizerOutcome src_tok, tgt_tok;
  if (!cfg.tokenizer.model.empty() || cfg.tokenizer.joint) {
    const Digest key = Hasher()
                           .field("translation-joint")
                           .field(train.src.digest)
                           .field(train.tgt.digest)
                           .digest();
    src_tok = obtain_sentencepiece(
        cfg.tokenizer, key,
        [&] {
          train.parse();
          auto all = non_blank(train.src_lines);
          auto tgt = non_blank(train.tgt_lines);
          all.insert(all.end(), tgt.begin(), tgt.end());
          return all;
        },
        cache_dir, "joint", log);
    tgt_tok = src_tok;
  } else {
    auto side = [&](const TextFile& file, const std::vector<std::string>& lines, const char* what) {
      return obtain_sentencepiece(
          cfg.tokenizer, Hasher().field("one-side").field(file.digest).digest(),
          [&] {
            train.parse();
            return non_blank(lines);
          },
          cache_dir, what, log);
    };
    src_tok = side(train.src, train.src_lines, "source");
    tgt_tok = side(train.tgt, train.tgt_lines, "target");
  }

  Dataset d;
  d.src_tokenizer = src_tok.tokenizer;
  d.tgt_tokenizer = tgt_tok.tokenizer;
  d.src_vocab = src_tok.tokenizer->vocab_size();
  d.tgt_vocab = tgt_tok.tokenizer->vocab_size();

  std::vector<SplitLoad> loads;
  std::vector<std::string> parts;
  Split* targets[3] = {&d.train, &d.valid, &d.test};
  for (int s = 0; s < 3; ++s) {
    ParallelFiles& f = files[s];
    if (!f.present) continue;
    const bool is_train = s == 0;
    const int max_len = is_train ? cfg.max_len : 0;
    const Digest key = Hasher()
                           .field("normlab-corpus-v1")
                           .field("translation")
                           .field(int64_t(max_len))
                           .field(f.src.digest)
                           .field(f.tgt.digest)
                           .field(src_tok.tokenizer->digest())
                           .field(tgt_tok.tokenizer->digest())
                           .digest();
    const fs::path file = cache_file(cache_dir, "corpora", key, ".bin");
    SplitLoad load{f.name};
    CachedSplit c;
    load.hit = read_split_cache(file, key, c);
    if (!load.hit) {
      const auto t0 = std::chrono::steady_clock::now();
      f.parse();
      c = tokenize(f, *src_tok.tokenizer, *tgt_tok.tokenizer, max_len);
      load.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      log << fmt::format("data: tokenized {} ({} pairs) in {:.2f} s\n", f.name,
                         c.split.examples.size(), load.seconds);
      write_split_cache(file, key, c, log);
    }
    if (is_train && c.split.examples.empty())
      throw DataError(fmt::format(
          "data.train_src/train_tgt: no usable pairs in '{}' and '{}' ({} lines, {} with an "
          "empty side, {} longer than max_len {})",
          f.src.path, f.tgt.path, c.stats.lines, c.stats.empty_skipped, c.stats.too_long,
          cfg.max_len));
    parts.push_back(split_text(f.name, c, is_train, cfg.max_len));
    *targets[s] = std::move(c.split);
    loads.push_back(load);
  }

  std::string vocab;
  if (!cfg.tokenizer.model.empty())
    vocab = fmt::format("vocab {} from tokenizer.model", d.src_vocab);
  else if (cfg.tokenizer.joint)
    vocab = fmt::format("vocab {} joint {}", d.src_vocab, cfg.tokenizer.model_type);
  else
    vocab =
        fmt::format("vocab {} src / {} tgt {}", d.src_vocab, d.tgt_vocab, cfg.tokenizer.model_type);
  const std::string& first =
      train.present ? train.src.path : (files[1].present ? files[1] : files[2]).src.path;
  d.summary =
      fmt::format("{} (translation): {}, {}, {}, {}", dataset_name(first), fmt::join(parts, ", "),
                  vocab, tokenizer_status(src_tok, &tgt_tok), corpus_status(loads));
  return d;
}

}  // namespace normlab::data::detail
