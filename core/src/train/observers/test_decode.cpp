// The test score of the final weights, once (docs/evaluate.md): beam
// eval.test_beam over the test set, BLEU and chrF for translation, perplexity for both.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>

#include "eval/run_model.h"
#include "normlab/eval/bleu.h"
#include "standard_observers.h"
#include "train/training_session.h"

namespace normlab {
namespace {

class TestDecodeObserver final : public TrainingObserver {
 public:
  void on_training_done(TrainingSession& s) override {
    if (s.spec.eval.test_beam <= 0 || s.ds.test.examples.empty()) return;
    // A run resumed at max_updates (killed in its end phase) keeps the test score it logged.
    if (s.resuming && util::find_record(s.run->path() / "train.jsonl", "test", s.st.updates))
      return;
    s.enter_phase("test decode", fmt::format("{} sentences, beam {}", s.ds.test.examples.size(),
                                             s.spec.eval.test_beam));
    eval::BeamOptions beam;
    beam.beam = s.spec.eval.test_beam;
    beam.max_len_a = s.spec.eval.max_len_a;
    beam.max_len_b = s.spec.eval.max_len_b;
    beam.batch_tokens =
        std::max<int64_t>(s.spec.optim.max_tokens * beam.beam, 8000);  // no gradients: more fits
    const eval::SplitEvaluation ev =
        eval::evaluate_split(*s.model, s.ds, s.ds.test, "test", s.device, beam);
    TestScore score;
    score.record = {
        {"kind", "test"},          {"update", s.st.updates},    {"nll", ev.nll},
        {"ppl", std::exp(ev.nll)}, {"sentences", ev.sentences}, {"elapsed_s", s.elapsed()}};
    std::string scores;
    if (ev.translated) {
      score.record["beam"] = beam.beam;
      score.record["bleu"] = ev.bleu.score;
      score.record["chrf"] = ev.chrf.score;
      score.record["bleu_signature"] = eval::bleu_signature();
      std::filesystem::create_directories(s.run->path() / "eval");
      s.run->write_file(
          fmt::format("eval/test.final.beam{}.hyp", beam.beam),
          ev.hypotheses.empty() ? "" : fmt::format("{}\n", fmt::join(ev.hypotheses, "\n")));
      scores = fmt::format(" | beam {} | {} | {}", beam.beam, eval::bleu_line(ev.bleu),
                           eval::chrf_line(ev.chrf));
    }
    score.line = fmt::format("test   | update {:>6} | nll {:.4f} | ppl {:.2f}{}", s.st.updates,
                             ev.nll, std::exp(ev.nll), scores);
    s.events->on_scalar("test/nll", s.st.updates, ev.nll);
    if (ev.translated) s.events->on_scalar("test/bleu", s.st.updates, ev.bleu.score);
    s.publish([&](TrainingObserver& o) { o.on_test(s, score); });
  }
};

}  // namespace

std::unique_ptr<TrainingObserver> make_test_decode() {
  return std::make_unique<TestDecodeObserver>();
}

}  // namespace normlab
