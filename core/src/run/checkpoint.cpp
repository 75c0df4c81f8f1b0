#include "run/checkpoint.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <cmath>
#include <cstring>
#include <map>
#include <nlohmann/json.hpp>

#include "run/lr_schedule_record.h"
#include "run/optimizer.h"
#include "torch_compat.h"
#include "util/safetensors.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace normlab {
namespace {

// __metadata__.format of the two kinds of file, and the layout version of the checkpoint.
constexpr const char* kCheckpointFormat = "normlab.checkpoint";
constexpr const char* kSchemeStateFormat = "normlab.scheme_state";
constexpr const char* kLayoutVersion = "1";

CheckpointFormatError error(const fs::path& path, const std::string& what) {
  return CheckpointFormatError(fmt::format("checkpoint {}: {}", path.string(), what));
}

// Opens a file of normlab's format `format`; an old TorchScript archive is refused unread.
util::SafetensorsReader open_checked(const fs::path& path, const char* format) {
  if (const std::string kind = file_kind_problem(path); !kind.empty()) throw error(path, kind);
  if (util::is_zip_archive(path))
    throw error(
        path,
        "is a TorchScript/torch.save archive (normlab's checkpoints before the safetensors "
        "format); "
        "loading one can run code stored in it, so normlab does not read it. If you trust where it "
        "came from, convert its run: normlab checkpoint convert RUN --trust-code");
  try {
    util::SafetensorsReader r(path);
    const auto it = r.metadata().find("format");
    if (it == r.metadata().end() || it->second != format)
      throw error(path,
                  fmt::format("a safetensors file, but not a {} file (__metadata__.format is '{}')",
                              format, it == r.metadata().end() ? "" : it->second));
    if (r.metadata().count("layout") && r.meta("layout") != kLayoutVersion)
      throw error(path, fmt::format("layout version {} is not the {} this normlab reads",
                                    r.meta("layout"), kLayoutVersion));
    return r;
  } catch (const util::TensorFileError& e) {
    throw CheckpointFormatError(fmt::format("checkpoint {}", e.what()));
  }
}

std::string describe(at::ScalarType t, const std::vector<int64_t>& shape) {
  return fmt::format("{} {}", util::safetensors_dtype_name(t), util::shape_text(shape));
}

// The file's tensors named prefix + name must be exactly `want`'s names, dtypes and shapes.
// Otherwise one line with the first differences: the checkpoint is of another model.
void check_matches(const util::SafetensorsReader& r, const std::string& prefix,
                   const NamedTensors& want, const char* what) {
  std::vector<std::string> problems;
  std::map<std::string, bool> expected;
  for (const auto& [name, t] : want) {
    expected[prefix + name] = true;
    const auto it = r.entries().find(prefix + name);
    if (it == r.entries().end()) {
      problems.push_back(fmt::format("{}{} missing (this run: {})", prefix, name,
                                     describe(t.scalar_type(), t.sizes().vec())));
    } else if (it->second.dtype != t.scalar_type() || it->second.shape != t.sizes().vec()) {
      problems.push_back(fmt::format("{}{} is {} in the checkpoint, {} in this run", prefix, name,
                                     describe(it->second.dtype, it->second.shape),
                                     describe(t.scalar_type(), t.sizes().vec())));
    }
  }
  for (const auto& [name, e] : r.entries())
    if (name.rfind(prefix, 0) == 0 && !expected.count(name))
      problems.push_back(fmt::format("{} is not in this run's {}", name, what));
  if (problems.empty()) return;
  std::string text;
  for (size_t i = 0; i < problems.size() && i < 3; ++i) text += (i ? "; " : "") + problems[i];
  if (problems.size() > 3) text += fmt::format("; and {} more", problems.size() - 3);
  throw error(r.path(),
              fmt::format("holds another {} ({} difference(s)): {}", what, problems.size(), text));
}

// What makes two models different beyond their tensors' shapes (a 4-head and a 2-head model have
// the same ones): written into each checkpoint, compared on load.
json model_identity(const TransformerModelImpl& model) {
  const ModelConfig& c = model.config();
  json id = {{"arch", to_string(c.arch)},
             {"d_model", c.d_model},
             {"ffn_dim", c.ffn_dim},
             {"heads", c.heads},
             {"enc_layers", c.enc_layers},
             {"dec_layers", c.dec_layers},
             {"src_vocab", c.src_vocab},
             {"tgt_vocab", c.tgt_vocab},
             {"sharing", int(c.sharing)},
             {"norm", to_string(c.norm.kind)},
             {"scheme", model.scheme_name()},
             // What else changes the function (issue 42.5): the scheme's version and every
             // parameter, and the norms' ε.
             {"scheme_version", model.scheme_handle().version},
             {"scheme_params", model.scheme_handle().params},
             {"norm_eps", c.norm.eps}};
  if (c.family != Family::Transformer) {  // absent in a Transformer checkpoint (written before
                                          // families existed)
    id["family"] = to_string(c.family);
    id["kv_heads"] = c.kv_head_count();
    id["rope_theta"] = c.rope_theta;
  }
  // Issue 67.1's interventions, where on (absent in checkpoints written without them).
  if (c.qk_norm != QkNorm::None) {
    id["qk_norm"] = c.qk_norm == QkNorm::RMS ? "rms" : "layer";
    id["qk_norm_scope"] = c.qk_norm_all ? "all" : "head";
  }
  if (c.attn_logit_softcap > 0) id["attn_logit_softcap"] = c.attn_logit_softcap;
  if (c.final_logit_softcap > 0) id["final_logit_softcap"] = c.final_logit_softcap;
  return id;
}

// Identity keys present only where a model uses them: a checkpoint holding one that this run
// lacks was saved with the intervention on.
constexpr const char* kOptionalIdentityKeys[] = {"qk_norm", "qk_norm_scope", "attn_logit_softcap",
                                                 "final_logit_softcap"};

void check_identity(const util::SafetensorsReader& r, const TransformerModelImpl& model) {
  const auto it = r.metadata().find("model");
  if (it == r.metadata().end())
    throw error(r.path(), "__metadata__ lacks 'model' (the model it was saved from)");
  const json saved = json::parse(it->second, nullptr, /*allow_exceptions=*/false);
  if (!saved.is_object()) throw error(r.path(), "__metadata__.model is not a JSON object");
  std::vector<std::string> diffs;
  const json current = model_identity(model);
  for (const auto& [key, now] : current.items()) {
    const auto s = saved.find(key);
    if (s == saved.end() || *s != now)
      diffs.push_back(fmt::format("{} {} in the checkpoint, {} in this run", key,
                                  s == saved.end() ? "absent" : s->dump(), now.dump()));
  }
  for (const char* key : kOptionalIdentityKeys)
    if (saved.find(key) != saved.end() && current.find(key) == current.end())
      diffs.push_back(
          fmt::format("{} {} in the checkpoint, absent (off) in this run", key, saved[key].dump()));
  if (!diffs.empty())
    throw error(r.path(), fmt::format("was saved from another model: {}", fmt::join(diffs, "; ")));
}

NamedTensors model_tensors(TransformerModelImpl& model) {
  NamedTensors out;
  for (const auto& list : {model.named_parameters(), model.named_buffers()})
    for (const auto& item : list) out.emplace_back(item.key(), item.value());
  return out;
}

// Copies the file's prefix + name tensors into `into` (in place: FlatAdamW's views stay views).
void copy_into(util::SafetensorsReader& r, const std::string& prefix, const NamedTensors& into) {
  torch::NoGradGuard no_grad;
  for (const auto& [name, t] : into) t.copy_(r.read(prefix + name));
}

NamedTensors read_prefixed(util::SafetensorsReader& r, const std::string& prefix) {
  NamedTensors out;
  for (const auto& [name, e] : r.entries())
    if (name.rfind(prefix, 0) == 0) out.emplace_back(name.substr(prefix.size()), r.read(name));
  return out;
}

// A scheme whose state exists from construction (BranchNorm's clock) must get the same names,
// dtypes and shapes; one whose state appears later (Admin's profile) checks it in load_state.
void load_scheme_entries(util::SafetensorsReader& r, const std::string& prefix,
                         TransformerModelImpl& model) {
  const NamedTensors now = model.scheme().state();
  if (!now.empty()) check_matches(r, prefix, now, "scheme state");
  try {
    model.scheme().load_state(read_prefixed(r, prefix));
  } catch (const c10::Error& e) {
    throw error(r.path(), fmt::format("scheme state rejected ({})", e.what_without_backtrace()));
  }
}

// The parameters' AdamW state, by parameter name; empty before the first update.
struct Moments {
  NamedTensors exp_avg, exp_avg_sq;
  int64_t step = 0;
};

Moments optimizer_moments(TransformerModelImpl& model, FlatAdamW& optimizer) {
  Moments m;
  for (const auto& item : model.named_parameters()) {
    const auto it = optimizer.state().find(compat::optimizer_state_key(item.value()));
    if (it == optimizer.state().end()) continue;
    const auto& st = static_cast<const torch::optim::AdamWParamState&>(*it->second);
    m.exp_avg.emplace_back(item.key(), st.exp_avg());
    m.exp_avg_sq.emplace_back(item.key(), st.exp_avg_sq());
    m.step = st.step();
  }
  return m;
}

NamedTensors parameters(TransformerModelImpl& model) {
  NamedTensors params;
  for (const auto& item : model.named_parameters()) params.emplace_back(item.key(), item.value());
  return params;
}

// False for a checkpoint saved before the first update (the optimizer then starts fresh, as it
// did).
bool check_moments(const util::SafetensorsReader& r, TransformerModelImpl& model) {
  bool any = false;
  for (const auto& [name, e] : r.entries()) any = any || name.rfind("optimizer/", 0) == 0;
  if (!any) return false;
  const NamedTensors params = parameters(model);
  // One prefix at a time, so a stray optimizer/x/… is named too.
  check_matches(r, "optimizer/exp_avg/", params, "model (optimizer moments)");
  check_matches(r, "optimizer/exp_avg_sq/", params, "model (optimizer moments)");
  for (const auto& [name, e] : r.entries())
    if (name.rfind("optimizer/", 0) == 0 && name.rfind("optimizer/exp_avg/", 0) != 0 &&
        name.rfind("optimizer/exp_avg_sq/", 0) != 0)
      throw error(r.path(), fmt::format("{} is not an AdamW moment", name));
  return true;
}

void load_moments(util::SafetensorsReader& r, TransformerModelImpl& model, FlatAdamW& optimizer,
                  int64_t step, const torch::Device& device) {
  const NamedTensors params = parameters(model);
  for (const auto& [name, p] : params) {
    auto st = std::make_unique<torch::optim::AdamWParamState>();
    st->step(step);
    st->exp_avg(r.read("optimizer/exp_avg/" + name).to(device));
    st->exp_avg_sq(r.read("optimizer/exp_avg_sq/" + name).to(device));
    optimizer.state()[compat::optimizer_state_key(p)] = std::move(st);
  }
  optimizer.moments_replaced();
}

json state_json(const TrainingState& s, int64_t optimizer_step) {
  json j = {{"updates", s.updates},
            {"epoch", s.epoch},
            {"batch_index", s.batch_index},
            {"best_valid_bleu", s.best_valid_bleu},
            {"elapsed_s", s.elapsed_s},
            {"stale_validations", s.stale_validations},
            {"world_size", s.world_size},
            {"global_batches", s.global_batches},
            {"optimizer_step", optimizer_step}};
  // JSON has no infinity: no best validation yet is null.
  j["best_valid_nll"] = std::isfinite(s.best_valid_nll) ? json(s.best_valid_nll) : json(nullptr);
  if (s.loss_scale > 0) {
    j["loss_scale"] = s.loss_scale;
    j["loss_scale_good_steps"] = s.loss_scale_good_steps;
  }
  if (s.tokens >= 0) j["tokens"] = s.tokens;
  const IntervalProgress& iv = s.interval;
  if (iv.updates > 0 || iv.overflows > 0)
    j["log_interval"] = {{"updates", iv.updates}, {"tokens", iv.tokens},
                         {"clipped", iv.clipped}, {"overflows", iv.overflows},
                         {"loss", iv.loss},       {"nll", iv.nll},
                         {"gnorm", iv.gnorm},     {"lr", iv.lr},
                         {"seconds", iv.seconds}, {"allreduce_seconds", iv.allreduce_seconds}};
  return j;
}

struct ParsedState {
  TrainingState st;
  int64_t optimizer_step = 0;
};

ParsedState parse_state(const util::SafetensorsReader& r) {
  const fs::path& path = r.path();
  const json j = r.metadata().count("training_state")
                     ? json::parse(r.meta("training_state"), nullptr, /*allow_exceptions=*/false)
                     : json();
  if (!j.is_object()) throw error(path, "__metadata__.training_state is not a JSON object");
  // Every counter is bounded (issue 42.4: global_batches = 2^62 hung a resume, updates = 10^18
  // was believed): a bound here is far beyond any real run, the run-dependent ones are in
  // check_resume_state.
  auto count = [&](const char* key, int64_t most) -> int64_t {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number_integer() || it->get<int64_t>() < 0 ||
        it->get<int64_t>() > most)
      throw error(path, fmt::format("training_state.{}: expected an integer from 0 to {}, got {}",
                                    key, most, it == j.end() ? "nothing" : it->dump()));
    return it->get<int64_t>();
  };
  auto number = [&](const char* key, double least, double most) -> double {
    const auto it = j.find(key);
    if (it == j.end() || !it->is_number() || !(it->get<double>() >= least) ||
        !(it->get<double>() <= most))
      throw error(path, fmt::format("training_state.{}: expected a number from {} to {}, got {}",
                                    key, least, most, it == j.end() ? "nothing" : it->dump()));
    return it->get<double>();
  };
  ParsedState p;
  p.st.updates = count("updates", kMaxCheckpointUpdates);
  const int64_t updates = p.st.updates;
  p.st.epoch = count("epoch", updates * kMaxGlobalBatches);
  p.st.batch_index = count("batch_index", updates * kMaxGlobalBatches);
  p.st.stale_validations = count("stale_validations", updates);
  p.st.tokens = j.contains("tokens") ? count("tokens", int64_t(1) << 62) : -1;
  if (j.contains("world_size"))
    p.st.world_size = std::max<int64_t>(count("world_size", kMaxWorldSize), 1);
  if (j.contains("global_batches")) {
    p.st.global_batches = count("global_batches", kMaxGlobalBatches);
    if (p.st.global_batches > 0 && p.st.global_batches % p.st.world_size != 0)
      throw error(path, fmt::format("training_state.global_batches {} is not a multiple of its "
                                    "world_size {} (each rank takes an equal share)",
                                    p.st.global_batches, p.st.world_size));
  }
  p.optimizer_step = count("optimizer_step", updates);
  p.st.elapsed_s = number("elapsed_s", 0, 1e12);
  // A perfect corpus is exp(4·ln 100 / 4) = 100.00000000000004 in doubles, as in sacreBLEU: a
  // margin far below any real difference keeps a run's own checkpoints readable.
  p.st.best_valid_bleu = number("best_valid_bleu", -1, 100 + 1e-9);
  if (p.st.best_valid_bleu < 0 && p.st.best_valid_bleu != -1)
    throw error(path, fmt::format("training_state.best_valid_bleu: expected -1 (none yet) or a "
                                  "score from 0 to 100, got {}",
                                  p.st.best_valid_bleu));
  const auto nll = j.find("best_valid_nll");
  if (nll == j.end() || !(nll->is_null() || nll->is_number()) ||
      (nll->is_number() && !(nll->get<double>() >= 0 && std::isfinite(nll->get<double>()))))
    throw error(path, "training_state.best_valid_nll: expected a finite number ≥ 0 or null");
  p.st.best_valid_nll =
      nll->is_null() ? std::numeric_limits<double>::infinity() : nll->get<double>();
  if (j.contains("loss_scale")) {
    p.st.loss_scale = number("loss_scale", std::numeric_limits<double>::min(), 0x1p64);
    p.st.loss_scale_good_steps = count("loss_scale_good_steps", updates);
  }
  if (j.contains("log_interval")) {
    const json& l = j["log_interval"];
    if (!l.is_object()) throw error(path, "training_state.log_interval: expected a JSON object");
    auto sub_count = [&](const char* key, int64_t most) -> int64_t {
      const auto it = l.find(key);
      if (it == l.end() || !it->is_number_integer() || it->get<int64_t>() < 0 ||
          it->get<int64_t>() > most)
        throw error(path, fmt::format("training_state.log_interval.{}: expected an integer from 0 "
                                      "to {}",
                                      key, most));
      return it->get<int64_t>();
    };
    auto sub_number = [&](const char* key) -> double {
      const auto it = l.find(key);
      if (it == l.end() || !it->is_number() || !std::isfinite(it->get<double>()))
        throw error(path,
                    fmt::format("training_state.log_interval.{}: expected a finite number", key));
      return it->get<double>();
    };
    IntervalProgress& iv = p.st.interval;
    iv.updates = sub_count("updates", updates);
    iv.tokens = sub_count("tokens", std::numeric_limits<int64_t>::max());
    iv.clipped = sub_count("clipped", iv.updates);
    iv.overflows = sub_count("overflows", std::numeric_limits<int32_t>::max());
    iv.loss = sub_number("loss"), iv.nll = sub_number("nll"), iv.gnorm = sub_number("gnorm");
    iv.lr = sub_number("lr"), iv.seconds = sub_number("seconds");
    iv.allreduce_seconds = sub_number("allreduce_seconds");
  }
  if (r.metadata().count("data")) {  // absent in checkpoints before issue 56.4
    const json d = json::parse(r.meta("data"), nullptr, /*allow_exceptions=*/false);
    if (!d.is_object()) throw error(path, "__metadata__.data is not a JSON object");
    p.st.data_identity = d.dump();
  }
  if (r.metadata().count("lr_schedule")) {  // absent in checkpoints before issue 66.2
    try {
      schedule_from_record(r.meta("lr_schedule"), OptimSection());
    } catch (const std::invalid_argument& e) {
      throw error(path, fmt::format("__metadata__.lr_schedule: {}", e.what()));
    }
    p.st.lr_schedule = r.meta("lr_schedule");
  }
  // Absent in checkpoints before env.json's segments. Only a resume uses it, and checks it there:
  // a reader of the weights (eval, export) never refuses a checkpoint for it.
  if (r.metadata().count("segment")) p.st.segment = r.meta("segment").substr(0, 64);
  if (r.metadata().count("batching")) p.st.batching = r.meta("batching");
  if (r.metadata().count("validation")) p.st.validation = r.meta("validation");
  return p;
}

// The device the model's weights are on (its GPU's generator is the one dropout draws from).
torch::Device model_device(TransformerModelImpl& model) {
  const auto params = model.parameters();
  return params.empty() ? torch::Device(torch::kCPU) : params.front().device();
}

// A generator state of another size or dtype than this build's generator is refused by name,
// before LibTorch sees it.
void check_rng_entry(const util::SafetensorsReader& r, const std::string& name,
                     const at::Tensor& now) {
  const auto& e = r.entries().at(name);
  if (e.dtype != now.scalar_type() || e.shape != now.sizes().vec())
    throw error(
        r.path(),
        fmt::format("{} is {} in the checkpoint, this build's generator state is {}", name,
                    describe(e.dtype, e.shape), describe(now.scalar_type(), now.sizes().vec())));
}

void restore_rng(util::SafetensorsReader& r, const torch::Device& device) {
  if (!r.has("rng/cpu")) throw error(r.path(), "no tensor 'rng/cpu' (the CPU generator's state)");
  check_rng_entry(r, "rng/cpu", compat::cpu_rng_state());
  if (r.has("rng/cuda")) {
    const at::Tensor now = compat::cuda_rng_state(device);
    if (now.defined()) check_rng_entry(r, "rng/cuda", now);
  }
  try {
    compat::set_cpu_rng_state(r.read("rng/cpu"));
    if (r.has("rng/cuda")) compat::set_cuda_rng_state(device, r.read("rng/cuda"));
  } catch (const c10::Error& e) {
    throw error(r.path(), fmt::format("generator state rejected ({})", e.what_without_backtrace()));
  }
}

}  // namespace

bool same_training_point(const TrainingState& a, const TrainingState& b) {
  TrainingState x = a;
  x.elapsed_s = b.elapsed_s;
  return state_json(x, 0) == state_json(b, 0);
}

CheckpointContents checkpoint_contents(TransformerModelImpl& model, FlatAdamW& optimizer,
                                       const TrainingState& state) {
  CheckpointContents c;
  util::TensorList& tensors = c.tensors;
  for (const auto& [name, t] : model_tensors(model)) tensors.emplace_back("model/" + name, t);
  const Moments m = optimizer_moments(model, optimizer);
  for (const auto& [name, t] : m.exp_avg) tensors.emplace_back("optimizer/exp_avg/" + name, t);
  for (const auto& [name, t] : m.exp_avg_sq)
    tensors.emplace_back("optimizer/exp_avg_sq/" + name, t);
  for (const auto& [name, t] : model.scheme().state()) tensors.emplace_back("scheme/" + name, t);
  tensors.emplace_back("rng/cpu", compat::cpu_rng_state());
  if (auto cuda_rng = compat::cuda_rng_state(model_device(model)); cuda_rng.defined())
    tensors.emplace_back("rng/cuda", cuda_rng);
  c.metadata = {{"format", kCheckpointFormat},
                {"layout", kLayoutVersion},
                {"model", model_identity(model).dump()},
                {"training_state", state_json(state, m.step).dump()}};
  if (!state.data_identity.empty()) c.metadata["data"] = state.data_identity;
  if (!state.lr_schedule.empty()) c.metadata["lr_schedule"] = state.lr_schedule;
  if (!state.segment.empty()) c.metadata["segment"] = state.segment;
  if (!state.batching.empty()) c.metadata["batching"] = state.batching;
  if (!state.validation.empty()) c.metadata["validation"] = state.validation;
  return c;
}

void take_checkpoint_snapshot(CheckpointContents& snapshot, TransformerModelImpl& model,
                              FlatAdamW& optimizer, const TrainingState& state) {
  CheckpointContents now = checkpoint_contents(model, optimizer, state);
  std::map<std::string, at::Tensor> kept;
  for (auto& [name, t] : snapshot.tensors) kept.emplace(name, t);
  for (auto& [name, view] : now.tensors) {
    const at::Tensor src = view.detach();
    at::Tensor buffer;
    if (auto it = kept.find(name); it != kept.end() &&
                                   it->second.scalar_type() == src.scalar_type() &&
                                   it->second.sizes() == src.sizes())
      buffer = it->second;
    else  // pinned host memory copies from a GPU at full speed
      buffer = at::empty(src.sizes(), src.options().device(at::kCPU).pinned_memory(src.is_cuda()));
    buffer.copy_(src);
    view = buffer;
  }
  snapshot = std::move(now);
}

std::vector<SnapshotBufferSpec> snapshot_buffer_specs(TransformerModelImpl& model) {
  std::vector<SnapshotBufferSpec> specs;
  for (const auto& [name, t] : model_tensors(model))
    specs.push_back({"model/" + name, t.scalar_type(), t.sizes().vec()});
  for (const char* moment : {"optimizer/exp_avg/", "optimizer/exp_avg_sq/"})
    for (const auto& item : model.named_parameters())
      if (item.value().requires_grad())
        specs.push_back(
            {moment + item.key(), item.value().scalar_type(), item.value().sizes().vec()});
  return specs;
}

void allocate_snapshot_buffers(CheckpointContents& snapshot,
                               const std::vector<SnapshotBufferSpec>& specs, bool pinned,
                               int64_t slab_bytes) {
  constexpr int64_t kAlign = 64;  // every buffer starts on a cache line
  auto bytes_of = [](const SnapshotBufferSpec& s) {
    return c10::multiply_integers(s.sizes) * int64_t(c10::elementSize(s.dtype));
  };
  auto padded_bytes = [&](const SnapshotBufferSpec& s) {
    return (bytes_of(s) + kAlign - 1) / kAlign * kAlign;
  };
  util::TensorList buffers;
  for (size_t first = 0; first < specs.size();) {
    // The specs from `first` that fit one slab, in order (at least one).
    size_t end = first;
    int64_t bytes = 0;
    while (end < specs.size() && (end == first || bytes + padded_bytes(specs[end]) <= slab_bytes))
      bytes += padded_bytes(specs[end++]);
    at::Tensor slab = at::empty({std::max<int64_t>(bytes, 1)},
                                at::TensorOptions(at::kByte).pinned_memory(pinned));
    if (!pinned)  // one thread, no ATen parallelism: the training loop keeps its cores
      std::memset(slab.data_ptr(), 0, size_t(slab.nbytes()));
    int64_t offset = 0;
    for (size_t i = first; i < end; ++i) {
      const SnapshotBufferSpec& s = specs[i];
      buffers.emplace_back(s.name, slab.narrow(0, offset, bytes_of(s)).view(s.dtype).view(s.sizes));
      offset += padded_bytes(s);
    }
    first = end;
  }
  snapshot.tensors = std::move(buffers);
}

void write_checkpoint(util::AtomicFile& file, const CheckpointContents& contents) {
  util::write_safetensors(file, contents.tensors, contents.metadata);
}

void write_checkpoint(util::AtomicFile& file, TransformerModelImpl& model, FlatAdamW& optimizer,
                      const TrainingState& state) {
  write_checkpoint(file, checkpoint_contents(model, optimizer, state));
}

void check_resume_state(const fs::path& path, const TrainingState& st, int64_t max_updates,
                        int64_t epoch_batches) {
  if (st.updates > max_updates)
    throw error(path, fmt::format("training_state.updates {} is past this run's optim.max_updates "
                                  "{}; raise max_updates to continue it",
                                  st.updates, max_updates));
  const int64_t per_update = std::max<int64_t>(st.global_batches, 1);
  if (st.epoch > st.updates * per_update)
    throw error(path, fmt::format("training_state.epoch {} cannot be reached in {} updates of {} "
                                  "batches",
                                  st.epoch, st.updates, per_update));
  if (st.batch_index > epoch_batches)
    throw error(path,
                fmt::format("training_state.batch_index {} is past the {} batches of an epoch "
                            "of this run's data",
                            st.batch_index, epoch_batches));
}

TrainingState load_checkpoint(const fs::path& path, TransformerModelImpl& model,
                              FlatAdamW& optimizer, const torch::Device& device) {
  util::SafetensorsReader r = open_checked(path, kCheckpointFormat);
  const ParsedState parsed = parse_state(r);
  // Everything is checked before anything changes: a refused file leaves the model as it was.
  check_identity(r, model);
  const NamedTensors tensors = model_tensors(model);
  check_matches(r, "model/", tensors, "model");
  const bool has_moments = check_moments(r, model);
  try {
    copy_into(r, "model/", tensors);
    if (has_moments) load_moments(r, model, optimizer, parsed.optimizer_step, device);
    load_scheme_entries(r, "scheme/", model);
    restore_rng(r, model_device(model));
  } catch (const util::TensorFileError& e) {
    throw CheckpointFormatError(fmt::format("checkpoint {}", e.what()));
  }
  return parsed.st;
}

void load_model_weights(const fs::path& path, TransformerModelImpl& model) {
  util::SafetensorsReader r = open_checked(path, kCheckpointFormat);
  check_identity(r, model);
  const NamedTensors tensors = model_tensors(model);
  check_matches(r, "model/", tensors, "model");
  try {
    copy_into(r, "model/", tensors);
    load_scheme_entries(r, "scheme/", model);
  } catch (const util::TensorFileError& e) {
    throw CheckpointFormatError(fmt::format("checkpoint {}", e.what()));
  }
}

void check_checkpoint_header(const fs::path& path) {
  parse_state(open_checked(path, kCheckpointFormat));
}

int64_t checkpoint_updates(const fs::path& path) { return checkpoint_state(path).updates; }

void check_checkpoint_model(const fs::path& path, const TransformerModelImpl& model) {
  check_identity(open_checked(path, kCheckpointFormat), model);
}

TrainingState checkpoint_state(const fs::path& path) {
  return parse_state(open_checked(path, kCheckpointFormat)).st;
}

void save_scheme_state(const fs::path& path, const NamedTensors& state) {
  util::AtomicFile file(path);
  util::write_safetensors(file, state,
                          {{"format", kSchemeStateFormat}, {"layout", kLayoutVersion}});
  file.commit();
}

NamedTensors load_scheme_state(const fs::path& path) {
  util::SafetensorsReader r = open_checked(path, kSchemeStateFormat);
  try {
    return read_prefixed(r, "");
  } catch (const util::TensorFileError& e) {
    throw CheckpointFormatError(fmt::format("checkpoint {}", e.what()));
  }
}

// The lr schedule a checkpoint records (lr_schedule_record.h).
std::string lr_schedule_record(const OptimSection& o) {
  return nlohmann::json{{"lr", o.lr},
                        {"warmup_updates", o.warmup_updates},
                        {"lr_schedule", o.lr_schedule},
                        {"min_lr_ratio", o.min_lr_ratio},
                        {"max_updates", o.max_updates},
                        {"decay_updates", o.decay_updates},
                        {"decay_shape", o.decay_shape}}
      .dump();
}

OptimSection schedule_from_record(const std::string& record, OptimSection o) {
  const nlohmann::json j = nlohmann::json::parse(record, nullptr, /*allow_exceptions=*/false);
  if (!j.is_object()) throw std::invalid_argument("not a JSON object");
  auto field = [&](const char* key) -> const nlohmann::json& {
    if (!j.contains(key)) throw std::invalid_argument(fmt::format("no '{}'", key));
    return j.at(key);
  };
  auto number_of = [&](const char* key, double lo, double hi) {
    const nlohmann::json& v = field(key);
    if (!v.is_number() || !(v.get<double>() >= lo && v.get<double>() <= hi))
      throw std::invalid_argument(
          fmt::format("'{}' is {}, expected a number in [{}, {}]", key, v.dump(), lo, hi));
    return v.get<double>();
  };
  auto count_of = [&](const char* key) {
    const nlohmann::json& v = field(key);
    if (!v.is_number_integer() || v.get<int64_t>() < 0)
      throw std::invalid_argument(
          fmt::format("'{}' is {}, expected an integer of at least 0", key, v.dump()));
    return v.get<int64_t>();
  };
  auto name_of = [&](const char* key, std::vector<std::string> choices) {
    const nlohmann::json& v = field(key);
    if (!v.is_string() ||
        std::find(choices.begin(), choices.end(), v.get<std::string>()) == choices.end())
      throw std::invalid_argument(fmt::format("'{}' is {}, expected one of {}", key, v.dump(),
                                              nlohmann::json(choices).dump()));
    return v.get<std::string>();
  };
  o.lr = number_of("lr", 0, 10);
  o.warmup_updates = count_of("warmup_updates");
  o.lr_schedule =
      name_of("lr_schedule", {"inverse_sqrt", "constant", "cosine", "wsd", "wsd_hagele2024"});
  o.min_lr_ratio = number_of("min_lr_ratio", 0, 1);
  o.max_updates = count_of("max_updates");
  o.decay_updates = count_of("decay_updates");
  o.decay_shape = name_of("decay_shape", {"1-sqrt", "linear"});
  return o;
}

}  // namespace normlab
