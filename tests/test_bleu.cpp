// Corpus BLEU and the 13a tokenizer against values produced by sacreBLEU 2.6.0 itself
// (sacrebleu.tokenizers.tokenizer_13a.Tokenizer13a and sacrebleu.corpus_bleu, default options).
#include <doctest/doctest.h>

#include <array>
#include <cmath>
#include <stdexcept>
#include <string>
#include <vector>

#include "normlab/eval/bleu.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_bleu {

using normlab::eval::corpus_bleu;
using normlab::eval::tokenize_13a;

TEST_SUITE("bleu") {
  TEST_CASE("13a tokenization matches sacreBLEU") {
    CHECK(tokenize_13a("Hello, world!") == "Hello , world !");
    // commas/periods between digits stay; a dash after a digit is split off
    CHECK(tokenize_13a("It costs $3,000.50 (approx.) - really?") ==
          "It costs $ 3,000.50 ( approx . ) - really ?");
    CHECK(tokenize_13a("1990-2000 and 3.5-4.2") == "1990 - 2000 and 3.5 - 4.2");
    CHECK(tokenize_13a("a.. b,, .5 ,x 1.a a.1") == "a . . b , , . 5 , x 1 . a a . 1");
    CHECK(tokenize_13a("...") == ". . .");
    CHECK(tokenize_13a("5-") == "5 -");
    // apostrophes and dashes between letters are not symbols for 13a
    CHECK(tokenize_13a("don't stop-watch e.g. U.S.A.") == "don't stop-watch e . g . U . S . A .");
    CHECK(tokenize_13a("a/b:c;d@e[f]g{h}i~j`k^l_m|n\\o") ==
          "a / b : c ; d @ e [ f ] g { h } i ~ j ` k ^ l _ m | n \\ o");
    // HTML entities, replaced in sacreBLEU's order (&amp;lt; becomes '<')
    CHECK(tokenize_13a("&quot;Quoted&quot; &amp; &lt;tag&gt; &amp;lt;") ==
          "\" Quoted \" & < tag > <");
    CHECK(tokenize_13a("x<skipped>y -\nz\nw") == "xy z w");
    // UTF-8: umlauts and ß are letters like any other non-digit
    CHECK(tokenize_13a("Die Straße ist schön. Größer, weiß?") ==
          "Die Straße ist schön . Größer , weiß ?");
    CHECK(tokenize_13a("Mr.Müller's café!") == "Mr . Müller's café !");
    CHECK(tokenize_13a("über.") == "über .");
    CHECK(tokenize_13a("ß,ß") == "ß , ß");
    // Python's str.split(): tab, U+00A0 and U+3000 are whitespace
    CHECK(tokenize_13a("tab\there\u00a0nbsp\u3000ideo") == "tab here nbsp ideo");
    CHECK(tokenize_13a("") == "");
    CHECK(tokenize_13a("   ") == "");
  }

  TEST_CASE("a perfect match is 100") {
    auto s = corpus_bleu({"Ein Mann fährt Fahrrad .", "The cat sat on the mat."},
                         {"Ein Mann fährt Fahrrad .", "The cat sat on the mat."});
    CHECK(s.score == doctest::Approx(100.0).epsilon(1e-12));
    CHECK(s.counts == std::array<int64_t, 4>{12, 10, 8, 6});
    CHECK(s.totals == s.counts);
    CHECK(s.brevity_penalty == 1.0);
    CHECK(s.to_string() ==
          "BLEU = 100.00 100.0/100.0/100.0/100.0 (BP = 1.000 ratio = 1.000 hyp_len = 12 ref_len = "
          "12)");
  }

  TEST_CASE("an empty hypothesis scores 0") {
    auto s = corpus_bleu({""}, {"Ein Mann fährt Fahrrad."});
    CHECK(s.score == 0.0);
    CHECK(s.sys_len == 0);
    CHECK(s.ref_len == 5);
    CHECK(s.brevity_penalty == 0.0);
    CHECK(s.to_string() ==
          "BLEU = 0.00 0.0/0.0/0.0/0.0 (BP = 0.000 ratio = 0.000 hyp_len = 0 ref_len = 5)");
  }

  TEST_CASE("brevity penalty, with a zero 4-gram count smoothed") {
    // sacreBLEU: 14.256747717620575, counts [4, 2, 1, 0], totals [4, 3, 2, 1]
    auto s = corpus_bleu({"Ein Mann fährt."}, {"Ein Mann fährt ein rotes Fahrrad auf der Straße."});
    CHECK(s.counts == std::array<int64_t, 4>{4, 2, 1, 0});
    CHECK(s.totals == std::array<int64_t, 4>{4, 3, 2, 1});
    CHECK(s.sys_len == 4);
    CHECK(s.ref_len == 10);
    CHECK(s.brevity_penalty == doctest::Approx(std::exp(1.0 - 10.0 / 4.0)));
    CHECK(s.precisions[3] == 50.0);  // exp smoothing: 100 / (2 * 1)
    CHECK(s.score == doctest::Approx(14.256747717620575).epsilon(1e-12));
    CHECK(s.to_string() ==
          "BLEU = 14.26 100.0/66.7/50.0/50.0 (BP = 0.223 ratio = 0.400 hyp_len = 4 ref_len = 10)");
  }

  TEST_CASE("exp smoothing doubles for each further zero count") {
    // sacreBLEU: 45.18010018049227, counts [4, 2, 0, 0]: p3 = 100/(2*2), p4 = 100/(4*1)
    auto s = corpus_bleu({"der Hund der Katze"}, {"der Katze der Hund"});
    CHECK(s.counts == std::array<int64_t, 4>{4, 2, 0, 0});
    CHECK(s.precisions[2] == 25.0);
    CHECK(s.precisions[3] == 25.0);
    CHECK(s.score == doctest::Approx(45.18010018049227).epsilon(1e-12));

    // sacreBLEU: 15.97357760615681 (hyp longer than ref, clipped unigram counts)
    auto t = corpus_bleu({"the the the the"}, {"the cat"});
    CHECK(t.counts == std::array<int64_t, 4>{1, 0, 0, 0});
    CHECK(t.brevity_penalty == 1.0);
    CHECK(t.score == doctest::Approx(15.97357760615681).epsilon(1e-12));
  }

  TEST_CASE("statistics are summed over the corpus") {
    // sacreBLEU: 39.28146509005132, counts [5, 2, 1, 0], totals [7, 5, 3, 2]
    auto s = corpus_bleu({"a b c d e", "x y"}, {"a b c x e", "x z"});
    CHECK(s.counts == std::array<int64_t, 4>{5, 2, 1, 0});
    CHECK(s.totals == std::array<int64_t, 4>{7, 5, 3, 2});
    CHECK(s.score == doctest::Approx(39.28146509005132).epsilon(1e-12));
    CHECK(s.to_string() ==
          "BLEU = 39.28 71.4/40.0/33.3/25.0 (BP = 1.000 ratio = 1.000 hyp_len = 7 ref_len = 7)");
  }

  TEST_CASE("fewer than four tokens in the whole corpus score 0, as in sacreBLEU") {
    // no 4-grams at all: the loop stops, p4 stays 0 and its log is floored
    auto s = corpus_bleu({"Ein Hund."}, {"Ein Hund."});
    CHECK(s.totals == std::array<int64_t, 4>{3, 2, 1, 0});
    CHECK(s.score == 0.0);
    CHECK(s.to_string() ==
          "BLEU = 0.00 100.0/100.0/100.0/0.0 (BP = 1.000 ratio = 1.000 hyp_len = 3 ref_len = 3)");
  }

  TEST_CASE("trailing whitespace is stripped before tokenizing; sizes must agree") {
    auto s = corpus_bleu({"Ein Hund läuft.  \n\u00a0"}, {"Ein Hund läuft."});
    CHECK(s.sys_len == 4);
    CHECK(s.score == doctest::Approx(100.0));
    CHECK_THROWS_AS(corpus_bleu({"a"}, {}), std::invalid_argument);
  }

}  // TEST_SUITE

}  // namespace normlab_test_bleu
