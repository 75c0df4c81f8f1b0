#include "normlab/train/trainer.h"

#include <fmt/chrono.h>
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>
#include <torch/torch.h>
#include <unistd.h>

#include <atomic>
#include <chrono>
#include <cmath>
#include <csignal>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <sstream>
#include <thread>

#include "checkpoint.h"
#include "progress_text.h"
#include "eval/run_model.h"
#include "greedy_decoder.h"
#include "memory_estimate.h"
#include "model_config.h"
#include "run_directory.h"
#include "run_recipe.h"
#include "label_smoothing.h"
#include "loss_scaler.h"
#include "commands/commands.h"
#include "normlab/runtime_env.h"
#include "optimizer.h"
#include "normlab/eval/bleu.h"
#include "normlab/model/transformer_model.h"
#include "normlab/plugins/registry.h"
#include "normlab/train/run_events.h"
#include "update_step.h"

namespace fs = std::filesystem;
using json = nlohmann::json;
using Clock = std::chrono::steady_clock;

namespace normlab {
namespace {

// Tokens of the longest sequence a batch can hold (a side plus BOS), for the memory estimate.
int64_t longest_sequence(const data::Split& split) {
  size_t n = 0;
  for (const auto& ex : split.examples) n = std::max({n, ex.src.size(), ex.tgt.size()});
  return int64_t(n) + 1;
}

std::atomic<int> g_signal{0};
extern "C" void remember_signal(int sig) { g_signal = sig; }

// Installs SIGINT/SIGTERM handlers for the duration of a run; the loop checks the flag.
struct SignalScope {
  using Handler = void (*)(int);
  Handler old_int, old_term;
  SignalScope() {
    g_signal = 0;
    old_int = std::signal(SIGINT, remember_signal);
    old_term = std::signal(SIGTERM, remember_signal);
  }
  ~SignalScope() {
    std::signal(SIGINT, old_int);
    std::signal(SIGTERM, old_term);
  }
};

// Whether the validation at `update` decodes for BLEU: from eval.bleu_after_updates on, at every
// eval.bleu_every-th validation and at the final one. The loss is validated every time.
bool bleu_due(const EvalSection& e, int64_t update, bool final) {
  if (update < e.bleu_after_updates) return false;
  return final || e.interval <= 0 || (update / e.interval) % e.bleu_every == 0;
}

struct Validation {
  // bleu: on the eval.bleu_max_sentences subset (comparable across validations, best.safetensors by BLEU);
  // bleu_full: the final validation's BLEU on every sentence when the subset is smaller.
  double nll = 0, loss = 0, bleu = -1, bleu_full = -1;
  int64_t bleu_sentences = 0;
  int64_t tokens = 0;
};

}  // namespace

TrainOutcome run_training(const ExperimentSpec& spec, const PluginRegistry& registry, std::ostream& out,
                          const TrainControl& control) {
  const fs::path dir = spec.run.out_dir;
  const std::string resolved = resolved_manifest_text(spec);
  if (auto done = finished_run(spec, dir, resolved, out)) return *done;

  // Threads: LibTorch defaults to 1 here; PERF: with OpenMP OpenBLAS use all cores in LibTorch.
  const int threads = spec.run.threads > 0 ? int(spec.run.threads)
                                           : int(std::max(1u, std::thread::hardware_concurrency()));
  at::set_num_threads(threads);
  // Checked before torch::Device parses it: LibTorch's errors carry a whole stack trace.
  if (const std::string problem = device_problem(spec.run.device); !problem.empty())
    throw ManifestError(fmt::format("{}: [run] device: {}", spec.source, problem));
  const torch::Device device(spec.run.device);

  torch::manual_seed(uint64_t(spec.run.seed));
  data::Dataset ds = data::load_dataset(spec.data, out);
  fmt::print(out, "data: {}\n", ds.summary);
  const ModelConfig mcfg = model_config(spec, ds);
  if (!spec.run.allow_oversize) {
    const std::string problem = oversize_problem(spec.source, mcfg, spec.optim.max_tokens,
                                                 available_memory_bytes(spec.run.device), spec.run.device,
                                                 {spec.run.activation_checkpointing, spec.run.dtype != "fp32",
                                                  longest_sequence(ds.train)});
    if (!problem.empty()) throw ManifestError(problem);
  }
  SchemeHandle scheme = registry.create(spec.scheme.name, spec.scheme.params, mcfg.geometry());
  TransformerModel model(mcfg, scheme);
  model->to(device);
  model->set_activation_checkpointing(spec.run.activation_checkpointing);
  int64_t n_params = 0;
  for (const auto& p : model->parameters()) n_params += p.numel();
  const double uniform_loss = std::log(double(ds.tgt_vocab));
  const double divergence_nll = spec.run.divergence_loss > 0 ? spec.run.divergence_loss : 3 * uniform_loss;

  FlatAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(spec.optim.lr)
                                                         .betas({spec.optim.beta1, spec.optim.beta2})
                                                         .eps(spec.optim.eps)
                                                         .weight_decay(spec.optim.weight_decay));
  const json env = run_environment(spec, registry, scheme.name, scheme.file, threads, n_params);

  // Everything above only read: a manifest, data, plugin or size error leaves no run directory.
  RunDirectory run(dir, control.lock_wait);
  if (auto done = finished_run(spec, dir, resolved, out)) return *done;  // finished while we waited
  TrainingState st;
  DynamicLossScaler loss_scaler;  // fp16 only
  const bool fp16 = spec.run.dtype == "fp16";
  // The 1-based epoch the run is in; once the last one is done (the next not begun), that one.
  auto epoch_now = [&] { return st.batch_index == 0 && st.epoch > 0 ? st.epoch : st.epoch + 1; };
  RunProgress progress;
  progress.max_updates = spec.optim.max_updates;
  auto fail_with = [&](const std::string& cause) {
    progress.updates = st.updates;
    run.write_final_status_noexcept("failed", progress, cause);
  };
  try {
  run.write_file("manifest.resolved.toml", resolved);
  run.write_file("env.json", env.dump(2) + "\n");

  const std::optional<fs::path> resume_from = run.resume_point(control.resume_from, control.allow_unverified);
  const bool resuming = resume_from.has_value();

  data::BatchPlan train_plan(ds.train, spec.optim.max_tokens, uint64_t(spec.run.seed), /*shuffle=*/true);
  data::BatchPlan valid_plan(ds.valid, spec.optim.max_tokens, uint64_t(spec.run.seed), /*shuffle=*/false);
  const auto valid_batches = valid_plan.epoch(0);

  fmt::print(out, "model: {} {} d={} ffn={} heads={}, scheme {} ({}), {} parameters, {} thread(s), {}\n",
             spec.model.arch,
             mcfg.arch == Arch::LM ? fmt::format("{}L", mcfg.dec_layers) : fmt::format("{}L-{}L", mcfg.enc_layers, mcfg.dec_layers),
             mcfg.d_model, mcfg.ffn_dim, mcfg.heads, scheme.name, scheme.file, n_params, threads, spec.run.device);

  // Admin-style setup pass on the first training batch, once per run; its result is kept in the
  // run directory and restored with every checkpoint.
  // (A resumed run restores it too: its observers see θ_0 before the checkpoint is loaded.)
  const fs::path setup_path = dir / "scheme_setup.safetensors";
  if (model->scheme().needs_setup_pass()) {
    if (fs::exists(setup_path)) {
      model->scheme().load_state(load_scheme_state(setup_path));
    }
    if (!resuming && model->scheme().needs_setup_pass()) {
      DeviceBatch b = to_device(train_plan.make(train_plan.epoch(0).at(0)), device);
      model->run_setup_pass([&] { forward(*model, b); });
      save_scheme_state(setup_path, model->scheme().state());
      fmt::print(out, "scheme setup pass done ({})\n", setup_path.string());
    }
  }
  // The initialization itself (after Admin's profile), for init studies without training.
  if (!resuming && spec.run.save_initial && st.updates == 0) {
    run.save_checkpoint("step_0.safetensors", [&](util::AtomicFile& f) { write_checkpoint(f, *model, optimizer, st); });
    fmt::print(out, "initialization saved ({})\n", run.checkpoint("step_0.safetensors").string());
  }

  // Here the model is still θ_0 (same seed; a resumed run has not loaded its checkpoint yet).
  RunObservers events(control.observers);
  events.on_model_ready({spec, *model, dir, [&](int64_t n) {
                           std::vector<int32_t> idx;
                           for (int32_t i = 0; i < int32_t(std::min<size_t>(ds.valid.examples.size(), size_t(n))); ++i)
                             idx.push_back(i);
                           const DeviceBatch b = to_device(valid_plan.make(idx), device);
                           return ExampleBatch{b.src, b.tgt_in, data::kPad};
                         }});

  if (resuming) {
    st = load_checkpoint(*resume_from, *model, optimizer, device);
    if (st.loss_scale > 0) loss_scaler.restore(st.loss_scale, st.loss_scale_good_steps);
    fmt::print(out, "resuming {} at update {} (epoch {}, batch {}) from {}\n", dir.string(), st.updates, st.epoch + 1,
               st.batch_index, resume_from->string());
    // A branch (--resume-from an older checkpoint) becomes last.safetensors before the records after
    // it move aside, so a failure or kill before the branch's next checkpoint resumes the branch
    // again, never the abandoned last with a gap in train.jsonl.
    if (fs::absolute(*resume_from).lexically_normal() != fs::absolute(run.checkpoint("last.safetensors")).lexically_normal())
      run.save_last(st.updates, /*with_step=*/false, spec.run.checkpoint_keep_last,
                    [&](util::AtomicFile& f) { write_checkpoint(f, *model, optimizer, st); });
  }
  progress.updates = st.updates;
  progress.epoch = epoch_now();
  progress.elapsed_s = st.elapsed_s;
  run.write_status("running", progress);
  util::JsonlLog log = run.training_log(st.updates);
  events.on_run_start(st.updates);
  std::vector<std::vector<int32_t>> epoch_batches = train_plan.epoch(st.epoch);

  auto validate = [&](bool with_bleu, bool final) {
    torch::NoGradGuard ng;
    model->eval();
    Validation v;
    double loss = 0, nll = 0;
    for (const auto& idx : valid_batches) {
      DeviceBatch b = to_device(valid_plan.make(idx), device);
      LossSums s = fp32_batch_loss(*model, b, spec.optim.label_smoothing, data::kPad);
      loss += s.loss.item<double>();
      nll += s.nll.item<double>();
      v.tokens += b.tokens;
    }
    v.nll = nll / double(std::max<int64_t>(v.tokens, 1));
    v.loss = loss / double(std::max<int64_t>(v.tokens, 1));
    const bool translation = mcfg.arch == Arch::EncDec && !ds.valid.references.empty();
    if (with_bleu && translation && spec.eval.bleu) {
      const size_t all = ds.valid.examples.size();
      size_t n = all;
      if (spec.eval.bleu_max_sentences > 0) n = std::min(n, size_t(spec.eval.bleu_max_sentences));
      // During training the fixed subset; at the end every sentence (the subset's BLEU is the first
      // n hypotheses of the same decoding, greedy decoding being per sentence).
      const size_t decoded = final ? all : n;
      std::vector<std::vector<int32_t>> sources;
      for (size_t i = 0; i < decoded; ++i) sources.push_back(ds.valid.examples[i].src);
      auto hyps = greedy_decode(*model, sources, device, spec.eval.max_len_a, spec.eval.max_len_b, spec.optim.max_tokens);
      std::vector<std::string> hyp_text;
      for (const auto& h : hyps) hyp_text.push_back(ds.tgt_tokenizer->decode(h));
      const std::vector<std::string> subset(hyp_text.begin(), hyp_text.begin() + long(n));
      v.bleu = eval::corpus_bleu(subset, {ds.valid.references.begin(), ds.valid.references.begin() + long(n)}).score;
      v.bleu_sentences = int64_t(n);
      if (decoded > n) v.bleu_full = eval::corpus_bleu(hyp_text, ds.valid.references).score;
      run.write_file("valid_hypotheses.txt", fmt::format("{}\n", fmt::join(hyp_text, "\n")));
    }
    model->train();
    return v;
  };

  TrainOutcome outcome;
  outcome.uniform_loss = uniform_loss;
  outcome.best_valid_nll = st.best_valid_nll;
  const auto t_start = Clock::now();
  auto elapsed = [&] { return st.elapsed_s + std::chrono::duration<double>(Clock::now() - t_start).count(); };
  const int64_t first_update = st.updates;
  // Time left at this process's rate so far (-1: not known yet), to max_updates or, when it
  // comes first, the end of optim.max_epochs.
  auto eta_seconds = [&] {
    const double run_secs = std::chrono::duration<double>(Clock::now() - t_start).count();
    const double rate = double(st.updates - first_update) / std::max(run_secs, 1e-9);
    int64_t left = spec.optim.max_updates - st.updates;
    if (spec.optim.max_epochs > 0) {
      const int64_t per_epoch = int64_t(epoch_batches.size());
      left = std::min(left, (spec.optim.max_epochs - st.epoch) * per_epoch - st.batch_index);
    }
    return rate > 0 ? double(std::max<int64_t>(left, 0)) / rate : -1.0;
  };
  int64_t saved_at = -1;  // the update last.safetensors holds
  // last.safetensors (and step_N.safetensors as the same file), older steps pruned.
  auto save_checkpoints = [&](bool with_step) {
    TrainingState snap = st;
    snap.elapsed_s = elapsed();
    if (fp16) snap.loss_scale = loss_scaler.scale(), snap.loss_scale_good_steps = loss_scaler.good_steps();
    run.save_last(st.updates, with_step, spec.run.checkpoint_keep_last,
                  [&](util::AtomicFile& f) { write_checkpoint(f, *model, optimizer, snap); });
    saved_at = st.updates;
  };
  const bool tty = isatty(STDOUT_FILENO) && &out == &std::cout;
  // The run's last word, once `outcome` is filled in: status.json, the note on the console, the observers.
  auto end_run = [&](const std::string& status) {
    progress.updates = st.updates;
    progress.epoch = epoch_now();
    progress.elapsed_s = elapsed();
    progress.eta_s = status == "completed" || status == "stopped_early" ? 0 : -1;
    run.write_status(status, progress, outcome.note);
    if (!outcome.note.empty()) {
      if (tty) fmt::print(out, "\r\033[K");
      fmt::print(out, "{}\n", outcome.note);
    }
    events.on_run_end(outcome);
    return outcome;
  };
  // Per-interval statistics.
  double iv_loss = 0, iv_nll = 0, iv_gnorm = 0;
  int64_t iv_tokens = 0, iv_updates = 0, iv_clipped = 0;
  auto iv_start = Clock::now();
  auto last_bar = Clock::now();

  auto run_validation = [&](bool final) {
    Validation v = validate(bleu_due(spec.eval, st.updates, final), final);
    const bool best = v.nll < st.best_valid_nll;
    if (best) st.best_valid_nll = v.nll;
    st.stale_validations = best ? 0 : st.stale_validations + 1;
    const bool best_bleu = v.bleu >= 0 && v.bleu > st.best_valid_bleu;
    if (best_bleu) st.best_valid_bleu = v.bleu;
    progress.valid_loss = v.loss;
    progress.valid_nll = v.nll;
    progress.valid_bleu = v.bleu;
    outcome.last_valid_nll = v.nll;
    outcome.best_valid_nll = st.best_valid_nll;
    outcome.last_valid_bleu = v.bleu_full >= 0 ? v.bleu_full : v.bleu;
    json j = {{"kind", "valid"}, {"update", st.updates}, {"epoch", epoch_now()}, {"loss", v.loss},
              {"nll", v.nll}, {"ppl", std::exp(v.nll)}, {"tokens", v.tokens}, {"best", best},
              {"elapsed_s", elapsed()}};
    if (v.bleu >= 0) j["bleu"] = v.bleu, j["bleu_sentences"] = v.bleu_sentences;
    if (v.bleu_full >= 0) j["bleu_full"] = v.bleu_full;
    log.write(j);
    model->on_validate(st.updates, v.nll);
    events.on_scalar("valid/nll", st.updates, v.nll);
    if (v.bleu >= 0) events.on_scalar("valid/bleu", st.updates, v.bleu);
    if (tty) fmt::print(out, "\r\033[K");
    fmt::print(out, "valid  | {} | loss {:.4f} | nll {:.4f} | ppl {:.2f}{}{} | {} elapsed | ETA {}\n",
               position_text(st.updates, spec.optim.max_updates, epoch_now(), spec.optim.max_epochs), v.loss, v.nll,
               std::exp(v.nll),
               v.bleu >= 0 ? fmt::format(" | bleu {:.2f}{}", v.bleu,
                                         v.bleu_full >= 0 ? fmt::format(" ({} sentences; all {}: {:.2f})", v.bleu_sentences,
                                                                        ds.valid.examples.size(), v.bleu_full)
                                                          : "")
                           : "",
               final ? fmt::format(" | uniform-prediction loss {:.4f}", uniform_loss) : "", duration_text(elapsed()),
               duration_text(final ? 0.0 : eta_seconds()));
    out.flush();
    const std::string& save_best = spec.run.checkpoint_save_best;
    if ((save_best == "valid_nll" && best) || (save_best == "bleu" && best_bleu)) {
      TrainingState snap = st;
      snap.elapsed_s = elapsed();
      if (fp16) snap.loss_scale = loss_scaler.scale(), snap.loss_scale_good_steps = loss_scaler.good_steps();
      run.save_checkpoint("best.safetensors", [&](util::AtomicFile& f) { write_checkpoint(f, *model, optimizer, snap); });
    }
  };

  SignalScope signals;
  model->train();
  bool validated_at_end = false;
  const bool cuda = device.is_cuda();
  int64_t overflows = 0;  // fp16 updates skipped since the last log line
  while (true) {
    if (st.updates >= spec.optim.max_updates) break;
    // The optim.update_freq batches of this update; they may cross an epoch's end. The data
    // position moves as they are taken, so a checkpoint (after the update) resumes after them.
    std::vector<DeviceBatch> batches;
    while (int64_t(batches.size()) < spec.optim.update_freq) {
      if (spec.optim.max_epochs > 0 && st.epoch >= spec.optim.max_epochs) break;
      if (st.batch_index >= int64_t(epoch_batches.size())) {
        ++st.epoch;
        st.batch_index = 0;
        epoch_batches = train_plan.epoch(st.epoch);
        continue;
      }
      batches.push_back(to_device(train_plan.make(epoch_batches[size_t(st.batch_index)]), device));
      ++st.batch_index;
    }
    if (batches.empty()) break;
    StepSettings step;
    step.forward.label_smoothing = spec.optim.label_smoothing;
    step.forward.pad_id = data::kPad;
    step.forward.dtype = spec.run.dtype;
    step.forward.cuda = cuda;
    step.lr = learning_rate(spec.optim, st.updates + 1);
    step.clip_norm = spec.optim.clip_norm;
    step.divergence_nll = divergence_nll;
    const UpdateResult r = run_update(*model, optimizer, loss_scaler, batches, step, st.updates + 1, events);
    const double lr = step.lr, loss = r.loss, nll = r.nll, gnorm = r.gnorm;
    if (r.kind == UpdateResult::Kind::Overflow) {
      ++overflows;
      log.write({{"kind", "overflow"}, {"update", st.updates + 1}, {"loss_scale", loss_scaler.scale()}});
      continue;
    }
    if (r.kind == UpdateResult::Kind::Diverged) {
      const std::string where = r.first_nonfinite.empty() ? "all module outputs and gradients finite"
                                                          : "first non-finite: " + r.first_nonfinite;
      outcome.status = "diverged";
      outcome.updates = st.updates;
      outcome.note = fmt::format("diverged at update {}: {}; {}", st.updates + 1, r.cause, where);
      outcome.exit_code = kExitDiverged;
      outcome.last_train_loss = loss;
      log.write({{"kind", "diverged"}, {"update", st.updates + 1}, {"loss", loss}, {"nll", nll}, {"gnorm", gnorm},
                 {"cause", r.cause}, {"first_nonfinite", r.first_nonfinite}});
      ++st.updates;  // status.json names the update that diverged, as before
      return end_run("diverged");
    }
    ++st.updates;
    outcome.last_train_loss = loss;
    iv_loss += loss;
    iv_nll += nll;
    iv_gnorm += gnorm;
    iv_tokens += r.tokens;
    ++iv_updates;
    iv_clipped += (spec.optim.clip_norm > 0 && gnorm > spec.optim.clip_norm) ? 1 : 0;

    if (st.updates % spec.run.log_interval == 0 || st.updates == spec.optim.max_updates) {
      const double secs = std::chrono::duration<double>(Clock::now() - iv_start).count();
      const double n = double(iv_updates);
      const std::string status = model->scheme().status();
      json j = {{"kind", "train"}, {"update", st.updates}, {"epoch", epoch_now()}, {"loss", iv_loss / n},
                {"nll", iv_nll / n}, {"ppl", std::exp(iv_nll / n)}, {"gnorm", iv_gnorm / n},
                {"clipped", double(iv_clipped) / n}, {"lr", lr}, {"tokens_per_s", double(iv_tokens) / secs},
                {"ms_per_update", 1e3 * secs / n},
                {"elapsed_s", elapsed()}};
      if (!status.empty()) j["scheme"] = status;
      if (fp16) j["loss_scale"] = loss_scaler.scale(), j["overflows"] = overflows;
      overflows = 0;
      log.write(j);
      events.on_scalar("train/loss", st.updates, iv_loss / n);
      events.on_scalar("train/nll", st.updates, iv_nll / n);
      events.on_scalar("train/gnorm", st.updates, iv_gnorm / n);
      events.on_scalar("train/lr", st.updates, lr);
      if (tty) fmt::print(out, "\r\033[K");
      // status.json and the console at every log interval: progress and an ETA from this process's rate.
      progress.updates = st.updates;
      progress.epoch = epoch_now();
      progress.train_loss = iv_loss / n;
      progress.tokens_per_s = double(iv_tokens) / secs;
      progress.elapsed_s = elapsed();
      progress.eta_s = eta_seconds();
      fmt::print(out, "train  | {} | loss {:.4f} | nll {:.4f} | ppl {:8.2f} | gnorm {:7.3f} | clip {:3.0f}% | lr {:.3e}{} | {:7.0f} tok/s | {:6.1f} ms/update | {} elapsed | ETA {}\n",
                 position_text(st.updates, spec.optim.max_updates, epoch_now(), spec.optim.max_epochs),
                 iv_loss / n, iv_nll / n, std::exp(iv_nll / n), iv_gnorm / n,
                 100.0 * double(iv_clipped) / n, lr, status.empty() ? "" : " | " + status,
                 double(iv_tokens) / secs, 1e3 * secs / n, duration_text(elapsed()), duration_text(progress.eta_s));
      out.flush();  // one plain line per interval, also when stdout is a file
      run.write_status("running", progress);
      iv_loss = iv_nll = iv_gnorm = 0;
      iv_tokens = iv_updates = iv_clipped = 0;
      iv_start = Clock::now();
    } else if (tty && Clock::now() - last_bar > std::chrono::milliseconds(200)) {
      const int width = 30, filled = int(width * double(st.updates) / double(spec.optim.max_updates));
      fmt::print(out, "\r[{}{}] {}/{} loss {:.4f} | ETA {}", std::string(size_t(filled), '#'),
                 std::string(size_t(width - filled), '.'), st.updates, spec.optim.max_updates, loss,
                 duration_text(eta_seconds()));
      out.flush();
      last_bar = Clock::now();
    }
    if (spec.eval.interval > 0 && st.updates % spec.eval.interval == 0) {
      validated_at_end = st.updates == spec.optim.max_updates;
      run_validation(validated_at_end);
      if (spec.eval.patience > 0 && st.stale_validations >= spec.eval.patience && !validated_at_end) {
        save_checkpoints(/*with_step=*/false);
        outcome.status = "stopped_early";
        outcome.updates = st.updates;
        outcome.note = fmt::format("stopped early at update {}: valid nll not below its best {:.4f} for {} validations "
                                   "(eval.patience)", st.updates, st.best_valid_nll, st.stale_validations);
        outcome.exit_code = kExitCompleted;
        return end_run("stopped_early");
      }
    }
    if (st.updates % spec.run.checkpoint_interval == 0) save_checkpoints(/*with_step=*/true);
    if (const int sig = g_signal.load()) {
      save_checkpoints(/*with_step=*/false);
      outcome.status = "interrupted";
      outcome.updates = st.updates;
      outcome.note = fmt::format("stopped by signal {} after update {}; run the same command to resume", sig, st.updates);
      outcome.exit_code = kExitInterrupted;
      return end_run("interrupted");
    }
  }
  // The end phase, once: a run resumed at max_updates (killed during the final validation, the test
  // decode or before its last status) keeps what it already logged for this update.
  const fs::path log_file = dir / "train.jsonl";
  const std::optional<json> logged_valid = resuming && !validated_at_end
                                               ? util::find_record(log_file, "valid", st.updates) : std::nullopt;
  if (logged_valid) {
    const json& v = *logged_valid;
    progress.valid_loss = v.value("loss", progress.valid_loss);
    progress.valid_nll = v.value("nll", progress.valid_nll);
    progress.valid_bleu = v.value("bleu", -1.0);
    if (v.value("best", false)) st.best_valid_nll = std::min(st.best_valid_nll, progress.valid_nll);
    outcome.last_valid_nll = progress.valid_nll;
    outcome.best_valid_nll = st.best_valid_nll;
    outcome.last_valid_bleu = v.value("bleu_full", progress.valid_bleu);
  } else if (!validated_at_end) {
    run_validation(true);
  }
  // The test score of the final weights, once (README "Evaluate and inspect a model").
  if (spec.eval.test_beam > 0 && !ds.test.examples.empty() &&
      !(resuming && util::find_record(log_file, "test", st.updates))) {
    eval::BeamOptions beam;
    beam.beam = spec.eval.test_beam;
    beam.max_len_a = spec.eval.max_len_a;
    beam.max_len_b = spec.eval.max_len_b;
    beam.batch_tokens = std::max<int64_t>(spec.optim.max_tokens * beam.beam, 8000);  // no gradients: more fits
    const eval::SplitEvaluation ev = eval::evaluate_split(*model, ds, ds.test, "test", device, beam);
    json j = {{"kind", "test"}, {"update", st.updates}, {"nll", ev.nll}, {"ppl", std::exp(ev.nll)},
              {"sentences", ev.sentences}, {"elapsed_s", elapsed()}};
    std::string scores;
    if (ev.translated) {
      j["beam"] = beam.beam;
      j["bleu"] = ev.bleu.score;
      j["chrf"] = ev.chrf.score;
      j["bleu_signature"] = eval::bleu_signature();
      fs::create_directories(dir / "eval");
      run.write_file(fmt::format("eval/test.final.beam{}.hyp", beam.beam),
                     ev.hypotheses.empty() ? "" : fmt::format("{}\n", fmt::join(ev.hypotheses, "\n")));
      scores = fmt::format(" | beam {} | {} | {}", beam.beam, eval::bleu_line(ev.bleu), eval::chrf_line(ev.chrf));
    }
    log.write(j);
    events.on_scalar("test/nll", st.updates, ev.nll);
    if (ev.translated) events.on_scalar("test/bleu", st.updates, ev.bleu.score);
    fmt::print(out, "test   | update {:>6} | nll {:.4f} | ppl {:.2f}{}\n", st.updates, ev.nll, std::exp(ev.nll), scores);
  }
  // Unless last.safetensors already holds this very state (then step_N.safetensors stays the same file).
  if (!(validated_at_end && saved_at == st.updates)) save_checkpoints(/*with_step=*/false);
  outcome.status = "completed";
  outcome.updates = st.updates;
  outcome.exit_code = kExitCompleted;
  fmt::print(out, "completed {} updates in {:.1f} s | final train loss {:.4f} vs uniform-prediction loss {:.4f} | best valid nll {:.4f}{}\n",
             st.updates, elapsed(), outcome.last_train_loss, uniform_loss, st.best_valid_nll,
             outcome.last_valid_bleu >= 0 ? fmt::format(" | valid BLEU {:.2f}", outcome.last_valid_bleu) : "");
  return end_run("completed");
  } catch (const std::bad_alloc&) {
    const std::string cause = fmt::format(
        "out of memory (std::bad_alloc) at update {}; lower model.d_model or optim.max_tokens", st.updates);
    fail_with(cause);
    throw std::runtime_error(fmt::format("{}: {}", dir.string(), cause));
  } catch (const c10::Error& e) {
    // LibTorch's messages carry a C++ stack trace (35 lines): the first line is the cause.
    const std::string what = e.what_without_backtrace();
    const std::string first = what.substr(0, what.find('\n'));
    const bool oom = first.find("can't allocate memory") != std::string::npos ||  // CPU allocator (2.x)
                     first.find("not enough memory") != std::string::npos ||     // CPU allocator (1.13)
                     first.find("out of memory") != std::string::npos;           // CUDA
    const std::string cause =
        oom ? fmt::format("out of memory at update {} ({}); lower optim.max_tokens or model.d_model, or set "
                          "run.activation_checkpointing = true", st.updates, first)
            : first;
    fail_with(cause);
    throw std::runtime_error(fmt::format("{}: {}", dir.string(), cause));
  } catch (const std::exception& e) {
    fail_with(e.what());
    throw;
  } catch (...) {
    // A plugin may throw anything; the run still ends with a status and one line.
    const std::string cause = fmt::format("a non-standard exception was thrown at update {}", st.updates);
    fail_with(cause);
    throw std::runtime_error(fmt::format("{}: {}", dir.string(), cause));
  }
}

}  // namespace normlab
