// `normlab train M.toml --nproc N`: a launcher for one machine, as `torchrun --nproc-per-node N
// --no-python` would be. It runs this same command line N times with torchrun's variables set
// (RANK, LOCAL_RANK, WORLD_SIZE, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1, a free MASTER_PORT),
// passes SIGINT/SIGTERM on to them, and stops them all when one fails.
#pragma once

#include <iosfwd>

namespace normlab {

// Returns rank 0's exit code (128 + signal when a signal ended it). `grace_s`: how long the other
// ranks get to notice a failed rank and stop on their own before they are sent SIGTERM.
int launch_local_ranks(int nproc, double grace_s, std::ostream& err);

}  // namespace normlab
