// What this build is and what it can run on, from LibTorch itself: `normlab --version`, a run's
// provenance (env.json), and the device check shared by the CLI, the trainer and eval.
#pragma once

#include <string>

namespace normlab {

// `normlab --version`: normlab's version, the git commit it was built from, LibTorch's version,
// whether CUDA is usable, the plugin SDK's ABI version; one "name value" per line.
std::string version_text();
// The same facts one by one, for a run's provenance (env.json).
struct BuildIdentity {
  std::string version, git, libtorch;  // git: commit (+"-dirty"), or "unknown"
};
BuildIdentity build_identity();

// Why `device` ("cpu", "cuda", "cuda:N") cannot be used by this build on this machine, in one
// line (e.g. "\"cuda:7\": this machine has 1 CUDA device (cuda:0)"); empty when it can.
std::string device_problem(const std::string& device);

}  // namespace normlab
