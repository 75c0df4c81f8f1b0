#include "training_session.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <iostream>
#include <thread>

#include "run/build_info.h"
#include "memory_estimate.h"
#include "run/model_assembly.h"
#include "normlab/plugins/registry.h"
#include "run_recipe.h"

namespace fs = std::filesystem;

namespace normlab {
namespace {

// Tokens of the longest sequence a batch can hold (a side plus BOS), for the memory estimate.
int64_t longest_sequence(const data::Split& split) {
  size_t n = 0;
  for (const auto& ex : split.examples) n = std::max({n, ex.src.size(), ex.tgt.size()});
  return int64_t(n) + 1;
}

// Admin-style setup pass on the first training batch, once per run; its result is kept in the run
// directory and restored with every checkpoint (a resumed run restores it too: its observers see
// θ_0 before the checkpoint is loaded).
void scheme_setup_pass(TrainingSession& s) {
  const fs::path setup_path = s.run->path() / "scheme_setup.safetensors";
  if (!s.model->scheme().needs_setup_pass()) return;
  if (fs::exists(setup_path)) s.model->scheme().load_state(load_scheme_state(setup_path));
  if (s.resuming || !s.model->scheme().needs_setup_pass()) return;
  DeviceBatch b = to_device(s.train_plan->make(s.train_plan->epoch(0).at(0)), s.device);
  s.model->run_setup_pass([&] { forward(*s.model, b); });
  save_scheme_state(setup_path, s.model->scheme().state());
  fmt::print(s.out, "scheme setup pass done ({})\n", setup_path.string());
}

void resume(TrainingSession& s, const fs::path& from) {
  s.st = load_checkpoint(from, *s.model, *s.optimizer, s.device);
  if (s.st.loss_scale > 0) s.loss_scaler.restore(s.st.loss_scale, s.st.loss_scale_good_steps);
  fmt::print(s.out, "resuming {} at update {} (epoch {}, batch {}) from {}\n", s.run->path().string(), s.st.updates,
             s.st.epoch + 1, s.st.batch_index, from.string());
  // A branch (--resume-from an older checkpoint) becomes last.safetensors before the records after
  // it move aside, so a failure or kill before the branch's next checkpoint resumes the branch
  // again, never the abandoned last with a gap in train.jsonl.
  if (fs::absolute(from).lexically_normal() != fs::absolute(s.run->checkpoint("last.safetensors")).lexically_normal())
    s.save_last(/*with_step=*/false);
}

}  // namespace

double TrainingSession::eta_seconds() const {
  const double run_secs = std::chrono::duration<double>(Clock::now() - t_start).count();
  const double rate = double(st.updates - first_update) / std::max(run_secs, 1e-9);
  int64_t left = spec.optim.max_updates - st.updates;
  if (spec.optim.max_epochs > 0) {
    const int64_t per_epoch = int64_t(epoch_batches.size());
    left = std::min(left, (spec.optim.max_epochs - st.epoch) * per_epoch - st.batch_index);
  }
  return rate > 0 ? double(std::max<int64_t>(left, 0)) / rate : -1.0;
}

TrainingState TrainingSession::snapshot() const {
  TrainingState snap = st;
  snap.elapsed_s = elapsed();
  if (fp16) snap.loss_scale = loss_scaler.scale(), snap.loss_scale_good_steps = loss_scaler.good_steps();
  return snap;
}

void TrainingSession::save_last(bool with_step) {
  const TrainingState snap = snapshot();
  run->save_last(st.updates, with_step, spec.run.checkpoint_keep_last,
                 [&](util::AtomicFile& f) { write_checkpoint(f, *model, *optimizer, snap); });
  saved_at = st.updates;
}

void TrainingSession::save_best() {
  const TrainingState snap = snapshot();
  run->save_checkpoint("best.safetensors", [&](util::AtomicFile& f) { write_checkpoint(f, *model, *optimizer, snap); });
}

std::vector<DeviceBatch> TrainingSession::next_batches() {
  std::vector<DeviceBatch> batches;
  while (int64_t(batches.size()) < spec.optim.update_freq) {
    if (spec.optim.max_epochs > 0 && st.epoch >= spec.optim.max_epochs) break;
    if (st.batch_index >= int64_t(epoch_batches.size())) {
      ++st.epoch;
      st.batch_index = 0;
      epoch_batches = train_plan->epoch(st.epoch);
      continue;
    }
    batches.push_back(to_device(train_plan->make(epoch_batches[size_t(st.batch_index)]), device));
    ++st.batch_index;
  }
  return batches;
}

void TrainingSession::request_stop(std::string status, std::string note, int exit_code) {
  if (!stop) stop = Stop{std::move(status), std::move(note), exit_code};
}

OpenedSession open_session(const ExperimentSpec& spec, const PluginRegistry& registry, std::ostream& out,
                           const TrainControl& control) {
  OpenedSession opened;
  const fs::path dir = spec.run.out_dir;
  const std::string resolved = resolved_manifest_text(spec);
  if ((opened.finished = finished_run(spec, dir, resolved, out))) return opened;
  auto s = std::make_unique<TrainingSession>(spec, out);
  s->resolved_text = resolved;
  s->tty = isatty(STDOUT_FILENO) && &out == &std::cout;

  // Threads: LibTorch defaults to 1 here; PERF: with OpenMP OpenBLAS use all cores in LibTorch.
  const int threads = spec.run.threads > 0 ? int(spec.run.threads)
                                           : int(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  // Checked before torch::Device parses it: LibTorch's errors carry a whole stack trace.
  if (const std::string problem = device_problem(spec.run.device); !problem.empty())
    throw ManifestError(fmt::format("{}: [run] device: {}", spec.source, problem));
  s->device = torch::Device(spec.run.device);

  torch::manual_seed(uint64_t(spec.run.seed));
  s->ds = data::load_dataset(spec.data, out);
  fmt::print(out, "data: {}\n", s->ds.summary);
  const ModelSpec model = model_spec(spec, s->ds);
  s->mcfg = model.config;
  if (!spec.run.allow_oversize) {
    const std::string problem = oversize_problem(
        spec.source, s->mcfg, spec.optim.max_tokens, available_memory_bytes(spec.run.device), spec.run.device,
        {spec.run.activation_checkpointing, spec.run.dtype != "fp32", longest_sequence(s->ds.train)});
    if (!problem.empty()) throw ManifestError(problem);
  }
  AssembledModel assembled = assemble_model(model, registry, s->device);
  s->model = assembled.model;
  s->model->set_activation_checkpointing(spec.run.activation_checkpointing);
  const int64_t n_params = assembled.parameters;
  s->uniform_loss = std::log(double(s->ds.tgt_vocab));
  s->divergence_nll = spec.run.divergence_loss > 0 ? spec.run.divergence_loss : 3 * s->uniform_loss;
  s->optimizer = std::make_unique<FlatAdamW>(s->model->parameters(),
                                             torch::optim::AdamWOptions(spec.optim.lr)
                                                 .betas({spec.optim.beta1, spec.optim.beta2})
                                                 .eps(spec.optim.eps)
                                                 .weight_decay(spec.optim.weight_decay));
  s->fp16 = spec.run.dtype == "fp16";
  s->env_text =
      run_environment(spec, registry, assembled.scheme_name, assembled.scheme_file, threads, n_params).dump(2) + "\n";
  const ModelConfig& m = s->mcfg;
  s->model_line = fmt::format(
      "model: {} {} d={} ffn={} heads={}, scheme {} ({}), {} parameters, {} thread(s), {}\n", spec.model.arch,
      m.arch == Arch::LM ? fmt::format("{}L", m.dec_layers) : fmt::format("{}L-{}L", m.enc_layers, m.dec_layers),
      m.d_model, m.ffn_dim, m.heads, assembled.scheme_name, assembled.scheme_file, n_params, threads, spec.run.device);

  // Everything above only read: a manifest, data, plugin or size error leaves no run directory.
  s->run = std::make_unique<RunDirectory>(dir, control.lock_wait);
  if ((opened.finished = finished_run(spec, dir, resolved, out))) return opened;  // finished while we waited
  s->progress.max_updates = spec.optim.max_updates;
  opened.session = std::move(s);
  return opened;
}

void start_session(TrainingSession& s, const TrainControl& control) {
  const ExperimentSpec& spec = s.spec;
  s.run->write_file("manifest.resolved.toml", s.resolved_text);
  s.run->write_file("env.json", s.env_text);
  const std::optional<fs::path> resume_from = s.run->resume_point(control.resume_from, control.allow_unverified);
  s.resuming = resume_from.has_value();
  s.train_plan = std::make_unique<data::BatchPlan>(s.ds.train, spec.optim.max_tokens, uint64_t(spec.run.seed),
                                                   /*shuffle=*/true);
  s.valid_plan = std::make_unique<data::BatchPlan>(s.ds.valid, spec.optim.max_tokens, uint64_t(spec.run.seed),
                                                   /*shuffle=*/false);
  s.valid_batches = s.valid_plan->epoch(0);
  fmt::print(s.out, "{}", s.model_line);
  scheme_setup_pass(s);
  // The initialization itself (after Admin's profile), for init studies without training.
  if (!s.resuming && spec.run.save_initial && s.st.updates == 0) {
    s.run->save_checkpoint("step_0.safetensors",
                           [&](util::AtomicFile& f) { write_checkpoint(f, *s.model, *s.optimizer, s.st); });
    fmt::print(s.out, "initialization saved ({})\n", s.run->checkpoint("step_0.safetensors").string());
  }
  // Here the model is still θ_0 (same seed; a resumed run has not loaded its checkpoint yet).
  s.events->on_model_ready({spec, *s.model, s.run->path(), [&s](int64_t n) {
                              std::vector<int32_t> idx;
                              const size_t all = s.ds.valid.examples.size();
                              for (int32_t i = 0; i < int32_t(std::min<size_t>(all, size_t(n))); ++i) idx.push_back(i);
                              const DeviceBatch b = to_device(s.valid_plan->make(idx), s.device);
                              return ExampleBatch{b.src, b.tgt_in, data::kPad};
                            }});
  if (s.resuming) resume(s, *resume_from);
  s.progress.updates = s.st.updates;
  s.progress.epoch = s.epoch_now();
  s.progress.elapsed_s = s.st.elapsed_s;
  s.epoch_batches = s.train_plan->epoch(s.st.epoch);
  s.t_start = TrainingSession::Clock::now();
  s.first_update = s.st.updates;
}

}  // namespace normlab
