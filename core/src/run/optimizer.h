// AdamW over one flat buffer: the parameters, their gradients and both moments are views into
// four contiguous tensors, so an update is one fused pass instead of ~10 kernels per parameter
// tensor (a 50L-50L model has ~2,000 of them), and the gradient norm is one reduction.
// It is a torch::optim::AdamW: param_groups, options and the checkpointed state (per-parameter
// step, exp_avg, exp_avg_sq) are the base class's.
#pragma once

#include <vector>

#include "torch_api.h"

namespace normlab {

class ProcessGroup;

// One AdamW update of flat buffers p, g, m, v (same device and size, fp32): p's first `decayed`
// elements are decayed by lr·weight_decay, the rest not. Every kernel computes the same update
// (PyTorch's AdamW: m ← β₁m + (1−β₁)g, v ← β₂v + (1−β₂)g², p ← p(1 − lr·λ) − lr/bc₁ · m/(√v/√bc₂ +
// ε)) and rounds differently:
//   Loop       normlab's vectorised CPU pass (CPU tensors only; the same bits for any thread count)
//   AtenOps    a handful of ATen kernels (the GPU reference)
//   FusedAten  LibTorch 2.x's at::_fused_adamw_, one multi-tensor kernel, no √v temporary (GPU)
enum class AdamWKernel { Loop, AtenOps, FusedAten };
struct AdamWHyper {
  double lr, beta1, beta2, eps, weight_decay;
  int64_t step;  // this update's, from 1
};
void adamw_update(AdamWKernel kernel, torch::Tensor p, const torch::Tensor& g, torch::Tensor m,
                  torch::Tensor v, int64_t decayed, const AdamWHyper& h);
// FusedAten where this LibTorch has it (2.x) and the lever is on, else AtenOps.
AdamWKernel device_adamw_kernel();

class FlatAdamW : public torch::optim::AdamW {
 public:
  // `decays[i]`: whether params[i] is decayed by options.weight_decay() (empty: every parameter).
  // The decayed ones form param group 0, the others group 1 with weight_decay 0 (issue 45.1).
  FlatAdamW(const std::vector<torch::Tensor>& params, const torch::optim::AdamWOptions& options,
            const std::vector<bool>& decays = {});

  torch::Tensor step(LossClosure closure = nullptr) override;
  // Zeroes the flat gradient buffer (gradients stay defined, as views into it).
  void zero_grad();
  // Total 2-norm of the gradients; scales them to max_norm when above it. Returns the norm.
  double clip_grad_norm(double max_norm);
  void set_lr(double lr);
  // What a CUDA graph can record (GraphedUpdate; flat and not sharded only), nothing waiting for
  // the device. The gradient norm as a device scalar, the gradients scaled to max_norm when above
  // it (the same coefficient, rounded the same, as clip_grad_norm):
  torch::Tensor clip_grad_norm_on_device(double max_norm);
  // fills the device's step count with this update's (before each replay, outside the graph);
  void prepare_device_step();
  // step() with the learning rate a device scalar (float on CUDA, where at::_fused_adamw_ reads it;
  // double on the CPU) and nothing done where `skip` (a float
  // device scalar) is not 0; the step counters do not move: count_step() afterwards, on the host,
  // once the step is known to be made. A CPU optimizer reads both scalars (the tests' twin).
  void step_on_device(const torch::Tensor& lr, const torch::Tensor& skip);
  void count_step();
  // The tensors that hold every gradient (the flat buffer, or each parameter's gradient when not
  // flat, zero-filled where undefined): a data-parallel job sums them over its ranks in place.
  std::vector<torch::Tensor> gradient_buffers();
  // Call after replacing state() (a checkpoint load): the moments are copied into the flat buffers
  // at the next call.
  void moments_replaced() { moments_packed_ = false; }
  // ZeRO stage 1 over the group's ranks: this rank keeps AdamW's moments for its 1/world shard of
  // the flat buffer only and updates that shard; each step ends with an all-gather of the
  // parameters. Call once, before the first step. Throws std::invalid_argument when not flat().
  void shard(ProcessGroup& group);
  bool sharded() const { return group_ != nullptr; }
  // Sharded: every rank's moments gathered into rank 0's state() (a collective: every rank calls
  // it), for a checkpoint; release_moments() frees them again. Not sharded: nothing to do.
  void gather_moments();
  void release_moments();
  // False when the parameters could not share one buffer (mixed devices or dtypes, shared
  // tensors): then every call does what torch::optim::AdamW does.
  bool flat() const { return flat_; }
  // The number of parameter elements weight decay reaches.
  int64_t decayed_elements() const;

 private:
  // Points every parameter, gradient and moment back into the flat buffers (after a checkpoint
  // load replaced the moments, or a gradient was reset to undefined).
  void repack();
  struct Slot {
    int64_t offset, numel;
  };
  bool flat_ = false;
  bool moments_packed_ = false;  // every parameter's state holds views into exp_avg_/exp_avg_sq_
  std::vector<Slot> slots_;
  std::vector<torch::Tensor> all_params_;  // the constructor's, in its order (slots_'s)
  std::vector<bool> decays_;               // of all_params_
  int64_t decay_end_ = 0;                  // flat: the decayed parameters are [0, decay_end_)
  double weight_decay_ = 0;
  torch::Tensor params_, grads_, exp_avg_,
      exp_avg_sq_;  // sharded: the moments of [shard_lo_, shard_hi_)
  int64_t step_ = 0;
  torch::Tensor device_step_;  // step_on_device's count (a float scalar, at::_fused_adamw_'s)
  ProcessGroup* group_ = nullptr;
  int64_t shard_size_ = 0, shard_lo_ = 0, shard_hi_ = 0;  // shard_size_ · world ≥ every element
  torch::Tensor gathered_avg_, gathered_avg_sq_;          // gather_moments()'s, until released
  torch::Tensor params_padded_;                           // sharded: params_ and its padding
  void unpack_loaded_moments();  // sharded: a checkpoint's moments (state()) into this rank's shard
};

}  // namespace normlab
