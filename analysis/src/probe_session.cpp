#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <map>
#include <set>
#include <sstream>
#include <stdexcept>
#include <tuple>

#include "normlab/analysis/metric_log.h"
#include "normlab/analysis/probe.h"
#include "normlab/analysis/probes.h"
#include "normlab/manifest/experiment.h"
#include "normlab/model/transformer_model.h"
#include "torch_api.h"

namespace fs = std::filesystem;

namespace normlab::analysis {

// ---- the registry ----

namespace {
// Filled by static initializers of any translation unit: a function-local map has no order problem.
std::map<std::string, ProbeFactory>& registry() {
  static std::map<std::string, ProbeFactory> probes;
  return probes;
}
}  // namespace

bool register_probe(const std::string& name, ProbeFactory make) {
  if (!registry().emplace(name, std::move(make)).second)
    throw std::logic_error(fmt::format("analysis probe '{}' registered twice", name));
  return true;
}

std::vector<std::string> probe_names() {
  std::vector<std::string> names;
  for (const auto& [name, make] : registry()) names.push_back(name);
  return names;
}

// [analysis] probes in a manifest accepts every registered probe by name.
[[maybe_unused]] const bool probe_names_published = (set_probe_name_source(&probe_names), true);

std::unique_ptr<Probe> make_probe(const std::string& name) {
  auto it = registry().find(name);
  return it == registry().end() ? nullptr : it->second();
}

// ---- the plan ----

bool ProbePlan::has(const std::string& name) const {
  return std::find(probes.begin(), probes.end(), name) != probes.end();
}

bool ProbePlan::due(int64_t u) const {
  return any() && (u <= dense_until || u % interval == 0 || u == last_update || cosine_due(u));
}

bool ProbePlan::cosine_due(int64_t u) const {
  return has("layer_cosine") && std::find(cosine_at.begin(), cosine_at.end(), u) != cosine_at.end();
}

ProbePlan make_probe_plan(const AnalysisSection& a, int64_t max_updates) {
  ProbePlan p;
  const std::vector<std::string> known = probe_names();
  for (const std::string& name : a.probes) {
    if (name == "all") {
      p.probes = known;
      break;
    }
    if (!std::binary_search(known.begin(), known.end(), name))
      throw std::invalid_argument(
          fmt::format("[analysis] probes: unknown probe '{}'; expected all or one of {}", name,
                      fmt::join(known, ", ")));
    if (!p.has(name)) p.probes.push_back(name);
  }
  std::sort(p.probes.begin(), p.probes.end());
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

// ---- what probes share ----

const char* stack_name(Stack s) { return s == Stack::Encoder ? "encoder" : "decoder"; }

double masked_mean(const torch::Tensor& per_position, const torch::Tensor& mask) {
  const auto m = mask.to(per_position.dtype());
  return (per_position * m).sum().item<double>() / std::max(1.0, m.sum().item<double>());
}

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

std::vector<double> squared_norms(const std::vector<torch::Tensor>& ts) {
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

void emit_grouped(ProbeContext& ctx, const std::string& metric, const std::vector<double>& sq,
                  const std::vector<double>* denominators, bool total) {
  struct Group {
    std::string stack;
    int layer;
    std::string sublayer;
    double num = 0, den = 0;
  };
  std::vector<Group> groups;  // in the order first seen
  std::map<std::tuple<std::string, int, std::string>, size_t> index;
  auto add = [&](const std::string& stack, int layer, const std::string& sub, double num,
                 double den) {
    auto [it, inserted] = index.try_emplace({stack, layer, sub}, groups.size());
    if (inserted) groups.push_back({stack, layer, sub});
    groups[it->second].num += num;
    groups[it->second].den += den;
  };
  for (size_t i = 0; i < sq.size(); ++i) {
    if (sq[i] < 0) continue;  // no gradient
    const ParamSlot& s = ctx.params[i].slot;
    const double den = denominators ? (*denominators)[i] : 0.0;
    if (!denominators) add(s.stack, s.layer, s.sublayer, sq[i], den);
    if (s.layer >= 0)
      add(s.stack, s.layer, "all", sq[i], den);
    else if (denominators)
      add(s.stack, s.layer, s.sublayer, sq[i], den);
    if (total) add("model", -1, "total", sq[i], den);
  }
  for (const Group& g : groups) {
    const double v =
        denominators ? std::sqrt(g.num) / std::max(std::sqrt(g.den), 1e-30) : std::sqrt(g.num);
    ctx.emit(metric, g.stack, g.layer, g.sublayer, v);
  }
}

torch::Tensor attention_logits(const AttentionScores& a, int64_t head) {
  const auto dtype = a.q.scalar_type() == torch::kDouble ? torch::kDouble : torch::kFloat;
  const torch::Tensor q = a.q.select(1, head).to(dtype), k = a.k.select(1, head).to(dtype);
  return torch::matmul(q, k.transpose(-2, -1)) * a.scale;
}

torch::Tensor attention_allowed(const AttentionScores& a, int64_t head) {
  const int64_t B = a.q.size(0), Tq = a.q.size(2), Tk = a.k.size(2);
  const auto on = torch::TensorOptions().dtype(torch::kBool).device(a.q.device());
  torch::Tensor allowed = torch::ones({B, Tq, Tk}, on);
  if (a.mask.defined()) {  // additive, [B|1, H|1, Tq|1, Tk]: −inf where a key is masked
    const torch::Tensor m = a.mask.size(1) == 1 ? a.mask.select(1, 0) : a.mask.select(1, head);
    allowed = allowed & m.gt(-std::numeric_limits<double>::infinity());
  }
  if (a.causal) allowed = allowed & torch::ones({Tq, Tk}, on).tril();
  return allowed;
}

bool ProbeContext::is_selected(const LayerId& id) const {
  auto it = selected.find(int(id.stack));
  return it != selected.end() && std::binary_search(it->second.begin(), it->second.end(), id.index);
}

void ProbeContext::emit(const std::string& metric, const std::string& stack, int layer,
                        const std::string& sublayer, double value) {
  write({update, metric, stack, layer, sublayer, value});
}

void ProbeContext::write(const Record& r) {
  if (pass == Pass::ProbeBatch)
    pass_records.push_back(r);
  else if (log)
    log->write(r);
}

// ---- the session ----

struct ProbeSession::Impl : ActivationObserver {
  ProbePlan plan;
  ProbeContext ctx;
  ProbeBatch batch;
  fs::path dir;
  RecordFormats formats;
  std::unique_ptr<MetricLog> log;
  std::vector<std::unique_ptr<Probe>> probes;  // plan.probes, in that order
  ProbePass reference;                         // F(x, θ_0)
  ProbePass current;                           // filled during a probe pass
  bool watching = false;                       // attached during a training pass
  bool attention = false;                      // a probe watches attention scores

  Impl(const AnalysisSection& a, int64_t max_updates, TransformerModelImpl& model, ProbeBatch b,
       const fs::path& run_dir)
      : plan(make_probe_plan(a, max_updates)), ctx(model, plan), batch(std::move(b)), dir(run_dir) {
    for (const std::string& name : plan.probes) probes.push_back(make_probe(name));
    for (const auto& p : probes) attention = attention || p->watches_attention();
    for (const auto& item : model.named_parameters())
      ctx.params.push_back({item.key(), item.value(), slot_of(item.key())});
    for (Stack s : {Stack::Encoder, Stack::Decoder}) {
      TransformerStackImpl* st = stack(s);
      if (!st) continue;
      ctx.selected[int(s)] = select_layers(a.layers, int(st->num_layers()));
      const torch::Tensor& tokens = s == Stack::Encoder ? batch.src : batch.tgt_in;
      ctx.masks[int(s)] = tokens.ne(batch.pad_id);
    }
  }

  TransformerStackImpl* stack(Stack s) {
    TransformerModelImpl& model = ctx.model;
    if (s == Stack::Encoder) return model.encoder ? model.encoder.get() : nullptr;
    return model.decoder.get();
  }

  // ---- ActivationObserver: the points of a training pass or a probe pass, to every probe ----
  void on_layer_input(const LayerId& id, const torch::Tensor& in) override {
    if (!ctx.is_selected(id)) return;
    for (auto& p : probes) p->on_layer_input(ctx, id, in);
  }
  void on_layer_output(const LayerId& id, const torch::Tensor& out) override {
    if (!ctx.is_selected(id)) return;
    if (ctx.pass == Pass::ProbeBatch) current.layer_out[{int(id.stack), id.index}] = out.detach();
    for (auto& p : probes) p->on_layer_output(ctx, id, out);
  }
  void on_norm(const LayerId& id, int norm_id, const torch::Tensor& in,
               const torch::Tensor& out) override {
    if (!ctx.is_selected(id)) return;
    const std::string& name =
        stack(id.stack)->layer(size_t(id.index)).norm_names().at(size_t(norm_id));
    for (auto& p : probes) p->on_norm(ctx, id, name, in, out);
  }
  void on_ffn_activation(const LayerId& id, const torch::Tensor& act) override {
    if (!ctx.is_selected(id)) return;
    for (auto& p : probes) p->on_ffn_activation(ctx, id, act);
  }
  bool wants_attention(const LayerId& id) const override {
    return attention && ctx.pass == Pass::ProbeBatch && ctx.is_selected(id);
  }
  void on_attention(const LayerId& id, Sublayer s, const AttentionScores& scores) override {
    for (auto& p : probes)
      if (p->watches_attention()) p->on_attention(ctx, id, s, scores);
  }

  // One forward pass of the probe batch; the records probes emit during it wait in
  // ctx.pass_records.
  ProbePass probe_pass() {
    TransformerModelImpl& model = ctx.model;
    const bool was_training = model.is_training();
    model.eval();
    // The scheme's state is read, never advanced: it is the state of the last training forward
    // (BranchNorm's α_u at update u). Advancing it here changed BranchNorm's results (issue 12.1).
    torch::NoGradGuard no_grad;
    current = ProbePass{};
    ctx.pass_records.clear();
    ctx.pass = Pass::ProbeBatch;
    model.set_observer(this);
    torch::Tensor logits;
    try {
      logits = batch.src.defined() ? model.forward(batch.src, batch.tgt_in)
                                   : model.forward_lm(batch.tgt_in);
    } catch (...) {
      model.set_observer(nullptr);
      ctx.pass = Pass::Training;
      throw;
    }
    model.set_observer(nullptr);
    ctx.pass = Pass::Training;
    if (was_training) model.train();
    current.logits = logits.detach();
    return std::move(current);
  }

  // The records of a probe pass: those emitted during it, then each probe's reading of it.
  void pass_records(const ProbePass& pass) {
    for (const Record& r : ctx.pass_records) log->write(r);
    ctx.pass_records.clear();
    for (auto& p : probes) p->on_probe_pass(ctx, pass);
  }
};

ProbeSession::ProbeSession(const AnalysisSection& a, int64_t max_updates,
                           TransformerModelImpl& model, ProbeBatch batch, const fs::path& run_dir)
    : impl_(std::make_unique<Impl>(a, max_updates, model, std::move(batch), run_dir)) {
  Impl& m = *impl_;
  m.formats = RecordFormats{a.writes("csv"), a.writes("jsonl"), a.writes("tensorboard")};
  if (!m.plan.any()) return;
  // F(x, θ_0), the reference of every later ‖ΔF‖: measured again by a resumed run (its model is
  // initialized from the same seed before the checkpoint is loaded), so no file keeps it.
  m.reference = m.probe_pass();
  for (auto& p : m.probes) p->on_reference(m.ctx, m.reference);
}

ProbeSession::ProbeSession(const AnalysisSection& a, int64_t max_updates,
                           TransformerModelImpl& model, ProbeBatch batch, const fs::path& run_dir,
                           int64_t resume_update)
    : ProbeSession(a, max_updates, model, std::move(batch), run_dir) {
  start(resume_update);
}

void ProbeSession::start(int64_t resume_update) {
  Impl& m = *impl_;
  if (!m.plan.any()) return;
  m.log = std::make_unique<MetricLog>(m.dir, m.formats, resume_update);
  m.ctx.log = m.log.get();
  m.ctx.update = resume_update;
  if (resume_update > 0) {  // update 0's records are in the files already
    m.ctx.pass_records.clear();
    m.reference = ProbePass{};
    return;
  }
  // Update 0: the initialization's records, from the forward pass that measured the reference.
  m.pass_records(m.reference);
  m.reference = ProbePass{};  // probes that need it kept their copy (on_reference)
  for (auto& p : m.probes) p->on_start(m.ctx);
  m.log->flush();
}

ProbeSession::~ProbeSession() = default;

bool ProbeSession::enabled() const { return impl_->plan.any(); }

bool ProbeSession::watches(int64_t u) const { return impl_->plan.due(u); }

void ProbeSession::before_forward(int64_t u) {
  Impl& m = *impl_;
  m.ctx.update = u;
  if (!m.plan.due(u)) return;
  bool watched = false;
  for (auto& p : m.probes) {
    p->before_forward(m.ctx);
    watched = watched || p->watches_training_pass();
  }
  if (watched) {
    m.ctx.model.set_observer(&m);
    m.watching = true;
  }
}

void ProbeSession::after_backward(int64_t u) {
  Impl& m = *impl_;
  if (m.watching) {
    m.ctx.model.set_observer(nullptr);
    m.watching = false;
  }
  if (!m.plan.due(u)) return;
  m.ctx.update = u;
  for (auto& p : m.probes) p->after_backward(m.ctx);
}

void ProbeSession::record_total_grad_norm(int64_t u, double norm) {
  Impl& m = *impl_;
  if (!m.plan.due(u)) return;
  m.ctx.update = u;
  for (auto& p : m.probes) p->on_grad_norm(m.ctx, norm);
}

void ProbeSession::before_step(int64_t u) {
  Impl& m = *impl_;
  if (!m.plan.due(u)) return;
  m.ctx.update = u;
  for (auto& p : m.probes) p->before_step(m.ctx);
}

void ProbeSession::after_step(int64_t u) {
  Impl& m = *impl_;
  if (!m.plan.due(u)) return;
  m.ctx.update = u;
  for (auto& p : m.probes) p->after_step(m.ctx);
  const bool pass = std::any_of(m.probes.begin(), m.probes.end(),
                                [&](const auto& p) { return p->needs_probe_pass(m.ctx); });
  if (pass) m.pass_records(m.probe_pass());
  m.log->flush();
}

void ProbeSession::scalar(const std::string& tag, int64_t step, double value) {
  if (impl_->log) impl_->log->scalar(tag, step, value);
}

}  // namespace normlab::analysis
