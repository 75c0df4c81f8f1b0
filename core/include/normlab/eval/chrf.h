// Corpus chrF as sacreBLEU computes it by default (chrF2: character 1..6-grams, whitespace
// removed, beta 2, effective-order averaging, one reference), and the sacreBLEU signatures that
// say which settings normlab's BLEU and chrF reproduce.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace normlab::eval {

// The sacreBLEU release whose default BLEU and chrF normlab matches
// (tests/check_eval_sacrebleu.py).
inline constexpr const char* kSacrebleuVersion = "2.6.0";

struct ChrfScore {
  double score = 0;            // 0..100
  std::vector<int64_t> stats;  // per order 1..6: hypothesis n-grams, reference n-grams, matches
};

ChrfScore corpus_chrf(const std::vector<std::string>& hypotheses,
                      const std::vector<std::string>& references);

// "nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:2.6.0", as sacreBLEU prints it.
std::string bleu_signature();
// "nrefs:1|case:mixed|eff:yes|nc:6|nw:0|space:no|version:2.6.0"
std::string chrf_signature();

}  // namespace normlab::eval
