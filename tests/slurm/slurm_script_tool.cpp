// The Slurm script generator without the rest of normlab (no LibTorch), for
// slurm_localhost_test.sh: writes the job-array script with normlab::submit_slurm, submits it and
// prints the job id (first line), then the watch hint.
//   normlab_slurm_script --exe E --manifest M --sweep-dir D --indices 0,2 [--time T]
//       [--signal-lead S] [--cpus C] [--gpus G] [--max-parallel N] [--partition P] [--no-submit]
//       [--set k=v]...
#include <cstdlib>
#include <iostream>
#include <string>
#include <vector>

#include "normlab/sweep/slurm.h"

int main(int argc, char** argv) {
  normlab::SlurmOptions opt;
  std::string exe, manifest, sweep_dir;
  std::vector<int> indices;
  std::vector<std::string> overrides;
  try {
    for (int i = 1; i < argc; ++i) {
      const std::string a = argv[i];
      auto value = [&]() -> std::string {
        if (i + 1 >= argc) throw std::invalid_argument(a + " needs a value");
        return argv[++i];
      };
      if (a == "--exe")
        exe = value();
      else if (a == "--manifest")
        manifest = value();
      else if (a == "--sweep-dir")
        sweep_dir = value();
      else if (a == "--time")
        opt.time = value();
      else if (a == "--signal-lead")
        opt.signal_lead_s = std::stoi(value());
      else if (a == "--cpus")
        opt.cpus_per_run = std::stoi(value());
      else if (a == "--gpus")
        opt.gpus_per_run = std::stoi(value());
      else if (a == "--max-parallel")
        opt.max_parallel = std::stoi(value());
      else if (a == "--partition")
        opt.partition = value();
      else if (a == "--no-submit")
        opt.submit = false;
      else if (a == "--set")
        overrides.push_back(value());
      else if (a == "--indices") {
        const std::string list = value();
        for (size_t p = 0; p <= list.size();) {
          size_t q = list.find(',', p);
          if (q == std::string::npos) q = list.size();
          indices.push_back(std::stoi(list.substr(p, q - p)));
          p = q + 1;
        }
      } else {
        throw std::invalid_argument("unknown argument " + a);
      }
    }
    std::string script;
    const std::string id =
        normlab::submit_slurm(opt, exe, manifest, overrides, indices, sweep_dir, &script);
    std::cout << (id.empty() ? "-" : id) << "\n"
              << normlab::slurm_watch_hint(id, manifest, sweep_dir, script);
    return 0;
  } catch (const std::exception& e) {
    std::cerr << "normlab_slurm_script: error: " << e.what() << "\n";
    return 1;
  }
}
