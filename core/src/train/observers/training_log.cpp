// train.jsonl: one record per log interval, validation, test score, fp16 overflow and divergence,
// continued after a resume (records after the checkpoint move to train.discarded.jsonl). The
// interval's training curves also go to the run observers (TensorBoard, analysis) from here.
#include <cmath>
#include <optional>

#include "standard_observers.h"
#include "train/spike_score.h"
#include "train/training_session.h"
#include "util/record_file.h"

namespace normlab {
namespace {

using json = nlohmann::json;

class TrainingLogObserver final : public TrainingObserver {
 public:
  void on_start(TrainingSession& s) override { log_.emplace(s.run->training_log(s.st.updates)); }
  void on_overflow(TrainingSession& s, int64_t u) override {
    log_->write({{"kind", "overflow"}, {"update", u}, {"loss_scale", s.loss_scaler.scale()}});
  }
  void on_diverged(TrainingSession&, const UpdateResult& r, int64_t u) override {
    log_->write({{"kind", "diverged"},
                 {"update", u},
                 {"loss", r.loss},
                 {"nll", r.nll},
                 {"gnorm", r.gnorm},
                 {"cause", r.cause},
                 {"first_nonfinite", r.first_nonfinite}});
  }
  void on_interval(TrainingSession& s, const TrainInterval& iv) override {
    const double n = double(iv.updates);
    json j = {{"kind", "train"},
              {"update", s.st.updates},
              {"epoch", s.epoch_now()},
              {"loss", iv.loss},
              {"nll", iv.nll},
              {"ppl", std::exp(iv.nll)},
              {"gnorm", iv.gnorm},
              {"clipped", double(iv.clipped) / n},
              {"lr", iv.lr},
              {"tokens", s.st.tokens},  // trained on so far (-1: resumed from an older checkpoint)
              {"tokens_per_s", double(iv.tokens) / iv.seconds},
              {"ms_per_update", 1e3 * iv.seconds / n},
              {"data_ms_per_update", 1e3 * iv.data_seconds / n},
              {"elapsed_s", s.elapsed()}};
    if (!iv.scheme_status.empty()) j["scheme"] = iv.scheme_status;
    // optim.z_loss: its term, a part of loss, never of nll/ppl.
    if (s.spec.optim.z_loss > 0) j["z_loss"] = iv.z_loss;
    // What overlapping the all-reduce with the backward pass could save at most.
    if (s.world() > 1) j["allreduce_ms_per_update"] = 1e3 * iv.allreduce_seconds / n;
    if (s.fp16) j["loss_scale"] = s.loss_scaler.scale(), j["overflows"] = iv.overflows;
    log_->write(j);
    s.events->on_scalar("train/loss", s.st.updates, iv.loss);
    s.events->on_scalar("train/nll", s.st.updates, iv.nll);
    s.events->on_scalar("train/gnorm", s.st.updates, iv.gnorm);
    s.events->on_scalar("train/lr", s.st.updates, iv.lr);
  }
  void on_validation(TrainingSession& s, const Validation& v) override {
    json j = {{"kind", "valid"},     {"update", s.st.updates}, {"epoch", s.epoch_now()},
              {"loss", v.loss},      {"nll", v.nll},           {"ppl", std::exp(v.nll)},
              {"tokens", v.tokens},  {"best", v.best},         {"elapsed_s", s.elapsed()},
              {"seconds", v.seconds}};
    if (v.bleu >= 0) j["bleu"] = v.bleu, j["bleu_sentences"] = v.bleu_sentences;
    if (v.bleu_full >= 0) j["bleu_full"] = v.bleu_full;
    log_->write(j);
  }
  void on_test(TrainingSession&, const TestScore& t) override { log_->write(t.record); }
  // The run's summary: OLMo 2's spike scores of its loss and gradient norm, from train.jsonl as
  // written (the updates before a resume too). Once per final update: a resumed end phase does not
  // repeat it.
  void on_end(TrainingSession& s, const TrainOutcome& o) override {
    if (o.status != "completed" && o.status != "stopped_early" && o.status != "diverged") return;
    const std::filesystem::path path = s.run->path() / "train.jsonl";
    if (util::find_record(path, "summary", s.st.updates)) return;
    const RunSpikeScores r = run_spike_scores(path);
    auto percent = [](const SpikeScore& x) { return x.scored > 0 ? json(x.percent) : json(); };
    log_->write({{"kind", "summary"},
                 {"update", s.st.updates},
                 {"loss_spike_score", percent(r.loss)},
                 {"loss_spikes", r.loss.spikes},
                 {"loss_spike_scored", r.loss.scored},
                 {"gnorm_spike_score", percent(r.gnorm)},
                 {"gnorm_spikes", r.gnorm.spikes},
                 {"gnorm_spike_scored", r.gnorm.scored}});
  }
  void on_tasks(TrainingSession& s, const TaskScores& t) override {
    for (const json& r : t.records) {
      log_->write(r);
      const std::string name = r.value("task", "");
      s.events->on_scalar("tasks/" + name + "/acc", s.st.updates, r.value("acc", 0.0));
      s.events->on_scalar("tasks/" + name + "/bits_per_byte", s.st.updates,
                          r.value("bits_per_byte", 0.0));
    }
    s.events->on_scalar("tasks/average_acc", s.st.updates, t.average_acc);
  }

 private:
  std::optional<util::JsonlLog> log_;
};

}  // namespace

std::unique_ptr<TrainingObserver> make_training_log() {
  return std::make_unique<TrainingLogObserver>();
}

}  // namespace normlab
