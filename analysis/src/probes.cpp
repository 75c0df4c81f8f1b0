#include "normlab/analysis/probes.h"

#include <fmt/format.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <set>
#include <sstream>

#include "normlab/analysis/metric_log.h"
#include "normlab/manifest/experiment.h"
#include "normlab/model/transformer_model.h"
#include "util/atomic_file.h"

namespace fs = std::filesystem;

namespace normlab::analysis {

bool ProbePlan::any() const {
  return grad_norm || act_grad_norm || update_norm || param_update || sparsity || ln_input_norm ||
         layer_cosine || scheme_state;
}

bool ProbePlan::due(int64_t u) const {
  return any() && (u <= dense_until || u % interval == 0 || u == last_update || cosine_due(u));
}

bool ProbePlan::cosine_due(int64_t u) const {
  return layer_cosine && std::find(cosine_at.begin(), cosine_at.end(), u) != cosine_at.end();
}

ProbePlan make_probe_plan(const AnalysisSection& a, int64_t max_updates) {
  ProbePlan p;
  auto wants = [&](const char* name) {
    return std::any_of(a.probes.begin(), a.probes.end(),
                       [&](const std::string& s) { return s == "all" || s == name; });
  };
  p.grad_norm = wants("grad_norm");
  p.act_grad_norm = wants("act_grad_norm");
  p.update_norm = wants("update_norm");
  p.param_update = wants("param_update");
  p.sparsity = wants("sparsity");
  p.ln_input_norm = wants("ln_input_norm");
  p.layer_cosine = wants("layer_cosine");
  p.scheme_state = wants("scheme_state");
  p.interval = std::max<int64_t>(1, a.interval);
  p.dense_until = a.dense_until;
  p.last_update = max_updates;
  p.cosine_at = a.cosine_at.empty() ? std::vector<int64_t>{0, max_updates} : a.cosine_at;
  return p;
}

std::vector<int> select_layers(const std::string& spec, int n) {
  std::set<int> s;
  if (spec == "all" || (spec == "auto" && n <= 24)) {
    for (int i = 0; i < n; ++i) s.insert(i);
  } else if (spec == "auto") {
    for (int i : {0, 1, n / 4, n / 2, 3 * n / 4, n - 2, n - 1}) s.insert(i);
  } else {
    std::stringstream ss(spec);
    std::string item;
    while (std::getline(ss, item, ',')) {
      int i = std::stoi(item);
      if (i < 0) i += n;
      if (i >= 0 && i < n) s.insert(i);
    }
  }
  return {s.begin(), s.end()};
}

namespace {

const char* stack_name(Stack s) { return s == Stack::Encoder ? "encoder" : "decoder"; }

// Mean over the non-padding positions of a per-position value [B,T].
double masked_mean(const torch::Tensor& per_position, const torch::Tensor& mask) {
  const auto m = mask.to(per_position.dtype());
  return (per_position * m).sum().item<double>() / std::max(1.0, m.sum().item<double>());
}

// Where a parameter belongs, from its stable name ("decoder.layers.7.cross_attn.v_proj.weight").
struct ParamSlot {
  std::string stack;  // encoder | decoder | model
  int layer = -1;
  std::string sublayer;
};

ParamSlot slot_of(const std::string& name) {
  std::vector<std::string> parts;
  std::stringstream ss(name);
  for (std::string p; std::getline(ss, p, '.');) parts.push_back(p);
  ParamSlot s;
  if (parts.size() >= 2 && parts[1] == "output_projection") return {"model", -1, "output"};
  s.stack = parts.empty() ? "model" : parts[0];
  if (parts.size() >= 4 && parts[1] == "layers") {
    s.layer = std::stoi(parts[2]);
    // self_attn, cross_attn, ffn, a scheme's LayerNorm by its name; a scheme's own parameter
    // ("encoder.layers.3.alpha") is "extra".
    s.sublayer = parts.size() == 4 ? "extra" : parts[3];
  } else if (parts.size() >= 2 && parts[1] == "embed_tokens") {
    s.sublayer = "embeddings";
  } else if (parts.size() >= 2 && parts[1] == "layer_norm") {
    s.sublayer = "final_norm";
  } else {
    s.stack = "model";
    s.sublayer = name;
  }
  return s;
}

std::string slot_key(const std::string& stack, int layer, const std::string& sub) {
  return fmt::format("{}\t{}\t{}", stack, layer, sub);
}

}  // namespace

struct ProbeSession::Impl : ActivationObserver {
  enum class Mode { Off, GradientHooks, ProbeForward };

  ProbePlan plan;
  TransformerModelImpl& model;
  ProbeBatch batch;
  fs::path dir;
  std::unique_ptr<MetricLog> log;
  RecordFormats formats;
  Mode mode = Mode::Off;
  int64_t update = 0;

  std::vector<std::string> names;         // parameters, in model order
  std::vector<torch::Tensor> params;
  std::vector<ParamSlot> slots;
  std::vector<torch::Tensor> before_step;  // θ before the update (param_update)
  std::map<int, std::vector<int>> selected;  // stack → chosen layers
  std::map<int, torch::Tensor> masks;        // stack → [B,T] bool, non-padding positions

  // Pending activation-gradient norms of this update (filled by tensor hooks during backward).
  std::vector<std::pair<Record, torch::Tensor>> pending;
  // Captured during a probe forward.
  std::map<std::pair<int, int>, torch::Tensor> layer_out;  // (stack, layer) → [B,T,D]
  std::vector<Record> forward_records;
  torch::Tensor ref_logits;
  std::map<std::pair<int, int>, torch::Tensor> ref_layer_out;

  Impl(const AnalysisSection& a, int64_t max_updates, TransformerModelImpl& m, ProbeBatch b,
       const fs::path& run_dir)
      : plan(make_probe_plan(a, max_updates)), model(m), batch(std::move(b)), dir(run_dir) {
    for (const auto& item : model.named_parameters()) {
      names.push_back(item.key());
      params.push_back(item.value());
      slots.push_back(slot_of(item.key()));
    }
    for (Stack s : {Stack::Encoder, Stack::Decoder}) {
      TransformerStackImpl* st = stack(s);
      if (!st) continue;
      selected[int(s)] = select_layers(a.layers, int(st->num_layers()));
      const torch::Tensor& tokens = s == Stack::Encoder ? batch.src : batch.tgt_in;
      masks[int(s)] = tokens.ne(batch.pad_id);
    }
  }

  TransformerStackImpl* stack(Stack s) {
    if (s == Stack::Encoder) return model.encoder ? model.encoder.get() : nullptr;
    return model.decoder.get();
  }
  bool is_selected(const LayerId& id) const {
    auto it = selected.find(int(id.stack));
    return it != selected.end() && std::binary_search(it->second.begin(), it->second.end(), id.index);
  }
  std::string norm_name(const LayerId& id, int norm_id) {
    return stack(id.stack)->layer(size_t(id.index)).norm_names().at(size_t(norm_id));
  }
  void emit(const std::string& metric, const std::string& stack_, int layer, const std::string& sub, double v) {
    log->write({update, metric, stack_, layer, sub, v});
  }

  // ---- ActivationObserver ----
  void watch_gradient(const torch::Tensor& t, Record r) {
    if (!t.requires_grad()) return;
    const size_t slot = pending.size();
    pending.emplace_back(std::move(r), torch::Tensor());
    t.register_hook([this, slot](torch::Tensor g) {
      if (slot < pending.size()) pending[slot].second = g.detach().norm();
    });
  }
  void on_layer_output(const LayerId& id, const torch::Tensor& out) override {
    if (!is_selected(id)) return;
    if (mode == Mode::GradientHooks) watch_gradient(out, {update, "act_grad_norm", stack_name(id.stack), id.index, "output", 0});
    if (mode == Mode::ProbeForward) layer_out[{int(id.stack), id.index}] = out.detach();
  }
  void on_norm(const LayerId& id, int norm_id, const torch::Tensor& in, const torch::Tensor& out) override {
    if (!is_selected(id)) return;
    const std::string name = norm_name(id, norm_id);
    if (mode == Mode::GradientHooks) {
      watch_gradient(in, {update, "act_grad_norm", stack_name(id.stack), id.index, name + ".in", 0});
      watch_gradient(out, {update, "act_grad_norm", stack_name(id.stack), id.index, name + ".out", 0});
    }
    if (mode == Mode::ProbeForward && plan.ln_input_norm)
      forward_records.push_back({update, "ln_input_norm", stack_name(id.stack), id.index, name,
                                 masked_mean(in.detach().norm(2, -1), masks.at(int(id.stack)))});
  }
  void on_ffn_activation(const LayerId& id, const torch::Tensor& act) override {
    if (mode != Mode::ProbeForward || !plan.sparsity || !is_selected(id)) return;
    const torch::Tensor& mask = masks.at(int(id.stack));
    const double zeros = masked_mean(act.detach().eq(0).to(torch::kDouble).mean(-1), mask);
    forward_records.push_back({update, "ffn_zero_fraction", stack_name(id.stack), id.index, "ffn", zeros});
    forward_records.push_back({update, "ffn_nonzero_fraction", stack_name(id.stack), id.index, "ffn", 1.0 - zeros});
  }

  // ---- probe-batch forward ----
  torch::Tensor probe_forward() {
    const bool was_training = model.is_training();
    model.eval();
    // The scheme's state is read, never advanced: it is the state of the last training forward
    // (BranchNorm's α_u at update u). Advancing it here changed BranchNorm's results (issue 12.1).
    torch::NoGradGuard no_grad;
    layer_out.clear();
    forward_records.clear();
    mode = Mode::ProbeForward;
    model.set_observer(this);
    torch::Tensor logits;
    try {
      logits = batch.src.defined() ? model.forward(batch.src, batch.tgt_in) : model.forward_lm(batch.tgt_in);
    } catch (...) {
      model.set_observer(nullptr);
      mode = Mode::Off;
      throw;
    }
    model.set_observer(nullptr);
    mode = Mode::Off;
    if (was_training) model.train();
    return logits.detach();
  }

  void probe_batch_metrics(const torch::Tensor& logits) {
    for (const auto& r : forward_records) log->write(r);
    if (plan.update_norm && ref_logits.defined()) {
      const torch::Tensor& dmask = masks.at(int(Stack::Decoder));
      emit("update_norm", "model", -1, "logits", masked_mean((logits - ref_logits).norm(2, -1), dmask));
      for (const auto& [key, out] : layer_out) {
        auto ref = ref_layer_out.find(key);
        if (ref == ref_layer_out.end()) continue;
        emit("update_norm", stack_name(Stack(key.first)), key.second, "output",
             masked_mean((out - ref->second).norm(2, -1), masks.at(key.first)));
      }
    }
    if (plan.cosine_due(update)) {
      for (const auto& [s, layers] : selected) {
        std::vector<torch::Tensor> outs;
        for (int i : layers) outs.push_back(layer_out.at({s, i}));
        // [L, N, D] over the non-padding positions, unit rows; cos(i,j) = mean_n <h_i,h_j>.
        const torch::Tensor m = masks.at(s).reshape({-1});
        torch::Tensor h = torch::stack(outs).flatten(1, 2).index({torch::indexing::Slice(), m}).to(torch::kDouble);
        h = h / h.norm(2, -1, true).clamp_min(1e-12);
        // On the host before reading it element-wise (a CUDA tensor's data is not addressable here).
        const torch::Tensor sim = (torch::einsum("lnd,knd->lk", {h, h}) / double(std::max<int64_t>(1, h.size(1)))).cpu();
        const auto acc = sim.accessor<double, 2>();
        for (size_t i = 0; i < layers.size(); ++i)
          for (size_t j = 0; j < layers.size(); ++j)
            emit("layer_cosine", stack_name(Stack(s)), layers[i], fmt::format("layer:{}", layers[j]), acc[long(i)][long(j)]);
      }
    }
  }

  void scheme_metrics() {
    // status() is "key=value …" by convention; numeric values are the scheme's live state.
    std::stringstream ss(model.scheme().status());
    for (std::string tok; ss >> tok;) {
      const auto eq = tok.find('=');
      if (eq == std::string::npos || eq == 0) continue;
      try {
        size_t used = 0;
        const double v = std::stod(tok.substr(eq + 1), &used);
        if (used == tok.size() - eq - 1) emit("scheme_state", "model", -1, tok.substr(0, eq), v);
      } catch (const std::exception&) {
      }
    }
    for (const auto& [name, t] : model.scheme().state()) {
      if (!t.defined() || !t.is_floating_point() || t.numel() == 0) continue;
      const torch::Tensor d = t.detach().to(torch::kDouble);
      if (d.numel() == 1) {
        emit("scheme_state", "model", -1, name, d.item<double>());
      } else {
        emit("scheme_state", "model", -1, name + ".mean", d.mean().item<double>());
        emit("scheme_state", "model", -1, name + ".min", d.min().item<double>());
        emit("scheme_state", "model", -1, name + ".max", d.max().item<double>());
      }
    }
    // A scheme's own parameters inside layers (ReZero's g, …): their mean value per layer.
    for (size_t i = 0; i < params.size(); ++i)
      if (slots[i].sublayer == "extra")
        emit("scheme_state", slots[i].stack, slots[i].layer, names[i].substr(names[i].rfind('.') + 1),
             params[i].detach().to(torch::kDouble).mean().item<double>());
  }

  // Groups per-parameter squared norms into (stack, layer, sublayer), (stack, layer, "all") and
  // model totals; emits sqrt of each group (divided by the θ group norm when `denominators`).
  void emit_grouped(const std::string& metric, const std::vector<double>& sq,
                    const std::vector<double>* denominators, bool total) {
    std::map<std::string, std::pair<double, double>> groups;  // key → (Σ num², Σ den²)
    std::vector<std::string> order;
    auto add = [&](const std::string& k, double num, double den) {
      auto [it, inserted] = groups.try_emplace(k, 0.0, 0.0);
      if (inserted) order.push_back(k);
      it->second.first += num;
      it->second.second += den;
    };
    for (size_t i = 0; i < sq.size(); ++i) {
      if (sq[i] < 0) continue;  // no gradient
      const ParamSlot& s = slots[i];
      const double den = denominators ? (*denominators)[i] : 0.0;
      if (!denominators) add(slot_key(s.stack, s.layer, s.sublayer), sq[i], den);
      if (s.layer >= 0) add(slot_key(s.stack, s.layer, "all"), sq[i], den);
      else if (denominators) add(slot_key(s.stack, s.layer, s.sublayer), sq[i], den);
      if (total) add(slot_key("model", -1, "total"), sq[i], den);
    }
    for (const auto& k : order) {
      std::stringstream ks(k);
      std::string st, layer, sub;
      std::getline(ks, st, '\t');
      std::getline(ks, layer, '\t');
      std::getline(ks, sub, '\t');
      const auto& [num, den] = groups[k];
      const double v = denominators ? std::sqrt(num) / std::max(std::sqrt(den), 1e-30) : std::sqrt(num);
      emit(metric, st, std::stoi(layer), sub, v);
    }
  }

  // ‖t‖² of each tensor in one pass (one host transfer); -1 where undefined.
  static std::vector<double> squared_norms(const std::vector<torch::Tensor>& ts) {
    std::vector<torch::Tensor> norms;
    std::vector<size_t> where;
    for (size_t i = 0; i < ts.size(); ++i)
      if (ts[i].defined()) {
        norms.push_back(ts[i].detach().to(torch::kFloat).norm().to(torch::kDouble).pow(2));
        where.push_back(i);
      }
    std::vector<double> out(ts.size(), -1.0);
    if (norms.empty()) return out;
    const torch::Tensor all = torch::stack(norms).cpu().contiguous();
    const double* p = all.data_ptr<double>();
    for (size_t k = 0; k < where.size(); ++k) out[where[k]] = p[k];
    return out;
  }

};

ProbeSession::ProbeSession(const AnalysisSection& a, int64_t max_updates, TransformerModelImpl& model,
                           ProbeBatch batch, const fs::path& run_dir)
    : impl_(std::make_unique<Impl>(a, max_updates, model, std::move(batch), run_dir)) {
  Impl& m = *impl_;
  m.formats = RecordFormats{a.writes("csv"), a.writes("jsonl"), a.writes("tensorboard")};
  if (!m.plan.any()) return;
  // F(x, θ_0), the reference of every later ‖ΔF‖: measured again by a resumed run (its model is
  // initialized from the same seed before the checkpoint is loaded), so no file keeps it.
  m.ref_logits = m.probe_forward();
  m.ref_layer_out = m.layer_out;
}

ProbeSession::ProbeSession(const AnalysisSection& a, int64_t max_updates, TransformerModelImpl& model,
                           ProbeBatch batch, const fs::path& run_dir, int64_t resume_update)
    : ProbeSession(a, max_updates, model, std::move(batch), run_dir) {
  start(resume_update);
}

void ProbeSession::start(int64_t resume_update) {
  Impl& m = *impl_;
  if (!m.plan.any()) return;
  m.log = std::make_unique<MetricLog>(m.dir, m.formats, resume_update);
  m.update = resume_update;
  if (resume_update > 0) return;
  // Update 0: the initialization's records, from the forward pass that measured the reference.
  m.probe_batch_metrics(m.ref_logits);
  if (m.plan.scheme_state) m.scheme_metrics();
  m.log->flush();
}

ProbeSession::~ProbeSession() = default;

bool ProbeSession::enabled() const { return impl_->plan.any(); }

void ProbeSession::before_forward(int64_t u) {
  Impl& m = *impl_;
  m.update = u;
  m.pending.clear();
  if (!m.plan.due(u) || !m.plan.act_grad_norm) return;
  m.mode = Impl::Mode::GradientHooks;
  m.model.set_observer(&m);
}

void ProbeSession::after_backward(int64_t u) {
  Impl& m = *impl_;
  if (m.mode == Impl::Mode::GradientHooks) {
    m.model.set_observer(nullptr);
    m.mode = Impl::Mode::Off;
  }
  if (!m.plan.due(u)) return;
  m.update = u;
  for (auto& [r, norm] : m.pending)
    if (norm.defined()) {
      r.value = norm.item<double>();
      m.log->write(r);
    }
  m.pending.clear();
  if (m.plan.grad_norm) {
    std::vector<torch::Tensor> grads;
    for (const auto& p : m.params) grads.push_back(p.grad());
    m.emit_grouped("grad_norm", Impl::squared_norms(grads), nullptr, /*total=*/false);
  }
}

void ProbeSession::record_total_grad_norm(int64_t u, double norm) {
  Impl& m = *impl_;
  if (m.plan.due(u) && m.plan.grad_norm) m.emit("grad_norm", "model", -1, "total", norm);
}

void ProbeSession::before_step(int64_t u) {
  Impl& m = *impl_;
  m.before_step.clear();
  if (!m.plan.due(u) || !m.plan.param_update) return;
  for (const auto& p : m.params) m.before_step.push_back(p.detach().clone());
}

void ProbeSession::after_step(int64_t u) {
  Impl& m = *impl_;
  if (!m.plan.due(u)) return;
  m.update = u;
  if (!m.before_step.empty()) {
    std::vector<torch::Tensor> deltas;
    for (size_t i = 0; i < m.params.size(); ++i) deltas.push_back(m.params[i].detach() - m.before_step[i]);
    const std::vector<double> num = Impl::squared_norms(deltas), den = Impl::squared_norms(m.before_step);
    m.emit_grouped("param_update", num, &den, /*total=*/true);
    m.before_step.clear();
  }
  if (m.plan.update_norm || m.plan.sparsity || m.plan.ln_input_norm || m.plan.cosine_due(u))
    m.probe_batch_metrics(m.probe_forward());
  if (m.plan.scheme_state) m.scheme_metrics();
  m.log->flush();
}

void ProbeSession::scalar(const std::string& tag, int64_t step, double value) {
  if (impl_->log) impl_->log->scalar(tag, step, value);
}

}  // namespace normlab::analysis
