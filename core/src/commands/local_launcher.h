// `normlab train M.toml --nproc N`: a launcher for one machine, as `torchrun --nproc-per-node N
// --no-python` would be. It runs this same command line N times with torchrun's variables set
// (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT),
// passes SIGINT/SIGTERM on to them, and stops them all when one fails.
#pragma once

#include <iosfwd>
#include <string>

namespace normlab {

#include <filesystem>

// Set in each rank's environment to the launcher's pid: a rank tells its launcher's variables from
// RANK/WORLD_SIZE a user's shell already had (then `--nproc` is refused: issue 42.21).
inline constexpr const char* kLauncherPidVariable = "NORMLAB_LAUNCHER_PID";
// Whether this process is a rank that `launch_local_ranks` started.
bool started_by_local_launcher();

// Returns rank 0's exit code (128 + signal when a signal ended it). `grace_s`: how long the other
// ranks get to notice a failed rank and stop on their own before they are sent SIGTERM. When a
// signal ended rank 0 (SIGKILL: it could not write its last status), `run_dir`'s status.json that
// still says "running" for rank 0 becomes "interrupted", and the exit code is 130, as for a run
// stopped by SIGINT: the same command resumes it (issue 42.18).
int launch_local_ranks(int nproc, double grace_s, const std::filesystem::path& run_dir,
                       std::ostream& err);

}  // namespace normlab
