// One optimizer update: its forward and backward passes over the batches it accumulates
// (optim.update_freq), under autocast (run.dtype), with the fp16 loss scale; the learning rate,
// clipping, and the step, an fp16 overflow or divergence. Shared by the trainer and its tests.
#pragma once

#include <torch/types.h>

#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "normlab/data/dataset.h"
#include "normlab/model/transformer_model.h"
#include "run/label_smoothing.h"

namespace normlab {

class DynamicLossScaler;
class FlatAdamW;
class ProcessGroup;
class RunObserver;
struct OptimSection;

struct DeviceBatch {
  torch::Tensor src, tgt_in, tgt_out;
  int64_t tokens = 0;
  bool unpadded = false;  // tgt_in holds no pad: the decoder's self-attention is causal alone
};

// pad_id ≥ 0: `unpadded` is found from the host's tokens (no device synchronisation).
DeviceBatch to_device(const data::Batch& b, const torch::Device& dev, int64_t pad_id = -1);

// Logits of a batch in the model's (fp32) precision.
torch::Tensor forward(TransformerModelImpl& model, const DeviceBatch& b);

// The label-smoothed loss of a batch in fp32 (plus z_loss·Σlog²Z: training only); on the CPU the
// output projection is fused into the loss (projected_label_smoothed_loss), elsewhere it is the
// logits' loss. With model.final_logit_softcap, the loss of the capped logits: the GPU's blocked
// loss caps them, the CPU takes the whole logits' loss (its projected kernel does not cap).
LossSums fp32_batch_loss(TransformerModelImpl& model, const DeviceBatch& b, double label_smoothing,
                         int64_t pad_id, double z_loss = 0.0);

struct UpdateOptions {
  double label_smoothing = 0.0;
  double z_loss = 0.0;  // optim.z_loss
  int64_t pad_id = 0;
  std::string dtype = "fp32";  // run.dtype: fp32 | bf16 | fp16
  bool cuda = false;           // autocast on the CUDA device type (else the CPU's)
  double loss_scale = 1.0;     // fp16: the dynamic loss scale
  int64_t total_tokens =
      0;  // the update's target tokens over all ranks (0: those of the batches given)
};

// The loss sums of one batch as an update takes them: under autocast to options.dtype (the GPU's
// blocked loss, else the whole logits' loss in fp32), or fp32_batch_loss. Not scaled, no backward.
LossSums batch_loss(TransformerModelImpl& model, const DeviceBatch& b,
                    const UpdateOptions& options);

// Sums over the batches of one update.
struct UpdateLoss {
  double loss = 0, nll = 0;  // summed token losses (label-smoothed, and −log p)
  double z = 0;              // summed z-loss terms c·log²Z (in `loss`)
  int64_t tokens = 0;
};

// Zeroes nothing: adds to the parameters' gradients those of loss_scale·Σ token losses / Σ tokens
// over `batches` (fairseq's normalisation, so k batches of max_tokens/k give the update of one
// batch of max_tokens). One batch's graph is alive at a time. `before_last` runs just before the
// last batch's forward (the trainer attaches the gradient probes there).
UpdateLoss accumulate_gradients(TransformerModelImpl& model,
                                const std::vector<DeviceBatch>& batches,
                                const UpdateOptions& options,
                                const std::function<void()>& before_last = {});

// fairseq's inverse_sqrt: linear warm-up to lr, then lr·√(warmup/u) (or constant, cosine, wsd).
// Update u is 1-based, so the first update has lr/warmup (fairseq's first has 0). wsd_hagele2024
// is Hägele et al.'s own scheduler instead, warm-up included (docs/manifests.md).
double learning_rate(const OptimSection& o, int64_t u);

struct StepSettings {
  UpdateOptions forward;  // its loss_scale is the scaler's (fp16) or 1
  double lr = 0;
  double clip_norm = 0;  // ≤ 0: no clipping
  double divergence_nll =
      std::numeric_limits<double>::infinity();  // a training nll above it diverged
  // A data-parallel job: the gradients and loss sums are summed over its ranks before anything
  // reads them (forward.total_tokens then counts every rank's tokens), and each rank seeds its
  // dropout stream with `dropout_seed` first.
  ProcessGroup* group = nullptr;
  uint64_t dropout_seed = 0;
  // The scheme's on_update(u − 1) was called already (GraphedUpdate left the update to
  // run_update): not again.
  bool scheme_updated = false;
};

struct UpdateResult {
  enum class Kind { Stepped, Overflow, Diverged } kind = Kind::Stepped;
  double loss = 0, nll = 0;  // per target token
  double z_loss = 0;         // per target token: c·log²Z, a part of `loss` (optim.z_loss)
  double gnorm = 0;          // global gradient norm before clipping
  int64_t tokens = 0;
  double allreduce_s =
      0;              // a data-parallel job: wall time of the gradient all-reduce (after backward)
  std::string cause;  // Diverged: "non-finite loss", "loss blow-up, …"
  std::string first_nonfinite;  // Diverged: the first module whose output or gradient is not finite
};

// Update u (1-based): the scheme's on_update, the learning rate, the gradients (the observers'
// before_forward just before the last batch's forward, after_backward once they are complete and
// unscaled), the global norm and clipping; then one of
// - Stepped: before_step, the optimizer step, the scheme's after_step hook, after_step;
// - Overflow (fp16): nothing stepped, the loss scale halved;
// - Diverged: a non-finite loss or gradient norm (or an fp16 scale worn down to its floor), or a
//   training nll above divergence_nll; nothing stepped, the batches re-run with the same dropout
//   masks under a probe that names the first non-finite module.
UpdateResult run_update(TransformerModelImpl& model, FlatAdamW& optimizer,
                        DynamicLossScaler& scaler, const std::vector<DeviceBatch>& batches,
                        StepSettings settings, int64_t u, RunObserver& events);

}  // namespace normlab
