// What a training run publishes: the trainer calls these events on every observer a caller
// registers (TrainControl::observers) and knows nothing else of them. The analysis probes are one
// observer (normlab/analysis/run_probes.h); the train and sweep commands register them. An
// observer reads the run, never changes it: the same seed gives the same results with or without.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

namespace normlab {

class TransformerModelImpl;
struct ExperimentSpec;
struct TrainOutcome;

// A few examples as the model's input, on the run's device.
struct ExampleBatch {
  torch::Tensor src;  // undefined for a language model
  torch::Tensor tgt_in;
  int64_t pad_id = 0;
};

// The run, once its model is built.
struct RunStart {
  const ExperimentSpec& spec;
  TransformerModelImpl&
      model;  // at its initialization θ_0 (a resumed run: checkpoint not loaded yet)
  std::filesystem::path dir;  // the run directory
  // The first n validation examples (at most all of them) as one batch.
  std::function<ExampleBatch(int64_t n)> first_valid_examples;
};

// Events of one run, in the order they happen. u is the update being made (1-based); after it
// u updates are done.
class RunObserver {
 public:
  virtual ~RunObserver() = default;
  // The model is built and initialized, after the scheme's setup pass, before a resumed run
  // loads its checkpoint.
  virtual void on_model_ready(const RunStart&) {}
  // Training starts (updates_done = 0) or continues after a resumed run's checkpoint.
  virtual void on_run_start(int64_t /*updates_done*/) {}
  // Whether this observer does anything at update u's before_forward … after_step. An update no
  // observer watches may be replayed from a CUDA graph (run.cuda_graph), which calls none of them.
  virtual bool watches_update(int64_t /*u*/) const { return true; }
  // Just before the forward pass of the update's last batch.
  virtual void before_forward(int64_t /*u*/) {}
  // The update's gradients are complete (fp16: unscaled), before clipping.
  virtual void after_backward(int64_t /*u*/) {}
  // The optimizer step will happen (not after an fp16 overflow or a divergence), with the global
  // gradient norm before clipping.
  virtual void before_step(int64_t /*u*/, double /*grad_norm*/) {}
  virtual void after_step(int64_t /*u*/) {}
  // A point of a training curve: train/loss, train/nll, train/gnorm, train/lr (each log
  // interval), valid/nll, valid/bleu (each validation), test/nll, test/bleu (at the end).
  virtual void on_scalar(const std::string& /*tag*/, int64_t /*update*/, double /*value*/) {}
  // The run ended with an outcome (completed, stopped early, diverged, interrupted); not after a
  // failure (an exception leaves the trainer instead).
  virtual void on_run_end(const TrainOutcome&) {}
};

// Passes every event to each of a list of observers, in the list's order.
class RunObservers final : public RunObserver {
 public:
  explicit RunObservers(std::vector<RunObserver*> list) : list_(std::move(list)) {}
  void on_model_ready(const RunStart& s) override {
    each([&](RunObserver& o) { o.on_model_ready(s); });
  }
  void on_run_start(int64_t done) override {
    each([&](RunObserver& o) { o.on_run_start(done); });
  }
  bool watches_update(int64_t u) const override {
    for (const RunObserver* o : list_)
      if (o && o->watches_update(u)) return true;
    return false;
  }
  void before_forward(int64_t u) override {
    each([&](RunObserver& o) { o.before_forward(u); });
  }
  void after_backward(int64_t u) override {
    each([&](RunObserver& o) { o.after_backward(u); });
  }
  void before_step(int64_t u, double g) override {
    each([&](RunObserver& o) { o.before_step(u, g); });
  }
  void after_step(int64_t u) override {
    each([&](RunObserver& o) { o.after_step(u); });
  }
  void on_scalar(const std::string& tag, int64_t u, double v) override {
    each([&](RunObserver& o) { o.on_scalar(tag, u, v); });
  }
  void on_run_end(const TrainOutcome& r) override {
    each([&](RunObserver& o) { o.on_run_end(r); });
  }

 private:
  template <class F>
  void each(const F& f) {
    for (RunObserver* o : list_)
      if (o) f(*o);
  }
  std::vector<RunObserver*> list_;
};

}  // namespace normlab
