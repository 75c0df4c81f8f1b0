// The run directory of one training run: one process at a time (run.lock), status.json rewritten
// atomically, checkpoints written atomically with their SHA-256 in checkpoints/SHA256SUMS and old
// step_N.safetensors pruned, train.jsonl continued after a resume, a finished run recognized. No
// LibTorch here: checkpoint.cpp fills the bytes.
#pragma once

#include <chrono>
#include <cstdint>
#include <filesystem>
#include <functional>
#include <iosfwd>
#include <limits>
#include <map>
#include <optional>
#include <stdexcept>
#include <string>
#include <vector>

#include "normlab/train/trainer.h"
#include "run/checksums.h"
#include "util/atomic_file.h"
#include "util/file_lock.h"
#include "util/owned_dir.h"
#include "util/record_file.h"

namespace normlab {

struct ExperimentSpec;

// Another process trains in this run directory (one line naming it and its pid).
class RunBusyError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// What status.json says about a run in progress (NaN / negative: not known yet).
struct RunProgress {
  int64_t updates = 0, max_updates = 0;
  int64_t epoch = 0;                                             // 1-based; 0: not started
  double train_loss = std::numeric_limits<double>::quiet_NaN();  // the last log interval's mean
  double train_nll = std::numeric_limits<double>::quiet_NaN();   // the same interval's mean nll
  std::string phase = "training";  // then "final validation", "test decode"; "" once ended
  double valid_loss = std::numeric_limits<double>::quiet_NaN();
  double valid_nll = std::numeric_limits<double>::quiet_NaN();
  double valid_bleu = -1;
  double tokens_per_s = 0;
  double eta_s = -1;
  double elapsed_s = 0;
};

// "2024-05-01T12:34:56Z"
std::string iso8601_utc(std::chrono::system_clock::time_point t);

class RunDirectory {
 public:
  // Creates the directory and takes its run.lock, waiting up to `wait` for a holder that is
  // finishing (a sweep worker saving its last checkpoint). Throws RunBusyError.
  RunDirectory(std::filesystem::path dir, std::chrono::milliseconds wait);
  // The run directory as the other ranks of a data-parallel job see it (rank 0 holds run.lock and
  // writes): they read, and every write throws std::logic_error (the final status does nothing).
  static RunDirectory reader(std::filesystem::path dir);
  bool writer() const { return lock_.has_value(); }

  const std::filesystem::path& path() const { return dir_; }
  std::filesystem::path checkpoint(const std::string& name) const {
    return dir_ / "checkpoints" / name;
  }

  // <dir>/name, replaced atomically and durably. Throws util::FileError.
  void write_file(const std::string& name, const std::string& text) const;
  // A file of the run directory as text ("" when there is none).
  std::string read_file_or_empty(const std::string& name) const;

  // status.json: status (running | completed | stopped_early | diverged | interrupted | failed),
  // the progress, pid, host and the started/updated times. Throws util::FileError.
  void write_status(const std::string& status, const RunProgress& progress,
                    const std::string& note = "");
  // As write_status, but never throws: the last word of a run that is already failing.
  void write_final_status_noexcept(const std::string& status, const RunProgress& progress,
                                   const std::string& note) noexcept;

  // checkpoints/name from the bytes `fill` appends; its SHA-256 goes to SHA256SUMS before the
  // rename (the previous file's stays listed until the rename is done, so a crash in between
  // leaves a verifiable file either way). Throws util::FileError; the previous file stays intact.
  void save_checkpoint(const std::string& name, const std::function<void(util::AtomicFile&)>& fill);
  // checkpoints/last.safetensors from `fill`; with `with_step`, or when step_<updates>.safetensors
  // exists already (saved before a final validation), step_<updates>.safetensors becomes the same
  // file on disk; then all but the newest `keep_last` step_N.safetensors are pruned (prune_steps).
  void save_last(int64_t updates, bool with_step, int64_t keep_last,
                 const std::function<void(util::AtomicFile&)>& fill);
  // What save_last does once last.safetensors holds update `updates`: the step link, the pruning.
  void finish_last(int64_t updates, bool with_step, int64_t keep_last);
  // checkpoints/to as the same bytes as checkpoints/from (a hard link: no extra disk; a copy where
  // the file system has none).
  void link_checkpoint(const std::string& from, const std::string& to);
  // Removes all but the newest `keep` step_N.safetensors (0: removes them all); step_0.safetensors
  // (the initialization, run.save_initial) always stays.
  void prune_steps(int64_t keep);
  std::string checkpoint_problem(const std::filesystem::path& file) const {
    return checksum_problem(file);
  }
  // The checkpoint to resume from: `resume_from` when given, else checkpoints/last.safetensors when
  // it exists (nullopt: a fresh run). Throws CheckpointError when it fails its checksum (unless
  // `allow_unverified`), or when the run holds only checkpoints of the old TorchScript format.
  std::optional<std::filesystem::path> resume_point(const std::string& resume_from,
                                                    bool allow_unverified) const;

  // train.jsonl, continued after `updates_done` updates: lines logged after them (before a kill)
  // move to train.discarded.jsonl, so updates appear once and nothing written is lost.
  util::JsonlLog training_log(int64_t updates_done) const;

 private:
  RunDirectory() = default;
  void require_writer() const;
  using Sums = std::multimap<std::string, std::string>;  // file name → SHA-256 hex
  Sums read_sums() const;
  void write_sums(const Sums& sums);
  std::vector<std::pair<int64_t, std::filesystem::path>> steps() const;  // ascending

  std::filesystem::path dir_;
  std::optional<util::FileLock> lock_;
  std::string started_, host_;
};

// Takes `dir` for a run (util::claim_directory, kind "run"): new, empty, marked by normlab, or a
// run of a normlab from before the marker (it holds run.lock). Throws
// util::DirectoryClaimError naming `what` before writing anything into a folder that is not a run.
void claim_run_directory(const std::filesystem::path& dir, const std::string& what);

// When status.json in `dir` still says "running" for process `pid` (killed, so it could not write
// its last word) and nobody holds run.lock: status "interrupted" with `note`. Returns whether it
// did; never throws (a launcher's last step).
bool mark_interrupted_if_running(const std::filesystem::path& dir, int pid,
                                 const std::string& note) noexcept;

// A run in `dir` that already ended (completed up to max_updates, stopped early, or diverged):
// its outcome, after printing that there is nothing to do; nullopt when there is work to do.
// Throws ManifestError when the directory holds another experiment (its manifest.resolved.toml
// differs from `resolved` in more than what may change on a resume). Reads only.
// How `resolved` differs from the manifest.resolved.toml in `dir` in more than a resume may change
// (the first difference, in words: "[optim] 'lr = 0.001' became 'lr = 0.002'"); empty when they
// agree or `dir` holds none.
std::string run_manifest_change(const std::filesystem::path& dir, const std::string& resolved);
// The first key of [section] whose line differs between `dir`'s manifest.resolved.toml and
// `resolved`, in words; empty when they agree or `dir` holds none.
std::string manifest_section_change(const std::filesystem::path& dir, const std::string& resolved,
                                    const std::string& section);

std::optional<TrainOutcome> finished_run(const ExperimentSpec& spec,
                                         const std::filesystem::path& dir,
                                         const std::string& resolved, std::ostream& out);

}  // namespace normlab
