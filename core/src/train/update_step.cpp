#include "update_step.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>

#include "loss_scaler.h"
#include "nonfinite_probe.h"
#include "normlab/manifest/experiment.h"
#include "normlab/train/run_events.h"
#include "run/label_smoothing.h"
#include "run/optimizer.h"
#include "run/process_group.h"
#include "torch_compat.h"

namespace normlab {

DeviceBatch to_device(const data::Batch& b, const torch::Device& dev, int64_t pad_id) {
  DeviceBatch d;
  auto make = [&](const std::vector<int64_t>& v, int64_t len) {
    if (!dev.is_cuda()) return torch::tensor(v, torch::kLong).view({b.size, len});
    // Through pinned host memory, copied without waiting: the copy overlaps the step before it.
    torch::Tensor host =
        torch::empty({b.size, len}, torch::TensorOptions(torch::kLong).pinned_memory(true));
    std::memcpy(host.data_ptr<int64_t>(), v.data(), v.size() * sizeof(int64_t));
    return host.to(torch::TensorOptions().device(dev), /*non_blocking=*/true);
  };
  if (!b.src.empty()) d.src = make(b.src, b.src_len);
  d.tgt_in = make(b.tgt_in, b.tgt_len);
  d.tgt_out = make(b.tgt_out, b.tgt_len);
  d.tokens = b.target_tokens;
  d.unpadded = pad_id >= 0 && std::find(b.tgt_in.begin(), b.tgt_in.end(), pad_id) == b.tgt_in.end();
  return d;
}

torch::Tensor forward(TransformerModelImpl& model, const DeviceBatch& b) {
  return b.src.defined() ? model.forward(b.src, b.tgt_in, b.unpadded)
                         : model.forward_lm(b.tgt_in, b.unpadded);
}

LossSums fp32_batch_loss(TransformerModelImpl& model, const DeviceBatch& b, double label_smoothing,
                         int64_t pad_id) {
  const torch::Tensor hidden = model.final_hidden(b.src, b.tgt_in, b.unpadded);
  const torch::Tensor w = model.output_projection();
  if (projected_loss_applies(hidden, w))
    return projected_label_smoothed_loss(hidden, w, b.tgt_out, label_smoothing, pad_id);
  if (blocked_loss_applies(w, torch::kFloat))
    return blocked_projected_loss(hidden, w, b.tgt_out, label_smoothing, pad_id, torch::kFloat);
  return label_smoothed_loss(torch::linear(hidden, w), b.tgt_out, label_smoothing, pad_id);
}

namespace {

// Under autocast: the GPU's blocked loss of the final states (the products in `dtype`, as
// autocast's linear), else the loss of the whole logits in fp32.
LossSums autocast_batch_loss(TransformerModelImpl& model, const DeviceBatch& b,
                             const compat::AutocastState& autocast, at::ScalarType dtype,
                             double label_smoothing, int64_t pad_id) {
  torch::Tensor logits, hidden, w;
  {
    compat::AutocastGuard guard(autocast);
    if (blocked_loss_applies(model.output_weight(), dtype)) {
      hidden = model.final_hidden(b.src, b.tgt_in, b.unpadded);
      w = model.output_projection();
    } else {
      logits = forward(model, b);
    }
  }
  if (hidden.defined())
    return blocked_projected_loss(hidden, w, b.tgt_out, label_smoothing, pad_id, dtype);
  // The loss in fp32 whatever the forward's precision (log-softmax over the vocabulary).
  return label_smoothed_loss(logits.to(torch::kFloat), b.tgt_out, label_smoothing, pad_id);
}

}  // namespace

LossSums batch_loss(TransformerModelImpl& model, const DeviceBatch& b, const UpdateOptions& o) {
  if (o.dtype == "fp32") return fp32_batch_loss(model, b, o.label_smoothing, o.pad_id);
  const at::ScalarType dtype = o.dtype == "fp16" ? at::kHalf : at::kBFloat16;
  return autocast_batch_loss(model, b, compat::autocast_to(o.cuda, dtype), dtype, o.label_smoothing,
                             o.pad_id);
}

UpdateLoss accumulate_gradients(TransformerModelImpl& model,
                                const std::vector<DeviceBatch>& batches, const UpdateOptions& o,
                                const std::function<void()>& before_last) {
  UpdateLoss sums;
  for (const auto& b : batches) sums.tokens += b.tokens;
  if (o.total_tokens > 0) sums.tokens = o.total_tokens;
  // Each batch's loss is divided by the tokens of the whole update before its backward, so the
  // gradients add up to those of one big batch (and one batch is exactly the old k = 1 path).
  const double ntok = double(std::max<int64_t>(sums.tokens, 1));
  torch::Tensor loss_sum, nll_sum;
  for (size_t i = 0; i < batches.size(); ++i) {
    if (i + 1 == batches.size() && before_last) before_last();
    const LossSums s = batch_loss(model, batches[i], o);
    ((s.loss * o.loss_scale) / ntok).backward();
    loss_sum = loss_sum.defined() ? loss_sum + s.loss.detach() : s.loss.detach();
    nll_sum = nll_sum.defined() ? nll_sum + s.nll.detach() : s.nll.detach();
  }
  if (loss_sum.defined()) {
    sums.loss = loss_sum.item<double>();
    sums.nll = nll_sum.item<double>();
  }
  return sums;
}

double learning_rate(const OptimSection& o, int64_t u) {
  const double w = double(o.warmup_updates);
  if (w > 0 && double(u) <= w) return o.lr * double(u) / w;
  if (o.lr_schedule == "constant") return o.lr;
  if (o.lr_schedule ==
      "cosine") {  // Loshchilov & Hutter 2017 (SGDR) without restarts, as LLaMA's recipe
    const double span = std::max(double(o.max_updates) - w, 1.0);
    const double progress = std::min(std::max(double(u) - w, 0.0) / span, 1.0);
    const double floor = o.lr * o.min_lr_ratio;
    return floor + 0.5 * (o.lr - floor) * (1.0 + std::cos(M_PI * progress));
  }
  if (o.lr_schedule == "wsd") {  // Hägele et al. 2024 (arXiv:2405.18392), Sec. 3: the cooldown
    const double floor = o.lr * o.min_lr_ratio;
    const double decay = double(o.decay_updates > 0 ? o.decay_updates : o.max_updates / 5);
    const double start = std::max(double(o.max_updates) - decay, w);
    if (double(u) <= start) return o.lr;
    const double p =
        std::min((double(u) - start) / std::max(double(o.max_updates) - start, 1.0), 1.0);
    const double fall = o.decay_shape == "linear" ? p : std::sqrt(p);  // 1-sqrt: lr·(1 − √p)
    return floor + (o.lr - floor) * (1.0 - fall);
  }
  return o.lr * std::sqrt(std::max(w, 1.0) / double(u));
}

UpdateResult run_update(TransformerModelImpl& model, FlatAdamW& optimizer,
                        DynamicLossScaler& scaler, const std::vector<DeviceBatch>& batches,
                        StepSettings settings, int64_t u, RunObserver& events) {
  const bool fp16 = settings.forward.dtype == "fp16";
  if (settings.group) torch::manual_seed(settings.dropout_seed);
  const torch::Tensor rng_before = compat::cpu_rng_state();
  const torch::Device device = model.output_weight().device();
  const torch::Tensor cuda_rng_before = compat::cuda_rng_state(device);
  if (!settings.scheme_updated) model.on_update(u - 1);
  for (auto& group : optimizer.param_groups())
    static_cast<torch::optim::AdamWOptions&>(group.options()).lr(settings.lr);
  optimizer.zero_grad();
  settings.forward.loss_scale = fp16 ? scaler.scale() : 1.0;
  UpdateLoss s =
      accumulate_gradients(model, batches, settings.forward, [&] { events.before_forward(u); });
  double allreduce_s = 0;
  if (settings.group) {  // the whole update's gradients and loss sums on every rank
    std::vector<torch::Tensor> grads = optimizer.gradient_buffers();
    const auto t0 = std::chrono::steady_clock::now();
    settings.group->sum(grads);
    allreduce_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    const std::vector<double> sums = settings.group->sum({s.loss, s.nll});
    s.loss = sums[0], s.nll = sums[1];
  }
  if (fp16) {
    torch::NoGradGuard no_grad;
    for (auto& p : model.parameters())
      if (p.grad().defined()) p.grad().mul_(1.0 / settings.forward.loss_scale);
  }
  model.after_backward();  // the scheme's hook, before the observers read the gradients
  events.after_backward(u);
  const double max_norm =
      settings.clip_norm > 0 ? settings.clip_norm : std::numeric_limits<double>::infinity();
  UpdateResult r;
  r.gnorm = optimizer.clip_grad_norm(max_norm);
  r.tokens = s.tokens;
  r.allreduce_s = allreduce_s;
  const double ntok = double(std::max<int64_t>(s.tokens, 1));
  r.loss = s.loss / ntok;
  r.nll = s.nll / ntok;
  // fp16: an overflow skips the update and halves the scale; only a scale worn down to its floor
  // is divergence.
  const bool overflow = fp16 && (!std::isfinite(r.loss) || !std::isfinite(r.gnorm));
  if (overflow) scaler.update(/*gradients_finite=*/false);
  if (overflow && !scaler.exhausted()) {
    r.kind = UpdateResult::Kind::Overflow;
    return r;
  }
  if (!std::isfinite(r.loss) || !std::isfinite(r.gnorm) || r.nll > settings.divergence_nll) {
    // A result, not a crash: re-run this update's batches with the same dropout masks and a
    // probe that names the first non-finite module.
    r.kind = UpdateResult::Kind::Diverged;
    r.cause = !std::isfinite(r.loss) ? "non-finite loss"
              : !std::isfinite(r.gnorm)
                  ? "non-finite gradient norm"
                  : fmt::format("loss blow-up, training nll {:.3f} above {:.3f}", r.nll,
                                settings.divergence_nll);
    if (overflow) r.cause += fmt::format(" (fp16 loss scale below {})", 1e-4);
    compat::set_cpu_rng_state(rng_before);
    compat::set_cuda_rng_state(device, cuda_rng_before);
    NonFiniteProbe probe(model);
    model.set_observer(&probe);
    optimizer.zero_grad();
    accumulate_gradients(model, batches, settings.forward);
    model.set_observer(nullptr);
    r.first_nonfinite =
        !probe.first_forward().empty() ? probe.first_forward() : probe.first_backward();
    return r;
  }
  if (fp16) scaler.update(true);
  events.before_step(u, r.gnorm);
  optimizer.step();
  model.after_step();  // the scheme's hook (nGPT's projection), before the observers read the
                       // weights
  events.after_step(u);
  return r;
}

}  // namespace normlab
