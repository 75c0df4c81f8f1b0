// One optimizer update's forward and backward passes: the batches it accumulates (optim.update_freq),
// under autocast (run.dtype), with the fp16 loss scale. Shared by the trainer and its tests.
#pragma once

#include <torch/types.h>

#include <functional>
#include <string>
#include <vector>

#include "normlab/data/dataset.h"
#include "normlab/model/transformer_model.h"

namespace normlab {

struct DeviceBatch {
  torch::Tensor src, tgt_in, tgt_out;
  int64_t tokens = 0;
};

DeviceBatch to_device(const data::Batch& b, const torch::Device& dev);

// Logits of a batch in the model's (fp32) precision.
torch::Tensor forward(TransformerModelImpl& model, const DeviceBatch& b);

struct UpdateOptions {
  double label_smoothing = 0.0;
  int64_t pad_id = 0;
  std::string dtype = "fp32";  // run.dtype: fp32 | bf16 | fp16
  bool cuda = false;           // autocast on the CUDA device type (else the CPU's)
  double loss_scale = 1.0;     // fp16: the dynamic loss scale
};

// Sums over the batches of one update.
struct UpdateLoss {
  double loss = 0, nll = 0;  // summed token losses (label-smoothed, and −log p)
  int64_t tokens = 0;
};

// Zeroes nothing: adds to the parameters' gradients those of loss_scale·Σ token losses / Σ tokens
// over `batches` (fairseq's normalisation, so k batches of max_tokens/k give the update of one
// batch of max_tokens). One batch's graph is alive at a time. `before_last` runs just before the
// last batch's forward (the trainer attaches the gradient probes there).
UpdateLoss accumulate_gradients(TransformerModelImpl& model, const std::vector<DeviceBatch>& batches,
                                const UpdateOptions& options, const std::function<void()>& before_last = {});

}  // namespace normlab
