// Validation every eval.interval updates and at the end: loss and nll on the validation set, and
// for translation greedy-decoded BLEU (on the eval.bleu_max_sentences subset; the final one on
// every sentence too). Updates the best scores and publishes on_validation.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <chrono>
#include <cmath>

#include "normlab/eval/bleu.h"
#include "standard_observers.h"
#include "train/greedy_decoder.h"
#include "train/training_session.h"

namespace normlab {
namespace {

// Whether the validation at `update` decodes for BLEU: from eval.bleu_after_updates on, at every
// eval.bleu_every-th validation and at the final one. The loss is validated every time.
bool bleu_due(const EvalSection& e, int64_t update, bool final) {
  if (update < e.bleu_after_updates) return false;
  return final || e.interval <= 0 || (update / e.interval) % e.bleu_every == 0;
}

void decode_bleu(TrainingSession& s, bool final, Validation& v) {
  const auto& valid = s.ds.valid;
  const size_t all = valid.examples.size();
  size_t n = all;
  if (s.spec.eval.bleu_max_sentences > 0) n = std::min(n, size_t(s.spec.eval.bleu_max_sentences));
  // During training the fixed subset; at the end every sentence (the subset's BLEU is the first
  // n hypotheses of the same decoding, greedy decoding being per sentence).
  const size_t decoded = final ? all : n;
  std::vector<std::vector<int32_t>> sources;
  for (size_t i = 0; i < decoded; ++i) sources.push_back(valid.examples[i].src);
  const auto hyps = greedy_decode(*s.model, sources, s.device, s.spec.eval.max_len_a,
                                  s.spec.eval.max_len_b, s.spec.optim.max_tokens);
  std::vector<std::string> text;
  for (const auto& h : hyps) text.push_back(s.ds.tgt_tokenizer->decode(h));
  const std::vector<std::string> subset(text.begin(), text.begin() + long(n));
  v.bleu = eval::corpus_bleu(subset, {valid.references.begin(), valid.references.begin() + long(n)})
               .score;
  v.bleu_sentences = int64_t(n);
  if (decoded > n) v.bleu_full = eval::corpus_bleu(text, valid.references).score;
  s.run->write_file("valid_hypotheses.txt", fmt::format("{}\n", fmt::join(text, "\n")));
}

Validation validate(TrainingSession& s, bool final) {
  torch::NoGradGuard no_grad;
  s.model->eval();
  Validation v;
  v.final = final;
  double loss = 0, nll = 0;
  // A data-parallel job's ranks share the batches (every world-th) and sum what they found.
  const int world = s.world(), rank = s.group ? s.group->rank() : 0;
  for (size_t i = size_t(rank); i < s.valid_batches.size(); i += size_t(world)) {
    const DeviceBatch b = to_device(s.valid_plan->make(s.valid_batches[i]), s.device);
    const LossSums sums = fp32_batch_loss(*s.model, b, s.spec.optim.label_smoothing, s.ds.pad_id);
    loss += sums.loss.item<double>();
    nll += sums.nll.item<double>();
    v.tokens += b.tokens;
  }
  if (s.group) {
    const std::vector<double> all = s.group->sum({loss, nll, double(v.tokens)});
    loss = all[0], nll = all[1], v.tokens = int64_t(all[2]);
  }
  // Never a score from no data: nll 0 would be "best" (issue 56.1; the data loaders refuse such a
  // split at the start, this is the last guard).
  if (v.tokens == 0)
    throw std::runtime_error(
        "validation: the validation split has no token to score (no whole batch); give it more "
        "data");
  v.nll = nll / double(std::max<int64_t>(v.tokens, 1));
  v.loss = loss / double(std::max<int64_t>(v.tokens, 1));
  const bool translation = s.mcfg.arch == Arch::EncDec && !s.ds.valid.references.empty();
  // BLEU is rank 0's alone (it decodes while the others go on to the next update's collective).
  if (s.leader() && bleu_due(s.spec.eval, s.st.updates, final) && translation && s.spec.eval.bleu)
    decode_bleu(s, final, v);
  s.model->train();
  return v;
}

// The run's bookkeeping of a validation: best scores, patience count, progress and outcome.
void record(TrainingSession& s, Validation& v) {
  v.best = v.nll < s.st.best_valid_nll;
  if (v.best) s.st.best_valid_nll = v.nll;
  s.st.stale_validations = v.best ? 0 : s.st.stale_validations + 1;
  v.best_bleu = v.bleu >= 0 && v.bleu > s.st.best_valid_bleu;
  if (v.best_bleu) s.st.best_valid_bleu = v.bleu;
  s.progress.valid_loss = v.loss;
  s.progress.valid_nll = v.nll;
  s.progress.valid_bleu = v.bleu;
  s.outcome.last_valid_nll = v.nll;
  s.outcome.best_valid_nll = s.st.best_valid_nll;
  s.outcome.last_valid_bleu = v.bleu_full >= 0 ? v.bleu_full : v.bleu;
}

class ValidationObserver final : public TrainingObserver {
 public:
  void after_update(TrainingSession& s) override {
    const int64_t interval = s.spec.eval.interval;
    if (interval > 0 && s.st.updates % interval == 0)
      run(s, s.st.updates == s.spec.optim.max_updates);
  }
  void on_training_done(TrainingSession& s) override {
    if (s.validated_at == s.st.updates) return;
    // A run resumed at max_updates (killed in its end phase) keeps the validation it logged.
    if (s.resuming) {
      if (const auto logged =
              util::find_record(s.run->path() / "train.jsonl", "valid", s.st.updates)) {
        restore(s, *logged);
        return;
      }
    }
    s.enter_phase("final validation",
                  fmt::format("{} {}", s.ds.valid.examples.size(),
                              s.mcfg.arch == Arch::LM ? "blocks" : "sentences"));
    run(s, /*final=*/true);
  }

 private:
  static void run(TrainingSession& s, bool final) {
    const auto t0 = std::chrono::steady_clock::now();
    Validation v = validate(s, final);
    v.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    s.validated_at = s.st.updates;
    record(s, v);
    s.model->on_validate(s.st.updates, v.nll);
    s.events->on_scalar("valid/nll", s.st.updates, v.nll);
    if (v.bleu >= 0) s.events->on_scalar("valid/bleu", s.st.updates, v.bleu);
    s.publish([&](TrainingObserver& o) { o.on_validation(s, v); });
  }
  static void restore(TrainingSession& s, const nlohmann::json& r) {
    s.validated_at = s.st.updates;
    s.progress.valid_loss = r.value("loss", s.progress.valid_loss);
    s.progress.valid_nll = r.value("nll", s.progress.valid_nll);
    s.progress.valid_bleu = r.value("bleu", -1.0);
    if (r.value("best", false))
      s.st.best_valid_nll = std::min(s.st.best_valid_nll, s.progress.valid_nll);
    s.outcome.last_valid_nll = s.progress.valid_nll;
    s.outcome.best_valid_nll = s.st.best_valid_nll;
    s.outcome.last_valid_bleu = r.value("bleu_full", s.progress.valid_bleu);
  }
};

}  // namespace

std::unique_ptr<TrainingObserver> make_validation() {
  return std::make_unique<ValidationObserver>();
}

}  // namespace normlab
