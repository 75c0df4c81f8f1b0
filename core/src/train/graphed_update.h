// run.cuda_graph (issue 43.4): the update of run_update recorded once per batch shape as a CUDA
// graph and replayed, so a small or deep model's step (thousands of kernels of a few µs each) costs
// one launch instead of thousands. What changes per update is in device tensors the graph reads:
// the batches (copied into the shape's static inputs), the token count, the learning rate and
// AdamW's step count. The gradient norm, clipping and whether to skip the step (a non-finite loss
// or norm, a blow-up) stay on the device; the host reads loss, nll, norm and the skip flag once,
// after the replay.
//
// An update goes the eager way (run() returns nullopt, having changed nothing) where a graph could
// not make it the same: an observer watches it (the analysis probes' updates), the scheme's live
// values() changed since the last update (BranchNorm's α while it rises: a host number the graph
// would keep), the shape's warm-up updates, a shape beyond the cache, and a step the graph skipped:
// run_update re-makes that one and reports the divergence with its probe.
#pragma once

#include <torch/types.h>

#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "update_step.h"

namespace normlab {

class FlatAdamW;
class RunObserver;
class TransformerModelImpl;

class GraphedUpdate {
 public:
  // Why a run with these settings cannot take graphs ("" when it can): the CPU, LibTorch 1.13, fp16
  // (its loss scale is host state), a data-parallel job, AdamW's parameters not one flat buffer or
  // sharded, activation checkpointing (its recomputation sets the generators' states), the fused
  // loss lever off.
  static std::string unavailable(const FlatAdamW& optimizer, const StepSettings& settings,
                                 const torch::Device& device,
                                 bool activation_checkpointing = false);

  // capture = false runs the same update body eagerly every time: the CPU's twin of a replay, which
  // the tests compare with run_update. max_tokens > 0 and pad_id ≥ 0: translation batches are
  // padded to bucket shapes (lengths to a multiple of 8, rows to what max_tokens allows there), so
  // a few graphs serve an epoch; the extra positions and rows carry no target, so the loss and
  // gradients are the batch's (with dropout, its masks are drawn over the bucket: others than an
  // eager update's). 0: each batch's own shape.
  GraphedUpdate(TransformerModelImpl& model, FlatAdamW& optimizer, bool capture,
                int64_t max_tokens = 0, int64_t pad_id = -1);
  ~GraphedUpdate();
  GraphedUpdate(const GraphedUpdate&) = delete;
  GraphedUpdate& operator=(const GraphedUpdate&) = delete;

  // Update u as run_update makes it, or nullopt: then make it with run_update, with
  // settings.scheme_updated = true (the scheme's on_update(u − 1) has been called).
  std::optional<UpdateResult> run(const std::vector<DeviceBatch>& batches,
                                  const StepSettings& settings, int64_t u, RunObserver& events);

  struct Counts {
    int64_t made = 0;    // updates made here (a shape's warm-ups, then its graph's replays)
    int64_t shapes = 0;  // static input shapes (buckets) made
    int64_t graphs = 0;  // shapes recorded
    int64_t eager = 0;   // updates left to run_update
  };
  const Counts& counts() const;
  // New notes for the log (each said once): a shape captured, the cache full, the scheme's values
  // changing.
  std::vector<std::string> take_notes();

  // Updates of a shape made eagerly before it is captured (cuBLAS, autograd and the caching
  // allocator set themselves up outside the capture); shapes with a graph at most.
  static constexpr int64_t kWarmups = 2;
  static constexpr size_t kMaxGraphs = 16;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

}  // namespace normlab
