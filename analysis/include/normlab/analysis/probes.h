// The probe session: runs the registered probes an [analysis] section selects (probe.h; one file
// each in analysis/src/probes/: per-layer gradient norms, activation-gradient norms, model update
// ‖F(x,θ_t) − F(x,θ_0)‖, relative parameter update, FFN sparsity, LayerNorm input norms, layer
// similarity, the scheme's own state) at the points of a training update. Attached through the
// core's ActivationObserver, so they work for every scheme plugin. Metric definitions:
// docs/analysis.md. run_probes.h makes a session a run observer of the trainer.
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <filesystem>
#include <memory>
#include <string>
#include <vector>

namespace normlab {
class TransformerModelImpl;
struct AnalysisSection;
}  // namespace normlab

namespace normlab::analysis {

// Which probes run and when, from the manifest's [analysis] section.
struct ProbePlan {
  std::vector<std::string> probes;  // registered names (probe.h), sorted; "all": every one
  int64_t interval = 10, dense_until = 200, last_update = 0;
  std::vector<int64_t> cosine_at;  // layer_cosine's updates

  bool any() const { return !probes.empty(); }
  bool has(const std::string& name) const;
  // Probe at update u (u updates done; u ≥ 1)?
  bool due(int64_t u) const;
  bool cosine_due(int64_t u) const;
};
// Throws std::invalid_argument for a probe name nobody registered.
ProbePlan make_probe_plan(const AnalysisSection& a, int64_t max_updates);

// Layer indices of one stack of `num_layers` for "auto", "all" or "0,1,-1" (negative from the top;
// out-of-range indices are dropped, duplicates removed, sorted).
std::vector<int> select_layers(const std::string& spec, int num_layers);

// The fixed probe batch, on the model's device: tgt_in (and src for encoder-decoder; undefined for
// a language model).
struct ProbeBatch {
  torch::Tensor src, tgt_in;
  int64_t pad_id = 0;  // data::kPad
};

class ProbeSession {
 public:
  // Measures F(x, θ_0) on the probe batch, the reference of every ‖ΔF‖: construct it with the
  // model at its initialization (a resumed run: before its checkpoint is loaded; the same seed
  // gives the same θ_0). Then start().
  ProbeSession(const AnalysisSection& a, int64_t max_updates, TransformerModelImpl& model,
               ProbeBatch batch, const std::filesystem::path& run_dir);
  // Starts (or, with resume_update > 0, continues) the records in `run_dir`; a fresh run writes
  // the update-0 records.
  void start(int64_t resume_update);
  // Both at once, for a model that is at its initialization.
  ProbeSession(const AnalysisSection& a, int64_t max_updates, TransformerModelImpl& model,
               ProbeBatch batch, const std::filesystem::path& run_dir, int64_t resume_update);
  ~ProbeSession();
  ProbeSession(const ProbeSession&) = delete;
  ProbeSession& operator=(const ProbeSession&) = delete;

  bool enabled() const;
  // Whether any probe runs at update u (its plan's due(u)).
  bool watches(int64_t u) const;
  // Around training update u (1-based, the update being made), in this order:
  void before_forward(int64_t u);  // hooks for activation gradients
  void after_backward(int64_t u);  // parameter gradient norms (call before clipping)
  void record_total_grad_norm(int64_t u, double norm_before_clipping);
  void before_step(int64_t u);  // remembers θ for ‖Δθ‖/‖θ‖
  void after_step(int64_t u);   // Δθ, probe-batch metrics, scheme state; flushes the records
  // Training curves as TensorBoard scalars (when TensorBoard output is on).
  void scalar(const std::string& tag, int64_t step, double value);

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace normlab::analysis
