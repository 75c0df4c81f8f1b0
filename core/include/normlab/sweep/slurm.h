// `normlab sweep M.toml --slurm`: one Slurm job array per sweep, one array task per run index.
// No LibTorch include here (nor in slurm.cpp): the script generator is plain text and processes.
#pragma once

#include <string>
#include <vector>

namespace normlab {

struct SlurmOptions {
  std::string partition;          // empty: the cluster's default partition
  std::string time = "04:00:00";  // per array task (one attempt of one run)
  std::string account, qos, mem;  // empty: not passed
  int gpus_per_run = 0;           // > 0: --gres=gpu:G and the run uses run.device="cuda"
  int cpus_per_run = 0;           // > 0: --cpus-per-task=C (run.threads follows the allocation)
  int max_parallel = 0;           // > 0: at most this many tasks at once (--array=...%N)
  int ntasks_per_run = 1;   // > 1: each run is a data-parallel job of K ranks (srun --ntasks K)
  int nodes_per_run = 1;    // the nodes those ranks spread over (--nodes)
  int signal_lead_s = 300;  // USR1 this long before the time limit: save, requeue; 0: none
  std::vector<std::string> sbatch_extra;  // more sbatch options, one per item ("--constraint=a100")
  bool submit = true;                     // false: write the script only (dry run)
};

// "0-3,5,7-8" for the sorted, de-duplicated indices, then "%N" when max_parallel > 0.
std::string slurm_array_spec(const std::vector<int>& indices, int max_parallel);

// The word for a POSIX shell: unchanged when it holds only safe characters, else single-quoted.
std::string shell_quote(const std::string& word);

// The job-array script for the given run indices of the sweep (only those runs; the caller leaves
// out runs already completed or diverged). Each task runs
//   normlab run-one MANIFEST --index $SLURM_ARRAY_TASK_ID [--set run.device="cuda"]
//                            [--set run.threads=<allocated CPUs>] [--set OVERRIDE...]
// in the background, turns USR1 (sent signal_lead_s before the time limit) into SIGTERM for the
// trainer, which checkpoints and exits 130, then requeues the task; the requeued task resumes from
// the checkpoint. Pure function. Throws std::invalid_argument for no indices, a negative index or
// a newline in a path or option.
std::string sbatch_script(const SlurmOptions& opt, const std::string& normlab_exe,
                          const std::string& manifest_abs,
                          const std::vector<std::string>& overrides,
                          const std::vector<int>& indices, const std::string& sweep_dir_abs);

// Writes <sweep_dir>/slurm/sweep-<timestamp>.sbatch and, when opt.submit, runs
// `sbatch --parsable` on it; returns the job id ("" when not submitted) and sets *script_path.
// Throws std::runtime_error with sbatch's stderr (or why it could not run) on failure.
std::string submit_slurm(const SlurmOptions& opt, const std::string& normlab_exe,
                         const std::string& manifest_abs, const std::vector<std::string>& overrides,
                         const std::vector<int>& indices, const std::string& sweep_dir_abs,
                         std::string* script_path = nullptr);

// What to print after a submission: squeue, `normlab sweep M --status`, the per-task logs.
// `overrides` are the submission's --sets, repeated in the --status command (they may move the
// sweep directory).
std::string slurm_watch_hint(const std::string& job_id, const std::string& manifest,
                             const std::string& sweep_dir_abs, const std::string& script_path,
                             const std::vector<std::string>& overrides = {});

// The absolute path of normlab's executable (never the dynamic loader that started it), for the
// script to call back.
std::string current_executable();

}  // namespace normlab
