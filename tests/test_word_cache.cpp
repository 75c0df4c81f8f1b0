// WordCacheEncoder (issue 44.3): lines encoded through a cache of words give exactly
// SentencePiece's tokens for the whole line, for every model it accepts; the models it refuses are
// refused for a reason that a counterexample shows. Then the same on the real corpora of
// ../shared/data.
#include <doctest/doctest.h>
#include <unistd.h>

#include <algorithm>
#include <deque>
#include <filesystem>
#include <fstream>
#include <string>
#include <vector>

#include "data/internal.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_word_cache {

namespace fs = std::filesystem;
namespace dd = normlab::data::detail;

namespace {

using Options = std::vector<std::pair<std::string, std::string>>;

// A deterministic generator (Knuth's MMIX LCG): next(m) is in [0, m).
struct Lcg {
  uint64_t x;
  uint64_t operator()(uint64_t m) {
    x = x * 6364136223846793005ULL + 1442695040888963407ULL;
    return (x >> 33) % m;
  }
};

// Sentences from a small vocabulary with ASCII punctuation, digits, capitals, and a few runs of
// spaces and non-ASCII words; no '{', '}', '|' or '~' (unknown to every model below).
std::vector<std::string> training_lines(int n) {
  static const char* const kWords[] = {
      "the", "a",     "man",   "woman", "dog",     "runs",  "over", "street", "near",  "house",
      "in",  "park",  "The",   "A",     "don't",   "it's",  "3.14", "2024",   "(red)", "blue,",
      "U.S", "well-", "known", "ball.", "\"yes\"", "what?", "café", "naïve",  "x",     "of"};
  std::vector<std::string> out;
  Lcg next{12345};
  for (int i = 0; i < n; ++i) {
    std::string line;
    const int len = 2 + int(next(10));
    for (int k = 0; k < len; ++k) {
      if (k) line += next(40) ? " " : "   ";
      line += kWords[next(std::size(kWords))];
    }
    out.push_back(line);
  }
  return out;
}

// Lines that take every branch: cached words, repeats, unknown characters inside and between
// words, and the lines that must be encoded whole (spaces at an end or doubled, a tab, non-ASCII,
// empty).
const std::vector<std::string> kEdgeLines = {
    "the man runs over the street",
    "the man runs over the street",
    "The dog, near the house (red) in 2024: 3.14 U.S well-known",
    "a {{ b ~|~ c {x} ~",
    "{ {",
    "x",
    "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~",
    "don't it's what? \"yes\" ball.",
    "qqqq zzzz vvvv",
    "the  man",
    " leading",
    "trailing ",
    "   ",
    "",
    "tab\there",
    "caf\xc3\xa9 na\xc3\xafve the man",
    "the\xc2\xa0man",
    "<br>foo the<br>man foofoo",
    // Normalization at a word's edges (nmt_nfkc): U+00A8 is " " + U+0308, NBSP and U+3000 are
    // spaces, U+200B and U+2581 become spaces, U+0001 is dropped, full and half width are folded.
    "x \xc2\xa8y \xc2\xa8",
    "ab\xc2\xa0 cd",
    "\xe3\x80\x80 x",
    "a \xe2\x80\x8b b",
    "e\xcc\x81t\xc3\xa9 x \xcc\x81"
    "abc",
    "a\xe2\x96\x81"
    "b c",
    "\xef\xbc\xa1\xef\xbc\xa2\xef\xbc\xa3 \xef\xbd\xb8\xef\xbe\x9e\xef\xbd\xb0",
    "a\x01"
    "b c",
    "\x01 b",
    "the\tman",
    // Documents: newlines, tabs and runs of them between words, at the ends (issue 59.5).
    "the man\nruns  over\t\tthe street ",
    "\n\tthe man\n",
    "a\r\nb\n\nthe dog",
    "\r x \f\n",
    "\n\n",
};

// The lines the cache must encode whole: without `collapse` (remove_extra_whitespaces false),
// spaces at an end or doubled; with it, a line of whitespace only (runs of spaces, and of the
// tabs, newlines … that nmt_nfkc makes spaces, separate words: issue 59.5); or a word whose
// normalization is empty or makes whitespace (the identity normalizer keeps every character but
// U+2581).
bool encoded_whole(const std::string& line, bool collapse, bool identity) {
  const char* separators = !collapse ? "" : identity ? " " : " \t\n\f\r";
  if (collapse ? line.find_first_not_of(separators) == std::string::npos
               : line.empty() || line.front() == ' ' || line.back() == ' ' ||
                     line.find("  ") != std::string::npos)
    return true;
  if (line.find("\xe2\x96\x81") != std::string::npos) return true;
  if (identity) return false;
  for (const char* w : {"\xc2\xa0m", "\xe3\x80\x80", "\xe2\x80\x8b", "\x01 "})
    if (line.find(w) != std::string::npos) return true;
  if (!collapse && line.find_first_of("\t\n\r\v\f") != std::string::npos) return true;
  return !collapse &&
         (line.find("\xc2\xa8") != std::string::npos || line.find("\xc2\xa0") != std::string::npos);
}

std::vector<int32_t> whole(const dd::SentencePieceTokenizer& tok, const std::string& line) {
  std::vector<int32_t> ids;
  tok.encode_into(line, ids);
  return ids;
}

bool has_word_split_counterexample(const dd::SentencePieceTokenizer& tok,
                                   const std::vector<std::string>& lines) {
  for (const auto& line : lines) {
    if (line.empty() ||
        line.find_first_not_of(" !\"#$%&'()*+,-./0123456789:;<=>?@ABCDEFGHIJKLMN"
                               "OPQRSTUVWXYZ[\\]^_`abcdefghijklmnopqrstuvwxyz{|}~") !=
            std::string::npos ||
        line.find("  ") != std::string::npos || line.front() == ' ' || line.back() == ' ')
      continue;
    std::vector<int32_t> joined;
    for (size_t b = 0, e; b <= line.size(); b = e + 1) {
      e = std::min(line.find(' ', b), line.size());
      const auto w = whole(tok, line.substr(b, e - b));
      joined.insert(joined.end(), w.begin(), w.end());
    }
    if (joined != whole(tok, line)) return true;
  }
  return false;
}

// The model with its NormalizerSpec.name (ModelProto field 3, its field 1) replaced: the name is
// what a model says of its rules, not what SentencePiece applies (issue 56.5).
std::string with_normalizer_name(const std::string& proto, const std::string& name) {
  auto varint = [](const std::string& s, size_t& at) {
    uint64_t v = 0;
    for (int shift = 0; at < s.size(); shift += 7) {
      const auto b = static_cast<uint8_t>(s[at++]);
      v |= uint64_t(b & 0x7f) << shift;
      if (!(b & 0x80)) break;
    }
    return v;
  };
  auto put_varint = [](std::string& out, uint64_t v) {
    do {
      out += char((v & 0x7f) | (v > 0x7f ? 0x80 : 0));
      v >>= 7;
    } while (v);
  };
  // Each field of a message, with `edit` given field `field`'s bytes (wire type 2) to rewrite.
  auto rewrite = [&](const std::string& msg, uint64_t field, auto edit) {
    std::string out;
    for (size_t at = 0; at < msg.size();) {
      const size_t start = at;
      const uint64_t key = varint(msg, at);
      switch (key & 7) {
        case 0:
          varint(msg, at);
          break;
        case 1:
          at += 8;
          break;
        case 5:
          at += 4;
          break;
        case 2: {
          const uint64_t n = varint(msg, at);
          if ((key >> 3) == field) {
            const std::string inner = edit(msg.substr(at, n));
            put_varint(out, key);
            put_varint(out, inner.size());
            out += inner;
            at += n;
            continue;
          }
          at += n;
          break;
        }
      }
      out += msg.substr(start, at - start);
    }
    return out;
  };
  return rewrite(proto, 3, [&](const std::string& spec) {
    return rewrite(spec, 1, [&](const std::string&) { return name; });
  });
}

std::string fmt_rules_name() { return "normlab-rules-" + std::to_string(::getpid()) + ".tsv"; }

// Code-like documents: nested indentation by spaces (and tabs), blank lines, aligned "=" and
// comments after two spaces, trailing spaces, CRLF, and a few non-ASCII strings: what
// `--keep-newlines` keeps (issue 59.2).
std::vector<std::string> code_documents(int n) {
  static const char* const kNames[] = {"value", "count", "items", "self", "x", "result", "data",
                                       "node",  "key",   "index", "name", "i", "total",  "flag"};
  static const char* const kLines[] = {
      "return {0}",           "{0} = {1} + 1",        "if {0} is None:",
      "for {0} in {1}:",      "{0}   = {1}  # align", "print(\"caf\xc3\xa9 {0}\")",
      "{0}.append({1})",      "# {0}  {1}  note",     "raise ValueError({0})",
      "{0}[{1}] = ~{0} | {1}"};
  std::vector<std::string> out;
  Lcg next{777};
  for (int d = 0; d < n; ++d) {
    std::string doc = std::string("def ") + kNames[next(std::size(kNames))] + "(self):\n";
    int depth = 1;
    const int lines = 1 + int(next(12));
    for (int l = 0; l < lines; ++l) {
      if (next(8) == 0) doc += "\n";  // a blank line
      const bool tabs = next(10) == 0;
      for (int k = 0; k < depth; ++k) doc += tabs ? "\t" : "    ";
      std::string line = kLines[next(std::size(kLines))];
      for (const char* slot : {"{0}", "{1}"})
        for (size_t at; (at = line.find(slot)) != std::string::npos;)
          line.replace(at, 3, kNames[next(std::size(kNames))]);
      doc += line;
      if (next(12) == 0) doc += "  ";  // trailing spaces
      doc += next(15) == 0 ? "\r\n" : "\n";
      if (line.back() == ':')
        ++depth;
      else if (depth > 1 && next(3) == 0)
        --depth;
    }
    if (next(2)) doc.pop_back();  // some end without "\n"
    out.push_back(doc);
  }
  return out;
}

// Documents of a model that keeps spaces and newlines that the cache must encode whole: U+2581
// itself, or with NFKC a character it makes a space (NBSP, U+3000), at a segment's end, where its
// "▁" meets the next segment's run of spaces (SentencePiece merges them: "ab\u00a0 cd" is
// ▁a b ▁▁ c d) or a line end (refused there too: the check does not look ahead).
bool document_encoded_whole(const std::string& doc, bool nfkc) {
  const std::vector<std::string> spaces =
      nfkc ? std::vector<std::string>{"\xe2\x96\x81", "\xc2\xa0", "\xe3\x80\x80"}
           : std::vector<std::string>{"\xe2\x96\x81"};
  for (const auto& c : spaces) {
    for (size_t at = doc.find(c); at != std::string::npos; at = doc.find(c, at + 1)) {
      const size_t after = at + c.size();
      if (after == doc.size() || doc[after] == ' ' || doc[after] == '\n') return true;
    }
  }
  return false;
}

const std::vector<std::string> kEdgeDocuments = {
    "",
    " ",
    "\n",
    "\n\n",
    "  x",
    "x  ",
    "a  \n  b  ",
    "\tx\n\ty",
    "a\r\nb",
    "x\n",
    "\n x",
    "\n\n  x\n\n",
    "   \n   ",
    "caf\xc3\xa9 \xf0\x9f\x98\x80 x\n \xf0\x9f\x98\x80",
    "{{ ~|~ }}\n  ~",
    "ab\xc2\xa0 cd",
    "\xe3\x80\x80 x",
    "the\xc2\xa0man",
    "x\xc2\xa0\ny",
    "a\xe2\x96\x81 b",
    "x \xc2\xa8y \xc2\xa8",
    "\x01 b",
    "a\x01 b",
    "a \xe2\x80\x8b b",
    "x\ty \x0b z",
    "e\xcc\x81t\xc3\xa9  \xcc\x81x",
    "\xef\xbc\xa1\xef\xbc\xa2  x"};

struct ModelCase {
  const char* name;
  Options options;
  const char* refusal;  // "" : the cache is used
  bool counterexample;  // a refused model: some line encodes differently word by word
};

}  // namespace

TEST_SUITE("data") {
  TEST_CASE("the word cache decides by the normalizer's rules, not its name (issue 56.5)") {
    const auto train = training_lines(3000);
    std::vector<const std::string*> text;
    for (const auto& l : train) text.push_back(&l);
    // One rule, "x y" -> "Z": it spans the space between two words.
    const fs::path rules = fs::temp_directory_path() / fmt_rules_name();
    std::ofstream(rules) << "78 20 79\t5A\n";
    const std::string trained =
        dd::train_sentencepiece({{"model_type", "bpe"},
                                 {"vocab_size", "150"},
                                 {"hard_vocab_limit", "false"},
                                 {"normalization_rule_tsv", rules.string()}},
                                text);
    fs::remove(rules);
    const std::string named = with_normalizer_name(trained, "nmt_nfkc");
    REQUIRE(named != trained);
    const dd::SentencePieceTokenizer tok(named, "x y -> Z named nmt_nfkc", false);
    const std::vector<std::string> lines = {"the x y man", "x y", "a x y b x", "x yx y"};
    // The rule is armed: word by word, "x" and "y" would not become "Z".
    CHECK(has_word_split_counterexample(tok, lines));
    CHECK(tok.word_split_refusal().find("spans a space") != std::string::npos);
    dd::WordCacheEncoder cached(tok);
    std::vector<int32_t> ids;
    for (const auto& line : lines) {
      CAPTURE(line);
      cached.encode_into(line, ids);
      CHECK(ids == whole(tok, line));
    }
  }

  TEST_CASE(
      "the word cache gives SentencePiece's tokens for every model it accepts; refusals hold") {
    const auto train = training_lines(3000);
    std::vector<const std::string*> text;
    for (const auto& l : train) text.push_back(&l);
    auto lines = kEdgeLines;
    const auto more = training_lines(600);  // runs of 3 spaces in some: encoded whole
    lines.insert(lines.end(), more.begin(), more.end());
    lines.push_back("zzqq vvxx");  // words unknown to the word model

    const std::vector<ModelCase> cases = {
        {"bpe", {{"model_type", "bpe"}, {"vocab_size", "150"}}, "", false},
        {"bpe, byte fallback, user symbols",
         {{"model_type", "bpe"},
          {"vocab_size", "400"},
          {"byte_fallback", "true"},
          {"user_defined_symbols", "<br>,foo"}},
         "",
         false},
        {"LLaMA-like: whitespace kept, whitespace-only pieces, split digits",
         {{"model_type", "bpe"},
          {"vocab_size", "400"},
          {"byte_fallback", "true"},
          {"remove_extra_whitespaces", "false"},
          {"allow_whitespace_only_pieces", "true"},
          {"split_digits", "true"}},
         "",
         false},
        {"char", {{"model_type", "char"}, {"vocab_size", "50"}}, "", false},
        {"case folding",
         {{"model_type", "bpe"}, {"vocab_size", "150"}, {"normalization_rule_name", "nmt_nfkc_cf"}},
         "",
         false},
        {"identity",
         {{"model_type", "bpe"}, {"vocab_size", "150"}, {"normalization_rule_name", "identity"}},
         "",
         false},
        {"unigram", {{"model_type", "unigram"}, {"vocab_size", "150"}}, "unigram model", false},
        {"word", {{"model_type", "word"}, {"vocab_size", "40"}}, "word model", true},
        {"no dummy prefix",
         {{"model_type", "bpe"}, {"vocab_size", "150"}, {"add_dummy_prefix", "false"}},
         "add_dummy_prefix false",
         true},
        {"pieces across spaces",
         {{"model_type", "bpe"}, {"vocab_size", "300"}, {"split_by_whitespace", "false"}},
         "spans a word start",
         true},
        {"whitespace as suffix",
         {{"model_type", "bpe"}, {"vocab_size", "150"}, {"treat_whitespace_as_suffix", "true"}},
         "treat_whitespace_as_suffix",
         false},
    };
    for (const auto& c : cases) {
      const std::string name = c.name;
      CAPTURE(name);
      Options options = c.options;
      options.push_back({"hard_vocab_limit", "false"});
      const dd::SentencePieceTokenizer tok(dd::train_sentencepiece(options, text), c.name,
                                           /*normlab_ids=*/false);
      CHECK(tok.word_split_refusal().find(c.refusal) != std::string::npos);
      CHECK(tok.word_split_refusal().empty() == (*c.refusal == 0));
      if (*c.refusal) {
        CHECK(has_word_split_counterexample(tok, lines) == c.counterexample);
        dd::WordCacheEncoder refused(tok);
        std::vector<int32_t> ids;
        for (const auto& line : lines) {
          refused.encode_into(line, ids);
          CHECK(ids == whole(tok, line));
        }
        CHECK(refused.whole_lines() == lines.size());
        continue;
      }
      const bool collapse = std::find(options.begin(), options.end(),
                                      std::pair<std::string, std::string>(
                                          "remove_extra_whitespaces", "false")) == options.end();
      // nmt_nfkc makes tabs, newlines, form feeds and CRs spaces (not \v); the identity
      // rules keep them; without remove_extra_whitespaces nothing collapses.
      CHECK(tok.whitespace_split() == (!collapse ? "" : name == "identity" ? " " : " \t\n\f\r"));
      for (const size_t max_words : {size_t(1) << 18, size_t(3)}) {  // 3: starts over often
        dd::WordCacheEncoder cached(tok, true, max_words);
        std::vector<int32_t> ids;
        for (const auto& line : lines) {
          CAPTURE(line);
          const uint64_t whole_before = cached.whole_lines();
          cached.encode_into(line, ids);
          CHECK(ids == whole(tok, line));
          CHECK(cached.whole_lines() - whole_before ==
                encoded_whole(line, collapse, name == "identity"));
        }
        CHECK(cached.words_encoded() > 0);
        CHECK(cached.words_cached() > (max_words > 3 ? cached.words_encoded() : 0));
      }
    }
  }

  TEST_CASE("documents that keep newlines and indentation go through the cache (issue 59.2)") {
    auto docs = code_documents(1500);
    std::vector<const std::string*> text, line_text;  // documents; their lines (as LLaMA's)
    std::deque<std::string> lines;
    for (size_t i = 0; i < 1000; ++i) {
      text.push_back(&docs[i]);
      for (size_t b = 0, e; b < docs[i].size(); b = e + 1) {
        e = std::min(docs[i].find('\n', b), docs[i].size());
        lines.push_back(docs[i].substr(b, e - b));
        line_text.push_back(&lines.back());
      }
    }
    docs.insert(docs.end(), kEdgeDocuments.begin(), kEdgeDocuments.end());
    for (const auto& l : kEdgeLines) docs.push_back(l);
    struct Case {
      const char* name;
      Options options;
      const char* refusal;    // "" : documents are split into lines and segments
      bool on_lines = false;  // trained on lines: no piece holds "\n"
    };
    Options keep = dd::keep_newlines_trainer_options();
    auto with = [&](Options more) {
      more.insert(more.begin(), keep.begin(), keep.end());
      return more;
    };
    const std::vector<Case> cases = {
        {"--keep-newlines (bpe)", with({{"model_type", "bpe"}, {"vocab_size", "600"}}), ""},
        {"--keep-newlines, small vocabulary", with({{"model_type", "bpe"}, {"vocab_size", "300"}}),
         ""},
        {"LLaMA-like: identity rules, newline by byte fallback",
         {{"model_type", "bpe"},
          {"vocab_size", "600"},
          {"normalization_rule_name", "identity"},
          {"remove_extra_whitespaces", "false"},
          {"allow_whitespace_only_pieces", "true"},
          {"split_digits", "true"},
          {"byte_fallback", "true"}},
         "",
         true},
        // A later key wins (SentencePiece's map): "\n" and "\n    " user symbols.
        {"newline pieces",
         with(
             {{"model_type", "bpe"}, {"vocab_size", "600"}, {"user_defined_symbols", "\n,\n    "}}),
         "holds a newline"},
        {"newline unknown",
         {{"model_type", "bpe"},
          {"vocab_size", "600"},
          {"normalization_rule_name", "identity"},
          {"remove_extra_whitespaces", "false"}},
         "is unknown",
         true},
        {"newline a space (nmt_nfkc)",
         {{"model_type", "bpe"}, {"vocab_size", "600"}, {"remove_extra_whitespaces", "false"}},
         "normalizes to something else"},
        {"--keep-newlines, unigram", with({{"model_type", "unigram"}, {"vocab_size", "600"}}),
         "unigram model"},
    };
    for (const auto& c : cases) {
      const std::string name = c.name;
      CAPTURE(name);
      Options options = c.options;
      options.push_back({"hard_vocab_limit", "false"});
      const dd::SentencePieceTokenizer tok(
          dd::train_sentencepiece(options, c.on_lines ? line_text : text), c.name, false);
      CAPTURE(tok.newline_split_refusal());
      CHECK(tok.newline_split_refusal().find(c.refusal) != std::string::npos);
      const bool split = *c.refusal == 0;
      CHECK(tok.newline_split_refusal().empty() == split);
      dd::WordCacheEncoder cached(tok);
      std::vector<int32_t> ids;
      const bool nfkc = name.rfind("--keep-newlines", 0) == 0;
      size_t differ = 0, whole_expected = 0;
      for (const auto& doc : docs) {
        CAPTURE(doc);
        const uint64_t whole_before = cached.whole_lines();
        cached.encode_into(doc, ids);
        if (ids != whole(tok, doc) && ++differ <= 3) CHECK_MESSAGE(false, "differs");
        if (split)
          CHECK((cached.whole_lines() - whole_before == 1) == document_encoded_whole(doc, nfkc));
        whole_expected += document_encoded_whole(doc, nfkc);
      }
      CHECK(differ == 0);
      if (split) {
        CHECK(cached.whole_lines() == whole_expected);
        CHECK(cached.words_cached() > 10 * cached.words_encoded());
      }
    }
  }

  TEST_CASE("the word cache gives SentencePiece's tokens on Multi30k en/de and tinyshakespeare" *
            doctest::test_suite("shared_data")) {
    const fs::path root(NORMLAB_TEST_SHARED_DATA);
    const std::vector<fs::path> files = {root / "multi30k" / "train.en",
                                         root / "multi30k" / "train.de",
                                         root / "tinyshakespeare" / "input.txt"};
    std::vector<std::string> lines;
    for (const auto& f : files) {
      std::ifstream in(f);
      if (!in) {
        MESSAGE("SKIP: " << f.string() << " is not there");
        return;
      }
      for (std::string l; std::getline(in, l);) lines.push_back(l);
    }
    std::vector<const std::string*> sample;
    for (size_t i = 0; i < lines.size(); i += 4) sample.push_back(&lines[i]);
    // tinyshakespeare's speeches as documents with their newlines (issue 59.2).
    std::vector<std::string> speeches(1);
    for (size_t i = lines.size() - 40000; i < lines.size(); ++i) {
      if (lines[i].empty()) {
        if (!speeches.back().empty()) speeches.emplace_back();
      } else {
        speeches.back() += (speeches.back().empty() ? "" : "\n") + lines[i];
      }
    }
    Options keep = dd::keep_newlines_trainer_options();
    keep.insert(keep.end(), {{"model_type", "bpe"}, {"vocab_size", "4000"}});
    for (const Options& options : {Options{{"model_type", "bpe"}, {"vocab_size", "4000"}},
                                   Options{{"model_type", "bpe"},
                                           {"vocab_size", "4000"},
                                           {"byte_fallback", "true"},
                                           {"remove_extra_whitespaces", "false"},
                                           {"allow_whitespace_only_pieces", "true"},
                                           {"split_digits", "true"}},
                                   keep}) {
      const bool documents = options == keep;
      const dd::SentencePieceTokenizer tok(dd::train_sentencepiece(options, sample), "corpora",
                                           false);
      REQUIRE(tok.word_split_refusal().empty());
      CHECK(tok.newline_split_refusal().empty() == documents);
      dd::WordCacheEncoder cached(tok);
      std::vector<int32_t> ids;
      size_t differ = 0;
      for (const auto& line : documents ? speeches : lines) {
        cached.encode_into(line, ids);
        if (ids != whole(tok, line) && ++differ <= 3) CHECK_MESSAGE(false, "differs: " << line);
      }
      CHECK(differ == 0);
      MESSAGE((documents ? speeches : lines).size()
              << std::string(documents ? " speeches, " : " lines, ") << cached.whole_lines()
              << " encoded whole, words: " << cached.words_cached() << " cached, "
              << cached.words_encoded() << " encoded");
      // A word at a line start and after a space are two segments: fewer repeats in 40,000 lines.
      CHECK(cached.words_cached() > (documents ? 5 : 10) * cached.words_encoded());
    }
  }
}

}  // namespace normlab_test_word_cache
