// The update loop: take the next batches, make the update, publish what happened. Validation, the
// test decode, checkpoints, early stopping, the console, train.jsonl and status.json are training
// observers (observers/), composed by the train command; the analysis probes are run observers.
#include "normlab/train/trainer.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <signal.h>

#include <atomic>
#include <optional>
#include <vector>

#include "graphed_update.h"
#include "model/cuda/fused_ops.h"
#include "observers/standard_observers.h"
#include "training_session.h"
#include "update_profiler.h"

namespace normlab {
namespace {

std::atomic<int> g_signal{0};

// When this process began (static initialisation of the library: before main).
TrainingSession::Clock::time_point process_start() {
  static const TrainingSession::Clock::time_point t = TrainingSession::Clock::now();
  return t;
}
[[maybe_unused]] const auto g_process_start = process_start();
extern "C" void remember_signal(int sig) { g_signal = sig; }

// Installs SIGINT/SIGTERM handlers for the duration of a run; the loop checks the flag. The handler
// runs on a stack of its own: a signal's frame pushed onto the interrupted thread's stack corrupted
// the heap of oneDNN's sgemm (its JIT code keeps data below the stack pointer), a crash in about
// one SIGTERM in four during the backward pass.
struct SignalScope {
  struct sigaction old_int {
  }, old_term{};
  stack_t old_stack{};
  std::vector<char> stack = std::vector<char>(size_t(1) << 16);
  SignalScope() {
    g_signal = 0;
    stack_t ss{};
    ss.ss_sp = stack.data();
    ss.ss_size = stack.size();
    sigaltstack(&ss, &old_stack);
    struct sigaction sa {};
    sa.sa_handler = remember_signal;
    sa.sa_flags = SA_RESTART | SA_ONSTACK;
    sigemptyset(&sa.sa_mask);
    sigaction(SIGINT, &sa, &old_int);
    sigaction(SIGTERM, &sa, &old_term);
  }
  ~SignalScope() {
    sigaction(SIGINT, &old_int, nullptr);
    sigaction(SIGTERM, &old_term, nullptr);
    sigaltstack(&old_stack, nullptr);
  }
};

// The running means of one log interval.
struct IntervalSums {
  TrainInterval iv;
  TrainingSession::Clock::time_point start = TrainingSession::Clock::now();
  void add(const UpdateResult& r, double lr, double clip_norm) {
    iv.loss += r.loss, iv.nll += r.nll, iv.gnorm += r.gnorm, iv.tokens += r.tokens, iv.lr = lr;
    iv.allreduce_seconds += r.allreduce_s;
    z_sum += r.z_loss, ++z_updates;
    ++iv.updates;
    iv.clipped += clip_norm > 0 && r.gnorm > clip_norm ? 1 : 0;
  }
  // Time the observers took (validation, checkpoints, the console): not the updates' own, so
  // excluded from the interval's ms/update and tokens/s.
  double observer_seconds = 0;
  // optim.z_loss's term, over the updates this process made of the interval (not checkpointed).
  double z_sum = 0;
  int64_t z_updates = 0;
  // The interval a checkpoint saved in the middle (a resumed run continues its sums).
  void restore(const IntervalProgress& p) {
    iv.updates = p.updates, iv.tokens = p.tokens, iv.clipped = p.clipped;
    iv.overflows = p.overflows, iv.loss = p.loss, iv.nll = p.nll, iv.gnorm = p.gnorm, iv.lr = p.lr;
    iv.allreduce_seconds = p.allreduce_seconds;
    start = TrainingSession::Clock::now() -
            std::chrono::duration_cast<TrainingSession::Clock::duration>(
                std::chrono::duration<double>(p.seconds));
  }
  // What a checkpoint taken now saves of the interval.
  IntervalProgress progress() const {
    IntervalProgress p;
    p.updates = iv.updates, p.tokens = iv.tokens, p.clipped = iv.clipped;
    p.overflows = iv.overflows, p.loss = iv.loss, p.nll = iv.nll, p.gnorm = iv.gnorm, p.lr = iv.lr;
    p.allreduce_seconds = iv.allreduce_seconds;
    p.seconds = std::chrono::duration<double>(TrainingSession::Clock::now() - start).count() -
                observer_seconds;
    return p;
  }
  TrainInterval take() {
    TrainInterval out = iv;
    const double n = double(std::max<int64_t>(out.updates, 1));
    out.loss /= n, out.nll /= n, out.gnorm /= n;
    out.z_loss = z_sum / double(std::max<int64_t>(z_updates, 1));
    z_sum = 0, z_updates = 0;
    out.seconds = std::chrono::duration<double>(TrainingSession::Clock::now() - start).count() -
                  observer_seconds;
    iv = TrainInterval{};
    start = TrainingSession::Clock::now();
    observer_seconds = 0;
    return out;
  }
};

TrainOutcome end_run(TrainingSession& s, const std::string& status, const std::string& note,
                     int exit_code) {
  s.outcome.status = status;
  s.outcome.updates = s.st.updates;
  s.outcome.note = note;
  s.outcome.exit_code = exit_code;
  if (!s.loop_end) s.loop_end = TrainingSession::Clock::now();
  s.publish([&](TrainingObserver& o) { o.on_end(s, s.outcome); });
  s.events->on_run_end(s.outcome);
  return s.outcome;
}

// The updates until max_updates, the end of optim.max_epochs or a stop.
TrainOutcome updates(TrainingSession& s) {
  const ExperimentSpec& spec = s.spec;
  IntervalSums sums;
  sums.restore(s.st.interval);
  StepSettings step;
  step.forward.label_smoothing = spec.optim.label_smoothing;
  step.forward.z_loss = spec.optim.z_loss;
  step.forward.pad_id = s.ds.pad_id;
  step.forward.dtype = spec.run.dtype;
  step.forward.cuda = s.device.is_cuda();
  step.clip_norm = spec.optim.clip_norm;
  step.divergence_nll = s.divergence_nll;
  step.group = s.group;
  std::optional<UpdateProfiler> profiler;
  if (const std::optional<int64_t> at = UpdateProfiler::requested_update(); at && s.leader()) {
    if (*at <= s.st.updates || *at > spec.optim.max_updates)
      fmt::print(s.out, "profile: NORMLAB_PROFILE_UPDATE={}, but this run makes updates {} to {}\n",
                 *at, s.st.updates + 1, spec.optim.max_updates);
    profiler.emplace(*at, s.run->path(), s.device);
  }
  std::unique_ptr<GraphedUpdate> graphs;
  if (spec.run.cuda_graph) {
    const std::string why =
        GraphedUpdate::unavailable(*s.optimizer, step, s.device, spec.run.activation_checkpointing);
    if (why.empty())
      graphs = std::make_unique<GraphedUpdate>(*s.model, *s.optimizer, /*capture=*/true,
                                               spec.optim.max_tokens, s.ds.pad_id);
    else if (s.leader())
      fmt::print(s.out, "cuda graph: off ({})\n", why);
  }
  while (!s.stop && s.st.updates < spec.optim.max_updates) {
    const TrainingSession::UpdateBatches batches = s.next_batches();
    if (batches.taken == 0) break;  // the end of optim.max_epochs
    sums.iv.data_seconds += batches.data_seconds;
    const int64_t u = s.st.updates + 1;
    step.lr = learning_rate(spec.optim, u);
    if (s.group) {
      step.forward.total_tokens = batches.tokens;
      step.dropout_seed = rank_stream_seed(uint64_t(spec.run.seed), s.group->rank(), u);
    }
    const auto update_start = TrainingSession::Clock::now();
    if (profiler) profiler->before(u);
    std::optional<UpdateResult> graphed;
    if (graphs) graphed = graphs->run(batches.mine, step, u, *s.events);
    step.scheme_updated = graphs != nullptr;
    const UpdateResult r = graphed ? *graphed
                                   : run_update(*s.model, *s.optimizer, s.loss_scaler, batches.mine,
                                                step, u, *s.events);
    if (profiler) profiler->after(u, s.out);
    if (graphs && s.leader())
      for (const std::string& note : graphs->take_notes())
        fmt::print(s.out, "cuda graph: {}\n", note);
    if (r.kind == UpdateResult::Kind::Overflow) {
      ++sums.iv.overflows;
      s.st.interval = sums.progress();
      s.publish([&](TrainingObserver& o) { o.on_overflow(s, u); });
      continue;
    }
    if (r.kind == UpdateResult::Kind::Diverged) {
      s.publish([&](TrainingObserver& o) { o.on_diverged(s, r, u); });
      const std::string where = r.first_nonfinite.empty()
                                    ? "all module outputs and gradients finite"
                                    : "first non-finite: " + r.first_nonfinite;
      ++s.st.updates;  // status.json names the update that diverged
      return end_run(s, "diverged", fmt::format("diverged at update {}: {}; {}", u, r.cause, where),
                     kExitDiverged);
    }
    ++s.st.updates;
    if (s.st.tokens >= 0) s.st.tokens += r.tokens;
    if (u == s.first_update + 1) {  // the setup's cost, as a user waits for it, and its parts
      const auto now = TrainingSession::Clock::now();
      fmt::print(s.out, "first update done {:.2f} s after the start (data {:.2f} s of it)\n",
                 std::chrono::duration<double>(now - process_start()).count(),
                 batches.data_seconds);
      fmt::print(s.out, "setup: {}, first update {:.2f} s\n", s.setup_phases,
                 std::chrono::duration<double>(now - update_start).count());
    }
    for (const std::string& note : take_gpu_fallback_notes())
      fmt::print(s.out, "gpu path: {}\n", note);
    sums.add(r, step.lr, spec.optim.clip_norm);
    s.st.interval = sums.progress();  // what a checkpoint after this update keeps
    const auto observers_start = TrainingSession::Clock::now();
    if (u % spec.run.log_interval == 0 || u == spec.optim.max_updates) {
      TrainInterval iv = sums.take();
      s.st.interval = IntervalProgress{};
      iv.scheme_status = s.model->scheme().status();
      s.progress.train_loss = iv.loss, s.progress.train_nll = iv.nll;
      s.outcome.last_train_nll = iv.nll;
      s.publish([&](TrainingObserver& o) { o.on_interval(s, iv); });
    } else {
      s.publish([&](TrainingObserver& o) { o.on_tick(s, r.loss); });
    }
    s.publish([&](TrainingObserver& o) { o.after_update(s); });
    sums.observer_seconds +=
        std::chrono::duration<double>(TrainingSession::Clock::now() - observers_start).count();
    // Every rank of a job stops after the same update.
    const int64_t sig = s.group ? s.group->max(g_signal.load()) : g_signal.load();
    if (sig)
      s.request_stop(
          "interrupted",
          fmt::format("stopped by signal {} after update {}; run the same command to resume", sig,
                      u),
          kExitInterrupted);
  }
  if (graphs && s.leader()) {
    const GraphedUpdate::Counts& c = graphs->counts();
    fmt::print(
        s.out,
        "cuda graph: {} updates made by the graph path ({} batch shapes recorded), {} eager\n",
        c.made, c.graphs, c.eager);
  }
  if (s.stop) return end_run(s, s.stop->status, s.stop->note, s.stop->exit_code);
  // A run that trained on shards is complete only once their SHA-256s are known to match.
  if (s.ds.integrity)
    if (const std::string problem = s.ds.integrity->wait(); !problem.empty())
      throw std::runtime_error(problem);  // a failed run (exit 1), not bad input
  s.loop_end = TrainingSession::Clock::now();
  s.publish([&](TrainingObserver& o) { o.on_training_done(s); });
  return end_run(s, "completed", "", kExitCompleted);
}

TrainOutcome update_loop(TrainingSession& s) {
  s.publish([&](TrainingObserver& o) { o.on_start(s); });
  s.events->on_run_start(s.st.updates);
  s.outcome.uniform_loss = s.uniform_loss;
  s.outcome.best_valid_nll = s.st.best_valid_nll;
  s.setup_seconds =
      std::chrono::duration<double>(TrainingSession::Clock::now() - process_start()).count();
  if (s.leader())  // the checkpoints' host buffers, made on the writer's thread as training starts
    s.checkpoints->prepare([specs = snapshot_buffer_specs(*s.model),
                            pinned = s.device.is_cuda()](CheckpointContents& c) {
      allocate_snapshot_buffers(c, specs, pinned);
    });
  SignalScope signals;
  s.model->train();
  try {
    return updates(s);
  } catch (const PeerLostError& e) {
    // Another rank of the job is gone: this one stops too. The update in flight was not made, but
    // the data position moved, so nothing is saved: a rerun resumes from the last checkpoint.
    s.checkpointable = false;
    return end_run(
        s, "interrupted",
        fmt::format(
            "{}; stopped after update {} (nothing saved since the last checkpoint); run the "
            "same command to resume",
            e.what(), s.st.updates),
        kExitInterrupted);
  }
}

// Every run that started ends with a final status.json: failures too, with their cause in one line.
template <class F>
TrainOutcome with_failure_status(TrainingSession& s, F&& body) {
  auto fail_with = [&](const std::string& cause) {
    if (s.status_kept) return;
    s.progress.updates = s.st.updates;
    s.run->write_final_status_noexcept("failed", s.progress, cause);
  };
  const std::string dir = s.run->path().string();
  try {
    return body();
  } catch (const std::bad_alloc&) {
    const std::string cause = fmt::format(
        "out of memory (std::bad_alloc) at update {}; lower model.d_model or optim.max_tokens",
        s.st.updates);
    fail_with(cause);
    throw std::runtime_error(fmt::format("{}: {}", dir, cause));
  } catch (const c10::Error& e) {
    // LibTorch's messages carry a C++ stack trace (35 lines): the first line is the cause.
    const std::string what = e.what_without_backtrace();
    const std::string first = what.substr(0, what.find('\n'));
    const bool oom =
        first.find("can't allocate memory") != std::string::npos ||  // CPU allocator (2.x)
        first.find("not enough memory") != std::string::npos ||      // CPU allocator (1.13)
        first.find("out of memory") != std::string::npos;            // CUDA
    const std::string cause = oom ? fmt::format(
                                        "out of memory at update {} ({}); lower optim.max_tokens "
                                        "or model.d_model, or set "
                                        "run.activation_checkpointing = true",
                                        s.st.updates, first)
                                  : first;
    fail_with(cause);
    throw std::runtime_error(fmt::format("{}: {}", dir, cause));
  } catch (const std::exception& e) {
    fail_with(e.what());
    throw;
  } catch (...) {
    // A plugin may throw anything; the run still ends with a status and one line.
    const std::string cause =
        fmt::format("a non-standard exception was thrown at update {}", s.st.updates);
    fail_with(cause);
    throw std::runtime_error(fmt::format("{}: {}", dir, cause));
  }
}

}  // namespace

TrainOutcome run_training(const ExperimentSpec& spec, const PluginRegistry& registry,
                          std::ostream& out, const TrainControl& control) {
  OpenedSession opened;
  try {
    opened = open_session(spec, registry, out, control);
  } catch (const std::exception& e) {
    post_start_failure(control.group, e.what());
    throw;
  }
  if (opened.finished) return *opened.finished;
  TrainingSession& s = *opened.session;
  RunObservers events(control.observers);
  s.events = &events;
  const bool leader = !control.group || control.group->leader();
  const auto standard = control.training_observers.empty()
                            ? standard_training_observers(leader)
                            : std::vector<std::unique_ptr<TrainingObserver>>{};
  for (const auto& o : standard) s.observers.push_back(o.get());
  s.observers.insert(s.observers.end(), control.training_observers.begin(),
                     control.training_observers.end());
  return with_failure_status(s, [&] {
    try {
      start_session(s, control);
    } catch (const std::exception& e) {
      post_start_failure(s.group, e.what());
      throw;
    }
    return update_loop(s);
  });
}

}  // namespace normlab
