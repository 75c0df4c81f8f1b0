// Writing a probe: a class derived from Probe in one file of analysis/src/probes/ (or of any
// target linked with libnormlab), registered with one NORMLAB_PROBE line. The session (probes.h)
// calls it at the points of a due update, gives it the model, its parameters and the fixed probe
// batch, and writes what it emits to the run's records (docs/analysis.md, "Write a probe").
#pragma once

#include <torch/types.h>

#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "normlab/analysis/metric_log.h"
#include "normlab/model/observer.h"

namespace normlab {
class TransformerModelImpl;
}  // namespace normlab

namespace normlab::analysis {

struct ProbePlan;

// Where a parameter belongs, from its stable name ("decoder.layers.7.cross_attn.v_proj.weight"):
// stack encoder | decoder | model; layer −1 outside the layers; sublayer self_attn, cross_attn,
// ffn, a norm by name, "extra" (a scheme's own layer parameter), embeddings, final_norm, output.
struct ParamSlot {
  std::string stack;
  int layer = -1;
  std::string sublayer;
};
ParamSlot slot_of(const std::string& name);

struct ProbedParam {
  std::string name;
  torch::Tensor value;
  ParamSlot slot;
};

// Which forward pass the observer points of a probe come from.
enum class Pass {
  Training,    // the last batch's forward of a due update (tensors carry gradients: hooks go here)
  ProbeBatch,  // the fixed probe batch, eval mode, no gradients
};

// One forward pass of the probe batch: the logits and the outputs of the selected layers.
struct ProbePass {
  torch::Tensor logits;
  std::map<std::pair<int, int>, torch::Tensor> layer_out;  // (int(Stack), layer) → [B,T,D]
};

// What every probe sees. Records carry `update`: u after u optimizer steps, 0 the initialization.
class ProbeContext {
 public:
  ProbeContext(TransformerModelImpl& model, const ProbePlan& plan) : model(model), plan(plan) {}

  TransformerModelImpl& model;
  const ProbePlan& plan;
  int64_t update = 0;
  Pass pass = Pass::Training;
  std::vector<ProbedParam> params;           // the model's parameters, in model order
  std::map<int, std::vector<int>> selected;  // int(Stack) → its layers chosen by analysis.layers
  std::map<int, torch::Tensor>
      masks;  // int(Stack) → [B,T] non-padding positions of the probe batch

  bool is_selected(const LayerId& id) const;
  // One record of this update. Records emitted during a probe pass are written with the pass's
  // other records (a resumed run's reference pass writes none).
  void emit(const std::string& metric, const std::string& stack, int layer,
            const std::string& sublayer, double value);
  void write(const Record& r);

  // The session's side.
  MetricLog* log = nullptr;
  std::vector<Record> pass_records;
};

// A probe. Every method has a default that does nothing; the session calls them, for a due
// update u (ProbePlan::due), in this order: before_forward, the observer points of the training
// pass (when watches_training_pass), after_backward, on_grad_norm, before_step, (the optimizer
// step), after_step, then — when any probe needs_probe_pass(u) — the observer points of the probe
// pass and on_probe_pass.
class Probe {
 public:
  virtual ~Probe() = default;

  // The probe pass at θ_0, once per session (also in a resumed run, before its checkpoint is
  // loaded): the reference of a quantity measured against the initialization.
  virtual void on_reference(ProbeContext&, const ProbePass&) {}
  // A fresh run's update 0, after its probe-pass records (the initialization's state).
  virtual void on_start(ProbeContext&) {}

  virtual void before_forward(ProbeContext&) {}
  // Whether the observer points below should run during a due update's training forward.
  virtual bool watches_training_pass() const { return false; }
  virtual void on_layer_input(ProbeContext&, const LayerId&, const torch::Tensor& /*in*/) {}
  virtual void on_layer_output(ProbeContext&, const LayerId&, const torch::Tensor& /*out*/) {}
  virtual void on_norm(ProbeContext&, const LayerId&, const std::string& /*norm*/,
                       const torch::Tensor& /*in*/, const torch::Tensor& /*out*/) {}
  virtual void on_ffn_activation(ProbeContext&, const LayerId&, const torch::Tensor& /*act*/) {}
  // Whether on_attention should get each selected layer's attention scores in the probe pass
  // (observer.h: q and k as the softmax sees them); keeping them costs nothing elsewhere.
  virtual bool watches_attention() const { return false; }
  // Self- or cross-attention `s` of layer `id` in the probe pass.
  virtual void on_attention(ProbeContext&, const LayerId&, Sublayer /*s*/, const AttentionScores&) {
  }
  // Parameter gradients complete (unscaled), before clipping.
  virtual void after_backward(ProbeContext&) {}
  virtual void on_grad_norm(ProbeContext&, double /*total_before_clipping*/) {}
  virtual void before_step(ProbeContext&) {}
  virtual void after_step(ProbeContext&) {}
  // Whether this update (ctx.update) needs a forward pass of the probe batch after its step.
  virtual bool needs_probe_pass(const ProbeContext&) const { return false; }
  // After a probe pass (also at update 0, on the reference pass); any probe may read it.
  virtual void on_probe_pass(ProbeContext&, const ProbePass&) {}
};

using ProbeFactory = std::function<std::unique_ptr<Probe>()>;
// Registers a probe under the name [analysis] probes selects it by ("all" selects every one);
// returns true, for a static initializer. Throws std::logic_error for a name taken twice.
bool register_probe(const std::string& name, ProbeFactory make);
// Every registered name, sorted (the session calls its probes in this order).
std::vector<std::string> probe_names();
// nullptr for a name nobody registered.
std::unique_ptr<Probe> make_probe(const std::string& name);

// Helpers shared by the probes.
const char* stack_name(Stack s);
// Mean over the non-padding positions of a per-position value [B,T].
double masked_mean(const torch::Tensor& per_position, const torch::Tensor& mask);
// One head's attention logits scale·q·kᵀ [B,Tq,Tk] (float, or double for double q), before any
// soft-cap and mask.
torch::Tensor attention_logits(const AttentionScores& a, int64_t head);
// The keys each query of one head may attend to, [B,Tq,Tk] bool: allowed by the attention's mask
// (finite) and, for a causal one, not after the query.
torch::Tensor attention_allowed(const AttentionScores& a, int64_t head);
// ‖t‖² of each tensor in one pass (one host transfer); −1 where undefined.
std::vector<double> squared_norms(const std::vector<torch::Tensor>& ts);
// Groups per-parameter squared norms (ctx.params order; < 0: skipped) into (stack, layer,
// sublayer), (stack, layer, "all") and, with `total`, model/-1/total, and emits the square root
// of each group — divided by the group's norm of `denominators` when given (then parameters
// outside layers are grouped by sublayer, layer parameters only as "all").
void emit_grouped(ProbeContext& ctx, const std::string& metric, const std::vector<double>& sq,
                  const std::vector<double>* denominators, bool total);

}  // namespace normlab::analysis

// One line registers a probe class (default-constructible) under `name`.
#define NORMLAB_PROBE(name, Class)                                                          \
  static const bool normlab_probe_registered_##Class = ::normlab::analysis::register_probe( \
      name, [] { return std::unique_ptr<::normlab::analysis::Probe>(new Class()); })
