// The command-line flags of `normlab sweep M.toml --slurm ...` (header-only; the runner's CLI11).
// The sweep subcommand calls add_slurm_options(sweep_cmd, opt) and, when the returned --slurm
// flag was given, submits the runs that are not completed or diverged with normlab::submit_slurm.
#pragma once

#include <CLI/CLI.hpp>

#include "normlab/sweep/slurm.h"
#include "verb.h"

namespace normlab {

// Adds --slurm and the Slurm flags to `cmd`; returns the --slurm flag (check its count()).
inline CLI::Option* add_slurm_options(CLI::App* cmd, SlurmOptions& opt) {
  // No bound variable: add_flag(name, "text") is ambiguous in CLI11 under C++20 (the wheel's
  // build).
  auto* slurm = cmd->add_flag("--slurm")->description(
      "submit the runs as one Slurm job array (one task per run)");
  auto group = [&](CLI::Option* o) { return o->needs(slurm)->group("Slurm (with --slurm)"); };
  group(cmd->add_option("--partition", opt.partition, "partition (default: the cluster's)"));
  group(cmd->add_option("--time", opt.time, "time limit per task attempt, e.g. 08:00:00")
            ->capture_default_str());
  group(cmd->add_option("--gpus-per-run", opt.gpus_per_run,
                        "GPUs per run, per node with --nodes-per-run (--gres=gpu:G; the run uses "
                        "cuda, a rank per GPU)")
            ->check(verbs::kNonNegative));
  group(cmd->add_option("--cpus-per-run", opt.cpus_per_run,
                        "CPUs per run, per rank with --ntasks-per-run (--cpus-per-task)")
            ->check(verbs::kNonNegative));
  group(
      cmd->add_option("--ntasks-per-run", opt.ntasks_per_run,
                      "ranks per run: each run trains data-parallel as one srun of K tasks (c10d)")
          ->check(CLI::Range(1, 65536)));
  group(cmd->add_option("--nodes-per-run", opt.nodes_per_run,
                        "nodes the ranks of a run spread over (--nodes)")
            ->check(CLI::Range(1, 4096)));
  group(cmd->add_option("--max-parallel", opt.max_parallel, "at most N tasks at once (%N)")
            ->check(verbs::kNonNegative));
  group(cmd->add_option("--account", opt.account, "account to charge"));
  group(cmd->add_option("--qos", opt.qos, "quality of service"));
  group(cmd->add_option("--mem", opt.mem, "memory per run, e.g. 32G"));
  group(cmd->add_option("--signal-lead", opt.signal_lead_s,
                        "seconds before the time limit to checkpoint and requeue (0: never)")
            ->capture_default_str()
            ->check(CLI::Range(0, 65535)));
  group(cmd->add_option("--sbatch-arg", opt.sbatch_extra,
                        "one more sbatch option, e.g. --sbatch-arg=--constraint=a100 (repeatable)")
            ->allow_extra_args(false));
  return slurm;
}

}  // namespace normlab
