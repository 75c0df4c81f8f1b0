// Corpus BLEU exactly as sacreBLEU computes it by default (13a tokenization, exp smoothing,
// case-sensitive, one reference): Post (2018), "A Call for Clarity in Reporting BLEU Scores".
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace normlab::eval {

struct BleuScore {
  double score = 0;                    // 0..100
  std::array<double, 4> precisions{};  // percentages, as sacreBLEU prints them
  double brevity_penalty = 0;
  int64_t sys_len = 0, ref_len = 0;
  std::array<int64_t, 4> counts{}, totals{};
  std::string to_string() const;  // "BLEU = 35.12 66.1/41.2/28.0/19.3 (BP = 1.000 ratio = 1.012
                                  // hyp_len = … ref_len = …)"
};

// sacreBLEU's tokenizer_13a (mteval-v13a): the text as sacreBLEU would split it.
std::string tokenize_13a(const std::string& line);

BleuScore corpus_bleu(const std::vector<std::string>& hypotheses,
                      const std::vector<std::string>& references);

}  // namespace normlab::eval
