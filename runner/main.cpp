// The `normlab` executable: argument parsing only; every subcommand is a core function.
#include <CLI/CLI.hpp>
#include <cstdlib>
#include <filesystem>
#include <functional>
#include <iostream>
#include <memory>

#include "commands/commands.h"
#include "normlab/analysis/plot_command.h"
#include "normlab/eval/eval_commands.h"
#include "normlab/interop_commands.h"
#include "normlab/runtime_env.h"
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

// What every subcommand may need of the global options.
struct Globals {
  std::vector<std::string> plugin_paths;  // --plugin-path
  bool allow_unsafe_plugin_path = false;
};

// A subcommand: its CLI11 options, bound to state the closure owns, and what running it does.
struct Verb {
  CLI::App* cmd;
  std::function<int()> run;
};

template <class T>
std::shared_ptr<T> state() {
  return std::make_shared<T>();
}

Verb add_plugins(CLI::App& app, const Globals& g) {
  struct S {
    std::string new_name, new_dir = ".", show_name, arch = "encdec";
    int enc_layers = 6, dec_layers = 6;
    bool json = false;
    std::vector<std::string> params;
  };
  auto s = state<S>();
  auto* plugins = app.add_subcommand("plugins", "list and inspect scheme plugins");
  plugins->require_subcommand(1);
  auto* list =
      plugins->add_subcommand("list", "name, version, ABI, file and description of each plugin");
  auto* plugin_new =
      plugins->add_subcommand("new", "write a commented starting point for a scheme plugin");
  plugin_new->add_option("NAME", s->new_name, "scheme name, e.g. my-scheme")->required();
  plugin_new->add_option("--dir", s->new_dir, "parent folder (default: the working directory)");
  auto* show =
      plugins->add_subcommand("show", "parameters, equation and derived values of a scheme");
  show->add_option("NAME", s->show_name, "scheme name")->required();
  show->add_option("--arch", s->arch, "encdec | lm")->check(CLI::IsMember({"encdec", "lm"}));
  show->add_option("--enc-layers", s->enc_layers, "encoder layers N")->check(CLI::PositiveNumber);
  show->add_option("--dec-layers", s->dec_layers, "decoder layers M")->check(CLI::PositiveNumber);
  show->add_option("--param", s->params, "scheme parameter KEY=VALUE (repeatable)");
  show->add_flag("--json", s->json, "machine-readable output");
  return {plugins, [s, &g, plugin_new, list, show]() -> int {
            if (plugin_new->parsed())
              return normlab::plugins_new(s->new_name, s->new_dir, std::cout);
            normlab::PluginRegistry registry(
                std::vector<std::filesystem::path>(g.plugin_paths.begin(), g.plugin_paths.end()));
            if (list->parsed()) return normlab::plugins_list(registry, std::cout, std::cerr);
            normlab::PluginShowOptions opt;
            opt.name = s->show_name;
            opt.geometry.arch = parse_arch(s->arch);
            opt.geometry.enc_layers = opt.geometry.arch == normlab::Arch::LM ? 0 : s->enc_layers;
            opt.geometry.dec_layers = s->dec_layers;
            opt.params = parse_assignments(s->params);
            opt.json = s->json;
            return show->parsed() ? normlab::plugins_show(registry, opt, std::cout) : 0;
          }};
}

Verb add_smoke(CLI::App& app, const Globals& g) {
  struct S {
    normlab::SmokeOptions opt;
    std::string arch = "encdec", family = "transformer";
  };
  auto s = state<S>();
  auto* smoke = app.add_subcommand(
      "smoke", "one forward and backward pass of a default model per scheme (the default job)");
  smoke->add_option("--scheme", s->opt.schemes, "scheme(s) to run (default: all)");
  smoke->add_option("--arch", s->arch, "encdec | lm")->check(CLI::IsMember({"encdec", "lm"}));
  smoke
      ->add_option("--family", s->family,
                   "transformer | llama (decoder-only: implies --arch lm; RMSNorm)")
      ->check(CLI::IsMember({"transformer", "llama"}));
  smoke->add_option("--enc-layers", s->opt.geometry.enc_layers)->check(CLI::PositiveNumber);
  smoke->add_option("--dec-layers", s->opt.geometry.dec_layers)->check(CLI::PositiveNumber);
  smoke->add_option("--d-model", s->opt.geometry.d_model)->check(CLI::PositiveNumber);
  smoke->add_option("--ffn-dim", s->opt.geometry.ffn_dim)->check(CLI::PositiveNumber);
  smoke->add_option("--heads", s->opt.geometry.heads)->check(CLI::PositiveNumber);
  smoke->add_option("--device", s->opt.device, "cpu | cuda");
  smoke->add_option("--threads", s->opt.threads, "LibTorch intra-op threads");
  return {smoke, [s, &g]() -> int {
            if (const std::string problem = normlab::device_problem(s->opt.device);
                !problem.empty()) {
              std::cerr << "normlab: error: --device " << problem << "\n";
              return kExitUsage;
            }
            s->opt.geometry.arch = parse_arch(s->family == "llama" ? "lm" : s->arch);
            if (s->family == "llama") {
              s->opt.geometry.family = normlab::Family::Llama;
              s->opt.geometry.norm = normlab::NormSpec::of(normlab::NormKind::RMSNorm);
            }
            if (s->opt.geometry.arch == normlab::Arch::LM) s->opt.geometry.enc_layers = 0;
            normlab::PluginRegistry registry(
                std::vector<std::filesystem::path>(g.plugin_paths.begin(), g.plugin_paths.end()));
            return normlab::smoke(registry, s->opt, std::cout);
          }};
}

Verb add_bench(CLI::App& app, const Globals& g) {
  struct S {
    normlab::BenchOptions opt;
    std::string arch = "encdec";
  };
  auto s = state<S>();
  normlab::BenchOptions& o = s->opt;
  auto* bench = app.add_subcommand(
      "bench",
      "time training steps of a model on a random batch (JSON lines; see bench/run_bench.py)");
  bench->add_option("--arch", s->arch, "encdec | lm")->check(CLI::IsMember({"encdec", "lm"}));
  bench->add_option("--scheme", o.scheme, "scheme (default post-ln)");
  bench->add_option("--enc-layers", o.geometry.enc_layers)->check(CLI::PositiveNumber);
  bench->add_option("--dec-layers", o.geometry.dec_layers)->check(CLI::PositiveNumber);
  bench->add_option("--d-model", o.geometry.d_model)->check(CLI::PositiveNumber);
  bench->add_option("--ffn-dim", o.geometry.ffn_dim)->check(CLI::PositiveNumber);
  bench->add_option("--heads", o.geometry.heads)->check(CLI::PositiveNumber);
  bench->add_option("--batch", o.batch, "sentences (LM: blocks) per batch")
      ->check(CLI::PositiveNumber);
  bench->add_option("--length", o.length, "tokens per sentence (LM: per block)")
      ->check(CLI::PositiveNumber);
  bench->add_option("--vocab", o.vocab)->check(CLI::PositiveNumber);
  bench->add_option("--dropout", o.dropout, "residual dropout (model.dropout)");
  bench->add_option("--attention-dropout", o.attention_dropout, "model.attention_dropout");
  bench->add_option("--activation-dropout", o.activation_dropout, "model.activation_dropout");
  bench->add_option("--label-smoothing", o.label_smoothing);
  bench->add_option("--threads", o.threads, "LibTorch intra-op threads (default: all cores)");
  bench->add_option("--warmup", o.warmup, "untimed steps first");
  bench->add_option("--steps", o.steps, "timed steps (without --serve)");
  bench->add_option("--disable", o.disable, "speed levers to turn off, to measure them")
      ->check(CLI::IsMember(
          {"dropout", "adamw", "loss", "attention", "ffn", "projection", "onednn", "linear"}));
  bench->add_option("--dtype", o.dtype, "fp32 | bf16 (autocast forward, as run.dtype)")
      ->check(CLI::IsMember({"fp32", "bf16"}));
  bench->add_flag("--serve", o.serve, "answer 'steps N', 'info', 'quit' lines on stdin");
  return {bench, [s, &g]() -> int {
            s->opt.geometry.arch = parse_arch(s->arch);
            normlab::PluginRegistry registry(
                std::vector<std::filesystem::path>(g.plugin_paths.begin(), g.plugin_paths.end()));
            return normlab::bench(registry, s->opt, std::cin, std::cout);
          }};
}

Verb add_train(CLI::App& app, const Globals& g) {
  auto o = state<normlab::TrainOptions>();
  auto* train = app.add_subcommand("train", "train (or resume) the experiment of a TOML manifest");
  train->add_option("MANIFEST", o->manifest, "experiment manifest (.toml)")->required();
  train->add_option("--set", o->overrides, "override a key: section.key=value (repeatable)");
  train->add_flag("--dump-config", o->dump_config, "print the fully resolved manifest and exit");
  train
      ->add_option(
          "--resume-from", o->resume_from,
          "resume from this checkpoint (e.g. RUN/checkpoints/step_N.safetensors) instead of "
          "RUN/checkpoints/last.safetensors")
      ->check(CLI::ExistingFile);
  train->add_flag("--allow-unverified", o->allow_unverified,
                  "resume even when checkpoints/SHA256SUMS does not list the checkpoint's SHA-256");
  train
      ->add_option("--nproc", o->nproc,
                   "data-parallel: start N ranks on this machine (c10d; as torchrun "
                   "--nproc-per-node N --no-python)")
      ->check(CLI::Range(1, 1024));
  train->add_flag(
      "--allow-world-size-change", o->allow_world_size_change,
      "resume a checkpoint written by another number of ranks, keeping its batches per update");
  return {train, [o, &g] {
            o->plugin_paths = g.plugin_paths;
            return normlab::train_command(*o, std::cout, std::cerr);
          }};
}

Verb add_sweep(CLI::App& app, const Globals& g) {
  auto o = state<normlab::SweepOptions>();
  auto* sweep = app.add_subcommand("sweep", "run every run of a manifest's [sweep] (resumable)");
  sweep->add_option("MANIFEST", o->manifest, "sweep manifest (.toml with a [sweep] section)")
      ->required();
  sweep->add_option("--set", o->overrides,
                    "override a key of every run: section.key=value (repeatable)");
  sweep
      ->add_option("--jobs,-j", o->jobs,
                   "worker processes at a time (each uses its manifest's run.threads)")
      ->check(CLI::PositiveNumber);
  sweep
      ->add_option(
          "--threads-per-run", o->threads_per_run,
          "override every run's run.threads (recorded in its env.json; results depend on threads)")
      ->check(CLI::PositiveNumber);
  auto* dry =
      sweep->add_flag("--dry-run", o->dry_run, "list the runs (validated) and start nothing");
  auto* status = sweep->add_flag("--status", o->status, "table of the sweep directory's runs");
  sweep->add_flag("--json", o->json, "with --status: one JSON object instead of the table")
      ->needs(status);
  sweep
      ->add_option(
          "--watch", o->watch_s,
          "with --status: the table again every SECONDS until no run is pending or running")
      ->check(CLI::PositiveNumber)
      ->needs(status);
  sweep->add_flag("--retry-failed", o->retry_failed, "also run the runs that failed before");
  dry->excludes(status);
  auto* slurm = normlab::add_slurm_options(sweep, o->slurm_opt);
  slurm->excludes(status);
  return {sweep, [o, &g, slurm] {
            o->plugin_paths = g.plugin_paths;
            o->slurm = slurm->count() > 0;
            return normlab::sweep_command(*o, std::cout, std::cerr);
          }};
}

Verb add_frontier(CLI::App& app, const Globals& g) {
  auto o = state<normlab::FrontierOptions>();
  auto* frontier = app.add_subcommand("frontier",
                                      "per scheme and depth, the largest peak lr that trains K "
                                      "updates without divergence (resumable)");
  frontier->add_option("MANIFEST", o->manifest, "base manifest (no [sweep] section)")->required();
  frontier->add_option("--schemes", o->schemes, "comma-separated scheme names")
      ->delimiter(',')
      ->required();
  frontier
      ->add_option("--depths", o->depths,
                   "comma-separated layer counts (encdec: enc_layers = dec_layers; lm: dec_layers)")
      ->delimiter(',')
      ->required();
  frontier->add_option("--lr", o->lr, "MIN:MAX of the half-decade lr grid (default 3e-4:3e-1)");
  frontier
      ->add_option("--seeds", o->seeds,
                   "comma-separated seeds; an lr is stable when every seed is (default 1,2)")
      ->delimiter(',');
  frontier->add_option("--updates", o->updates, "K: updates per trial (default 100)");
  frontier->add_option("--bisect", o->bisect, "bisection steps after the grid (default 2)");
  frontier->add_option("--out", o->out,
                       "directory of the trials and results (default: the manifest's run.out_dir)");
  frontier->add_option("--jobs,-j", o->jobs,
                       "worker processes at a time (each uses its manifest's run.threads)");
  frontier->add_option("--set", o->overrides,
                       "override a key of every trial: section.key=value (repeatable)");
  frontier->add_flag("--dry-run", o->dry_run,
                     "validate and list the trials the next round needs; start nothing");
  frontier->add_flag("--retry-failed", o->retry_failed,
                     "also rerun trials whose worker failed before");
  return {frontier, [o, &g] {
            o->plugin_paths = g.plugin_paths;
            return normlab::frontier_command(*o, std::cout, std::cerr);
          }};
}

Verb add_run_one(CLI::App& app, const Globals& g) {
  auto o = state<normlab::RunOneOptions>();
  auto* run_one = app.add_subcommand("run-one", "train (or resume) run I of a sweep manifest");
  run_one->add_option("MANIFEST", o->manifest, "sweep manifest (.toml with a [sweep] section)")
      ->required();
  run_one
      ->add_option("--index", o->index, "the run's index (see `normlab sweep MANIFEST --dry-run`)")
      ->required();
  run_one->add_option("--set", o->overrides, "override a key: section.key=value (repeatable)");
  return {run_one, [o, &g] {
            o->plugin_paths = g.plugin_paths;
            return normlab::run_one_command(*o, std::cout, std::cerr);
          }};
}

Verb add_data(CLI::App& app, const Globals&) {
  auto o = state<normlab::DataOptions>();
  auto* data =
      app.add_subcommand("data", "named datasets: list, fetch (resumable, SHA-256 checked), path");
  data->require_subcommand(1);
  data->add_subcommand("list", "the datasets, whether fetched, whether their SHA-256 is pinned");
  for (const char* action : {"fetch", "path"}) {
    auto* sub = data->add_subcommand(
        action, std::string(action) == "fetch"
                    ? "download, verify and unpack NAME (from $NORMLAB_DATA_MIRROR when set)"
                    : "print NAME's folder (exit 1 when not fetched)");
    sub->add_option("NAME", o->name, "dataset name (normlab data list)")->required();
  }
  return {data, [o, data] {
            o->action = data->get_subcommands().front()->get_name();
            return normlab::data_command(*o, std::cout, std::cerr);
          }};
}

Verb add_export(CLI::App& app, const Globals& g) {
  auto o = state<normlab::ExportOptions>();
  auto* cmd = app.add_subcommand(
      "export",
      "a run's weights as a PyTorch state_dict + config.json (python/normlab_torch.py loads them)");
  cmd->add_option("RUN", o->run_dir, "run directory")->required();
  cmd->add_option("--to", o->to, "output directory")->required();
  cmd->add_option("--checkpoint", o->checkpoint, "best | last | step_N (default: best, else last)");
  cmd->add_flag("--allow-unverified", o->allow_unverified,
                "export even when checkpoints/SHA256SUMS does not list the checkpoint's SHA-256");
  cmd->add_option(
      "--format", o->format,
      "torch: model.pt (torch.load); hf: model.safetensors, a HuggingFace-style folder");
  cmd->add_flag("--reference-logits", o->reference_logits,
                "also write reference.pt: a fixed input and normlab's logits (for checks)")
      ->group("");
  return {cmd, [o, &g] {
            o->plugin_paths = g.plugin_paths;
            return normlab::export_command(*o, std::cout, std::cerr);
          }};
}

Verb add_checkpoint(CLI::App& app, const Globals& g) {
  auto o = state<normlab::CheckpointConvertOptions>();
  auto* cmd = app.add_subcommand("checkpoint", "checkpoint tools");
  cmd->require_subcommand(1);
  auto* convert = cmd->add_subcommand(
      "convert",
      "rewrite a run's old TorchScript checkpoints (*.pt) as .safetensors (needs --trust-code)");
  convert->add_option("RUN", o->run, "run directory")->required();
  convert->add_flag("--trust-code", o->trust_code,
                    "required: loading a TorchScript archive can run code stored in it; only for "
                    "files you trust");
  return {cmd, [o, &g] {
            o->plugin_paths = g.plugin_paths;
            return normlab::checkpoint_convert_command(*o, std::cout, std::cerr);
          }};
}

Verb add_manifest(CLI::App& app, const Globals&) {
  auto* manifest = app.add_subcommand("manifest", "manifest tools");
  manifest->require_subcommand(1);
  manifest->add_subcommand("reference", "markdown table of every manifest key");
  return {manifest, [] { return normlab::manifest_reference_command(std::cout); }};
}

// Hidden (empty group): sacreBLEU-compatible corpus BLEU, for evaluation scripts and tests.
Verb add_bleu(CLI::App& app, const Globals&) {
  auto o = state<normlab::BleuOptions>();
  auto* bleu =
      app.add_subcommand("bleu", "corpus BLEU as sacreBLEU computes it by default (13a, exp)");
  bleu->group("");
  auto* hyp =
      bleu->add_option("--hyp", o->hyp, "hypotheses, one per line")->check(CLI::ExistingFile);
  auto* ref =
      bleu->add_option("--ref", o->ref, "references, one per line")->check(CLI::ExistingFile);
  hyp->needs(ref);
  ref->needs(hyp);
  bleu->add_flag("--json", o->json, "score, counts, totals, sys_len, ref_len as JSON");
  bleu->add_option("--tokenize-13a", o->tokenize_13a, "print FILE's lines tokenized by 13a instead")
      ->check(CLI::ExistingFile)
      ->excludes(hyp)
      ->excludes(ref);
  return {bleu, [o] {
            if (o->tokenize_13a.empty() && o->hyp.empty())
              throw CLI::RequiredError("--hyp and --ref (or --tokenize-13a)");
            return normlab::bleu(*o, std::cout);
          }};
}

// eval / translate / forward: a run's model from its directory (docs/evaluate.md).
void add_model_options(CLI::App* cmd, normlab::RunModelOptions& m) {
  cmd->add_option("RUN", m.run, "run directory (runs/NAME)")->required();
  cmd->add_option(
      "--checkpoint", m.checkpoint,
      "best | last | step_N | avg:K (mean of the newest K step_N.safetensors) | FILE.safetensors "
      "(default: best, else last)");
  cmd->add_option("--device", m.device, "cpu | cuda | cuda:N (default: the run's)");
  cmd->add_flag("--allow-unverified", m.allow_unverified,
                "use the checkpoint even when the SHA256SUMS beside it does not list its SHA-256");
}

void add_decode_options(CLI::App* cmd, normlab::DecodeOptions& d) {
  cmd->add_option("--beam", d.beam, "beam size (1: greedy)")->check(CLI::PositiveNumber);
  cmd->add_option("--lenpen", d.lenpen, "length penalty: score / length^lenpen (fairseq)");
  cmd->add_option("--max-len-a", d.max_len_a,
                  "output limit a*src_len + b (default: the run's eval.max_len_a)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--max-len-b", d.max_len_b,
                  "output limit a*src_len + b (default: the run's eval.max_len_b)")
      ->check(CLI::NonNegativeNumber);
  cmd->add_option("--batch-tokens", d.batch_tokens,
                  "sentences x beam x (source + output limit) per batch")
      ->check(CLI::PositiveNumber);
}

Verb add_eval(CLI::App& app, const Globals& g) {
  auto o = state<normlab::EvalOptions>();
  auto* eval = app.add_subcommand(
      "eval", "test/valid score of a run: beam search, sacreBLEU-signed BLEU and chrF, perplexity");
  add_model_options(eval, o->model);
  add_decode_options(eval, o->decode);
  eval->add_option("--split", o->split, "valid | test")->check(CLI::IsMember({"valid", "test"}));
  eval->add_flag("--json", o->json, "one JSON object instead of text");
  return {eval, [o, &g] {
            o->model.plugin_paths = g.plugin_paths;
            return normlab::eval_command(*o, std::cout, std::cerr);
          }};
}

Verb add_ablate(CLI::App& app, const Globals& g) {
  auto o = state<normlab::AblateOptions>();
  auto* ablate = app.add_subcommand(
      "ablate", "how much each layer matters: the validation loss with each layer skipped");
  add_model_options(ablate, o->model);
  ablate->add_option("--drop-layer", o->drop_layer,
                     "each | comma list of layer indices (negative from the top)");
  ablate->add_option("--split", o->split, "valid | test")->check(CLI::IsMember({"valid", "test"}));
  ablate->add_option("--batch-tokens", o->batch_tokens, "target tokens per batch")
      ->check(CLI::PositiveNumber);
  ablate->add_flag("--json", o->json, "one JSON object instead of text");
  return {ablate, [o, &g] {
            o->model.plugin_paths = g.plugin_paths;
            return normlab::ablate_command(*o, std::cout, std::cerr);
          }};
}

Verb add_translate(CLI::App& app, const Globals& g) {
  auto o = state<normlab::TranslateOptions>();
  auto* translate =
      app.add_subcommand("translate", "translate stdin (raw text, one sentence a line) to stdout");
  add_model_options(translate, o->model);
  add_decode_options(translate, o->decode);
  return {translate, [o, &g] {
            o->model.plugin_paths = g.plugin_paths;
            return normlab::translate_command(*o, std::cin, std::cout, std::cerr);
          }};
}

Verb add_forward(CLI::App& app, const Globals& g) {
  struct S {
    normlab::ForwardOptions opt;
    bool json = true;  // JSON is the only format; the flag is accepted for symmetry with eval
  };
  auto s = state<S>();
  auto* forward = app.add_subcommand(
      "forward", "tokens, log-probabilities and top-k logits of given inputs as JSON");
  add_model_options(forward, s->opt.model);
  forward
      ->add_option("--input", s->opt.input,
                   "encdec: SOURCE<TAB>TARGET PREFIX lines; lm: text lines")
      ->required();
  forward->add_option("--top-k", s->opt.top_k, "most likely next tokens per position")
      ->check(CLI::PositiveNumber);
  forward->add_flag("--hidden", s->opt.hidden, "also every layer's output vectors");
  forward->add_flag("--json", s->json, "JSON output (the only format)");
  return {forward, [s, &g] {
            s->opt.model.plugin_paths = g.plugin_paths;
            return normlab::forward_command(s->opt, std::cout, std::cerr);
          }};
}

Verb add_plot(CLI::App& app, const Globals&) {
  auto o = state<normlab::analysis::PlotOptions>();
  auto* plot = app.add_subcommand(
      "plot", "figures of the analysis quantities (PNG/SVG) from run and sweep directories");
  plot->add_option("DIR", o->dirs, "run directories and/or sweep directories (sweep.json)")
      ->required();
  plot->add_option("--out", o->out, "output directory")->required();
  plot->add_option("--format", o->formats, "comma-separated: png, svg, pdf (default png,svg)");
  plot->add_option("--update", o->updates,
                   "updates for the per-layer gradient figures: first, last or numbers, "
                   "comma-separated (default first,last)");
  plot->footer(
      "Runs Python with matplotlib: $NORMLAB_PYTHON, else /usr/bin/python3, else python3.");
  return {plot, [o] { return normlab::analysis::plot_command(*o); }};
}

Verb add_report(CLI::App& app, const Globals&) {
  auto o = state<normlab::analysis::ReportOptions>();
  auto* report = app.add_subcommand(
      "report", "summary.csv, a self-contained HTML report and Markdown of a sweep");
  report->add_option("DIR", o->dirs, "sweep directory (and/or run directories)")->required();
  report->add_option("--out", o->out, "output directory (default: DIR/report)");
  report->footer(
      "Runs Python with matplotlib: $NORMLAB_PYTHON, else /usr/bin/python3, else python3.");
  return {report, [o] { return normlab::analysis::report_command(*o); }};
}

// The subcommands, in the order `normlab --help` lists them.
using AddVerb = Verb (*)(CLI::App&, const Globals&);
constexpr AddVerb kVerbs[] = {add_plugins,  add_smoke,   add_bench, add_train,  add_sweep,
                              add_frontier, add_run_one, add_data,  add_export, add_checkpoint,
                              add_manifest, add_bleu,    add_eval,  add_ablate, add_translate,
                              add_forward,  add_plot,    add_report};

}  // namespace

int main(int argc, char** argv) {
  // Before anything else: may re-execute this program with OPENBLAS_CORETYPE set.
  normlab::choose_blas_kernels(argv);
  normlab::tune_malloc();
  CLI::App app{"normlab — residual/normalization schemes for deep Transformers"};
  app.set_version_flag(
      "--version", [] { return normlab::version_text(); },
      "normlab version, git commit, LibTorch version, CUDA, SDK ABI");
  app.require_subcommand(1);
  app.fallthrough();  // global options (--plugin-path) may follow the subcommand
  Globals g;
  app.add_option("--plugin-path", g.plugin_paths, "extra plugin directory or file (repeatable)");
  app.add_flag("--allow-unsafe-plugin-path", g.allow_unsafe_plugin_path,
               "accept world-writable plugin folders/files and files of other users (warns)");
  std::vector<Verb> verbs;
  for (AddVerb add : kVerbs) verbs.push_back(add(app, g));

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return usage_exit(app, e);
  }
  // Through the environment, so sweep workers (`normlab run-one`) inherit the choice.
  if (g.allow_unsafe_plugin_path) ::setenv(normlab::PluginRegistry::kAllowUnsafeEnv, "1", 1);
  try {
    for (const Verb& v : verbs)
      if (v.cmd->parsed()) return v.run();
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
