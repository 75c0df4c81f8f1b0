// Data pipeline: file checks and their messages, SentencePiece training and caching, the corpus
// cache (hits, damage), synthetic tasks, LM blocks, token-budget batches, and the real Multi30k.
#include <doctest/doctest.h>
#include <fcntl.h>
#include <fmt/format.h>
#include <signal.h>
#include <sys/file.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <deque>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <set>
#include <sstream>

#include "data/internal.h"
#include "data/text_pieces.h"
#include "data/tokenize_corpus.h"
#include "normlab/data/dataset.h"
#include "util/atomic_file.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_data {

using namespace normlab::data;
namespace fs = std::filesystem;
namespace dd = normlab::data::detail;  // (ATen has a ::detail too)

namespace {

struct TempDir {
  fs::path path;
  explicit TempDir(const std::string& name) {
    path = fs::temp_directory_path() /
           ("normlab_test_data_" + name + "_" + std::to_string(::getpid()));
    fs::remove_all(path);
    fs::create_directories(path);
  }
  ~TempDir() {
    std::error_code ec;
    fs::remove_all(path, ec);
  }
  std::string operator/(const std::string& f) const { return (path / f).string(); }
};

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << content;
}

std::string read_file(const fs::path& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const DataError& e) {
    return e.what();
  }
  return "(no DataError)";
}

// A log sink for loads whose progress lines are not looked at.
std::ostream& quiet() {
  static std::ostringstream sink;
  sink.str("");
  return sink;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// A toy parallel corpus: word-by-word "translations" (German side with umlauts and ß), lengths
// 3..10, deterministic.
const std::vector<std::pair<const char*, const char*>> kWords = {
    {"a", "ein"},        {"man", "Mann"},      {"woman", "Frau"},  {"dog", "Hund"},
    {"runs", "läuft"},   {"jumps", "springt"}, {"over", "über"},   {"the", "die"},
    {"red", "rote"},     {"blue", "blaue"},    {"ball", "Ball"},   {"street", "Straße"},
    {"near", "nahe"},    {"house", "Haus"},    {"with", "mit"},    {"child", "Kind"},
    {"plays", "spielt"}, {"in", "im"},         {"park", "Park"},   {"green", "grüne"},
    {"small", "kleine"}, {"big", "große"},     {"white", "weiße"}, {"cat", "Katze"},
    {"sits", "sitzt"}};

std::pair<std::vector<std::string>, std::vector<std::string>> toy_pairs(int n, uint64_t seed = 1) {
  std::vector<std::string> en, de;
  uint64_t x = seed * 0x9e3779b97f4a7c15ULL + 1;
  auto next = [&](uint64_t m) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return (x >> 33) % m;
  };
  for (int i = 0; i < n; ++i) {
    int len = 3 + int(next(8));
    std::string e, d;
    for (int k = 0; k < len; ++k) {
      const auto& w = kWords[next(kWords.size())];
      e += (k ? " " : "") + std::string(w.first);
      d += (k ? " " : "") + std::string(w.second);
    }
    en.push_back(e + ".");
    de.push_back(d + ".");
  }
  return {en, de};
}

std::string join_lines(const std::vector<std::string>& lines) {
  std::string s;
  for (const auto& l : lines) s += l + "\n";
  return s;
}

// Toy translation files in `dir`, and a config reading them with a small SentencePiece model.
DataConfig toy_translation(const TempDir& dir, int n_train = 1200, int n_valid = 100) {
  auto [en, de] = toy_pairs(n_train, 1);
  write_file(dir / "train.en", join_lines(en));
  write_file(dir / "train.de", join_lines(de));
  auto [ven, vde] = toy_pairs(n_valid, 2);
  write_file(dir / "valid.en", join_lines(ven));
  write_file(dir / "valid.de", join_lines(vde));
  DataConfig cfg;
  cfg.task = "translation";
  cfg.train_src = dir / "train.en";
  cfg.train_tgt = dir / "train.de";
  cfg.valid_src = dir / "valid.en";
  cfg.valid_tgt = dir / "valid.de";
  cfg.tokenizer.vocab_size = 80;
  cfg.cache_dir = dir / "cache";
  return cfg;
}

std::vector<fs::path> files_in(const fs::path& dir) {
  std::vector<fs::path> out;
  if (fs::exists(dir))
    for (const auto& e : fs::directory_iterator(dir)) out.push_back(e.path());
  std::sort(out.begin(), out.end());
  return out;
}

bool same_examples(const Split& a, const Split& b) {
  if (a.examples.size() != b.examples.size()) return false;
  for (size_t i = 0; i < a.examples.size(); ++i)
    if (a.examples[i].src != b.examples[i].src || a.examples[i].tgt != b.examples[i].tgt)
      return false;
  return a.references == b.references && a.sources == b.sources;
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

// Two BPE models of one vocabulary size and EOS (SentencePiece's default ids), trained on words of
// other letters, so they tokenize the same text differently.
std::pair<std::string, std::string> two_tokenizers() {
  std::mt19937 rng(5);
  auto model = [&](const std::string& letters) {
    std::vector<std::string> lines(400);
    for (auto& l : lines)
      for (int w = 0; w < 8; ++w) {
        for (int c = 0; c < 5; ++c) l += letters[rng() % letters.size()];
        l += ' ';
      }
    std::vector<const std::string*> text;
    for (const auto& l : lines) text.push_back(&l);
    return dd::train_sentencepiece(
        {{"model_type", "bpe"}, {"vocab_size", "60"}, {"minloglevel", "1"}}, text);
  };
  return {model("abcdefghijklm"), model("nopqrstuvwxyz")};
}

// Lines of words over the letters of both tokenizers above.
std::string corpus_text(int lines, uint32_t seed) {
  std::mt19937 rng(seed);
  std::string text;
  for (int i = 0; i < lines; ++i) {
    for (int w = 0; w < 8; ++w) {
      for (int c = 0; c < 5; ++c) text += char('a' + rng() % 26);
      text += w == 7 ? '\n' : ' ';
    }
  }
  return text;
}

// A `data tokenize` into `out` with the model file `model`, one job.
TokenizeOptions tokenize_options(const std::vector<std::string>& inputs, const fs::path& out,
                                 const std::string& model) {
  TokenizeOptions o;
  o.inputs = inputs;
  o.out = out.string();
  o.model = model;
  o.jobs = 1;
  o.cache_dir = (out.parent_path() / "cache").string();
  return o;
}

}  // namespace

TEST_SUITE("data") {
  TEST_CASE("a missing file is named with its config key") {
    TempDir dir("missing");
    write_file(dir / "train.de", "Hallo\n");
    DataConfig cfg;
    cfg.task = "translation";
    cfg.train_src = dir / "nope.en";
    cfg.train_tgt = dir / "train.de";
    cfg.cache_dir = dir / "cache";
    std::string err = error_of([&] { load_dataset(cfg, quiet()); });
    CHECK(contains(err, "data.train_src"));
    CHECK(contains(err, cfg.train_src));
    CHECK(contains(err, "not found"));
    CHECK(err.find('\n') == std::string::npos);

    cfg.train_tgt.clear();
    err = error_of([&] { load_dataset(cfg, quiet()); });
    CHECK(contains(err, "data.train_src and data.train_tgt go together"));
  }

  TEST_CASE("an empty file is an error naming it") {
    TempDir dir("empty");
    write_file(dir / "train.en", "Hello\n");
    write_file(dir / "train.de", "");
    DataConfig cfg;
    cfg.task = "translation";
    cfg.train_src = dir / "train.en";
    cfg.train_tgt = dir / "train.de";
    cfg.cache_dir = dir / "cache";
    std::string err = error_of([&] { load_dataset(cfg, quiet()); });
    CHECK(contains(err, "data.train_tgt"));
    CHECK(contains(err, cfg.train_tgt));
    CHECK(contains(err, "is empty"));
  }

  TEST_CASE("mismatched line counts name both files and both counts") {
    TempDir dir("mismatch");
    write_file(dir / "train.en", "one\ntwo\nthree\n");
    write_file(dir / "train.de", "eins\nzwei");  // no final newline: still 2 lines
    DataConfig cfg;
    cfg.task = "translation";
    cfg.train_src = dir / "train.en";
    cfg.train_tgt = dir / "train.de";
    cfg.cache_dir = dir / "cache";
    std::string err = error_of([&] { load_dataset(cfg, quiet()); });
    CHECK(contains(err, "'" + cfg.train_src + "' has 3 lines"));
    CHECK(contains(err, "'" + cfg.train_tgt + "' has 2 lines"));
    CHECK(err.find('\n') == std::string::npos);
  }

  TEST_CASE("invalid UTF-8 is reported with file:line and byte offset") {
    TempDir dir("utf8");
    write_file(dir / "train.en",
               "fine\nabc\xFF"
               "def\nok\n");
    write_file(dir / "train.de", "gut\nauch gut\nja\n");
    DataConfig cfg;
    cfg.task = "translation";
    cfg.train_src = dir / "train.en";
    cfg.train_tgt = dir / "train.de";
    cfg.cache_dir = dir / "cache";
    std::string err = error_of([&] { load_dataset(cfg, quiet()); });
    CHECK(contains(err, cfg.train_src + ":2:"));
    CHECK(contains(err, "byte 4 of the line"));
    CHECK(contains(err, "file offset 8"));
    CHECK(contains(err, "0xFF"));

    using dd::find_invalid_utf8;
    const size_t ok = std::string_view::npos;
    CHECK(find_invalid_utf8("Straße über 😀 €") == ok);
    CHECK(find_invalid_utf8("ab\xC0\xAF") == 2);         // overlong '/'
    CHECK(find_invalid_utf8("\xED\xA0\x80") == 0);       // surrogate U+D800
    CHECK(find_invalid_utf8("x\xF4\x90\x80\x80") == 1);  // > U+10FFFF
    CHECK(find_invalid_utf8("\xE2\x82") == 0);           // truncated €
    CHECK(find_invalid_utf8("a\x80") == 1);              // stray continuation byte
  }

  TEST_CASE("a pair with an empty side is skipped and counted in the summary") {
    TempDir dir("emptylines");
    DataConfig cfg = toy_translation(dir, 400, 30);
    auto [en, de] = toy_pairs(400, 1);
    en[5] = "";
    de[17] = "   ";
    write_file(cfg.train_src, join_lines(en));
    write_file(cfg.train_tgt, join_lines(de));
    Dataset d = load_dataset(cfg, quiet());
    CHECK(d.train.examples.size() == 398);
    CHECK(contains(d.summary, "train 398 pairs (2 with an empty side skipped)"));
    REQUIRE(d.train.references.size() == 398);
    CHECK(d.train.references[5] == de[6]);  // aligned after the skip
    CHECK(d.train.sources[5] == en[6]);
  }

  TEST_CASE("SentencePiece: our special ids, exact vocab, round trip, a cached model is reusable") {
    TempDir dir("spm");
    DataConfig cfg = toy_translation(dir);
    Dataset d = load_dataset(cfg, quiet());
    REQUIRE(d.src_tokenizer);
    CHECK(d.src_tokenizer == d.tgt_tokenizer);  // joint
    CHECK(d.src_vocab == 80);
    CHECK(d.tgt_vocab == 80);
    CHECK(contains(d.summary, "vocab 80 joint unigram"));
    const Tokenizer& tok = *d.src_tokenizer;
    auto [en, de] = toy_pairs(50, 9);
    for (const auto& line : de) {
      auto ids = tok.encode(line);
      REQUIRE(!ids.empty());
      CHECK(*std::min_element(ids.begin(), ids.end()) > kEos);  // no specials, no unknowns
      CHECK(tok.decode(ids) == line);
      std::vector<int32_t> framed{kBos};
      framed.insert(framed.end(), ids.begin(), ids.end());
      framed.insert(framed.end(), {kEos, kPad, kPad});
      CHECK(tok.decode(framed) == line);  // specials are skipped
    }
    // every example ends with EOS, with no special inside
    for (const auto& ex : d.train.examples) {
      REQUIRE(ex.src.size() >= 2);
      CHECK(ex.src.back() == kEos);
      CHECK(ex.tgt.back() == kEos);
      CHECK(*std::min_element(ex.src.begin(), ex.src.end() - 1) > kEos);
    }
    CHECK(tok.decode(d.train.examples[3].tgt) == d.train.references[3]);

    // the trained model sits in the cache and loads as a given tokenizer.model
    auto models = files_in(fs::path(cfg.cache_dir) / "tokenizers");
    REQUIRE(models.size() == 1);
    CHECK(models[0].extension() == ".model");
    DataConfig given = cfg;
    given.tokenizer.model = models[0].string();
    given.cache_dir = dir / "cache2";
    Dataset g = load_dataset(given, quiet());
    CHECK(contains(g.summary, "from tokenizer.model"));
    CHECK(same_examples(g.train, d.train));
  }

  TEST_CASE("a training line of any length trains the tokenizer, for every model type") {
    // Lines over 4192 bytes (SentencePiece's max_sentence_length) used to segfault the training;
    // now the whole line is learned from: "QZXQZX" and "ü" occur only in the long line.
    auto [en, de] = toy_pairs(200, 4);
    std::string long_line;
    for (int i = 0; long_line.size() < 12000; ++i) long_line += (i % 3 ? "the QZXQZX " : "man ");
    for (int i = 0; i < 3000; ++i)
      long_line += "ü";  // one 6000-byte word: cut inside, not at a space
    long_line += " ball.";
    en.insert(en.begin() + 50, long_line);
    for (const char* type : {"unigram", "bpe", "char", "word"}) {
      CAPTURE(type);
      TempDir dir(std::string("spm_long_") + type);
      write_file(dir / "text.txt", join_lines(en));
      DataConfig cfg;
      cfg.task = "lm";
      cfg.train = dir / "text.txt";
      cfg.lm_block = 16;
      cfg.tokenizer.vocab_size = 40;
      cfg.tokenizer.model_type = type;
      cfg.cache_dir = dir / "cache";
      Dataset d = load_dataset(cfg, quiet());
      const Tokenizer& tok = *d.tgt_tokenizer;
      const auto ids = tok.encode("QZXQZX");
      CHECK(std::find(ids.begin(), ids.end(), kUnk) == ids.end());
      const bool round_trip =
          tok.decode(tok.encode(long_line)) == long_line;  // (no 24 KB failure message)
      if (std::string(type) != "word") CHECK(round_trip);
    }
  }

  TEST_CASE(
      "split_long_sentences: pieces of at most max bytes, cut at spaces or UTF-8 boundaries") {
    const std::string short_line = "a b c";
    std::string long_line = "x ";
    for (int i = 0; i < 40; ++i) long_line += "word" + std::to_string(i) + " ";
    for (int i = 0; i < 30; ++i) long_line += "ß";  // 60 bytes without a space
    long_line += " end";
    std::deque<std::string> storage;
    const auto pieces = dd::split_long_sentences({&short_line, &long_line}, 16, storage);
    REQUIRE(pieces.size() > 10);
    CHECK(pieces[0] == &short_line);  // short lines pass through untouched
    std::string joined;
    for (size_t i = 1; i < pieces.size(); ++i) {
      CAPTURE(*pieces[i]);
      CHECK(!pieces[i]->empty());
      CHECK(pieces[i]->size() <= 16);
      CHECK(dd::find_invalid_utf8(*pieces[i]) == std::string::npos);
      joined += *pieces[i];
    }
    std::string without_spaces = long_line;
    without_spaces.erase(std::remove(without_spaces.begin(), without_spaces.end(), ' '),
                         without_spaces.end());
    joined.erase(std::remove(joined.begin(), joined.end(), ' '), joined.end());
    CHECK(joined == without_spaces);
  }

  TEST_CASE("a given model with other special ids is rejected") {
    TempDir dir("spm_ids");
    auto [en, de] = toy_pairs(300, 3);
    std::vector<const std::string*> text;
    for (const auto& l : en) text.push_back(&l);
    // SentencePiece's defaults: unk=0 bos=1 eos=2, no pad
    std::string model = dd::train_sentencepiece({{"vocab_size", "40"}, {"minloglevel", "1"}}, text);
    write_file(dir / "default_ids.model", model);
    DataConfig cfg = toy_translation(dir, 50, 10);
    cfg.tokenizer.model = dir / "default_ids.model";
    std::string err = error_of([&] { load_dataset(cfg, quiet()); });
    CHECK(contains(err, cfg.tokenizer.model));
    CHECK(contains(err, "special ids pad=-1 unk=0 bos=1 eos=2, expected pad=0 unk=1 bos=2 eos=3"));

    write_file(dir / "junk.model", "not a model");
    cfg.tokenizer.model = dir / "junk.model";
    CHECK(
        contains(error_of([&] { load_dataset(cfg, quiet()); }), "not a valid SentencePiece model"));
  }

  TEST_CASE("the second load hits both caches with identical tokens; damage or edits are misses") {
    TempDir dir("cache");
    DataConfig cfg = toy_translation(dir);
    std::ostringstream log;
    Dataset first = load_dataset(cfg, log);
    CHECK(contains(first.summary, "tokenizer trained"));
    CHECK(contains(first.summary, "corpus cache miss"));
    Dataset second = load_dataset(cfg, log);
    CHECK(contains(second.summary, "tokenizer cache hit"));
    CHECK(contains(second.summary, "corpus cache hit"));
    CHECK(same_examples(first.train, second.train));
    CHECK(same_examples(first.valid, second.valid));

    // one cache file per split, no temp files left behind
    const fs::path corpora = fs::path(cfg.cache_dir) / "corpora";
    auto bins = files_in(corpora);
    REQUIRE(bins.size() == 2);
    for (const auto& f : files_in(fs::path(cfg.cache_dir) / "tokenizers"))
      CHECK(f.extension() == ".model");
    for (const auto& f : bins) CHECK(f.extension() == ".bin");

    SUBCASE("truncated and bit-flipped files are misses with the same result") {
      std::string a = read_file(bins[0]), b = read_file(bins[1]);
      write_file(bins[0].string(), a.substr(0, a.size() / 2));
      b[b.size() - 7] ^= 0x10;
      write_file(bins[1].string(), b);
      Dataset third = load_dataset(cfg, log);
      CHECK(contains(third.summary, "corpus cache miss"));
      CHECK(same_examples(first.train, third.train));
      CHECK(same_examples(first.valid, third.valid));
      CHECK(contains(load_dataset(cfg, log).summary, "corpus cache hit"));  // rewritten
    }
    SUBCASE("garbage and empty files are misses") {
      write_file(bins[0].string(), "garbage");
      write_file(bins[1].string(), "");
      Dataset third = load_dataset(cfg, log);
      CHECK(contains(third.summary, "corpus cache miss"));
      CHECK(same_examples(first.train, third.train));
    }
    SUBCASE("an edited file misses its own split only") {
      auto [ven, vde] = toy_pairs(100, 2);
      vde[10] = "Ein Hund läuft.";
      write_file(cfg.valid_tgt, join_lines(vde));
      Dataset third = load_dataset(cfg, log);
      CHECK(contains(third.summary, "corpus cache hit train, miss valid"));
      CHECK(third.valid.references[10] == "Ein Hund läuft.");
    }
    SUBCASE("another max_len is another train cache entry") {
      cfg.max_len = 9;
      Dataset third = load_dataset(cfg, log);
      CHECK(contains(third.summary, "corpus cache hit valid, miss train"));
      CHECK(contains(third.summary, "dropped > max_len 9"));
      CHECK(third.train.examples.size() < first.train.examples.size());
      for (const auto& ex : third.train.examples)
        CHECK(std::max(ex.src.size(), ex.tgt.size()) <= 9);
      CHECK(third.valid.examples.size() ==
            first.valid.examples.size());  // never dropped from valid
    }
    for (const auto& f : files_in(corpora)) CHECK(f.extension() == ".bin");
  }

  TEST_CASE("the split cache format: every truncation and damaged byte is a miss") {
    TempDir dir("format");
    dd::CachedSplit c;
    c.stats = {5, 1, 2, 40};
    c.split.examples = {{{5, 6, kEos}, {7, kEos}}, {{8, kEos}, {9, 10, 11, kEos}}};
    c.split.references = {"Ein Hund.", "Straße"};
    c.split.sources = {"A dog.", "street"};
    const auto key = dd::hash_bytes("key");
    const fs::path file = dir.path / "x.bin";
    std::ostringstream log;
    dd::write_split_cache(file, key, c, log);
    dd::CachedSplit back;
    REQUIRE(dd::read_split_cache(file, key, back));
    CHECK(same_examples(back.split, c.split));
    CHECK(back.stats.too_long == 2);
    CHECK(back.stats.tokens == 40);
    CHECK_FALSE(dd::read_split_cache(file, dd::hash_bytes("other key"), back));
    CHECK_FALSE(dd::read_split_cache(dir.path / "absent.bin", key, back));

    const std::string bytes = read_file(file);
    int hits = 0;
    for (size_t n = 0; n < bytes.size(); ++n) {
      write_file(file.string(), bytes.substr(0, n));
      hits += dd::read_split_cache(file, key, back);
    }
    for (size_t i = 0; i < bytes.size(); ++i) {
      std::string damaged = bytes;
      damaged[i] ^= 0x5a;
      write_file(file.string(), damaged);
      hits += dd::read_split_cache(file, key, back);
    }
    write_file(file.string(), bytes + "x");
    hits += dd::read_split_cache(file, key, back);
    CHECK(hits == 0);
  }

  TEST_CASE("content hash: any byte changes the digest; split feeding gives the same digest") {
    std::string s(1000, 'a');
    auto base = dd::hash_bytes(s);
    for (size_t i : {size_t(0), size_t(7), size_t(8), size_t(500), size_t(999)}) {
      std::string t = s;
      t[i] = 'b';
      CHECK(dd::hash_bytes(t) != base);
    }
    CHECK(dd::hash_bytes(s + '\0') != base);
    CHECK(dd::Hasher().bytes(s.data(), 3).bytes(s.data() + 3, 997).digest() == base);
    CHECK(dd::Hasher().field("ab").field("c").digest() !=
          dd::Hasher().field("a").field("bc").digest());
    CHECK(base.hex().size() == 32);
  }

  TEST_CASE(
      "synthetic copy and reverse: deterministic, the relations hold, noise replaces a share") {
    DataConfig cfg;
    cfg.synthetic_train = 1000;
    cfg.synthetic_valid = 50;
    cfg.synthetic_min_len = 3;
    cfg.synthetic_max_len = 9;
    cfg.synthetic_vocab = 20;
    for (std::string task : {"copy", "reverse"}) {
      CAPTURE(task);
      cfg.task = task;
      cfg.synthetic_noise = 0.0;
      std::ostringstream log;
      Dataset a = load_dataset(cfg, log), b = load_dataset(cfg, log);
      CHECK(same_examples(a.train, b.train));
      CHECK(a.train.examples.size() == 1000);
      CHECK(a.valid.examples.size() == 50);
      CHECK(a.src_vocab == 24);
      std::set<size_t> lengths;
      for (size_t i = 0; i < a.train.examples.size(); ++i) {
        const auto& ex = a.train.examples[i];
        REQUIRE(ex.src.back() == kEos);
        REQUIRE(ex.tgt.back() == kEos);
        std::vector<int32_t> body(ex.src.begin(), ex.src.end() - 1), expect = body;
        if (task == "reverse") std::reverse(expect.begin(), expect.end());
        CHECK(std::vector<int32_t>(ex.tgt.begin(), ex.tgt.end() - 1) == expect);
        for (int32_t t : body) CHECK((t >= 4 && t < 24));
        lengths.insert(body.size());
        CHECK(a.train.references[i] == a.tgt_tokenizer->decode(ex.tgt));
        CHECK(a.train.sources[i] == a.src_tokenizer->decode(ex.src));
      }
      CHECK(lengths == std::set<size_t>{3, 4, 5, 6, 7, 8, 9});
      CHECK_FALSE(same_examples(a.train, a.valid));

      DataConfig other = cfg;
      other.seed = 2;
      CHECK_FALSE(same_examples(load_dataset(other, log).train, a.train));

      // noise: the source differs from the clean sequence in about that share of positions
      cfg.synthetic_noise = 0.3;
      Dataset n = load_dataset(cfg, log);
      size_t changed = 0, total = 0;
      for (size_t i = 0; i < n.train.examples.size(); ++i) {
        const auto& ex = n.train.examples[i];
        std::vector<int32_t> clean(ex.tgt.begin(), ex.tgt.end() - 1);
        if (task == "reverse") std::reverse(clean.begin(), clean.end());
        REQUIRE(clean.size() + 1 == ex.src.size());
        CHECK(clean == std::vector<int32_t>(a.train.examples[i].src.begin(),
                                            a.train.examples[i].src.end() - 1));
        for (size_t k = 0; k < clean.size(); ++k) changed += clean[k] != ex.src[k];
        total += clean.size();
      }
      CHECK(double(changed) / double(total) == doctest::Approx(0.3).epsilon(0.05));
    }
  }

  TEST_CASE("the synthetic tokenizer maps w<k> to 4+k and back") {
    dd::SyntheticTokenizer tok(10);
    CHECK(tok.vocab_size() == 14);
    CHECK(tok.encode("w0 w9 w3") == std::vector<int32_t>{4, 13, 7});
    CHECK(tok.encode("w10 x w01 w") == std::vector<int32_t>{kUnk, kUnk, kUnk, kUnk});
    CHECK(tok.decode({kBos, 4, 13, kEos, kPad, 99}) == "w0 w9");
  }

  TEST_CASE(
      "synthetic-lm: blocks overlap by one token, the chain is sparse and below uniform entropy") {
    DataConfig cfg;
    cfg.task = "synthetic-lm";
    cfg.synthetic_vocab = 16;
    cfg.synthetic_train = 300;
    cfg.synthetic_valid = 20;
    cfg.lm_block = 32;
    std::ostringstream log;
    Dataset d = load_dataset(cfg, log);
    REQUIRE(d.train.examples.size() == 300);
    CHECK(d.valid.examples.size() == 20);
    std::map<int32_t, std::set<int32_t>> successors;
    for (size_t i = 0; i < d.train.examples.size(); ++i) {
      const auto& b = d.train.examples[i].tgt;
      REQUIRE(b.size() == 33);
      CHECK(d.train.examples[i].src.empty());
      if (i + 1 < d.train.examples.size()) CHECK(b.back() == d.train.examples[i + 1].tgt.front());
      for (size_t t = 0; t + 1 < b.size(); ++t) successors[b[t]].insert(b[t + 1]);
      for (int32_t x : b) CHECK((x >= 4 && x < 20));
    }
    for (const auto& [s, next] : successors) CHECK(next.size() <= 4);
    // "entropy rate ~H nats/token, uniform U"
    auto at = d.summary.find("entropy rate ~");
    REQUIRE(at != std::string::npos);
    double h = std::stod(d.summary.substr(at + 14));
    CHECK(h > 0.1);
    CHECK(h < std::log(4.0) + 1e-9);
    CHECK(same_examples(load_dataset(cfg, log).train, d.train));

    // a batch: tgt_in = block[:-1], tgt_out = block[1:]
    BatchPlan plan(d.train, 32 * 8, 1, true);
    auto batches = plan.epoch(0);
    REQUIRE(batches.size() == 300 / 8 + (300 % 8 != 0));
    Batch b = plan.make(batches[0]);
    CHECK(b.src_len == 0);
    CHECK(b.tgt_len == 32);
    for (int64_t r = 0; r < b.size; ++r) {
      const auto& block = d.train.examples[batches[0][r]].tgt;
      for (int64_t t = 0; t < 32; ++t) {
        CHECK(b.tgt_in[r * 32 + t] == block[t]);
        CHECK(b.tgt_out[r * 32 + t] == block[t + 1]);
      }
    }
    CHECK(b.target_tokens == b.size * 32);
  }

  TEST_CASE("cut_blocks: every token after the first is a target exactly once") {
    std::vector<int32_t> stream(11);
    for (int i = 0; i < 11; ++i) stream[i] = 4 + i;
    auto blocks = dd::cut_blocks(stream, 4);
    REQUIRE(blocks.size() == 3);
    CHECK(blocks[0].tgt == std::vector<int32_t>{4, 5, 6, 7, 8});
    CHECK(blocks[1].tgt == std::vector<int32_t>{8, 9, 10, 11, 12});
    CHECK(blocks[2].tgt == std::vector<int32_t>{12, 13, 14});
    CHECK(dd::cut_blocks({4}, 4).empty());
  }

  TEST_CASE("lm from a text file: held-out tail, one stream with EOS per line, shifted blocks") {
    TempDir dir("lm");
    auto [en, de] = toy_pairs(200, 4);
    en[20] = "";  // an empty line stays, as a lone EOS
    write_file(dir / "text.txt", join_lines(en));
    DataConfig cfg;
    cfg.task = "lm";
    cfg.train = dir / "text.txt";
    cfg.lm_block = 16;
    cfg.lm_valid_fraction = 0.1;
    cfg.tokenizer.vocab_size = 40;
    cfg.cache_dir = dir / "cache";
    std::ostringstream log;
    Dataset d = load_dataset(cfg, log);
    CHECK(contains(d.summary, "the last 10% of the train file's lines: 20 of 200"));
    CHECK(d.src_tokenizer == d.tgt_tokenizer);

    auto stream_of = [&](size_t begin, size_t end) {
      std::vector<int32_t> s;
      for (size_t i = begin; i < end; ++i) {
        auto ids = d.tgt_tokenizer->encode(en[i]);
        s.insert(s.end(), ids.begin(), ids.end());
        s.push_back(kEos);
      }
      return s;
    };
    auto rebuilt = [](const Split& split) {
      std::vector<int32_t> s = split.examples.at(0).tgt;
      for (size_t i = 1; i < split.examples.size(); ++i) {
        const auto& b = split.examples[i].tgt;
        REQUIRE(b.front() == s.back());
        s.insert(s.end(), b.begin() + 1, b.end());
      }
      return s;
    };
    for (size_t i = 0; i + 1 < d.train.examples.size(); ++i)
      CHECK(d.train.examples[i].tgt.size() == 17);
    CHECK(rebuilt(d.train) == stream_of(0, 180));
    CHECK(rebuilt(d.valid) == stream_of(180, 200));
    CHECK(d.train.references.empty());

    Dataset again = load_dataset(cfg, log);
    CHECK(contains(again.summary, "tokenizer cache hit, corpus cache hit"));
    CHECK(contains(again.summary, "20 of 200"));
    CHECK(same_examples(again.valid, d.valid));
  }

  TEST_CASE("BatchPlan: token budget, each example once per epoch, seeded batch order") {
    DataConfig cfg;
    cfg.task = "reverse";
    cfg.synthetic_train = 3000;
    cfg.synthetic_min_len = 1;
    cfg.synthetic_max_len = 40;
    std::ostringstream log;
    Dataset d = load_dataset(cfg, log);
    const int64_t budget = 400;
    BatchPlan plan(d.train, budget, 7, true);
    auto e0 = plan.epoch(0);
    REQUIRE(e0.size() > 20);
    auto check_epoch = [&](const std::vector<std::vector<int32_t>>& batches) {
      std::vector<int> seen(d.train.examples.size(), 0);
      for (const auto& batch : batches) {
        REQUIRE(!batch.empty());
        size_t longest = 0;
        for (int32_t i : batch) {
          ++seen.at(i);
          longest =
              std::max({longest, d.train.examples[i].src.size(), d.train.examples[i].tgt.size()});
        }
        CHECK(batch.size() * longest <= size_t(budget));
        Batch b = plan.make(batch);
        CHECK(b.size * std::max(b.src_len, b.tgt_len) <= budget);
      }
      CHECK(std::all_of(seen.begin(), seen.end(), [](int n) { return n == 1; }));
    };
    check_epoch(e0);
    auto e1 = plan.epoch(1);
    check_epoch(e1);
    CHECK(e1 != e0);  // another order…
    CHECK(std::set(e1.begin(), e1.end()) ==
          std::set(e0.begin(), e0.end()));                      // …of the same batches
    CHECK(BatchPlan(d.train, budget, 7, true).epoch(0) == e0);  // same seed, same batches
    CHECK(BatchPlan(d.train, budget, 7, true).epoch(1) == e1);
    CHECK(BatchPlan(d.train, budget, 8, true).epoch(0) != e0);
    CHECK(plan.epoch(0) == e0);

    // unshuffled: lengths never decrease
    auto fixed = BatchPlan(d.train, budget, 7, false).epoch(5);
    for (size_t k = 1; k < fixed.size(); ++k)
      CHECK(d.train.examples[fixed[k - 1].back()].src.size() <=
            d.train.examples[fixed[k].front()].src.size());

    // the padded batch: tgt_in = BOS + tgt[:-1], tgt_out = tgt, kPad after the end
    Batch b = plan.make(e0[0]);
    int64_t targets = 0;
    for (int64_t r = 0; r < b.size; ++r) {
      const auto& ex = d.train.examples[e0[0][r]];
      targets += int64_t(ex.tgt.size());
      CHECK(b.tgt_in[r * b.tgt_len] == kBos);
      for (int64_t t = 0; t < b.tgt_len; ++t) {
        const bool in = t < int64_t(ex.tgt.size());
        CHECK(b.tgt_out[r * b.tgt_len + t] == (in ? ex.tgt[t] : kPad));
        if (t > 0) CHECK(b.tgt_in[r * b.tgt_len + t] == (in ? ex.tgt[t - 1] : kPad));
      }
      for (int64_t t = 0; t < b.src_len; ++t)
        CHECK(b.src[r * b.src_len + t] == (t < int64_t(ex.src.size()) ? ex.src[t] : kPad));
    }
    CHECK(b.target_tokens == targets);

    // an example longer than the budget forms its own batch
    Split s;
    s.examples = {
        {{5, kEos}, {5, kEos}}, {std::vector<int32_t>(50, 6), {6, kEos}}, {{7, kEos}, {7, kEos}}};
    auto own = BatchPlan(s, 10, 1, false).epoch(0);
    REQUIRE(own.size() == 2);
    CHECK(own[0] == std::vector<int32_t>{0, 2});
    CHECK(own[1] == std::vector<int32_t>{1});
    CHECK(contains(error_of([&] { BatchPlan(s, 0, 1, false); }), "max_tokens"));
  }

  TEST_CASE("unknown task and bad synthetic settings are errors") {
    DataConfig cfg;
    cfg.task = "translate";
    CHECK(
        contains(error_of([&] { load_dataset(cfg, quiet()); }), "data.task: unknown 'translate'"));
    cfg.task = "copy";
    cfg.synthetic_min_len = 5;
    cfg.synthetic_max_len = 4;
    CHECK(contains(error_of([&] { load_dataset(cfg, quiet()); }),
                   "synthetic_min_len (5) <= synthetic_max_len (4)"));
  }

  TEST_CASE("Multi30k: 29000 training and 1014 validation pairs, then cache hits" *
            doctest::test_suite("shared_data")) {
    const fs::path root = fs::path(NORMLAB_TEST_SHARED_DATA) / "multi30k";
    if (!fs::exists(root / "train.en")) {
      MESSAGE("SKIP: the Multi30k corpus is not at " << root.string());
      return;
    }
    TempDir dir("multi30k");
    DataConfig cfg;
    cfg.task = "translation";
    cfg.train_src = (root / "train.en").string();
    cfg.train_tgt = (root / "train.de").string();
    cfg.valid_src = (root / "val.en").string();
    cfg.valid_tgt = (root / "val.de").string();
    cfg.tokenizer.vocab_size = 1000;
    cfg.tokenizer.model_type = "bpe";
    cfg.cache_dir = dir / "cache";
    std::ostringstream log;
    auto t0 = std::chrono::steady_clock::now();
    Dataset d = load_dataset(cfg, log);
    const double cold = seconds_since(t0);
    CHECK(d.train.examples.size() == 29000);
    CHECK(d.valid.examples.size() == 1014);
    CHECK(d.valid.references.size() == 1014);
    CHECK(d.train.references[0] ==
          "Zwei junge weiße Männer sind im Freien in der Nähe vieler Büsche.");
    CHECK(d.src_vocab == 1000);
    CHECK(d.src_tokenizer->decode(d.train.examples[0].tgt) == d.train.references[0]);
    CHECK(contains(d.summary,
                   "multi30k (translation): train 29000 pairs, valid 1014, vocab 1000 joint bpe, "
                   "tokenizer trained"));

    t0 = std::chrono::steady_clock::now();
    Dataset again = load_dataset(cfg, log);
    const double warm = seconds_since(t0);
    CHECK(contains(again.summary, "tokenizer cache hit, corpus cache hit"));
    CHECK(same_examples(again.train, d.train));
    MESSAGE(log.str() << d.summary << "\n"
                      << again.summary << "\nfirst load " << cold << " s, cache-hit load " << warm
                      << " s");
  }

  // Issue 66.9: the tokenizer's sample stopped filling at the first empty JSONL record (1 line of
  // 3,000 when the first was empty). Each of the n non-empty lines and records must be drawn with
  // probability k/n whatever the empty ones around them: the sample against Algorithm R over the
  // non-empty items written out here, draw by draw, and each item's count over 4,000 seeds against
  // k/n.
  TEST_CASE("tokenize: the tokenizer's sample is uniform over non-empty lines and records") {
    TempDir dir("tokenizer_sample");
    // Empty records (the first too, as wikitext's JSONL begins), an empty line, records with `""`
    // that are not empty; plain lines between blank ones, CRLF and "\r\n" alone (empty).
    write_file(dir / "a.jsonl",
               "{\"text\": \"\"}\n{\"text\": \"r1\"}\n{\"text\":\"\"}\n"
               "{\"text\": \"say \\\"\\\" r2\"}\n{\"text\": \"r3\", \"meta\": \"\"}\n\n"
               "{\"meta\": 1, \"text\": \"\"}\n{\"text\": \"r4\"}\n");
    write_file(dir / "b.txt", "\n\nl1\n\r\n\nl2\r\n   \nl3");
    const std::vector<std::string> items = {"r1", "say \"\" r2", "r3",  "r4",
                                            "l1", "l2",          "   ", "l3"};
    TokenizeOptions o;
    o.inputs = {dir / "a.jsonl", dir / "b.txt"};
    o.sample_lines = 20;  // more than there are: all of them, in order
    CHECK(tokenizer_sample(o, quiet()) == items);

    constexpr int kSeeds = 4000;
    constexpr size_t k = 3;
    o.sample_lines = int64_t(k);
    std::map<std::string, int> drawn;
    std::ostringstream said;
    for (int seed = 0; seed < kSeeds; ++seed) {
      o.sample_seed = uint64_t(seed);
      const std::vector<std::string> sample = tokenizer_sample(o, seed == 0 ? said : quiet());
      std::mt19937_64 rng(dd::mix_seed(uint64_t(seed), 0x746f6b73616d706cULL));  // its stream
      std::vector<std::string> want;
      for (size_t i = 0; i < items.size(); ++i) {
        if (want.size() < k) {
          want.push_back(items[i]);
        } else if (const uint64_t j = dd::uniform_below(rng, i + 1); j < k) {
          want[j] = items[i];
        }
      }
      REQUIRE(sample == want);
      for (const auto& s : sample) ++drawn[s];
      if (seed == 0) {
        const auto from_a = std::count_if(want.begin(), want.end(), [&](const std::string& s) {
          return std::find(items.begin(), items.begin() + 4, s) != items.begin() + 4;
        });
        CHECK(contains(said.str(), "training the tokenizer on 3 of 8 non-empty lines"));
        CHECK(contains(said.str(), "a.jsonl " + std::to_string(from_a) + " of 4, b.txt " +
                                       std::to_string(3 - from_a) + " of 4"));
      }
    }
    // Binomial(4000, 3/8): 1500 ± 30.6; 5 standard deviations.
    const double p = double(k) / double(items.size()), mean = kSeeds * p;
    const double sd = std::sqrt(kSeeds * p * (1 - p));
    CHECK(drawn.size() == items.size());
    for (const auto& item : items) {
      INFO(item << " drawn " << drawn[item] << " times, expected " << mean << " ± " << sd);
      CHECK(std::abs(drawn[item] - mean) < 5 * sd);
    }
  }

  // Issue 66.20: text beginning "PAR1", or with "ustar" at byte 257, was refused as Parquet or tar.
  // Parquet is binary after its magic and ends with a footer ("\0", its length, "PAR1"); a tar
  // header's checksum is the sum of its bytes. (Real files: test tokenize_inputs.)
  TEST_CASE("tokenize: Parquet and tar are told from text by their structure") {
    const auto format_of = [](const std::string& file, bool stream) {
      const std::string_view all(file);
      return stream ? unsupported_format(all.substr(0, 512))
                    : unsupported_format(all.substr(0, 512),
                                         all.substr(all.size() - std::min<size_t>(all.size(), 12)),
                                         int64_t(all.size()));
    };
    const std::string text = "PAR1 is the first paragraph.\n" + std::string(700, 'x') + "\nPAR1";
    CHECK(format_of(text, false).empty());
    CHECK(format_of(text, true).empty());
    CHECK(format_of("PAR1", false).empty());
    // Binary after the magic (a page header: Thrift, NULs), or a text-like head with a footer.
    const std::string page = std::string("PAR1\x15\x00\x15\x80\x01", 9) + std::string(600, 'x');
    CHECK(contains(format_of(page, true), "a Parquet file, not text"));
    CHECK(format_of(page, false).empty());  // its end known: no footer, not Parquet (issue 66, D)
    const auto footed = [&](uint32_t length) {
      std::string f = "PAR1" + std::string(600, 'a') + std::string("\x15\x02\x00", 3);
      for (int i = 0; i < 4; ++i) f += char((length >> (8 * i)) & 0xff);
      return f + "PAR1";
    };
    CHECK(contains(format_of(footed(3), false), "a Parquet file, not text"));
    CHECK(format_of(footed(3), true).empty());     // a stream's head alone is text
    CHECK(format_of(footed(700), false).empty());  // a footer longer than the file: not one
    TempDir dir("formats");  // a text run's data.train reads the whole file: head and tail known
    write_file(dir / "par1.txt", text);
    CHECK(dd::read_text_file("data.train", dir / "par1.txt").bytes == text);
    write_file(dir / "footed.parquet", footed(3));
    CHECK(contains(error_of([&] { dd::read_text_file("data.train", dir / "footed.parquet"); }),
                   "footed.parquet': a Parquet file, not text"));

    // A POSIX tar header (ustar, checksum "%06o\0 " over the header with its field as spaces).
    std::string header(512, '\0');
    const auto put = [&](size_t at, const std::string& s) { header.replace(at, s.size(), s); };
    put(0, "a.txt");
    put(100, "0000644");
    put(108, "0001750");
    put(116, "0001750");
    put(124, "00000000014");
    put(136, "14721356700");
    put(156, "0");
    put(257, std::string("ustar") + '\0' + "00");
    put(148, "        ");
    int sum = 0;
    for (unsigned char c : header) sum += c;
    char checksum[8];
    std::snprintf(checksum, sizeof checksum, "%06o", sum);
    put(148, std::string(checksum) + std::string("\0 ", 2));
    const std::string tar = header + "hello world\n" + std::string(500, '\0');
    CHECK(contains(format_of(tar, true), "a tar archive, not text"));
    std::string bad = tar;
    bad[0] = 'b';  // the checksum no longer holds
    CHECK(format_of(bad, true).empty());
    const std::string ustar_text =
        std::string(257, 'w') + "ustar and more words\n" + std::string(300, 'z');
    CHECK(format_of(ustar_text, true).empty());
    CHECK(format_of(ustar_text, false).empty());
  }

  // Issue 66, D: text after "PAR1" with a NUL or invalid UTF-8 was refused as "a Parquet file"
  // though it had no footer and its end was known. Now the footer decides there; such text gets the
  // error (or the tokens) it would get without the prefix. A stream (.gz) has only its head.
  TEST_CASE("tokenize: PAR1 text without a footer is text where the file's end is known") {
    TempDir dir("par1_text");
    const std::string bad_utf8 = "PAR1 caf\xe9 au lait\n",
                      nul = std::string("PAR1 tokens\n\0 nul here\n", 24);
    for (const std::string& text : {bad_utf8, nul}) {
      CAPTURE(text);
      CHECK(unsupported_format(text, text.substr(text.size() - 12), int64_t(text.size())).empty());
      CHECK(contains(unsupported_format(text), "a Parquet file"));  // a stream's head: binary
    }
    const auto [model, other] = two_tokenizers();
    write_file(dir / "m.model", model);
    // The same bytes with "PAR2": what the text gets without the Parquet magic.
    const auto outcome = [&](const std::string& text, const std::string& out) {
      write_file(dir / "in.txt", text);
      std::string error = error_of([&] {
        tokenize_to_shards(tokenize_options({dir / "in.txt"}, dir.path / out, dir / "m.model"),
                           quiet(), false);
      });
      return std::make_pair(error, read_file(dir.path / out / "shard_00000.bin"));
    };
    auto par2 = [](std::string t) { return t.replace(3, 1, "2"); };
    const auto utf8 = outcome(bad_utf8, "u1"), utf8_plain = outcome(par2(bad_utf8), "u2");
    CHECK(contains(utf8.first, "in.txt:1: invalid UTF-8 at byte 8 of the line"));
    CHECK(utf8.first == utf8_plain.first);
    const auto with_nul = outcome(nul, "n1"), nul_plain = outcome(par2(nul), "n2");
    CHECK(with_nul.first == nul_plain.first);
    CHECK_FALSE(contains(with_nul.first, "Parquet"));
    CHECK(with_nul.second.empty() == nul_plain.second.empty());
    write_file(dir / "in.txt", bad_utf8);  // a text run's data.train reads the file whole
    const dd::TextFile file = dd::read_text_file("data.train", dir / "in.txt");
    CHECK(contains(error_of([&] { dd::split_lines(file); }), "in.txt:1: invalid UTF-8"));
  }

  // Issue 66, A: a failed rerun with another --model swapped tokenizer.model first and left the old
  // shards and shards.json, which named the tokenizer by file name only: every SHA-256 checked and
  // training took the old tokens with the new tokenizer. Now the tokenizer is written with
  // shards.json, at the end, and shards.json records its SHA-256, which loading checks.
  TEST_CASE("tokenize: tokenizer.model changes only with shards.json, which records its SHA-256") {
    TempDir dir("tokenizer_swap");
    const auto [model_a, model_b] = two_tokenizers();
    REQUIRE(model_a != model_b);
    write_file(dir / "mA.model", model_a);
    write_file(dir / "mB.model", model_b);
    write_file(dir / "good.txt", corpus_text(300, 1));
    write_file(dir / "bad.txt", "ok line\nbad \xe9 line\n");
    const fs::path out = dir.path / "ofail";
    const auto sha = [](const std::string& bytes) {
      normlab::util::Sha256 h;
      h.update(bytes.data(), bytes.size());
      return h.hex();
    };
    tokenize_to_shards(tokenize_options({dir / "good.txt"}, out, dir / "mA.model"), quiet(), false);
    const std::string shards_json = read_file(out / "shards.json");
    const std::string shard = read_file(out / "shard_00000.bin");
    CHECK(read_file(out / "tokenizer.model") == model_a);
    CHECK(nlohmann::json::parse(shards_json).value("tokenizer_sha256", "") == sha(model_a));

    const std::string error = error_of([&] {
      tokenize_to_shards(
          tokenize_options({dir / "bad.txt", dir / "good.txt"}, out, dir / "mB.model"), quiet(),
          false);
    });
    CHECK(contains(error, "bad.txt:2: invalid UTF-8"));
    CHECK(read_file(out / "tokenizer.model") == model_a);  // was mB's
    CHECK(read_file(out / "shards.json") == shards_json);  // no shard written: the folder whole
    CHECK(read_file(out / "shard_00000.bin") == shard);

    DataConfig cfg;
    cfg.task = "lm";
    cfg.format = "normlab";
    cfg.lm_block = 16;
    cfg.train = (out / "shard_00000.bin").string();
    cfg.cache_dir = (dir.path / "cache").string();
    std::ostringstream log;
    CHECK_NOTHROW(load_dataset(cfg, log));
    // The other tokenizer in its place (as the failed rerun left it): refused naming both.
    write_file((out / "tokenizer.model").string(), model_b);
    const std::string refused = error_of([&] { load_dataset(cfg, log); });
    CHECK(contains(refused, (out / "shards.json").string() + ": tokenizer_sha256 " + sha(model_a)));
    CHECK(contains(refused, (out / "tokenizer.model").string() + " has SHA-256 " + sha(model_b)));
    // An older shards.json, without the field: loads as before.
    nlohmann::json older = nlohmann::json::parse(shards_json);
    older.erase("tokenizer_sha256");
    write_file((out / "shards.json").string(), older.dump(2));
    write_file((out / "tokenizer.model").string(), model_a);
    CHECK_NOTHROW(load_dataset(cfg, log));
    // Failing after its first shard (mB's tokens over mA's): no shards.json, refused at once.
    CHECK(contains(error_of([&] {
                     tokenize_to_shards(tokenize_options({dir / "good.txt", dir / "bad.txt"}, out,
                                                         dir / "mB.model"),
                                        quiet(), false);
                   }),
                   "bad.txt:2: invalid UTF-8"));
    CHECK(read_file(out / "shard_00000.bin") != shard);
    CHECK_FALSE(fs::exists(out / "shards.json"));
    CHECK(read_file(out / "tokenizer.model") == model_a);
    CHECK(contains(error_of([&] { load_dataset(cfg, log); }),
                   (out / "shards.json").string() + ": not found"));
    // A rerun that succeeds: the new pair (the good piece kept from the failed run).
    tokenize_to_shards(tokenize_options({dir / "good.txt"}, out, dir / "mB.model"), quiet(), false);
    CHECK(read_file(out / "tokenizer.model") == model_b);
    CHECK(nlohmann::json::parse(read_file(out / "shards.json")).value("tokenizer_sha256", "") ==
          sha(model_b));
    CHECK(read_file(out / "shard_00000.bin") != shard);
    CHECK_NOTHROW(load_dataset(cfg, log));
  }

  // Issue 66, B and C: two runs into one --out at once both ended well, one's shards.json over the
  // other's shards; a killed run's temporaries stayed after the rerun. Now a run holds
  // --out/tokenize.lock (a second one is refused at once, naming the folder and the holder) and,
  // holding it, removes the temporaries of the folder's own files that other processes left.
  TEST_CASE("tokenize: one run per --out (tokenize.lock); killed runs' temporaries removed") {
    TempDir dir("tokenize_lock");
    const auto [model, other] = two_tokenizers();
    write_file(dir / "m.model", model);
    write_file(dir / "good.txt", corpus_text(50, 2));
    const fs::path out = dir.path / "out";
    const TokenizeOptions o = tokenize_options({dir / "good.txt"}, out, dir / "m.model");
    tokenize_to_shards(o, quiet(), false);
    const std::string shards_json = read_file(out / "shards.json");

    int ready[2];
    REQUIRE(::pipe(ready) == 0);
    const pid_t holder = ::fork();
    if (holder == 0) {  // another `data tokenize` at work: holds the lock (async-signal-safe calls)
      const int fd = ::open((out / "tokenize.lock").c_str(), O_RDWR | O_CREAT, 0644);
      const bool locked = fd >= 0 && ::flock(fd, LOCK_EX | LOCK_NB) == 0;
      (void)!::write(ready[1], locked ? "y" : "n", 1);
      ::pause();
      ::_exit(0);
    }
    char c = 0;
    REQUIRE(::read(ready[0], &c, 1) == 1);
    REQUIRE(c == 'y');
    std::string busy = "(no error)";
    try {
      tokenize_to_shards(o, quiet(), false);
    } catch (const TokenizeBusyError& e) {
      busy = e.what();
    } catch (const std::exception& e) {
      busy = std::string("another error: ") + e.what();
    }
    ::kill(holder, SIGKILL);
    ::waitpid(holder, nullptr, 0);
    ::close(ready[0]);
    ::close(ready[1]);
    CHECK(contains(busy, out.string() + ": another `normlab data tokenize`"));
    CHECK(contains(busy, "holds tokenize.lock"));
    CHECK(read_file(out / "shards.json") == shards_json);

    // Temporaries a killed run left: of a dead process, and of a pid that lives again (pid 1).
    const pid_t dead = ::fork();
    if (dead == 0) ::_exit(0);
    ::waitpid(dead, nullptr, 0);
    const std::vector<std::string> stale = {fmt::format("shard_00003.bin.tmp.{}.5", dead),
                                            fmt::format("shards.json.tmp.{}.0", dead),
                                            "tokenizer.model.tmp.1.2", "shard_00000.bin.tmp.1.7"};
    for (const auto& name : stale) write_file((out / name).string(), "partial");
    write_file((out / fmt::format("notes.txt.tmp.{}.1", dead)).string(), "not ours");
    tokenize_to_shards(o, quiet(), false);
    for (const auto& name : stale) {
      CAPTURE(name);
      CHECK_FALSE(fs::exists(out / name));
    }
    CHECK(fs::exists(out / fmt::format("notes.txt.tmp.{}.1", dead)));  // not this command's name
    CHECK(read_file(out / "shards.json") == shards_json);
  }

  // Issue 66, E: one input given twice, or by a link, was tokenized twice: its text twice in the
  // training data. Refused naming both arguments, before anything is written.
  TEST_CASE("tokenize: the same input twice (by name, symbolic or hard link) is refused") {
    TempDir dir("same_input");
    const auto [model, other] = two_tokenizers();
    write_file(dir / "m.model", model);
    write_file(dir / "a.txt", corpus_text(20, 3));
    write_file(dir / "b.txt", corpus_text(20, 3));  // the same text, another file: taken
    fs::create_symlink(dir.path / "a.txt", dir.path / "soft.txt");
    fs::create_hard_link(dir.path / "a.txt", dir.path / "hard.txt");
    int n = 0;
    for (const std::string& second : {dir / "a.txt", dir / "soft.txt", dir / "hard.txt"}) {
      CAPTURE(second);
      const fs::path out = dir.path / fmt::format("out{}", n++);
      const std::string error = error_of([&] {
        tokenize_to_shards(
            tokenize_options({dir / "a.txt", dir / "b.txt", second}, out, dir / "m.model"), quiet(),
            false);
      });
      CHECK(contains(
          error, "inputs 1 '" + (dir / "a.txt") + "' and 3 '" + second + "' are the same file"));
      CHECK_FALSE(fs::exists(out));
    }
    CHECK(tokenize_to_shards(
              tokenize_options({dir / "a.txt", dir / "b.txt"}, dir.path / "ok", dir / "m.model"),
              quiet(), false) > 0);
  }

}  // TEST_SUITE

}  // namespace normlab_test_data
