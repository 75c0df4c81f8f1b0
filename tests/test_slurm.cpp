// The sbatch job-array script of `normlab sweep --slurm` (text only; the real Slurm run is
// tests/slurm/slurm_localhost_test.sh).
#include <doctest/doctest.h>
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <stdexcept>
#include <string>
#include <vector>

#include "normlab/sweep/slurm.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_slurm {

using normlab::sbatch_script;
using normlab::shell_quote;
using normlab::slurm_array_spec;
using normlab::SlurmOptions;

namespace {

std::vector<std::string> lines_of(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

bool has_line(const std::string& text, const std::string& line) {
  for (const auto& l : lines_of(text))
    if (l == line) return true;
  return false;
}

int count_prefix(const std::string& text, const std::string& prefix) {
  int n = 0;
  for (const auto& l : lines_of(text)) n += l.rfind(prefix, 0) == 0;
  return n;
}

std::string script(const SlurmOptions& opt, std::vector<int> indices = {0, 1, 2},
                   std::vector<std::string> overrides = {},
                   std::string sweep_dir = "/scratch/runs/sweep") {
  return sbatch_script(opt, "/opt/normlab/bin/normlab", "/home/u/exp/m.toml", overrides, indices,
                       sweep_dir);
}

// Runs `bash -n` on the text: the script must at least parse.
bool bash_parses(const std::string& text) {
  auto path = std::filesystem::temp_directory_path() / "normlab_test_slurm_script.sh";
  std::ofstream(path) << text;
  int rc = std::system(("bash -n " + path.string() + " 2>/dev/null").c_str());
  std::filesystem::remove(path);
  return rc == 0;
}

}  // namespace

TEST_SUITE("slurm") {
  TEST_CASE("array spec: sorted ranges, only the given indices, throttle") {
    CHECK(slurm_array_spec({0, 1, 2, 3}, 0) == "0-3");
    CHECK(slurm_array_spec({5, 0, 2, 3, 4, 9}, 0) == "0,2-5,9");
    CHECK(slurm_array_spec({7}, 0) == "7");
    CHECK(slurm_array_spec({3, 3, 1}, 2) == "1,3%2");
    CHECK(slurm_array_spec({0, 1, 2}, 4) == "0-2%4");
    CHECK_THROWS_AS(slurm_array_spec({}, 0), std::invalid_argument);
    CHECK_THROWS_AS(slurm_array_spec({-1, 2}, 0), std::invalid_argument);
  }

  TEST_CASE("array line and log path") {
    SlurmOptions opt;
    std::string s = script(opt, {4, 0, 1, 6});
    CHECK(lines_of(s).front() == "#!/bin/bash");
    CHECK(has_line(s, "#SBATCH --array=0-1,4,6"));
    CHECK(count_prefix(s, "#SBATCH --array=") == 1);
    CHECK(has_line(s, "#SBATCH --output=/scratch/runs/sweep/slurm/%A_%a.out"));
    CHECK(has_line(s, "#SBATCH --open-mode=append"));
    CHECK(has_line(s, "#SBATCH --job-name=normlab-sweep"));
    CHECK(s.find("--index \"$SLURM_ARRAY_TASK_ID\"") != std::string::npos);
    CHECK(bash_parses(s));

    s = script(opt, {0}, {}, "/scratch/runs/depth/");
    CHECK(has_line(s, "#SBATCH --job-name=normlab-depth"));
    CHECK(has_line(s, "#SBATCH --output=/scratch/runs/depth/slurm/%A_%a.out"));

    opt.max_parallel = 3;
    CHECK(has_line(script(opt, {2, 3}), "#SBATCH --array=2-3%3"));
  }

  TEST_CASE("resources, time, partition and the options left out when unset") {
    SlurmOptions opt;
    std::string s = script(opt);
    CHECK(has_line(s, "#SBATCH --time=04:00:00"));
    CHECK(count_prefix(s, "#SBATCH --partition") == 0);
    CHECK(count_prefix(s, "#SBATCH --gres") == 0);
    CHECK(count_prefix(s, "#SBATCH --cpus-per-task") == 0);
    CHECK(count_prefix(s, "#SBATCH --account") == 0);
    CHECK(count_prefix(s, "#SBATCH --mem") == 0);
    CHECK(s.find("run.device") == std::string::npos);

    opt.partition = "gpu";
    opt.time = "1-00:00:00";
    opt.account = "proj42";
    opt.qos = "normal";
    opt.mem = "32G";
    opt.cpus_per_run = 8;
    opt.sbatch_extra = {"--constraint=a100", "--exclusive"};
    s = script(opt);
    CHECK(has_line(s, "#SBATCH --partition=gpu"));
    CHECK(has_line(s, "#SBATCH --time=1-00:00:00"));
    CHECK(has_line(s, "#SBATCH --account=proj42"));
    CHECK(has_line(s, "#SBATCH --qos=normal"));
    CHECK(has_line(s, "#SBATCH --mem=32G"));
    CHECK(has_line(s, "#SBATCH --cpus-per-task=8"));
    CHECK(has_line(s, "#SBATCH --constraint=a100"));
    CHECK(has_line(s, "#SBATCH --exclusive"));
    // run.threads follows the allocation
    CHECK(s.find("threads=${SLURM_CPUS_PER_TASK:-${SLURM_CPUS_ON_NODE:-}}") != std::string::npos);
    CHECK(s.find("--set \"run.threads=$threads\"") != std::string::npos);
    CHECK(bash_parses(s));
  }

  TEST_CASE("gres and the cuda device") {
    SlurmOptions opt;
    opt.gpus_per_run = 2;
    std::string s = script(opt);
    CHECK(has_line(s, "#SBATCH --gres=gpu:2"));
    CHECK(has_line(s, "args+=(--set 'run.device=\"cuda\"')"));
    // user overrides come after the device, so --set run.device=cuda:1 still wins
    s = script(opt, {0}, {"run.device=cuda:1"});
    CHECK(s.find("run.device=\"cuda\"") < s.find("run.device=cuda:1"));
    CHECK(bash_parses(s));
  }

  TEST_CASE(
      "a data-parallel run: one srun of K ranks, signalled through Slurm, its rendezvous on the "
      "first node") {
    SlurmOptions opt;
    std::string s = script(opt);
    CHECK(has_line(s, "#SBATCH --ntasks=1"));
    CHECK(s.find("srun") == std::string::npos);
    opt.ntasks_per_run = 4;
    opt.nodes_per_run = 2;
    opt.gpus_per_run = 2;
    s = script(opt);
    CHECK(has_line(s, "#SBATCH --nodes=2"));
    CHECK(has_line(s, "#SBATCH --ntasks=4"));
    CHECK(has_line(s, "#SBATCH --gres=gpu:2"));
    CHECK(has_line(s, "srun --ntasks=\"$SLURM_NTASKS\" \"$NORMLAB\" \"${args[@]}\" &"));
    CHECK(has_line(
        s, "export MASTER_ADDR=$(scontrol show hostnames \"$SLURM_JOB_NODELIST\" | head -n 1)"));
    // srun would answer a SIGTERM of its own by killing the ranks: they get theirs from Slurm.
    CHECK(has_line(s, "stop_run() { scancel --signal=TERM \"${SLURM_JOB_ID}.0\" 2>/dev/null; }"));
    CHECK(s.find("kill -TERM \"$child\"") == std::string::npos);
    CHECK(bash_parses(s));
    opt.nodes_per_run = 5;
    CHECK_THROWS_AS(script(opt), std::invalid_argument);
  }

  TEST_CASE("signal before the time limit, requeue") {
    SlurmOptions opt;
    std::string s = script(opt);
    CHECK(has_line(s, "#SBATCH --signal=B:USR1@300"));
    CHECK(has_line(s, "#SBATCH --requeue"));
    CHECK(has_line(s, "trap on_usr1 USR1"));
    CHECK(has_line(s, "trap on_term TERM INT"));
    CHECK(s.find("kill -TERM \"$child\"") != std::string::npos);
    CHECK(has_line(s, "task=\"${SLURM_ARRAY_JOB_ID}_${SLURM_ARRAY_TASK_ID}\""));
    CHECK(s.find("scontrol requeue \"$task\"") != std::string::npos);
    CHECK(s.find("[ \"$rc\" = 130 ] || [ \"$rc\" = 143 ]") != std::string::npos);
    // the trap is in place before the run starts, the run in the background so the trap can fire
    CHECK(s.find("trap on_usr1 USR1") < s.find("\"$NORMLAB\" \"${args[@]}\" &"));

    opt.signal_lead_s = 45;
    CHECK(has_line(script(opt), "#SBATCH --signal=B:USR1@45"));
    opt.signal_lead_s = 0;
    CHECK(count_prefix(script(opt), "#SBATCH --signal") == 0);
  }

  TEST_CASE("paths with spaces, quotes and % are quoted") {
    SlurmOptions opt;
    std::string s = sbatch_script(opt, "/opt/my tools/normlab", "/home/u/it's here/m.toml",
                                  {"run.note=a b", "data.x=\"q\""}, {1}, "/scratch/my runs/50%/sw");
    CHECK(has_line(s, "#SBATCH --output=\"/scratch/my runs/50%%/sw/slurm/%A_%a.out\""));
    CHECK(has_line(s, "NORMLAB='/opt/my tools/normlab'"));
    CHECK(has_line(s, "MANIFEST='/home/u/it'\\''s here/m.toml'"));
    CHECK(has_line(s, "args+=(--set 'run.note=a b' --set 'data.x=\"q\"')"));
    CHECK(bash_parses(s));

    CHECK(shell_quote("plain/path-1.toml") == "plain/path-1.toml");
    CHECK(shell_quote("") == "''");
    CHECK(shell_quote("a b") == "'a b'");
    CHECK(shell_quote("$HOME") == "'$HOME'");
    CHECK(shell_quote("it's") == "'it'\\''s'");

    CHECK_THROWS_AS(sbatch_script(opt, "/bin/normlab", "/m.toml", {"a=1\nrm -rf /"}, {0}, "/s"),
                    std::invalid_argument);
    CHECK_THROWS_AS(sbatch_script(opt, "/bin/normlab", "/m.toml", {}, {}, "/s"),
                    std::invalid_argument);
  }

  TEST_CASE("the script runs: USR1 → SIGTERM to the run → requeue of this task") {
    // A stand-in `normlab` and `scontrol` on PATH; the script itself runs in bash, signalled
    // as Slurm would. (tests/slurm/slurm_localhost_test.sh does this on a real Slurm.)
    namespace fs = std::filesystem;
    fs::path dir = fs::temp_directory_path() / ("normlab_test_slurm_" + std::to_string(::getpid()));
    fs::create_directories(dir / "bin");
    auto write_exe = [&](const fs::path& p, const std::string& text) {
      std::ofstream(p) << text;
      fs::permissions(p, fs::perms::owner_all);
    };
    write_exe(dir / "bin" / "normlab", R"(#!/bin/bash
sleep 30 &
s=$!
trap 'kill $s; echo saved >"$(dirname "$0")/../saved"; exit 130' TERM
printf '%s\n' "$@" >"$(dirname "$0")/../args"
wait $s
)");
    write_exe(dir / "bin" / "scontrol", R"(#!/bin/bash
echo "$@" >"$(dirname "$0")/../scontrol"
)");
    SlurmOptions opt;
    std::string s = sbatch_script(opt, (dir / "bin" / "normlab").string(), "/m.toml",
                                  {"optim.lr=1e-3"}, {3}, dir.string());
    std::ofstream(dir / "job.sh") << s;
    const std::string cmd = "cd " + dir.string() + " && export PATH=" + (dir / "bin").string() +
                            ":$PATH; SLURM_ARRAY_JOB_ID=77 SLURM_ARRAY_TASK_ID=3 SLURM_JOB_ID=80 "
                            "SLURM_CPUS_PER_TASK=4 bash job.sh >log 2>&1 & pid=$!; "
                            "for i in $(seq 50); do [ -f args ] && break; sleep 0.1; done; "
                            "kill -USR1 $pid; wait $pid; echo $? >rc";
    REQUIRE(std::system(("bash -c '" + cmd + "'").c_str()) == 0);
    auto read = [&](const char* name) {
      std::ifstream f(dir / name);
      std::stringstream ss;
      ss << f.rdbuf();
      return ss.str();
    };
    CHECK(read("saved") == "saved\n");
    CHECK(read("scontrol") == "requeue 77_3\n");
    CHECK(read("rc") == "0\n");
    CHECK(read("args") ==
          "run-one\n/m.toml\n--index\n3\n--set\nrun.threads=4\n--set\noptim.lr=1e-3\n");
    fs::remove_all(dir);
  }

}  // TEST_SUITE

}  // namespace normlab_test_slurm
