// The console: one plain line per log interval, validation and test score (also when stdout is a
// file), a live progress bar between them on a terminal, and the run's last word.
#include <fmt/format.h>
#include <fmt/ostream.h>
#ifdef NORMLAB_WITH_CUDA
#include <c10/cuda/CUDACachingAllocator.h>
#endif

#include <cmath>

#include "standard_observers.h"
#include "train/progress_text.h"
#include "train/training_session.h"

namespace normlab {
namespace {

// Peak bytes the CUDA caching allocator handed out on the run's GPU (issue 43.3: the figure to
// compare with a PyTorch peer's torch.cuda.max_memory_allocated); -1 on the CPU.
double cuda_peak_allocated(const torch::Device& device) {
#ifdef NORMLAB_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(
        device.has_index() ? device.index() : c10::DeviceIndex(0));
    return double(stats.allocated_bytes[0].peak);  // StatType::AGGREGATE
  }
#endif
  (void)device;
  return -1;
}

class ConsoleProgress final : public TrainingObserver {
 public:
  void on_interval(TrainingSession& s, const TrainInterval& iv) override {
    const double n = double(iv.updates);
    clear_bar(s);
    fmt::print(s.out,
               "train  | {} | loss {:.4f} | nll {:.4f} | ppl {:8.2f} | gnorm {:7.3f} | clip "
               "{:3.0f}% | lr {:.3e}{} | "
               "{:7.0f} tok/s{} | {:6.1f} ms/update | {} elapsed | ETA {}\n",
               position(s), iv.loss, iv.nll, std::exp(iv.nll), iv.gnorm,
               100.0 * double(iv.clipped) / n, iv.lr,
               iv.scheme_status.empty() ? "" : " | " + iv.scheme_status,
               double(iv.tokens) / iv.seconds,
               // A data-parallel job's tokens are every rank's.
               s.world() > 1 ? fmt::format(" ({} ranks)", s.world()) : std::string(),
               1e3 * iv.seconds / n, duration_text(s.elapsed()), duration_text(s.eta_seconds()));
    s.out.flush();
  }
  void on_tick(TrainingSession& s, double loss) override {
    if (!s.tty || TrainingSession::Clock::now() - last_bar_ < std::chrono::milliseconds(200))
      return;
    const int64_t max = s.spec.optim.max_updates;
    const int width = 30, filled = int(width * double(s.st.updates) / double(max));
    fmt::print(s.out, "\r[{}{}] {}/{} loss {:.4f} | ETA {}", std::string(size_t(filled), '#'),
               std::string(size_t(width - filled), '.'), s.st.updates, max, loss,
               duration_text(s.eta_seconds()));
    s.out.flush();
    last_bar_ = TrainingSession::Clock::now();
  }
  void on_validation(TrainingSession& s, const Validation& v) override {
    clear_bar(s);
    const std::string bleu =
        v.bleu < 0
            ? ""
            : fmt::format(" | bleu {:.2f}{}", v.bleu,
                          v.bleu_full >= 0
                              ? fmt::format(" ({} sentences; all {}: {:.2f})", v.bleu_sentences,
                                            s.ds.valid.examples.size(), v.bleu_full)
                              : "");
    fmt::print(s.out,
               "valid  | {} | loss {:.4f} | nll {:.4f} | ppl {:.2f}{}{} | {} elapsed | ETA {}\n",
               position(s), v.loss, v.nll, std::exp(v.nll), bleu,
               v.final ? fmt::format(" | uniform-prediction loss {:.4f}", s.uniform_loss) : "",
               duration_text(s.elapsed()), duration_text(v.final ? 0.0 : s.eta_seconds()));
    s.out.flush();
  }
  void on_tasks(TrainingSession& s, const TaskScores& t) override {
    clear_bar(s);
    std::string each;
    for (const auto& r : t.records)
      each += fmt::format(" | {} {:.4f}", r.value("task", ""), r.value("acc", 0.0));
    fmt::print(s.out, "tasks  | {}{} | average acc {:.4f} | {:.1f} s\n", position(s), each,
               t.average_acc, t.seconds);
    s.out.flush();
  }
  void on_phase(TrainingSession& s, const std::string& what) override {
    clear_bar(s);
    fmt::print(s.out, "{}   | {} | {} elapsed\n",
               s.progress.phase == "test decode" ? "test " : "valid", what,
               duration_text(s.elapsed()));
    s.out.flush();
  }
  void on_test(TrainingSession& s, const TestScore& t) override {
    fmt::print(s.out, "{}\n", t.line);
  }
  void on_end(TrainingSession& s, const TrainOutcome& o) override {
    if (o.status == "completed")
      fmt::print(
          s.out,
          "completed {} updates in {:.1f} s | {} vs uniform-prediction loss {:.4f} | best valid "
          "nll {:.4f}{}\n",
          s.st.updates, s.elapsed(),
          std::isfinite(o.last_train_nll)
              ? fmt::format("train nll {:.4f} (the last log interval's)", o.last_train_nll)
              : std::string("no train nll (no update in this process)"),
          s.uniform_loss, s.st.best_valid_nll,
          o.last_valid_bleu >= 0 ? fmt::format(" | valid BLEU {:.2f}", o.last_valid_bleu) : "");
    if (!o.note.empty()) {
      clear_bar(s);
      fmt::print(s.out, "{}\n", o.note);
    }
    if (s.loop_end) {
      const auto seconds = [](auto d) { return std::chrono::duration<double>(d).count(); };
      fmt::print(s.out,
                 "time: setup {:.1f} s, updates {:.1f} s, final phase {:.1f} s (final validation, "
                 "test decode, last checkpoint on disk); checkpoints held the update loop {:.2f} s "
                 "(snapshots {:.2f} s, waiting for earlier writes {:.2f} s)\n",
                 s.setup_seconds, seconds(*s.loop_end - s.t_start),
                 seconds(TrainingSession::Clock::now() - *s.loop_end),
                 s.checkpoints->snapshot_seconds() + s.checkpoints->wait_seconds(),
                 s.checkpoints->snapshot_seconds(), s.checkpoints->wait_seconds());
    }
    if (const double peak = cuda_peak_allocated(s.device); peak >= 0)
      fmt::print(s.out, "GPU memory: peak allocated {:.2f} GiB (CUDA caching allocator)\n",
                 peak / double(1 << 30));
    s.out.flush();  // the run's last word is seen now, not at exit
  }

 private:
  static void clear_bar(TrainingSession& s) {
    if (s.tty) fmt::print(s.out, "\r\033[K");
  }
  static std::string position(const TrainingSession& s) {
    return position_text(s.st.updates, s.spec.optim.max_updates, s.epoch_now(),
                         s.spec.optim.max_epochs);
  }
  TrainingSession::Clock::time_point last_bar_ = TrainingSession::Clock::now();
};

}  // namespace

std::unique_ptr<TrainingObserver> make_console_progress() {
  return std::make_unique<ConsoleProgress>();
}

}  // namespace normlab
