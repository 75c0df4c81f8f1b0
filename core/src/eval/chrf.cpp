#include "normlab/eval/chrf.h"

#include <fmt/format.h>

#include <algorithm>
#include <stdexcept>
#include <unordered_map>

namespace normlab::eval {
namespace {

constexpr int kCharOrder = 6;
constexpr double kBeta = 2;

// UTF-8 → code points (sacreBLEU counts Python characters); an invalid byte stands for itself.
std::u32string code_points(const std::string& s) {
  std::u32string out;
  for (size_t i = 0; i < s.size();) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    const int extra = c >= 0xF0 ? 3 : c >= 0xE0 ? 2 : c >= 0xC0 ? 1 : 0;
    char32_t cp = extra == 3 ? c & 0x07u : extra == 2 ? c & 0x0Fu : extra == 1 ? c & 0x1Fu : c;
    bool ok = true;
    for (int k = 1; ok && k <= extra; ++k) {
      if (i + size_t(k) >= s.size() ||
          (static_cast<unsigned char>(s[i + size_t(k)]) & 0xC0) != 0x80)
        ok = false;
      else
        cp = (cp << 6) | (static_cast<unsigned char>(s[i + size_t(k)]) & 0x3Fu);
    }
    if (!ok) {
      out.push_back(c);
      ++i;
    } else {
      out.push_back(cp);
      i += size_t(extra) + 1;
    }
  }
  return out;
}

// What Python's str.split() splits on.
bool is_python_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

using Counts = std::unordered_map<std::u32string, int64_t>;

std::vector<Counts> char_ngrams(const std::string& line) {
  std::u32string text;
  for (char32_t c : code_points(line))
    if (!is_python_space(c)) text.push_back(c);
  std::vector<Counts> out(kCharOrder);
  for (size_t n = 1; n <= size_t(kCharOrder); ++n)
    for (size_t i = 0; i + n <= text.size(); ++i) ++out[n - 1][text.substr(i, n)];
  return out;
}

double f_score(const std::vector<int64_t>& stats) {
  const double factor = kBeta * kBeta;
  double avg_prec = 0, avg_rec = 0;
  int effective_order = 0;
  for (int i = 0; i < kCharOrder; ++i) {
    const int64_t n_hyp = stats[size_t(3 * i)], n_ref = stats[size_t(3 * i + 1)],
                  n_match = stats[size_t(3 * i + 2)];
    if (n_hyp > 0 && n_ref > 0) {
      avg_prec += double(n_match) / double(n_hyp);
      avg_rec += double(n_match) / double(n_ref);
      ++effective_order;
    }
  }
  if (effective_order == 0) return 0;
  avg_prec /= effective_order;
  avg_rec /= effective_order;
  if (avg_prec + avg_rec == 0) return 0;
  return 100 * (1 + factor) * avg_prec * avg_rec / (factor * avg_prec + avg_rec);
}

}  // namespace

ChrfScore corpus_chrf(const std::vector<std::string>& hypotheses,
                      const std::vector<std::string>& references) {
  if (hypotheses.size() != references.size())
    throw std::invalid_argument(
        fmt::format("chrF: {} hypotheses for {} references", hypotheses.size(), references.size()));
  ChrfScore s;
  s.stats.assign(size_t(3 * kCharOrder), 0);
  for (size_t k = 0; k < hypotheses.size(); ++k) {
    const auto hyp = char_ngrams(hypotheses[k]), ref = char_ngrams(references[k]);
    for (size_t n = 0; n < size_t(kCharOrder); ++n) {
      int64_t h = 0, r = 0, m = 0;
      for (const auto& [g, c] : hyp[n]) {
        h += c;
        if (auto it = ref[n].find(g); it != ref[n].end()) m += std::min(c, it->second);
      }
      for (const auto& [g, c] : ref[n]) r += c;
      s.stats[3 * n] += h;
      s.stats[3 * n + 1] += r;
      s.stats[3 * n + 2] += m;
    }
  }
  s.score = f_score(s.stats);
  return s;
}

std::string bleu_signature() {
  return fmt::format("nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:{}", kSacrebleuVersion);
}

std::string chrf_signature() {
  return fmt::format("nrefs:{}|case:mixed|eff:yes|nc:{}|nw:0|space:no|version:{}", 1, kCharOrder,
                     kSacrebleuVersion);
}

}  // namespace normlab::eval
