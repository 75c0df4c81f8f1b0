#include "normlab/analysis/run_probes.h"

#include "normlab/analysis/probes.h"
#include "normlab/manifest/experiment.h"
#include "normlab/train/run_events.h"

namespace normlab::analysis {
namespace {

// A ProbeSession made when the model is ready (θ_0, the reference of ‖ΔF‖) and closed with the run.
class ProbeObserver final : public RunObserver {
 public:
  void on_model_ready(const RunStart& run) override {
    const AnalysisSection& a = run.spec.analysis;
    if (!make_probe_plan(a, run.spec.optim.max_updates).any()) return;
    // The fixed probe batch: the first validation examples.
    const ExampleBatch b = run.first_valid_examples(a.probe_sentences);
    session_ = std::make_unique<ProbeSession>(a, run.spec.optim.max_updates, run.model,
                                              ProbeBatch{b.src, b.tgt_in, b.pad_id}, run.dir);
  }
  void on_run_start(int64_t updates_done) override {
    if (session_) session_->start(updates_done);
  }
  bool watches_update(int64_t u) const override { return session_ && session_->watches(u); }
  void before_forward(int64_t u) override {
    if (session_) session_->before_forward(u);
  }
  void after_backward(int64_t u) override {
    if (session_) session_->after_backward(u);
  }
  void before_step(int64_t u, double grad_norm) override {
    if (!session_) return;
    session_->record_total_grad_norm(u, grad_norm);
    session_->before_step(u);
  }
  void after_step(int64_t u) override {
    if (session_) session_->after_step(u);
  }
  void on_scalar(const std::string& tag, int64_t update, double value) override {
    if (session_) session_->scalar(tag, update, value);
  }
  void on_run_end(const TrainOutcome&) override { session_.reset(); }  // closes the record files

 private:
  std::unique_ptr<ProbeSession> session_;
};

}  // namespace

std::unique_ptr<RunObserver> make_probe_observer() { return std::make_unique<ProbeObserver>(); }

}  // namespace normlab::analysis
