#include "run/optimizer.h"

#include <ATen/Parallel.h>
#ifdef NORMLAB_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif
#include <torch/nn/utils/clip_grad.h>

#include <algorithm>
#include <cmath>
#include <unordered_set>

#include "model/cpu_isa.h"
#include "model/cuda/fused_ops.h"
#include "run/process_group.h"
#include "speed_levers.h"
#include "torch_compat.h"

namespace normlab {
namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

// One pass over n elements: decoupled weight decay, both moments, bias-corrected update. Without
// FMA contraction, so the vector body and the scalar tail round alike: an element's update does
// not depend on where a range starts (a ZeRO shard, a thread's chunk), and sharded runs are bitwise
// those without.
NORMLAB_ISA_KERNEL((optimize("fp-contract=off")), void, adamw_pass,
                   (float* p, const float* g, float* m, float* v, int64_t n, float decay,
                    float beta1, float beta2, float step_size, float inv_sqrt_bc2, float eps),
                   (p, g, m, v, n, decay, beta1, beta2, step_size, inv_sqrt_bc2, eps)) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

torch::Tensor view_of(const torch::Tensor& flat, int64_t offset, int64_t numel,
                      at::IntArrayRef sizes) {
  return flat.narrow(0, offset, numel).view(sizes).detach();
}

// Group 0: the decayed parameters (all of them when `decays` is empty); group 1: the others,
// with weight_decay 0.
std::vector<torch::optim::OptimizerParamGroup> param_groups_of(
    const std::vector<torch::Tensor>& params, const AdamWOptions& options,
    const std::vector<bool>& decays) {
  std::vector<torch::Tensor> decayed, kept;
  for (size_t i = 0; i < params.size(); ++i)
    (decays.empty() || decays[i] ? decayed : kept).push_back(params[i]);
  std::vector<torch::optim::OptimizerParamGroup> groups;
  if (!decayed.empty() || kept.empty())
    groups.emplace_back(decayed, std::make_unique<AdamWOptions>(options));
  if (!kept.empty()) {
    auto no_decay = std::make_unique<AdamWOptions>(options);
    no_decay->weight_decay(0);
    groups.emplace_back(kept, std::move(no_decay));
  }
  return groups;
}

}  // namespace

AdamWKernel device_adamw_kernel() {
  return NORMLAB_TORCH_2 && speed_levers().cuda_fused && speed_levers().cuda_adamw
             ? AdamWKernel::FusedAten
             : AdamWKernel::AtenOps;
}

void adamw_update(AdamWKernel kernel, torch::Tensor p, const torch::Tensor& g, torch::Tensor m,
                  torch::Tensor v, int64_t decayed, const AdamWHyper& h) {
  TORCH_CHECK(p.dim() == 1 && g.sizes() == p.sizes() && m.sizes() == p.sizes() &&
                  v.sizes() == p.sizes() && decayed >= 0 && decayed <= p.numel(),
              "adamw_update: four flat buffers of one size");
  torch::NoGradGuard no_grad;
  const int64_t n = p.numel();
  const double bc1 = 1 - std::pow(h.beta1, double(h.step)),
               bc2 = 1 - std::pow(h.beta2, double(h.step));
  const float decay = float(1 - h.lr * h.weight_decay), step_size = float(h.lr / bc1);
  const float inv_sqrt_bc2 = float(1 / std::sqrt(bc2)), eps = float(h.eps);
  const float beta1 = float(h.beta1), beta2 = float(h.beta2);
  switch (kernel) {
    case AdamWKernel::Loop: {
      TORCH_CHECK(p.device().is_cpu(), "adamw_update: the loop is for CPU tensors");
      float *pp = p.data_ptr<float>(), *pm = m.data_ptr<float>(), *pv = v.data_ptr<float>();
      const float* pg = g.data_ptr<float>();
      at::parallel_for(0, n, 1 << 14, [&](int64_t b, int64_t e) {
        // [b, e) split where the decayed parameters end
        for (int64_t from = b; from < e;) {
          const int64_t to = from < decayed ? std::min(e, decayed) : e;
          adamw_pass(pp + from, pg + from, pm + from, pv + from, to - from,
                     from < decayed ? decay : 1.0f, beta1, beta2, step_size, inv_sqrt_bc2, eps);
          from = to;
        }
      });
      return;
    }
    case AdamWKernel::AtenOps:
      if (decayed > 0) p.narrow(0, 0, decayed).mul_(decay);
      m.mul_(h.beta1).add_(g, 1 - h.beta1);
      v.mul_(h.beta2).addcmul_(g, g, 1 - h.beta2);
      p.addcdiv_(m, v.sqrt().mul_(inv_sqrt_bc2).add_(eps), -step_size);
      return;
    case AdamWKernel::FusedAten: {
#if NORMLAB_TORCH_2
      // The step count is read from a tensor on the parameters' device (not incremented).
      const torch::Tensor step = torch::full({}, double(h.step), p.options());
      auto part = [&](int64_t from, int64_t to, double weight_decay) {
        if (to <= from) return;
        at::_fused_adamw_({p.narrow(0, from, to - from)}, {g.narrow(0, from, to - from)},
                          {m.narrow(0, from, to - from)}, {v.narrow(0, from, to - from)}, {},
                          {step}, h.lr, h.beta1, h.beta2, weight_decay, h.eps,
                          /*amsgrad=*/false, /*maximize=*/false);
      };
      part(0, decayed, h.weight_decay);
      part(decayed, n, 0.0);
      return;
#else
      TORCH_CHECK(false, "adamw_update: at::_fused_adamw_ needs LibTorch 2.x");
#endif
    }
  }
}

FlatAdamW::FlatAdamW(const std::vector<torch::Tensor>& params, const AdamWOptions& options,
                     const std::vector<bool>& decays)
    : torch::optim::AdamW(param_groups_of(params, options, decays), options),
      all_params_(params),
      decays_(decays.empty() ? std::vector<bool>(params.size(), true) : decays),
      weight_decay_(options.weight_decay()) {
  TORCH_CHECK(decays_.size() == params.size(), "FlatAdamW: one decay flag per parameter");
  if (params.empty() || options.amsgrad() || !speed_levers().flat_adamw) return;
  const auto opts = params[0].options();
  std::unordered_set<const void*> seen;
  for (const auto& p : params)
    if (p.device() != opts.device() || p.scalar_type() != at::kFloat ||
        !seen.insert(p.unsafeGetTensorImpl()).second)
      return;
  // The decayed parameters first (weight decay is one range), then the others; in each, matrices
  // first, then vectors, each in registration order: q/k/v weights (and their biases) end up back
  // to back, and attention uses them as one packed projection without a copy.
  slots_.resize(params.size());
  int64_t total = 0;
  for (bool decayed : {true, false}) {
    for (bool matrices : {true, false})
      for (size_t i = 0; i < params.size(); ++i)
        if ((params[i].dim() >= 2) == matrices && decays_[i] == decayed) {
          slots_[i] = {total, params[i].numel()};
          total += params[i].numel();
        }
    if (decayed) decay_end_ = total;
  }
  torch::NoGradGuard no_grad;
  params_ = torch::empty({total}, opts);
  grads_ = torch::zeros({total}, opts);
  exp_avg_ = torch::zeros({total}, opts);
  exp_avg_sq_ = torch::zeros({total}, opts);
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor p = params[i];
    params_.narrow(0, slots_[i].offset, slots_[i].numel).copy_(p.reshape({-1}));
    p.set_data(view_of(params_, slots_[i].offset, slots_[i].numel, p.sizes()));
  }
  flat_ = true;
  repack();
#ifdef NORMLAB_WITH_CUDA
  // The parameters' own blocks are free now but stay reserved by CUDA's caching allocator, a second
  // copy of the weights (about the 15 GiB by which deepnet-1000L's peak on an H200 exceeded the
  // estimate, docs/gpus-and-clusters.md): hand them back.
  if (opts.device().is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

void FlatAdamW::repack() {
  torch::NoGradGuard no_grad;
  const auto& params = all_params_;
  for (size_t i = 0; i < params.size(); ++i) {
    torch::Tensor p = params[i];
    const Slot s = slots_[i];
    float* want = params_.data_ptr<float>() + s.offset;
    if (p.data_ptr<float>() != want) {  // e.g. moved to another device: copy back in
      params_.narrow(0, s.offset, s.numel).copy_(p.reshape({-1}));
      p.set_data(view_of(params_, s.offset, s.numel, p.sizes()));
    }
    torch::Tensor& g = p.mutable_grad();
    if (!g.defined() || g.data_ptr<float>() != grads_.data_ptr<float>() + s.offset) {
      if (g.defined())
        grads_.narrow(0, s.offset, s.numel).copy_(g.reshape({-1}));
      else
        grads_.narrow(0, s.offset, s.numel).zero_();
      g = view_of(grads_, s.offset, s.numel, p.sizes());
    }
    // The moments only move when a checkpoint is loaded (or on the first call): checking them
    // costs a string key and two views per parameter, three times per update on 1.13.
    if (moments_packed_ || group_) continue;
    auto key = compat::optimizer_state_key(p);
    auto it = state().find(key);
    if (it == state().end()) {
      auto st = std::make_unique<AdamWParamState>();
      st->step(step_);
      st->exp_avg(view_of(exp_avg_, s.offset, s.numel, p.sizes()));
      st->exp_avg_sq(view_of(exp_avg_sq_, s.offset, s.numel, p.sizes()));
      state()[key] = std::move(st);
      continue;
    }
    auto& st = static_cast<AdamWParamState&>(*it->second);
    step_ = st.step();  // loaded from a checkpoint: every parameter has the same count
    auto copy_in = [&](torch::Tensor& flat, const torch::Tensor& t) {
      if (t.data_ptr<float>() != flat.data_ptr<float>() + s.offset)
        flat.narrow(0, s.offset, s.numel).copy_(t.reshape({-1}));
    };
    copy_in(exp_avg_, st.exp_avg());
    copy_in(exp_avg_sq_, st.exp_avg_sq());
    st.exp_avg(view_of(exp_avg_, s.offset, s.numel, p.sizes()));
    st.exp_avg_sq(view_of(exp_avg_sq_, s.offset, s.numel, p.sizes()));
  }
  if (group_ && !moments_packed_) unpack_loaded_moments();
  moments_packed_ = true;
}

void FlatAdamW::shard(ProcessGroup& group) {
  if (!flat_)
    throw std::invalid_argument(
        "run.shard_optimizer needs AdamW's flat buffer (one device and dtype, one group)");
  const int64_t total = params_.numel(), world = group.world();
  shard_size_ = (total + world - 1) / world;
  shard_lo_ = std::min(total, shard_size_ * group.rank());
  shard_hi_ = std::min(total, shard_lo_ + shard_size_);
  group_ = &group;
  torch::NoGradGuard no_grad;
  // The parameters in a buffer padded to world × shard, so the all-gather writes into them directly
  // (repack() points every parameter into it again).
  params_padded_ = torch::zeros({shard_size_ * world}, params_.options());
  params_padded_.narrow(0, 0, total).copy_(params_);
  params_ = params_padded_.narrow(0, 0, total);
  repack();
  // This rank's moments only (a loaded checkpoint's full ones are cut to the shard at the next
  // repack).
  exp_avg_ = torch::zeros({shard_size_}, params_.options());
  exp_avg_sq_ = torch::zeros({shard_size_}, params_.options());
  if (moments_packed_) state().clear();  // views into the full buffers just replaced
  moments_packed_ = state().empty();
}

void FlatAdamW::unpack_loaded_moments() {
  torch::NoGradGuard no_grad;
  const auto& params = all_params_;
  for (size_t i = 0; i < params.size(); ++i) {
    const auto it = state().find(compat::optimizer_state_key(params[i]));
    if (it == state().end()) continue;
    auto& st = static_cast<AdamWParamState&>(*it->second);
    step_ = st.step();
    const int64_t lo = std::max(slots_[i].offset, shard_lo_),
                  hi = std::min(slots_[i].offset + slots_[i].numel, shard_hi_);
    if (lo >= hi) continue;
    const int64_t from = lo - slots_[i].offset;
    exp_avg_.narrow(0, lo - shard_lo_, hi - lo)
        .copy_(st.exp_avg().reshape({-1}).narrow(0, from, hi - lo));
    exp_avg_sq_.narrow(0, lo - shard_lo_, hi - lo)
        .copy_(st.exp_avg_sq().reshape({-1}).narrow(0, from, hi - lo));
  }
  state().clear();  // the full moments are the checkpoint's: only this rank's shard stays
}

void FlatAdamW::gather_moments() {
  if (!group_) return;
  repack();
  torch::NoGradGuard no_grad;
  // Rank 0 alone holds the whole moments (it writes the checkpoint); the others only send theirs.
  const bool leader = group_->leader();
  if (leader) {
    gathered_avg_ = torch::empty({shard_size_ * group_->world()}, params_.options());
    gathered_avg_sq_ = torch::empty({shard_size_ * group_->world()}, params_.options());
  }
  group_->gather_to_leader(exp_avg_, leader ? &gathered_avg_ : nullptr);
  group_->gather_to_leader(exp_avg_sq_, leader ? &gathered_avg_sq_ : nullptr);
  const auto& params = all_params_;
  for (size_t i = 0; leader && step_ > 0 && i < params.size(); ++i) {  // no update yet: no moments
    auto st = std::make_unique<AdamWParamState>();
    st->step(step_);
    st->exp_avg(view_of(gathered_avg_, slots_[i].offset, slots_[i].numel, params[i].sizes()));
    st->exp_avg_sq(view_of(gathered_avg_sq_, slots_[i].offset, slots_[i].numel, params[i].sizes()));
    state()[compat::optimizer_state_key(params[i])] = std::move(st);
  }
}

void FlatAdamW::release_moments() {
  if (!group_) return;
  state().clear();
  gathered_avg_ = gathered_avg_sq_ = torch::Tensor();
}

void FlatAdamW::zero_grad() {
  if (!flat_) return torch::optim::AdamW::zero_grad();
  repack();
  grads_.zero_();
}

int64_t FlatAdamW::decayed_elements() const {
  int64_t n = 0;
  for (size_t i = 0; i < all_params_.size(); ++i) n += decays_[i] ? all_params_[i].numel() : 0;
  return weight_decay_ != 0 ? n : 0;
}

void FlatAdamW::set_lr(double lr) {
  for (auto& group : param_groups()) static_cast<AdamWOptions&>(group.options()).lr(lr);
}

std::vector<torch::Tensor> FlatAdamW::gradient_buffers() {
  if (flat_) {
    repack();
    return {grads_};
  }
  std::vector<torch::Tensor> out;
  for (auto& group : param_groups())
    for (auto& p : group.params()) {
      if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      out.push_back(p.grad());
    }
  return out;
}

double FlatAdamW::clip_grad_norm(double max_norm) {
  if (!flat_) {
    std::vector<torch::Tensor> params = param_groups()[0].params();
    for (size_t i = 1; i < param_groups().size(); ++i)
      for (const auto& p : param_groups()[i].params()) params.push_back(p);
    return torch::nn::utils::clip_grad_norm_(params, max_norm);
  }
  repack();
  torch::NoGradGuard no_grad;
  const double norm = grads_.norm().item<double>();
  const double coef = max_norm / (norm + 1e-6);
  if (coef < 1) grads_.mul_(coef);
  return norm;
}

torch::Tensor FlatAdamW::clip_grad_norm_on_device(double max_norm) {
  TORCH_CHECK(flat_ && !group_, "clip_grad_norm_on_device: a flat, unsharded AdamW");
  repack();
  torch::NoGradGuard no_grad;
  const torch::Tensor norm = grads_.norm();
  // clip_grad_norm's coefficient, max_norm / (norm + 1e-6) in double rounded to float, here
  // clamped to 1 instead of skipped: a product with 1 changes nothing.
  const torch::Tensor coef =
      (max_norm / (norm.to(torch::kDouble) + 1e-6)).clamp_max(1.0).to(torch::kFloat);
  grads_.mul_(coef);
  return norm;
}

void FlatAdamW::prepare_device_step() {
  TORCH_CHECK(flat_ && !group_, "prepare_device_step: a flat, unsharded AdamW");
  repack();  // a checkpoint's step count (a resumed run) is read here
  if (!device_step_.defined()) device_step_ = torch::zeros({}, params_.options());
  device_step_.fill_(double(step_ + 1));
}

void FlatAdamW::step_on_device(const torch::Tensor& lr, const torch::Tensor& skip) {
  TORCH_CHECK(flat_ && !group_, "step_on_device: a flat, unsharded AdamW");
  repack();
  torch::NoGradGuard no_grad;
  const auto& o = static_cast<const AdamWOptions&>(param_groups()[0].options());
  const int64_t n = params_.numel();
  if (params_.device().is_cpu()) {
    if (skip.item<float>() != 0) return;
    const AdamWHyper h{lr.item<double>(), std::get<0>(o.betas()), std::get<1>(o.betas()),
                       o.eps(),           weight_decay_,          step_ + 1};
    adamw_update(AdamWKernel::Loop, params_, grads_, exp_avg_, exp_avg_sq_, decay_end_, h);
    return;
  }
#if NORMLAB_TORCH_2
  TORCH_CHECK(device_step_.defined(), "step_on_device: prepare_device_step first");
  auto part = [&](int64_t from, int64_t to, double weight_decay) {
    if (to <= from) return;
    at::_fused_adamw_({params_.narrow(0, from, to - from)}, {grads_.narrow(0, from, to - from)},
                      {exp_avg_.narrow(0, from, to - from)},
                      {exp_avg_sq_.narrow(0, from, to - from)}, {}, {device_step_}, lr,
                      std::get<0>(o.betas()), std::get<1>(o.betas()), weight_decay, o.eps(),
                      /*amsgrad=*/false, /*maximize=*/false, /*grad_scale=*/std::nullopt,
                      /*found_inf=*/skip);
  };
  part(0, decay_end_, weight_decay_);
  part(decay_end_, n, 0.0);
#else
  (void)n;
  TORCH_CHECK(false, "step_on_device: at::_fused_adamw_ needs LibTorch 2.x");
#endif
}

void FlatAdamW::count_step() {
  ++step_;
  for (auto& kv : state()) static_cast<AdamWParamState&>(*kv.second).step(step_);
}

torch::Tensor FlatAdamW::step(LossClosure closure) {
  if (!flat_) {
    if (!all_params_.empty() && on_gpu_path(all_params_[0]))
      note_gpu_fallback(
          "AdamW: the parameters are not one flat buffer (several devices or dtypes, shared "
          "tensors, or amsgrad): torch::optim::AdamW per parameter");
    return torch::optim::AdamW::step(closure);
  }
  torch::Tensor loss;
  if (closure) {
    torch::AutoGradMode grad(true);
    loss = closure();
  }
  repack();
  torch::NoGradGuard no_grad;
  const auto& o = static_cast<const AdamWOptions&>(param_groups()[0].options());
  ++step_;
  for (auto& kv : state()) static_cast<AdamWParamState&>(*kv.second).step(step_);
  const AdamWHyper h{o.lr(),  std::get<0>(o.betas()), std::get<1>(o.betas()),
                     o.eps(), weight_decay_,          step_};
  // Sharded: this rank's range of the parameters, with its shard of the moments; then every rank's.
  const int64_t lo = group_ ? shard_lo_ : 0, n = group_ ? shard_hi_ - shard_lo_ : params_.numel();
  adamw_update(params_.device().is_cpu() ? AdamWKernel::Loop : device_adamw_kernel(),
               params_.narrow(0, lo, n), grads_.narrow(0, lo, n), exp_avg_.narrow(0, 0, n),
               exp_avg_sq_.narrow(0, 0, n), std::clamp<int64_t>(decay_end_ - lo, 0, n), h);
  if (group_)
    group_->all_gather_in_place(params_padded_, shard_size_);  // every rank's updated shard
  return loss;
}

}  // namespace normlab
