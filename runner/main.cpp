// The `normlab` executable: argument parsing only; every subcommand is a core function.
#include <CLI/CLI.hpp>

#include <cstdlib>
#include <filesystem>
#include <iostream>

#include "normlab/analysis/plot_command.h"
#include "normlab/interop_commands.h"
#include "normlab/runtime_env.h"
#include "commands/commands.h"
#include "normlab/eval/eval_commands.h"
#include "slurm_cli.h"

namespace {

normlab::Arch parse_arch(const std::string& s) {
  return s == "lm" ? normlab::Arch::LM : normlab::Arch::EncDec;
}

std::map<std::string, std::string> parse_assignments(const std::vector<std::string>& items) {
  std::map<std::string, std::string> out;
  for (const auto& item : items) {
    auto eq = item.find('=');
    if (eq == std::string::npos || eq == 0)
      throw CLI::ValidationError("--param", "expected KEY=VALUE, got '" + item + "'");
    out[item.substr(0, eq)] = item.substr(eq + 1);
  }
  return out;
}

// Usage errors exit 2 (the shell convention, and normlab's code for bad input) rather than
// CLI11's own codes (105, 106, 109, …); --help and --version still exit 0.
constexpr int kExitUsage = 2;
int usage_exit(CLI::App& app, const CLI::Error& e) {
  const int code = app.exit(e);
  return code == 0 ? 0 : kExitUsage;
}

}  // namespace

int main(int argc, char** argv) {
  // Before anything else: may re-execute this program with OPENBLAS_CORETYPE set.
  normlab::choose_blas_kernels(argv);
  normlab::tune_malloc();
  CLI::App app{"normlab — residual/normalization schemes for deep Transformers"};
  app.set_version_flag("--version", [] { return normlab::version_text(); },
                       "normlab version, git commit, LibTorch version, CUDA, SDK ABI");
  app.require_subcommand(1);
  app.fallthrough();  // global options (--plugin-path) may follow the subcommand
  std::vector<std::string> plugin_paths;
  app.add_option("--plugin-path", plugin_paths, "extra plugin directory or file (repeatable)");
  bool allow_unsafe_plugin_path = false;
  app.add_flag("--allow-unsafe-plugin-path", allow_unsafe_plugin_path,
               "accept world-writable plugin folders/files and files of other users (warns)");

  auto* plugins = app.add_subcommand("plugins", "list and inspect scheme plugins");
  plugins->require_subcommand(1);
  plugins->add_subcommand("list", "name, version, ABI, file and description of each plugin");
  auto* plugin_new = plugins->add_subcommand("new", "write a commented starting point for a scheme plugin");
  std::string new_name, new_dir = ".";
  plugin_new->add_option("NAME", new_name, "scheme name, e.g. my-scheme")->required();
  plugin_new->add_option("--dir", new_dir, "parent folder (default: the working directory)");
  auto* show = plugins->add_subcommand("show", "parameters, equation and derived values of a scheme");
  std::string show_name, arch = "encdec";
  int enc_layers = 6, dec_layers = 6;
  bool json = false;
  std::vector<std::string> params;
  show->add_option("NAME", show_name, "scheme name")->required();
  show->add_option("--arch", arch, "encdec | lm")->check(CLI::IsMember({"encdec", "lm"}));
  show->add_option("--enc-layers", enc_layers, "encoder layers N")->check(CLI::PositiveNumber);
  show->add_option("--dec-layers", dec_layers, "decoder layers M")->check(CLI::PositiveNumber);
  show->add_option("--param", params, "scheme parameter KEY=VALUE (repeatable)");
  show->add_flag("--json", json, "machine-readable output");

  normlab::SmokeOptions smoke_opt;
  auto* smoke = app.add_subcommand(
      "smoke", "one forward and backward pass of a default model per scheme (the default job)");
  std::string smoke_arch = "encdec";
  smoke->add_option("--scheme", smoke_opt.schemes, "scheme(s) to run (default: all)");
  smoke->add_option("--arch", smoke_arch, "encdec | lm")->check(CLI::IsMember({"encdec", "lm"}));
  smoke->add_option("--enc-layers", smoke_opt.geometry.enc_layers)->check(CLI::PositiveNumber);
  smoke->add_option("--dec-layers", smoke_opt.geometry.dec_layers)->check(CLI::PositiveNumber);
  smoke->add_option("--d-model", smoke_opt.geometry.d_model)->check(CLI::PositiveNumber);
  smoke->add_option("--ffn-dim", smoke_opt.geometry.ffn_dim)->check(CLI::PositiveNumber);
  smoke->add_option("--heads", smoke_opt.geometry.heads)->check(CLI::PositiveNumber);
  smoke->add_option("--device", smoke_opt.device, "cpu | cuda");
  smoke->add_option("--threads", smoke_opt.threads, "LibTorch intra-op threads");

  normlab::BenchOptions bench_opt;
  auto* bench = app.add_subcommand(
      "bench", "time training steps of a model on a random batch (JSON lines; see bench/run_bench.py)");
  std::string bench_arch = "encdec";
  bench->add_option("--arch", bench_arch, "encdec | lm")->check(CLI::IsMember({"encdec", "lm"}));
  bench->add_option("--scheme", bench_opt.scheme, "scheme (default post-ln)");
  bench->add_option("--enc-layers", bench_opt.geometry.enc_layers)->check(CLI::PositiveNumber);
  bench->add_option("--dec-layers", bench_opt.geometry.dec_layers)->check(CLI::PositiveNumber);
  bench->add_option("--d-model", bench_opt.geometry.d_model)->check(CLI::PositiveNumber);
  bench->add_option("--ffn-dim", bench_opt.geometry.ffn_dim)->check(CLI::PositiveNumber);
  bench->add_option("--heads", bench_opt.geometry.heads)->check(CLI::PositiveNumber);
  bench->add_option("--batch", bench_opt.batch, "sentences (LM: blocks) per batch")->check(CLI::PositiveNumber);
  bench->add_option("--length", bench_opt.length, "tokens per sentence (LM: per block)")->check(CLI::PositiveNumber);
  bench->add_option("--vocab", bench_opt.vocab)->check(CLI::PositiveNumber);
  bench->add_option("--dropout", bench_opt.dropout);
  bench->add_option("--label-smoothing", bench_opt.label_smoothing);
  bench->add_option("--threads", bench_opt.threads, "LibTorch intra-op threads (default: all cores)");
  bench->add_option("--warmup", bench_opt.warmup, "untimed steps first");
  bench->add_option("--steps", bench_opt.steps, "timed steps (without --serve)");
  bench->add_option("--disable", bench_opt.disable, "speed levers to turn off, to measure them")
      ->check(CLI::IsMember({"dropout", "adamw", "loss", "attention", "ffn", "projection", "onednn", "linear"}));
  bench->add_option("--dtype", bench_opt.dtype, "fp32 | bf16 (autocast forward, as run.dtype)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  bench->add_flag("--serve", bench_opt.serve, "answer 'steps N', 'info', 'quit' lines on stdin");

  normlab::TrainOptions train_opt;
  auto* train = app.add_subcommand("train", "train (or resume) the experiment of a TOML manifest");
  train->add_option("MANIFEST", train_opt.manifest, "experiment manifest (.toml)")->required();
  train->add_option("--set", train_opt.overrides, "override a key: section.key=value (repeatable)");
  train->add_flag("--dump-config", train_opt.dump_config, "print the fully resolved manifest and exit");
  train->add_option("--resume-from", train_opt.resume_from,
                    "resume from this checkpoint (e.g. RUN/checkpoints/step_N.safetensors) instead of RUN/checkpoints/last.safetensors")
      ->check(CLI::ExistingFile);
  train->add_flag("--allow-unverified", train_opt.allow_unverified,
                  "resume even when checkpoints/SHA256SUMS does not list the checkpoint's SHA-256");

  normlab::SweepOptions sweep_opt;
  auto* sweep = app.add_subcommand("sweep", "run every run of a manifest's [sweep] (resumable)");
  sweep->add_option("MANIFEST", sweep_opt.manifest, "sweep manifest (.toml with a [sweep] section)")->required();
  sweep->add_option("--set", sweep_opt.overrides, "override a key of every run: section.key=value (repeatable)");
  sweep->add_option("--jobs,-j", sweep_opt.jobs, "worker processes at a time (each uses its manifest's run.threads)")
      ->check(CLI::PositiveNumber);
  sweep->add_option("--threads-per-run", sweep_opt.threads_per_run,
                    "override every run's run.threads (recorded in its env.json; results depend on threads)")
      ->check(CLI::PositiveNumber);
  auto* sweep_dry = sweep->add_flag("--dry-run", sweep_opt.dry_run, "list the runs (validated) and start nothing");
  auto* sweep_status = sweep->add_flag("--status", sweep_opt.status, "table of the sweep directory's runs");
  sweep->add_flag("--json", sweep_opt.json, "with --status: one JSON object instead of the table")->needs(sweep_status);
  sweep->add_option("--watch", sweep_opt.watch_s, "with --status: the table again every SECONDS until no run is pending or running")
      ->check(CLI::PositiveNumber)->needs(sweep_status);
  sweep->add_flag("--retry-failed", sweep_opt.retry_failed, "also run the runs that failed before");
  sweep_dry->excludes(sweep_status);
  auto* sweep_slurm = normlab::add_slurm_options(sweep, sweep_opt.slurm_opt);
  sweep_slurm->excludes(sweep_status);

  normlab::FrontierOptions frontier_opt;
  auto* frontier = app.add_subcommand(
      "frontier", "per scheme and depth, the largest peak lr that trains K updates without divergence (resumable)");
  frontier->add_option("MANIFEST", frontier_opt.manifest, "base manifest (no [sweep] section)")->required();
  frontier->add_option("--schemes", frontier_opt.schemes, "comma-separated scheme names")->delimiter(',')->required();
  frontier->add_option("--depths", frontier_opt.depths,
                       "comma-separated layer counts (encdec: enc_layers = dec_layers; lm: dec_layers)")
      ->delimiter(',')->required();
  frontier->add_option("--lr", frontier_opt.lr, "MIN:MAX of the half-decade lr grid (default 3e-4:3e-1)");
  frontier->add_option("--seeds", frontier_opt.seeds, "comma-separated seeds; an lr is stable when every seed is (default 1,2)")
      ->delimiter(',');
  frontier->add_option("--updates", frontier_opt.updates, "K: updates per trial (default 100)");
  frontier->add_option("--bisect", frontier_opt.bisect, "bisection steps after the grid (default 2)");
  frontier->add_option("--out", frontier_opt.out, "directory of the trials and results (default: the manifest's run.out_dir)");
  frontier->add_option("--jobs,-j", frontier_opt.jobs, "worker processes at a time (each uses its manifest's run.threads)");
  frontier->add_option("--set", frontier_opt.overrides, "override a key of every trial: section.key=value (repeatable)");
  frontier->add_flag("--dry-run", frontier_opt.dry_run, "validate and list the trials the next round needs; start nothing");
  frontier->add_flag("--retry-failed", frontier_opt.retry_failed, "also rerun trials whose worker failed before");

  normlab::RunOneOptions run_one_opt;
  auto* run_one = app.add_subcommand("run-one", "train (or resume) run I of a sweep manifest");
  run_one->add_option("MANIFEST", run_one_opt.manifest, "sweep manifest (.toml with a [sweep] section)")->required();
  run_one->add_option("--index", run_one_opt.index, "the run's index (see `normlab sweep MANIFEST --dry-run`)")
      ->required();
  run_one->add_option("--set", run_one_opt.overrides, "override a key: section.key=value (repeatable)");

  normlab::DataOptions data_opt;
  auto* data_cmd = app.add_subcommand("data", "named datasets: list, fetch (resumable, SHA-256 checked), path");
  data_cmd->require_subcommand(1);
  data_cmd->add_subcommand("list", "the datasets, whether fetched, whether their SHA-256 is pinned");
  for (const char* action : {"fetch", "path"}) {
    auto* sub = data_cmd->add_subcommand(action, std::string(action) == "fetch"
                                                     ? "download, verify and unpack NAME (from $NORMLAB_DATA_MIRROR when set)"
                                                     : "print NAME's folder (exit 1 when not fetched)");
    sub->add_option("NAME", data_opt.name, "dataset name (normlab data list)")->required();
  }

  normlab::ExportOptions export_opt;
  auto* export_cmd = app.add_subcommand(
      "export", "a run's weights as a PyTorch state_dict + config.json (python/normlab_torch.py loads them)");
  export_cmd->add_option("RUN", export_opt.run_dir, "run directory")->required();
  export_cmd->add_option("--to", export_opt.to, "output directory")->required();
  export_cmd->add_option("--checkpoint", export_opt.checkpoint, "best | last | step_N (default: best, else last)");
  export_cmd->add_flag("--allow-unverified", export_opt.allow_unverified,
                       "export even when checkpoints/SHA256SUMS does not list the checkpoint's SHA-256");
  export_cmd->add_option("--format", export_opt.format,
                         "torch: model.pt (torch.load); hf: model.safetensors, a HuggingFace-style folder");
  export_cmd->add_flag("--reference-logits", export_opt.reference_logits,
                       "also write reference.pt: a fixed input and normlab's logits (for checks)")
      ->group("");

  normlab::CheckpointConvertOptions convert_opt;
  auto* checkpoint_cmd = app.add_subcommand("checkpoint", "checkpoint tools");
  checkpoint_cmd->require_subcommand(1);
  auto* convert = checkpoint_cmd->add_subcommand(
      "convert", "rewrite a run's old TorchScript checkpoints (*.pt) as .safetensors (needs --trust-code)");
  convert->add_option("RUN", convert_opt.run, "run directory")->required();
  convert->add_flag("--trust-code", convert_opt.trust_code,
                    "required: loading a TorchScript archive can run code stored in it; only for files you trust");

  auto* manifest = app.add_subcommand("manifest", "manifest tools");
  manifest->require_subcommand(1);
  manifest->add_subcommand("reference", "markdown table of every manifest key");

  // Hidden (empty group): sacreBLEU-compatible corpus BLEU, for evaluation scripts and tests.
  normlab::BleuOptions bleu_opt;
  auto* bleu = app.add_subcommand("bleu", "corpus BLEU as sacreBLEU computes it by default (13a, exp)");
  bleu->group("");
  auto* bleu_hyp = bleu->add_option("--hyp", bleu_opt.hyp, "hypotheses, one per line")->check(CLI::ExistingFile);
  auto* bleu_ref = bleu->add_option("--ref", bleu_opt.ref, "references, one per line")->check(CLI::ExistingFile);
  bleu_hyp->needs(bleu_ref);
  bleu_ref->needs(bleu_hyp);
  bleu->add_flag("--json", bleu_opt.json, "score, counts, totals, sys_len, ref_len as JSON");
  bleu->add_option("--tokenize-13a", bleu_opt.tokenize_13a, "print FILE's lines tokenized by 13a instead")
      ->check(CLI::ExistingFile)
      ->excludes(bleu_hyp)
      ->excludes(bleu_ref);

  // eval / translate / forward: a run's model from its directory (README "Evaluate and inspect a model").
  auto add_model_options = [](CLI::App* cmd, normlab::RunModelOptions& m) {
    cmd->add_option("RUN", m.run, "run directory (runs/NAME)")->required();
    cmd->add_option("--checkpoint", m.checkpoint,
                    "best | last | step_N | avg:K (mean of the newest K step_N.safetensors) | FILE.safetensors (default: best, else last)");
    cmd->add_option("--device", m.device, "cpu | cuda | cuda:N (default: the run's)");
    cmd->add_flag("--allow-unverified", m.allow_unverified,
                  "use the checkpoint even when the SHA256SUMS beside it does not list its SHA-256");
  };
  auto add_decode_options = [](CLI::App* cmd, normlab::DecodeOptions& d) {
    cmd->add_option("--beam", d.beam, "beam size (1: greedy)")->check(CLI::PositiveNumber);
    cmd->add_option("--lenpen", d.lenpen, "length penalty: score / length^lenpen (fairseq)");
    cmd->add_option("--max-len-a", d.max_len_a, "output limit a*src_len + b (default: the run's eval.max_len_a)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--max-len-b", d.max_len_b, "output limit a*src_len + b (default: the run's eval.max_len_b)")
        ->check(CLI::NonNegativeNumber);
    cmd->add_option("--batch-tokens", d.batch_tokens, "sentences x beam x (source + output limit) per batch")
        ->check(CLI::PositiveNumber);
  };
  normlab::EvalOptions eval_opt;
  auto* eval = app.add_subcommand("eval", "test/valid score of a run: beam search, sacreBLEU-signed BLEU and chrF, perplexity");
  add_model_options(eval, eval_opt.model);
  add_decode_options(eval, eval_opt.decode);
  eval->add_option("--split", eval_opt.split, "valid | test")->check(CLI::IsMember({"valid", "test"}));
  eval->add_flag("--json", eval_opt.json, "one JSON object instead of text");
  normlab::TranslateOptions translate_opt;
  auto* translate = app.add_subcommand("translate", "translate stdin (raw text, one sentence a line) to stdout");
  add_model_options(translate, translate_opt.model);
  add_decode_options(translate, translate_opt.decode);
  normlab::ForwardOptions forward_opt;
  auto* forward = app.add_subcommand("forward", "tokens, log-probabilities and top-k logits of given inputs as JSON");
  add_model_options(forward, forward_opt.model);
  forward->add_option("--input", forward_opt.input, "encdec: SOURCE<TAB>TARGET PREFIX lines; lm: text lines")->required();
  forward->add_option("--top-k", forward_opt.top_k, "most likely next tokens per position")->check(CLI::PositiveNumber);
  forward->add_flag("--hidden", forward_opt.hidden, "also every layer's output vectors");
  bool forward_json = true;  // JSON is the only format; the flag is accepted for symmetry with eval
  forward->add_flag("--json", forward_json, "JSON output (the only format)");

  normlab::analysis::PlotOptions plot_opt;
  auto* plot = app.add_subcommand(
      "plot", "figures of the analysis quantities (PNG/SVG) from run and sweep directories");
  plot->add_option("DIR", plot_opt.dirs, "run directories and/or sweep directories (sweep.json)")
      ->required();
  plot->add_option("--out", plot_opt.out, "output directory")->required();
  plot->add_option("--format", plot_opt.formats, "comma-separated: png, svg, pdf (default png,svg)");
  plot->add_option("--update", plot_opt.updates,
                   "updates for the per-layer gradient figures: first, last or numbers, "
                   "comma-separated (default first,last)");
  plot->footer("Runs Python with matplotlib: $NORMLAB_PYTHON, else /usr/bin/python3, else python3.");

  normlab::analysis::ReportOptions report_opt;
  auto* report = app.add_subcommand(
      "report", "summary.csv, a self-contained HTML report and Markdown of a sweep");
  report->add_option("DIR", report_opt.dirs, "sweep directory (and/or run directories)")->required();
  report->add_option("--out", report_opt.out, "output directory (default: DIR/report)");
  report->footer("Runs Python with matplotlib: $NORMLAB_PYTHON, else /usr/bin/python3, else python3.");

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return usage_exit(app, e);
  }
  // Through the environment, so sweep workers (`normlab run-one`) inherit the choice.
  if (allow_unsafe_plugin_path) ::setenv(normlab::PluginRegistry::kAllowUnsafeEnv, "1", 1);

  try {
    if (app.got_subcommand("train")) {
      train_opt.plugin_paths = plugin_paths;
      return normlab::train_command(train_opt, std::cout, std::cerr);
    }
    if (app.got_subcommand("eval")) {
      eval_opt.model.plugin_paths = plugin_paths;
      return normlab::eval_command(eval_opt, std::cout, std::cerr);
    }
    if (app.got_subcommand("translate")) {
      translate_opt.model.plugin_paths = plugin_paths;
      return normlab::translate_command(translate_opt, std::cin, std::cout, std::cerr);
    }
    if (app.got_subcommand("forward")) {
      forward_opt.model.plugin_paths = plugin_paths;
      return normlab::forward_command(forward_opt, std::cout, std::cerr);
    }
    if (app.got_subcommand("plot")) return normlab::analysis::plot_command(plot_opt);
    if (app.got_subcommand("report")) return normlab::analysis::report_command(report_opt);
    if (app.got_subcommand("sweep")) {
      sweep_opt.plugin_paths = plugin_paths;
      sweep_opt.slurm = sweep_slurm->count() > 0;
      return normlab::sweep_command(sweep_opt, std::cout, std::cerr);
    }
    if (app.got_subcommand("frontier")) {
      frontier_opt.plugin_paths = plugin_paths;
      return normlab::frontier_command(frontier_opt, std::cout, std::cerr);
    }
    if (app.got_subcommand("run-one")) {
      run_one_opt.plugin_paths = plugin_paths;
      return normlab::run_one_command(run_one_opt, std::cout, std::cerr);
    }
    if (app.got_subcommand("data")) {
      data_opt.action = data_cmd->get_subcommands().front()->get_name();
      return normlab::data_command(data_opt, std::cout, std::cerr);
    }
    if (app.got_subcommand("checkpoint")) {
      convert_opt.plugin_paths = plugin_paths;
      return normlab::checkpoint_convert_command(convert_opt, std::cout, std::cerr);
    }
    if (app.got_subcommand("export")) {
      export_opt.plugin_paths = plugin_paths;
      return normlab::export_command(export_opt, std::cout, std::cerr);
    }
    if (app.got_subcommand("manifest")) return normlab::manifest_reference_command(std::cout);
    if (app.got_subcommand("bleu")) {
      if (bleu_opt.tokenize_13a.empty() && bleu_opt.hyp.empty())
        throw CLI::RequiredError("--hyp and --ref (or --tokenize-13a)");
      return normlab::bleu(bleu_opt, std::cout);
    }
    if (plugins->got_subcommand("new")) return normlab::plugins_new(new_name, new_dir, std::cout);
    std::vector<std::filesystem::path> paths(plugin_paths.begin(), plugin_paths.end());
    normlab::PluginRegistry registry(paths);
    if (plugins->got_subcommand("list")) return normlab::plugins_list(registry, std::cout, std::cerr);
    if (plugins->got_subcommand("show")) {
      normlab::PluginShowOptions opt;
      opt.name = show_name;
      opt.geometry.arch = parse_arch(arch);
      opt.geometry.enc_layers = opt.geometry.arch == normlab::Arch::LM ? 0 : enc_layers;
      opt.geometry.dec_layers = dec_layers;
      opt.params = parse_assignments(params);
      opt.json = json;
      return normlab::plugins_show(registry, opt, std::cout);
    }
    if (app.got_subcommand("bench")) {
      bench_opt.geometry.arch = parse_arch(bench_arch);
      return normlab::bench(registry, bench_opt, std::cin, std::cout);
    }
    if (app.got_subcommand("smoke")) {
      if (const std::string problem = normlab::device_problem(smoke_opt.device); !problem.empty()) {
        std::cerr << "normlab: error: --device " << problem << "\n";
        return kExitUsage;
      }
      smoke_opt.geometry.arch = parse_arch(smoke_arch);
      if (smoke_opt.geometry.arch == normlab::Arch::LM) smoke_opt.geometry.enc_layers = 0;
      return normlab::smoke(registry, smoke_opt, std::cout);
    }
  } catch (const CLI::Error& e) {
    return usage_exit(app, e);
  } catch (const normlab::PluginError& e) {  // bad input: exit code 2, like a bad manifest
    std::cerr << "normlab: error: " << e.what() << "\n";
    return 2;
  } catch (const std::exception& e) {
    std::cerr << "normlab: error: " << e.what() << "\n";
    return 1;
  }
  return 0;
}
