// Checkpoints: model, optimizer moments, RNG, data position, update counter and scheme state in
// one safetensors file (util/safetensors.h), the trainer's counters as JSON in its metadata. Data
// only: reading a checkpoint runs no code from it, and every tensor's name, dtype and shape is
// checked against the model before anything is copied. RunDirectory writes the bytes atomically
// and records their checksum.
#pragma once

#include <filesystem>
#include <limits>
#include <map>
#include <stdexcept>
#include <string>

#include "normlab/model/transformer_model.h"
#include "run/checksums.h"
#include "torch_api.h"
#include "util/atomic_file.h"
#include "util/safetensors.h"

namespace normlab {

class FlatAdamW;

// A checkpoint that cannot be used: unreadable, of another format or another model (one line
// naming the file and, for another model, the first differences).
class CheckpointFormatError : public CheckpointError {
 public:
  using CheckpointError::CheckpointError;
};

// File names inside a run's checkpoints/ folder.
inline constexpr const char* kCheckpointExt = ".safetensors";
inline std::string checkpoint_file_name(const std::string& stem) { return stem + kCheckpointExt; }

// The log interval in progress, as sums (not means): a run stopped in the middle of an interval
// and resumed logs the same record as one that was not (issue 42.8).
struct IntervalProgress {
  int64_t updates = 0, tokens = 0, clipped = 0, overflows = 0;
  double loss = 0, nll = 0, gnorm = 0, lr = 0, seconds = 0, allreduce_seconds = 0;
};

struct TrainingState {
  int64_t updates = 0;  // completed optimizer updates
  int64_t epoch = 0;    // data position: epoch and batch index inside it
  int64_t batch_index = 0;
  double best_valid_nll = std::numeric_limits<double>::infinity();
  double best_valid_bleu = -1;  // -1: none yet
  double elapsed_s = 0;         // training wall time before this process
  double loss_scale = -1;       // fp16's dynamic loss scale (-1: not an fp16 run)
  int64_t loss_scale_good_steps = 0;
  int64_t stale_validations = 0;  // validations since the best valid nll (eval.patience)
  // Target tokens of the updates done, every rank's (-1: a checkpoint older than this count).
  int64_t tokens = 0;
  // The data-parallel shape that wrote it: processes, and batches per update over all of them
  // (optim.update_freq × world_size). Checkpoints older than data-parallel training: 1 and 0.
  int64_t world_size = 1;
  int64_t global_batches = 0;
  IntervalProgress interval;  // absent in older checkpoints: an interval starting at the resume
  std::string data_identity;  // Dataset::identity of the run (JSON); empty: not recorded
  // The lr schedule the run trained with (lr_schedule_record, train/lr_schedule_change.h: JSON);
  // empty: not recorded (checkpoints before issue 66.2).
  std::string lr_schedule;
  // The training segment (process) that wrote it: env.json's `segment`, 16 hex digits; empty: not
  // recorded (checkpoints before it). Which segments a resume continues follows from it.
  std::string segment;
  // How the run cut its training data into batches ({max_tokens, seed, batches_per_epoch}) and the
  // validation examples it chose its best by ({examples, sha256}), JSON (training_session.cpp);
  // empty: not recorded (checkpoints before them). Only a resume reads them.
  std::string batching, validation;
};

// Bounds of a checkpoint's counters, far beyond any real run (a forged value is refused by name).
inline constexpr int64_t kMaxCheckpointUpdates = int64_t(1) << 40;
inline constexpr int64_t kMaxGlobalBatches = int64_t(1) << 20;  // batches per update, all ranks
inline constexpr int64_t kMaxWorldSize = int64_t(1) << 16;

// The counters of a checkpoint a run resumes from, against that run: updates ≤ max_updates, an
// epoch reachable in its updates, a batch index inside an epoch of `epoch_batches` batches.
// Throws CheckpointFormatError naming the field.
void check_resume_state(const std::filesystem::path& path, const TrainingState& st,
                        int64_t max_updates, int64_t epoch_batches);

// Throws CheckpointFormatError (naming each difference) when the checkpoint was saved from another
// model than `model` (shapes, family, norm, scheme and its parameters); reads the header only.
void check_checkpoint_model(const std::filesystem::path& path, const TransformerModelImpl& model);

// Whether two states are the same point of a run: every field but the wall time (a best and a
// last checkpoint of the same point are one file).
bool same_training_point(const TrainingState& a, const TrainingState& b);

// What a checkpoint holds, as tensors and metadata. A snapshot owns copies in host memory (pinned
// when the model is on a GPU), so training can go on while it is written (issue 43.2).
struct CheckpointContents {
  util::TensorList tensors;
  std::map<std::string, std::string> metadata;
};
// The checkpoint's tensors as views of the model and optimizer (no copy): written at once.
CheckpointContents checkpoint_contents(TransformerModelImpl& model, FlatAdamW& optimizer,
                                       const TrainingState& state);
// Copies the checkpoint into `snapshot`, reusing its buffers where names, dtypes and shapes match
// (a run's checkpoints do: no allocation after the first).
void take_checkpoint_snapshot(CheckpointContents& snapshot, TransformerModelImpl& model,
                              FlatAdamW& optimizer, const TrainingState& state);
// The host buffers a snapshot of this model's checkpoints will need: its tensors and both AdamW
// moments of each trainable parameter (the rest is small and made at the first snapshot).
struct SnapshotBufferSpec {
  std::string name;
  at::ScalarType dtype;
  std::vector<int64_t> sizes;
};
std::vector<SnapshotBufferSpec> snapshot_buffer_specs(TransformerModelImpl& model);
// Allocates them into `snapshot` and touches every page (pinned memory is touched by pinning), so
// the first snapshot only copies: a fresh buffer of a big model costs seconds of page faults, or
// of pinning on a GPU machine (issue 43.2). Reads no tensor: safe on the writer's thread while
// training goes on. The buffers are views into slabs of `slab_bytes` (a tensor larger than that
// has its own): PyTorch's pinned allocator rounds each allocation up to a power of two, so one
// per tensor pinned 19.5 GiB for the 15.2 GiB of a 1.36B llama (a 44 MiB FFN matrix took 64 MiB),
// in 657 pinning calls.
inline constexpr int64_t kSnapshotSlabBytes = int64_t(1) << 30;
void allocate_snapshot_buffers(CheckpointContents& snapshot,
                               const std::vector<SnapshotBufferSpec>& specs, bool pinned,
                               int64_t slab_bytes = kSnapshotSlabBytes);
// Streams `contents` into `file` as safetensors (errors surface in file.finish()).
void write_checkpoint(util::AtomicFile& file, const CheckpointContents& contents);
// Streams the checkpoint into `file` (errors surface in file.finish()).
void write_checkpoint(util::AtomicFile& file, TransformerModelImpl& model, FlatAdamW& optimizer,
                      const TrainingState& state);
// Restores everything write_checkpoint saved. Throws CheckpointFormatError naming the path.
TrainingState load_checkpoint(const std::filesystem::path& path, TransformerModelImpl& model,
                              FlatAdamW& optimizer, const torch::Device& device);

// The model's weights and scheme state of a checkpoint, nothing else (no optimizer, the RNG is
// left alone): for evaluation. Throws CheckpointFormatError naming the path.
// Tensors are copied onto the device the model is on.
void load_model_weights(const std::filesystem::path& path, TransformerModelImpl& model);

// Checks the file is a normlab checkpoint (not an archive, a valid header and training state)
// without a model: before the slow part of a command. Throws CheckpointFormatError.
void check_checkpoint_header(const std::filesystem::path& path);

// The update count a checkpoint holds, read from its header alone.
int64_t checkpoint_updates(const std::filesystem::path& path);
// The training state a checkpoint holds, read from its header alone.
TrainingState checkpoint_state(const std::filesystem::path& path);

// The scheme's state alone (Admin's profile, kept in the run directory as
// scheme_setup.safetensors).
void save_scheme_state(const std::filesystem::path& path, const NamedTensors& state);
NamedTensors load_scheme_state(const std::filesystem::path& path);

}  // namespace normlab
