// Memory a training run needs, estimated before anything is allocated, and what the machine (or
// the GPU) has available. No LibTorch here.
#pragma once

#include <cstdint>
#include <string>

#include "normlab/model/config.h"

namespace normlab {

struct MemoryEstimate {
  int64_t parameters = 0;       // the model's, without a scheme's few extra scalars
  double state_bytes = 0;       // weights, gradients and Adam's two moments (fp32)
  double activation_bytes = 0;  // one batch of max_tokens, kept for the backward pass
  double runtime_bytes = 0;     // on the CPU: the loaded LibTorch runtime and per-layer bookkeeping
  // On the CPU: the copy of weights and moments a checkpoint is written from while training goes
  // on (train/checkpoint_writer.h); on a GPU it is host memory, outside this estimate.
  double checkpoint_bytes = 0;
  double total() const { return state_bytes + activation_bytes + runtime_bytes + checkpoint_bytes; }
};

// How the run trains: what changes the memory it needs besides the model and the batch.
struct TrainingMemoryOptions {
  bool activation_checkpointing =
      false;                     // only each layer's input kept, one layer recomputed at a time
  bool mixed_precision = false;  // run.dtype bf16/fp16: 2-byte activations, 2-byte weight copies
  int64_t max_len =
      0;  // the longest sequence of a batch (tokens): attention's heads x len x len; 0: not counted
  int64_t moment_shards = 1;  // run.shard_optimizer over N ranks: each keeps 1/N of Adam's moments
  bool on_cpu = true;         // the model lives in this process's memory, beside LibTorch itself
  double process_bytes = 0;   // this process's resident set before the model is built (0: unknown)
};

// Of MemoryEstimate::activation_bytes, what attention's score and probability tensors take.
double attention_activation_bytes(const ModelConfig& cfg, int64_t max_tokens,
                                  const TrainingMemoryOptions& options);

MemoryEstimate estimate_training_memory(const ModelConfig& cfg, int64_t max_tokens,
                                        const TrainingMemoryOptions& options = {});

// This process's resident set now (/proc/self/statm), or 0 where it cannot be read.
double resident_bytes();

// Bytes available to this process: MemAvailable, bounded by a cgroup memory limit; for a CUDA
// device the GPU's free memory. Negative when unknown.
double available_memory_bytes(const std::string& device);

// What a run's startup prints: "estimated X (weights, gradients and Adam state S, activations A,
// runtime R); Y available" (MiB below 1 GiB; "unknown" when available_bytes is negative).
std::string memory_summary(const ModelConfig& cfg, int64_t max_tokens, double available_bytes,
                           const TrainingMemoryOptions& options = {});

// The refusal, or "" when the estimate fits (or allow_oversize is set): one line naming the
// manifest, the estimate, what is available and the keys to change.
std::string oversize_problem(const std::string& manifest, const ModelConfig& cfg,
                             int64_t max_tokens, double available_bytes, const std::string& device,
                             const TrainingMemoryOptions& options = {});

}  // namespace normlab
