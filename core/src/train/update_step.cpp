#include "update_step.h"

#include <fmt/format.h>
#include <toml++/toml.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstring>
#include <nlohmann/json.hpp>
#include <optional>
#include <stdexcept>
#include <vector>

#include "loss_scaler.h"
#include "lr_schedule_change.h"
#include "nonfinite_probe.h"
#include "normlab/manifest/experiment.h"
#include "normlab/train/run_events.h"
#include "run/label_smoothing.h"
#include "run/optimizer.h"
#include "run/process_group.h"
#include "torch_api.h"
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
                         int64_t pad_id, double z_loss) {
  const torch::Tensor hidden = model.final_hidden(b.src, b.tgt_in, b.unpadded);
  const torch::Tensor w = model.output_projection();
  const double cap = model.final_logit_softcap();
  if (cap == 0 && projected_loss_applies(hidden, w))
    return projected_label_smoothed_loss(hidden, w, b.tgt_out, label_smoothing, pad_id, z_loss);
  if (blocked_loss_applies(w, torch::kFloat))
    return blocked_projected_loss(hidden, w, b.tgt_out, label_smoothing, pad_id, torch::kFloat, 0,
                                  z_loss, cap);
  return label_smoothed_loss(model.cap_logits(torch::linear(hidden, w)), b.tgt_out, label_smoothing,
                             pad_id, z_loss);
}

namespace {

// Under autocast: the GPU's blocked loss of the final states (the products in `dtype`, as
// autocast's linear), else the loss of the whole logits in fp32.
LossSums autocast_batch_loss(TransformerModelImpl& model, const DeviceBatch& b,
                             const compat::AutocastState& autocast, at::ScalarType dtype,
                             double label_smoothing, int64_t pad_id, double z_loss) {
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
    return blocked_projected_loss(hidden, w, b.tgt_out, label_smoothing, pad_id, dtype, 0, z_loss,
                                  model.final_logit_softcap());
  // The loss in fp32 whatever the forward's precision (log-softmax over the vocabulary); forward's
  // logits are capped already (model.final_logit_softcap).
  return label_smoothed_loss(logits.to(torch::kFloat), b.tgt_out, label_smoothing, pad_id, z_loss);
}

}  // namespace

LossSums batch_loss(TransformerModelImpl& model, const DeviceBatch& b, const UpdateOptions& o) {
  if (o.dtype == "fp32") return fp32_batch_loss(model, b, o.label_smoothing, o.pad_id, o.z_loss);
  const at::ScalarType dtype = o.dtype == "fp16" ? at::kHalf : at::kBFloat16;
  return autocast_batch_loss(model, b, compat::autocast_to(o.cuda, dtype), dtype, o.label_smoothing,
                             o.pad_id, o.z_loss);
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
  torch::Tensor loss_sum, nll_sum, z_sum;
  for (size_t i = 0; i < batches.size(); ++i) {
    if (i + 1 == batches.size() && before_last) before_last();
    const LossSums s = batch_loss(model, batches[i], o);
    ((s.loss * o.loss_scale) / ntok).backward();
    loss_sum = loss_sum.defined() ? loss_sum + s.loss.detach() : s.loss.detach();
    nll_sum = nll_sum.defined() ? nll_sum + s.nll.detach() : s.nll.detach();
    if (o.z_loss > 0) z_sum = z_sum.defined() ? z_sum + s.z.detach() : s.z.detach();
  }
  if (loss_sum.defined()) {
    sums.loss = loss_sum.item<double>();
    sums.nll = nll_sum.item<double>();
    if (z_sum.defined()) sums.z = o.z_loss * z_sum.item<double>();
  }
  return sums;
}

namespace {

// Hägele et al. 2024's own scheduler (github.com/epfml/schedules-and-scaling, commit 17e78d6,
// src/optim/utils.py wsd_schedule as src/main.py calls it: init_div_factor 100, final_lr_factor
// = --wsd-final-lr-scale, default 0): the factor of step s = u − 1 (torch's LambdaLR, stepped after
// each update): s/W + (1 − s/W)/100 for s < W; 1 for s < N − D; then f + (1 − f)(1 − shape(p)),
// p = (s − (N − D))/D; f after N.
double wsd_hagele2024_factor(const OptimSection& o, int64_t u) {
  const double s = double(std::max<int64_t>(u - 1, 0)), w = double(o.warmup_updates);
  const double n = double(o.max_updates), f = o.min_lr_ratio;
  // Their decay is int(fract_decay · N) updates: a fifth (fract 0.2) unless decay_updates says.
  const double d = double(o.decay_updates > 0 ? o.decay_updates : o.max_updates / 5);
  if (s < w) return s / w + (1.0 - s / w) / 100.0;
  if (s < n - d) return 1.0;
  if (s >= n) return f;
  const double p = (s - (n - d)) / d;
  return f + (1.0 - f) * (1.0 - (o.decay_shape == "linear" ? p : std::sqrt(p)));
}

}  // namespace

double learning_rate(const OptimSection& o, int64_t u) {
  if (o.lr_schedule == "wsd_hagele2024") return o.lr * wsd_hagele2024_factor(o, u);
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
    const std::vector<double> sums = settings.group->sum({s.loss, s.nll, s.z});
    s.loss = sums[0], s.nll = sums[1], s.z = sums[2];
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
  r.z_loss = s.z / ntok;
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

// Issue 66.2: what a resume may change of the lr schedule (lr_schedule_change.h). Named, not
// anonymous: the unity build compiles this file with others.
namespace lr_schedule_detail {

bool same_lr(double a, double b) {
  return a == b || std::abs(a - b) <= 1e-9 * std::max(std::abs(a), std::abs(b));
}

bool lr_differs(const OptimSection& was, const OptimSection& now, int64_t u) {
  return !same_lr(learning_rate(was, u), learning_rate(now, u));
}

// Updates around which a schedule turns: the end of the warm-up, the start of a wsd decay and
// max_updates.
void add_turning_points(const OptimSection& o, std::vector<int64_t>& at) {
  const int64_t decay = o.decay_updates > 0 ? o.decay_updates : o.max_updates / 5;
  for (const int64_t t :
       {o.warmup_updates, std::max(o.max_updates - decay, o.warmup_updates), o.max_updates})
    for (int64_t d = -1; d <= 1; ++d) at.push_back(t + d);
}

std::string number(double x) { return fmt::format("{}", x); }
std::string number(int64_t x) { return fmt::format("{}", x); }
std::string quoted(const std::string& s) { return nlohmann::json(s).dump(); }

}  // namespace lr_schedule_detail

std::optional<OptimSection> schedule_from_resolved_manifest(const std::string& text,
                                                            OptimSection o) {
  if (text.empty()) return std::nullopt;
  toml::table root;
  try {
    root = toml::parse(text);
  } catch (const toml::parse_error&) {
    return std::nullopt;
  }
  const toml::node_view optim = root["optim"];
  o.lr = optim["lr"].value<double>().value_or(o.lr);
  o.warmup_updates = optim["warmup_updates"].value<int64_t>().value_or(o.warmup_updates);
  o.lr_schedule = optim["lr_schedule"].value<std::string>().value_or(o.lr_schedule);
  o.min_lr_ratio = optim["min_lr_ratio"].value<double>().value_or(o.min_lr_ratio);
  o.max_updates = optim["max_updates"].value<int64_t>().value_or(o.max_updates);
  o.decay_updates = optim["decay_updates"].value<int64_t>().value_or(o.decay_updates);
  o.decay_shape = optim["decay_shape"].value<std::string>().value_or(o.decay_shape);
  return o;
}

int64_t first_lr_change(const OptimSection& was, const OptimSection& now, int64_t done) {
  constexpr int64_t kEveryUpdateUpTo = int64_t(1) << 22;
  if (done <= kEveryUpdateUpTo) {
    for (int64_t u = 1; u <= done; ++u)
      if (lr_schedule_detail::lr_differs(was, now, u)) return u;
    return 0;
  }
  // A forged or enormous update count: both schedules are smooth between their turning points.
  std::vector<int64_t> at;
  lr_schedule_detail::add_turning_points(was, at);
  lr_schedule_detail::add_turning_points(now, at);
  const int64_t stride = done / (int64_t(1) << 20);
  for (int64_t u = 1; u <= done; u += stride) at.push_back(u);
  at.push_back(done);
  std::sort(at.begin(), at.end());
  int64_t agreed = 0;  // the last update found to agree
  for (const int64_t u : at) {
    if (u < 1 || u > done) continue;
    if (!lr_schedule_detail::lr_differs(was, now, u)) {
      agreed = u;
      continue;
    }
    for (int64_t v = agreed + 1; v < u; ++v)  // the first change since the last agreement
      if (lr_schedule_detail::lr_differs(was, now, v)) return v;
    return u;
  }
  return 0;
}

void check_lr_schedule_change(const std::string& source, const OptimSection& was,
                              const OptimSection& now, int64_t done, const std::string& run) {
  const int64_t u = first_lr_change(was, now, done);
  if (u == 0) return;
  namespace detail = lr_schedule_detail;
  std::string changed, kept;
  auto key = [&](const char* name, const std::string& a, const std::string& b) {
    if (a == b) return;
    changed += fmt::format("{}optim.{} {} → {}", changed.empty() ? "" : ", ", name, a, b);
    kept += fmt::format("{}{} = {}", kept.empty() ? "" : ", ", name, a);
  };
  key("lr", detail::number(was.lr), detail::number(now.lr));
  key("warmup_updates", detail::number(was.warmup_updates), detail::number(now.warmup_updates));
  key("lr_schedule", detail::quoted(was.lr_schedule), detail::quoted(now.lr_schedule));
  key("min_lr_ratio", detail::number(was.min_lr_ratio), detail::number(now.min_lr_ratio));
  key("max_updates", detail::number(was.max_updates), detail::number(now.max_updates));
  key("decay_updates", detail::number(was.decay_updates), detail::number(now.decay_updates));
  key("decay_shape", detail::quoted(was.decay_shape), detail::quoted(now.decay_shape));
  std::string hint = fmt::format("keep {}", kept);
  if (u > 1)
    hint += fmt::format(
        ", or --resume-from a checkpoint of update {} or before (the two schedules agree up to "
        "there)",
        u - 1);
  if (was.max_updates != now.max_updates && was.lr_schedule != "wsd" &&
      was.lr_schedule != "wsd_hagele2024")
    hint +=
        ", or train runs meant to be extended with lr_schedule = \"wsd\" (extendable until its "
        "decay begins)";
  throw ManifestError(fmt::format(
      "{}: {} changes the {} schedule of {}: the lr of update {} was {:.4g}, it would be {:.4g}; "
      "{}",
      source, changed, was.lr_schedule, run, u, learning_rate(was, u), learning_rate(now, u),
      hint));
}

}  // namespace normlab
