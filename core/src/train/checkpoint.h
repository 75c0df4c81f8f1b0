// Checkpoints: model, optimizer, RNG, data position, update counter and scheme state in one
// LibTorch archive; RunDirectory writes the bytes atomically and records their checksum.
#pragma once

#include <torch/torch.h>

#include <filesystem>
#include <limits>
#include <string>

#include "normlab/model/transformer_model.h"
#include "util/atomic_file.h"

namespace normlab {

struct TrainingState {
  int64_t updates = 0;      // completed optimizer updates
  int64_t epoch = 0;        // data position: epoch and batch index inside it
  int64_t batch_index = 0;
  double best_valid_nll = std::numeric_limits<double>::infinity();
  double best_valid_bleu = -1;  // -1: none yet
  double elapsed_s = 0;     // training wall time before this process
};

// Streams the archive into `file` (errors surface in file.finish(), never inside LibTorch).
void write_checkpoint(util::AtomicFile& file, TransformerModelImpl& model, torch::optim::Optimizer& optimizer,
                      const TrainingState& state);
// Restores everything saved by save_checkpoint; throws with the path on a bad file.
TrainingState load_checkpoint(const std::filesystem::path& path, TransformerModelImpl& model,
                              torch::optim::Optimizer& optimizer, const torch::Device& device);

// The model's weights and scheme state of a checkpoint, nothing else (no optimizer, the RNG is
// left alone): for evaluation. Throws std::runtime_error naming the path on a bad file.
void load_model_weights(const std::filesystem::path& path, TransformerModelImpl& model, const torch::Device& device);

// The scheme's state alone (Admin's profile, kept in the run directory).
void save_scheme_state(const std::filesystem::path& path, const NamedTensors& state);
NamedTensors load_scheme_state(const std::filesystem::path& path);

}  // namespace normlab
