// Corpus BLEU with sacreBLEU's defaults. What sacreBLEU does, step by step:
//   segment  -> str.rstrip() -> Tokenizer13a -> str.split() -> n-grams 1..4 (Counter)
//   per segment: correct[n] += min(hyp count, ref count), total[n] += hyp count,
//                sys_len += hyp tokens, ref_len += ref tokens (one reference)
//   corpus: brevity penalty, 'exp' smoothing of zero counts, geometric mean of the precisions.
// The text is UTF-8. Every pattern of the 13a tokenizer is ASCII, and no ASCII byte occurs inside
// a multi-byte UTF-8 sequence, so scanning bytes finds the same matches as Python's regexes on
// code points; only Python's notion of whitespace (str.split / str.rstrip) needs decoding.
#include "normlab/eval/bleu.h"

#include <fmt/format.h>

#include <cmath>
#include <stdexcept>
#include <string_view>
#include <unordered_map>

namespace normlab::eval {
namespace {

// Length in bytes of the Python-whitespace code point starting at s[i], or 0 if none there
// (str.isspace: U+0009-000D, 001C-001F, 0020, 0085, 00A0, 1680, 2000-200A, 2028, 2029, 202F, 205F,
// 3000).
size_t space_at(std::string_view s, size_t i) {
  const auto b = [&](size_t k) { return static_cast<unsigned char>(s[k]); };
  const unsigned char c = b(i);
  if (c < 0x80) return (c == ' ' || (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F)) ? 1 : 0;
  if (c == 0xC2 && i + 1 < s.size()) return (b(i + 1) == 0x85 || b(i + 1) == 0xA0) ? 2 : 0;
  if (i + 2 >= s.size()) return 0;
  const unsigned c1 = b(i + 1), c2 = b(i + 2);
  if (c == 0xE1) return (c1 == 0x9A && c2 == 0x80) ? 3 : 0;  // U+1680
  if (c == 0xE2) {
    if (c1 == 0x80 && (c2 <= 0x8A || c2 == 0xA8 || c2 == 0xA9 || c2 == 0xAF))
      return 3;                              // 2000-200A, 2028, 2029, 202F
    if (c1 == 0x81 && c2 == 0x9F) return 3;  // U+205F
    return 0;
  }
  if (c == 0xE3) return (c1 == 0x80 && c2 == 0x80) ? 3 : 0;  // U+3000
  return 0;
}

// Python's str.split(): the non-empty runs between whitespace code points.
template <class F>
void for_each_token(std::string_view s, F&& f) {
  size_t i = 0, start = std::string_view::npos;
  while (i < s.size()) {
    if (size_t w = space_at(s, i)) {
      if (start != std::string_view::npos) f(s.substr(start, i - start));
      start = std::string_view::npos;
      i += w;
    } else {
      if (start == std::string_view::npos) start = i;
      // skip the whole code point: a whitespace check must start at a lead byte
      const auto c = static_cast<unsigned char>(s[i]);
      size_t len = c < 0x80 ? 1 : c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC0 ? 2 : 1;
      i = std::min(s.size(), i + len);
    }
  }
  if (start != std::string_view::npos) f(s.substr(start));
}

// Python's str.rstrip() with no argument.
std::string_view rstrip(std::string_view s) {
  size_t end = 0;
  for (size_t i = 0; i < s.size();) {
    if (size_t w = space_at(s, i)) {
      i += w;
    } else {
      const auto c = static_cast<unsigned char>(s[i]);
      i = std::min(s.size(), i + (c < 0x80    ? 1
                                  : c >= 0xF0 ? 4
                                  : c >= 0xE0 ? 3
                                  : c >= 0xC0 ? 2
                                              : 1));
      end = i;
    }
  }
  return s.substr(0, end);
}

// Python's str.replace(from, to): every non-overlapping occurrence, left to right, one pass.
void replace_all(std::string& s, std::string_view from, std::string_view to) {
  size_t pos = s.find(from);
  if (pos == std::string::npos) return;
  std::string out;
  out.reserve(s.size());
  size_t last = 0;
  for (; pos != std::string::npos; pos = s.find(from, last)) {
    out.append(s, last, pos - last);
    out.append(to);
    last = pos + from.size();
  }
  out.append(s, last, std::string::npos);
  s.swap(out);
}

bool is_digit(char c) { return c >= '0' && c <= '9'; }
bool is_period_comma(char c) { return c == '.' || c == ','; }

// [\{-\~\[-\` -\&\(-\+\:-\@\/]: ASCII punctuation and symbols except ' , - . (the range ' '-'&'
// includes the space itself, which only adds more spaces).
bool is_13a_symbol(char c) {
  return (c >= '{' && c <= '~') || (c >= '[' && c <= '`') || (c >= ' ' && c <= '&') ||
         (c >= '(' && c <= '+') || (c >= ':' && c <= '@') || c == '/';
}

// re.sub with a two-character pattern (A)(B): Python scans left to right and resumes after each
// match, so a character consumed as B cannot start the next match.
template <class A, class B, class Emit>
std::string sub_pairs(const std::string& s, A&& a, B&& b, Emit&& emit) {
  std::string out;
  out.reserve(s.size() + s.size() / 4);
  size_t i = 0;
  while (i < s.size()) {
    if (i + 1 < s.size() && a(s[i]) && b(s[i + 1])) {
      emit(out, s[i], s[i + 1]);
      i += 2;
    } else {
      out.push_back(s[i++]);
    }
  }
  return out;
}

// Counts of all n-grams (n = 1..4) of a tokenized segment. The tokens are separated by single
// spaces, so an n-gram is a substring of the segment and a string_view can be the key.
using NgramCounts = std::unordered_map<std::string_view, int64_t>;

void count_ngrams(const std::vector<std::string_view>& tok, NgramCounts& out) {
  out.clear();
  for (size_t n = 1; n <= 4; ++n)
    for (size_t i = 0; i + n <= tok.size(); ++i) {
      const char* b = tok[i].data();
      const char* e = tok[i + n - 1].data() + tok[i + n - 1].size();
      ++out[std::string_view(b, static_cast<size_t>(e - b))];
    }
}

size_t order_of(std::string_view ngram) {
  size_t n = 1;
  for (char c : ngram) n += c == ' ';
  return n;
}

}  // namespace

std::string tokenize_13a(const std::string& input) {
  std::string line = input;
  replace_all(line, "<skipped>", "");
  replace_all(line, "-\n", "");
  replace_all(line, "\n", " ");
  if (line.find('&') != std::string::npos) {
    replace_all(line, "&quot;", "\"");
    replace_all(line, "&amp;", "&");
    replace_all(line, "&lt;", "<");
    replace_all(line, "&gt;", ">");
  }

  // (' ' + line + ' ') with ([\{-\~\[-\` -\&\(-\+\:-\@\/]) -> ' \1 '
  std::string s;
  s.reserve(line.size() * 2 + 2);
  s.push_back(' ');
  for (char c : line) {
    if (is_13a_symbol(c)) {
      s.push_back(' ');
      s.push_back(c);
      s.push_back(' ');
    } else {
      s.push_back(c);
    }
  }
  s.push_back(' ');

  const auto not_digit = [](char c) { return !is_digit(c); };
  // ([^0-9])([\.,]) -> '\1 \2 '
  s = sub_pairs(s, not_digit, is_period_comma, [](std::string& o, char x, char y) {
    o.push_back(x), o.push_back(' '), o.push_back(y), o.push_back(' ');
  });
  // ([\.,])([^0-9]) -> ' \1 \2'
  s = sub_pairs(s, is_period_comma, not_digit, [](std::string& o, char x, char y) {
    o.push_back(' '), o.push_back(x), o.push_back(' '), o.push_back(y);
  });
  // ([0-9])(-) -> '\1 \2 '
  s = sub_pairs(
      s, is_digit, [](char c) { return c == '-'; },
      [](std::string& o, char x, char y) {
        o.push_back(x), o.push_back(' '), o.push_back(y), o.push_back(' ');
      });

  // ' '.join(line.split())
  std::string out;
  out.reserve(s.size());
  for_each_token(s, [&](std::string_view t) {
    if (!out.empty()) out.push_back(' ');
    out.append(t);
  });
  return out;
}

BleuScore corpus_bleu(const std::vector<std::string>& hypotheses,
                      const std::vector<std::string>& references) {
  if (hypotheses.size() != references.size())
    throw std::invalid_argument(fmt::format("corpus_bleu: {} hypotheses but {} references",
                                            hypotheses.size(), references.size()));
  BleuScore r;
  NgramCounts hyp_ngrams, ref_ngrams;
  std::vector<std::string_view> hyp_tok, ref_tok;
  for (size_t k = 0; k < hypotheses.size(); ++k) {
    const std::string hyp = tokenize_13a(std::string(rstrip(hypotheses[k])));
    const std::string ref = tokenize_13a(std::string(rstrip(references[k])));
    hyp_tok.clear();
    ref_tok.clear();
    for_each_token(hyp, [&](std::string_view t) { hyp_tok.push_back(t); });
    for_each_token(ref, [&](std::string_view t) { ref_tok.push_back(t); });
    count_ngrams(hyp_tok, hyp_ngrams);
    count_ngrams(ref_tok, ref_ngrams);
    r.sys_len += static_cast<int64_t>(hyp_tok.size());
    r.ref_len += static_cast<int64_t>(ref_tok.size());
    for (const auto& [ngram, count] : hyp_ngrams) {
      const size_t n = order_of(ngram) - 1;
      r.totals[n] += count;
      auto it = ref_ngrams.find(ngram);
      if (it != ref_ngrams.end()) r.counts[n] += std::min(count, it->second);
    }
  }

  // BLEU.compute_bleu with smooth_method='exp', effective_order=False, max_ngram_order=4.
  r.brevity_penalty = 1.0;
  if (r.sys_len < r.ref_len)
    r.brevity_penalty =
        r.sys_len > 0 ? std::exp(1.0 - static_cast<double>(r.ref_len) / r.sys_len) : 0.0;
  r.precisions = {0, 0, 0, 0};
  bool any_correct = false;
  for (auto c : r.counts) any_correct = any_correct || c != 0;
  if (!any_correct) {
    r.score = 0.0;
    return r;
  }
  double smooth_mteval = 1.0;
  for (size_t n = 0; n < 4; ++n) {
    if (r.totals[n] == 0) break;
    if (r.counts[n] == 0) {
      smooth_mteval *= 2;
      r.precisions[n] = 100. / (smooth_mteval * static_cast<double>(r.totals[n]));
    } else {
      r.precisions[n] = 100. * static_cast<double>(r.counts[n]) / static_cast<double>(r.totals[n]);
    }
  }
  double log_sum = 0;  // Python's sum() of my_log(p): log floored at -9999999999 for p == 0
  for (double p : r.precisions) log_sum += p == 0.0 ? -9999999999.0 : std::log(p);
  r.score = r.brevity_penalty * std::exp(log_sum / 4);
  return r;
}

std::string BleuScore::to_string() const {
  const double ratio = ref_len ? static_cast<double>(sys_len) / static_cast<double>(ref_len) : 0.0;
  return fmt::format(
      "BLEU = {:.2f} {:.1f}/{:.1f}/{:.1f}/{:.1f} (BP = {:.3f} ratio = {:.3f} hyp_len = {} ref_len "
      "= {})",
      score, precisions[0], precisions[1], precisions[2], precisions[3], brevity_penalty, ratio,
      sys_len, ref_len);
}

}  // namespace normlab::eval
