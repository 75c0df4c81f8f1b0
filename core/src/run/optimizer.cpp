#include "run/optimizer.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <unordered_set>

#include "speed_levers.h"
#include "torch_compat.h"

namespace normlab {
namespace {

using torch::optim::AdamWOptions;
using torch::optim::AdamWParamState;

// One pass over n elements: decoupled weight decay, both moments, bias-corrected update.
__attribute__((target_clones("avx512f", "avx2", "default"))) void adamw_pass(
    float* p, const float* g, float* m, float* v, int64_t n, float decay, float beta1, float beta2,
    float step_size, float inv_sqrt_bc2, float eps) {
  for (int64_t i = 0; i < n; ++i) {
    const float gi = g[i];
    const float mi = beta1 * m[i] + (1.0f - beta1) * gi;
    const float vi = beta2 * v[i] + (1.0f - beta2) * gi * gi;
    m[i] = mi;
    v[i] = vi;
    p[i] = p[i] * decay - step_size * mi / (std::sqrt(vi) * inv_sqrt_bc2 + eps);
  }
}

torch::Tensor view_of(const torch::Tensor& flat, int64_t offset, int64_t numel, at::IntArrayRef sizes) {
  return flat.narrow(0, offset, numel).view(sizes).detach();
}

}  // namespace

FlatAdamW::FlatAdamW(const std::vector<torch::Tensor>& params, const AdamWOptions& options)
    : torch::optim::AdamW(params, options) {
  if (params.empty() || options.amsgrad() || !speed_levers().flat_adamw) return;
  const auto opts = params[0].options();
  std::unordered_set<const void*> seen;
  for (const auto& p : params)
    if (p.device() != opts.device() || p.scalar_type() != at::kFloat || !seen.insert(p.unsafeGetTensorImpl()).second)
      return;
  // Matrices first, then vectors, each in registration order: q/k/v weights (and their biases)
  // end up back to back, and attention uses them as one packed projection without a copy.
  slots_.resize(params.size());
  int64_t total = 0;
  for (bool matrices : {true, false})
    for (size_t i = 0; i < params.size(); ++i)
      if ((params[i].dim() >= 2) == matrices) {
        slots_[i] = {total, params[i].numel()};
        total += params[i].numel();
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
}

void FlatAdamW::repack() {
  torch::NoGradGuard no_grad;
  const auto& params = param_groups()[0].params();
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
      if (g.defined()) grads_.narrow(0, s.offset, s.numel).copy_(g.reshape({-1}));
      else grads_.narrow(0, s.offset, s.numel).zero_();
      g = view_of(grads_, s.offset, s.numel, p.sizes());
    }
    // The moments only move when a checkpoint is loaded (or on the first call): checking them
    // costs a string key and two views per parameter, three times per update on 1.13.
    if (moments_packed_) continue;
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
  moments_packed_ = true;
}

void FlatAdamW::zero_grad() {
  if (!flat_) return torch::optim::AdamW::zero_grad();
  repack();
  grads_.zero_();
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

torch::Tensor FlatAdamW::step(LossClosure closure) {
  if (!flat_) return torch::optim::AdamW::step(closure);
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
  const double beta1 = std::get<0>(o.betas()), beta2 = std::get<1>(o.betas());
  const double bc1 = 1 - std::pow(beta1, double(step_)), bc2 = 1 - std::pow(beta2, double(step_));
  const float decay = float(1 - o.lr() * o.weight_decay()), step_size = float(o.lr() / bc1);
  const float inv_sqrt_bc2 = float(1 / std::sqrt(bc2)), eps = float(o.eps());
  if (!params_.device().is_cpu()) {  // the same arithmetic in a handful of ATen kernels
    params_.mul_(decay);
    exp_avg_.mul_(beta1).add_(grads_, 1 - beta1);
    exp_avg_sq_.mul_(beta2).addcmul_(grads_, grads_, 1 - beta2);
    params_.addcdiv_(exp_avg_, exp_avg_sq_.sqrt().mul_(inv_sqrt_bc2).add_(eps), -step_size);
    return loss;
  }
  float *p = params_.data_ptr<float>(), *m = exp_avg_.data_ptr<float>(), *v = exp_avg_sq_.data_ptr<float>();
  const float* g = grads_.data_ptr<float>();
  at::parallel_for(0, params_.numel(), 1 << 14, [&](int64_t b, int64_t e) {
    adamw_pass(p + b, g + b, m + b, v + b, e - b, decay, float(beta1), float(beta2), step_size, inv_sqrt_bc2, eps);
  });
  return loss;
}

}  // namespace normlab
