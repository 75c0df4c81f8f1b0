#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <fstream>
#include <istream>
#include <nlohmann/json.hpp>
#include <ostream>
#include <sstream>

#include "commands/commands.h"
#include "eval/beam_search.h"
#include "eval/run_model.h"
#include "eval/task_eval.h"
#include "input_errors.h"
#include "local_launcher.h"
#include "normlab/eval/eval_commands.h"
#include "run/process_group.h"
#include "util/atomic_file.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace normlab {
namespace {

eval::OpenedRun open_model(const RunModelOptions& m, std::ostream& log) {
  return eval::open_run(
      {m.run, m.checkpoint, m.device, m.plugin_paths, m.allow_unverified, m.all_tokens, m.threads},
      log);
}

eval::BeamOptions beam_options(const DecodeOptions& d, const ExperimentSpec& run) {
  eval::BeamOptions b;
  b.beam = d.beam;
  b.lenpen = d.lenpen;
  b.max_len_a = d.max_len_a >= 0 ? d.max_len_a : run.eval.max_len_a;
  b.max_len_b = d.max_len_b >= 0 ? d.max_len_b : run.eval.max_len_b;
  b.batch_tokens = d.batch_tokens;
  return b;
}

// Bad input of these commands exits 2 with one line, like a bad manifest.
template <class F>
int reporting_run_errors(std::ostream& err, F&& body) {
  return reporting_input_errors(err, [&]() -> int {
    try {
      return body();
    } catch (const eval::RunInputError& e) {
      fmt::print(err, "normlab: error: {}\n", e.what());
      return kExitBadInput;
    }
  });
}

void write_text(const fs::path& path, const std::string& text) {
  std::error_code ec;
  fs::create_directories(path.parent_path(), ec);
  if (ec)
    throw util::FileError(
        fmt::format("cannot write {}: {}", path.parent_path().string(), ec.message()));
  util::remove_stale_temporaries(path.parent_path());  // an eval killed while writing left them
  util::AtomicFile f(path);
  f.append(text.data(), text.size());
  f.commit();
}

std::string piece(const data::Tokenizer& tok, int64_t id) {
  switch (id) {
    case data::kPad:
      return "<pad>";
    case data::kUnk:
      return "<unk>";
    case data::kBos:
      return "<s>";
    case data::kEos:
      return "</s>";
    default:
      return tok.decode({int32_t(id)});
  }
}

// Every layer's output of one forward pass, per stack, in layer order.
struct LayerOutputs : ActivationObserver {
  std::vector<torch::Tensor> encoder, decoder;
  void on_layer_output(const LayerId& id, const torch::Tensor& out) override {
    auto& v = id.stack == Stack::Encoder ? encoder : decoder;
    if (v.size() <= size_t(id.index)) v.resize(size_t(id.index) + 1);
    v[size_t(id.index)] = out.detach().to(torch::kDouble).cpu();
  }
};

json matrices(const std::vector<torch::Tensor>& layers) {
  json out = json::array();
  for (const auto& t : layers) {  // [1, T, D]
    const auto a = t.accessor<double, 3>();
    json rows = json::array();
    for (int64_t i = 0; i < t.size(1); ++i) {
      json row = json::array();
      for (int64_t d = 0; d < t.size(2); ++d) row.push_back(a[0][i][d]);
      rows.push_back(std::move(row));
    }
    out.push_back(std::move(rows));
  }
  return out;
}

// A task name as a part of a file name: letters, digits, '_' and '-' kept, every other byte %XX,
// so that '.' and '+' only ever separate (a task "mc.2shot" and "mc" with --shots 2 shared a file).
std::string escaped_task_name(const std::string& name) {
  std::string out;
  for (const unsigned char c : name) {
    if (std::isalnum(c) || c == '_' || c == '-')
      out += char(c);
    else
      out += fmt::format("%{:02X}", c);
  }
  return out;
}

// Whether FILE holds the results of other task files than FILES (by their absolute paths): two
// x.jsonl of other folders, in two calls. Unreadable or not ours: replaced like our own.
bool holds_other_task_files(const fs::path& file, const std::vector<eval::TaskFile>& files) {
  std::ifstream in(file);
  if (!in) return false;
  const json j = json::parse(in, nullptr, false);
  if (j.is_discarded() || !j.is_object() || !j.contains("tasks") || !j["tasks"].is_object())
    return false;
  const json& tasks = j["tasks"];
  if (tasks.size() != files.size()) return true;
  for (const eval::TaskFile& f : files) {
    if (!tasks.contains(f.name) || !tasks[f.name].is_object()) return true;
    const json& recorded = tasks[f.name].value("file", json());
    if (!recorded.is_string() || fs::absolute(recorded.get<std::string>()).lexically_normal() !=
                                     fs::absolute(f.path).lexically_normal())
      return true;
  }
  return false;
}

// Each call's results a file of their own (issue 68.6: a one-task check replaced the full
// results): tasks.<checkpoint>.<task>+<task>…[.<K>shot][.limit<N>][.seed<S>].json, the tasks'
// names sorted and escaped; more than 100 characters of names become their count and a hash of
// them (the file lists them). The same call again replaces its own file; a file of that name
// holding other task files' results is kept, and this call's name gets a hash of its files' paths.
std::string tasks_file_name(const std::string& tag, const std::vector<eval::TaskFile>& files,
                            const EvalOptions& opt, const fs::path& eval_dir) {
  std::vector<std::string> names;
  for (const eval::TaskFile& f : files) names.push_back(escaped_task_name(f.name));
  std::sort(names.begin(), names.end());
  std::string joined = fmt::format("{}", fmt::join(names, "+"));
  if (joined.size() > 100) {
    util::Sha256 hash;
    hash.update(joined.data(), joined.size());
    joined = fmt::format("{}-tasks-{}", names.size(), hash.hex().substr(0, 12));
  }
  std::string name = fmt::format("tasks.{}.{}", tag, joined);
  if (opt.shots > 0) name += fmt::format(".{}shot", opt.shots);
  if (opt.limit > 0) name += fmt::format(".limit{}", opt.limit);
  if (opt.shots > 0 && opt.seed != 1234) name += fmt::format(".seed{}", opt.seed);
  if (opt.separate_choices) name += ".separate";  // the packed call's results stay
  if (holds_other_task_files(eval_dir / (name + ".json"), files)) {
    std::vector<std::string> paths;
    for (const eval::TaskFile& f : files)
      paths.push_back(fs::absolute(f.path).lexically_normal().string());
    std::sort(paths.begin(), paths.end());
    const std::string all = fmt::format("{}", fmt::join(paths, "\n"));
    util::Sha256 hash;
    hash.update(all.data(), all.size());
    name += ".files-" + hash.hex().substr(0, 12);
  }
  return name + ".json";
}

// `normlab eval RUN --tasks A.jsonl,B.jsonl`: every task scored as lm-evaluation-harness scores
// it; a table, then RUN/eval/tasks.<checkpoint>.<tasks>….json with every item's log-likelihoods.
int evaluate_tasks(const EvalOptions& opt, eval::OpenedRun& r, ProcessGroup* group,
                   std::ostream& out, std::ostream& err) {
  if (r.model->config().arch != Arch::LM)
    throw eval::RunInputError(
        fmt::format("--tasks: {} is a translation model; downstream tasks score language models "
                    "(model.arch = \"lm\")",
                    r.dir.string()));
  const eval::TaskTokens tt = eval::task_tokens(r.ds);
  std::vector<eval::TaskFile> files;
  for (const std::string& path : opt.tasks)
    files.push_back(eval::read_task_file(path, r.model->config().tgt_vocab));
  eval::check_task_names(files, "--tasks");
  eval::TaskOptions to;
  to.shots = opt.shots;
  to.limit = opt.limit;
  to.seed = opt.seed;
  to.share_contexts = !opt.separate_choices;
  to.max_length = eval::harness_max_length(r.spec.data.lm_block);
  // Every file checked before the first is scored: a bad last file costs no scoring. Items far
  // longer than the training block: said once per file (rank 0 for a job).
  for (const eval::TaskFile& f : files) {
    const std::vector<int64_t> tokens = eval::check_task(tt.tok, tt.eot, f, to);
    const std::string w = eval::long_items_warning(f, tokens, r.spec.data.lm_block);
    if (!w.empty() && (!group || group->leader())) fmt::print(err, "{}\n", w);
  }
  if (group) {
    to.rank = group->rank();
    to.world = group->world();
    to.sum_over_ranks = [group](const std::vector<double>& v) { return group->sum(v); };
  }
  if (group && !group->leader()) {  // rank 0 prints and writes for the job
    for (const eval::TaskFile& f : files)
      eval::evaluate_task(*r.model, tt.tok, tt.eot, f, to, r.device);
    return 0;
  }
  json tasks = json::object();
  if (!opt.json)
    fmt::print(out, "{:<20} {:>6}  {:<50}  {}\n", "task", "items",
               "lm-evaluation-harness's metrics (± stderr)", "normlab's own");
  for (const eval::TaskFile& f : files) {
    const eval::TaskResult t = eval::evaluate_task(*r.model, tt.tok, tt.eot, f, to, r.device);
    if (!opt.json) {
      // The harness's metrics for the task, in its order; then what normlab adds (issue 69.2).
      const auto metric = [&](const std::string& m) {
        if (m == "perplexity")
          return fmt::format("perplexity {:.2f} ± {:.2f}", t.ppl, t.ppl_stderr);
        if (m == "acc_norm")
          return fmt::format("acc_norm {:.4f} ± {:.4f}", t.acc_norm, t.acc_norm_stderr);
        return fmt::format("acc {:.4f} ± {:.4f}", t.acc, t.acc_stderr);
      };
      std::vector<std::string> harness, own;
      for (const std::string& m : t.harness_metrics) harness.push_back(metric(m));
      for (const std::string m : {"acc", "acc_norm", "perplexity"})
        if (std::find(t.harness_metrics.begin(), t.harness_metrics.end(), m) ==
                t.harness_metrics.end() &&
            (m == "perplexity") == (t.kind == "last_word"))
          own.push_back(metric(m));
      own.push_back(fmt::format("bpb {:.4f}", t.bits_per_byte));
      fmt::print(out, "{:<20} {:>6}  {:<50}  {}, {:.1f} s\n", t.name, t.items,
                 fmt::format("{}", fmt::join(harness, ", ")),
                 fmt::format("{}", fmt::join(own, ", ")), t.seconds);
    }
    if (!opt.json && t.truncated_items > 0)
      fmt::print(out,
                 "  {} of its {} items cut from the left to {} tokens, as lm-evaluation-harness\n",
                 t.truncated_items, t.items, t.max_length);
    json items = json::array();
    for (const eval::ItemScore& s : t.scores)
      items.push_back({{"line", s.line},
                       {"loglikelihood", s.loglikelihood},
                       {"greedy", s.greedy},
                       {"tokens", s.tokens},
                       {"fewshot", s.fewshot},
                       {"truncated", s.truncated},
                       {"correct", s.correct},
                       {"correct_norm", s.correct_norm}});
    json j = eval::task_metrics(t);
    j["item_scores"] = std::move(items);
    tasks[t.name] = std::move(j);
  }
  const json summary = {{"run", r.dir.string()}, {"checkpoint", r.checkpoint},
                        {"shots", opt.shots},    {"seed", opt.seed},
                        {"limit", opt.limit},    {"separate_choices", opt.separate_choices},
                        {"tasks", tasks}};
  if (opt.json) out << summary.dump() << "\n";
  out.flush();
  const fs::path file = r.dir / "eval" / tasks_file_name(r.tag, files, opt, r.dir / "eval");
  try {
    write_text(file, summary.dump(2) + "\n");
  } catch (const std::exception& e) {  // the scores above are printed first (issue 42.17)
    fmt::print(err, "normlab: error: {} (the scores above were not saved)\n", e.what());
    return kExitFailed;
  }
  if (!opt.json) fmt::print(out, "every item's log-likelihoods: {}\n", file.string());
  return 0;
}

// `eval --tasks` alone, or as a rank of a job (--nproc N here, or torchrun/srun's variables): the
// ranks join a gloo group, each scores its share of the items, rank 0 reports.
int tasks_job(const EvalOptions& opt, std::ostream& out, std::ostream& err) {
  DistEnv env;
  try {
    env = dist_env_from_environment();
  } catch (const std::invalid_argument& e) {
    throw eval::RunInputError(fmt::format("--nproc: {}", e.what()));
  }
  if (opt.nproc > 1 && env.distributed() && !started_by_local_launcher())
    throw eval::RunInputError(
        fmt::format("--nproc {}: this process is already rank {} of a job of {}; drop --nproc "
                    "under torchrun/srun",
                    opt.nproc, env.rank, env.world));
  if (opt.nproc > 1 && !env.distributed())
    return launch_local_ranks(opt.nproc, 1800, opt.model.run, err);
  std::unique_ptr<ProcessGroup> group;
  if (env.distributed()) {
    // Every rank must be asked the same: the run, checkpoint, files and options.
    const std::string asked =
        fmt::format("eval --tasks {} {} {} shots={} limit={} seed={} separate={}", opt.model.run,
                    opt.model.checkpoint, fmt::join(opt.tasks, ","), opt.shots, opt.limit, opt.seed,
                    opt.separate_choices);
    util::Sha256 hash;
    hash.update(asked.data(), asked.size());
    try {
      group = ProcessGroup::join(env, "gloo", "cpu", hash.hex(), std::chrono::minutes(30));
    } catch (const JoinError& e) {
      fmt::print(err, "normlab: error: rank {}: {}\n", env.rank, e.what());
      return kExitBadInput;
    }
  }
  RunModelOptions m = opt.model;
  if (group && m.device == "cuda") m.device = fmt::format("cuda:{}", env.local_rank);
  std::ostream silent(nullptr);
  eval::OpenedRun r = open_model(m, group && !group->leader() ? silent : err);
  return evaluate_tasks(opt, r, group.get(), out, err);
}

}  // namespace

int eval_command(const EvalOptions& opt, std::ostream& out, std::ostream& err) {
  return reporting_run_errors(err, [&]() -> int {
    if (opt.split != "valid" && opt.split != "test")
      throw eval::RunInputError(
          fmt::format("--split: expected valid or test, got '{}'", opt.split));
    if (!opt.tasks.empty()) return tasks_job(opt, out, err);
    if (opt.nproc > 1) throw eval::RunInputError("--nproc: with --tasks only");
    eval::OpenedRun r = open_model(opt.model, err);
    const data::Split& split = opt.split == "valid" ? r.ds.valid : r.ds.test;
    if (split.examples.empty())
      throw eval::RunInputError(
          fmt::format("{}: the run's data has no {} set ({}: set data.{} in the manifest)",
                      r.dir.string(), opt.split, (r.dir / "manifest.resolved.toml").string(),
                      r.spec.data.task == "translation" ? opt.split + "_src/" + opt.split + "_tgt"
                                                        : opt.split));
    eval::BeamOptions beam = beam_options(opt.decode, r.spec);
    // A line every few seconds on stderr while it decodes (a beam over a test set takes minutes).
    const auto t0 = std::chrono::steady_clock::now();
    auto last = t0;
    beam.on_progress = [&](int64_t done, int64_t total) {
      const auto now = std::chrono::steady_clock::now();
      if (done < total && now - last < std::chrono::seconds(5)) return;
      last = now;
      fmt::print(err, "eval: decoded {}/{} {} sentences (beam {}) in {:.0f} s\n", done, total,
                 opt.split, beam.beam, std::chrono::duration<double>(now - t0).count());
      err.flush();
    };
    const eval::SplitEvaluation ev =
        eval::evaluate_split(*r.model, r.ds, split, opt.split, r.device, beam);
    json j = {
        {"run", r.dir.string()},     {"checkpoint", r.checkpoint},        {"split", opt.split},
        {"sentences", ev.sentences}, {"target_tokens", ev.target_tokens}, {"nll", ev.nll},
        {"ppl", std::exp(ev.nll)}};
    // What share of the held-out split a language model's score covers (eval.valid_tokens).
    const int64_t available = split.available_blocks;
    const int64_t scored = int64_t(split.examples.size());
    if (available > 0) j["blocks"] = scored, j["available_blocks"] = available;
    std::string hyp_path, stem;
    if (ev.translated) {
      stem = fmt::format("{}.{}.beam{}{}", opt.split, r.tag, beam.beam,
                         beam.lenpen == 1.0 ? "" : fmt::format(".lenpen{}", beam.lenpen));
      hyp_path = (r.dir / "eval" / (stem + ".hyp")).string();
      j["hypotheses"] = hyp_path;
      j["beam"] = beam.beam;
      j["lenpen"] = beam.lenpen;
      j["bleu"] = {{"score", ev.bleu.score},        {"signature", eval::bleu_signature()},
                   {"counts", ev.bleu.counts},      {"totals", ev.bleu.totals},
                   {"bp", ev.bleu.brevity_penalty}, {"sys_len", ev.bleu.sys_len},
                   {"ref_len", ev.bleu.ref_len},    {"text", eval::bleu_line(ev.bleu)}};
      j["chrf"] = {{"score", ev.chrf.score},
                   {"signature", eval::chrf_signature()},
                   {"text", eval::chrf_line(ev.chrf)}};
      j["decode_seconds"] = ev.decode_seconds;
    }
    // The scores first: a decode of minutes is never lost to an eval/ that cannot be written
    // (issue 42.17).
    if (opt.json) {
      out << j.dump() << "\n";
    } else {
      // A language model's split is blocks of data.lm_block tokens, a translation's sentences.
      fmt::print(out, "{} | {} | {} {} | nll {:.4f} | ppl {:.2f}\n", opt.split, r.checkpoint,
                 ev.sentences, r.model->config().arch == Arch::LM ? "blocks" : "sentences", ev.nll,
                 std::exp(ev.nll));
      if (available > 0)
        fmt::print(out, "scored {} of the split's {} blocks ({:.1f}%){}\n", scored, available,
                   100.0 * double(scored) / double(available),
                   scored < available ? "; --all-tokens scores them all" : "");
      if (ev.translated) {
        fmt::print(out, "{}\n{}\n", eval::bleu_line(ev.bleu), eval::chrf_line(ev.chrf));
        fmt::print(out, "beam {} lenpen {} | {:.1f} s | hypotheses: {}\n", beam.beam, beam.lenpen,
                   ev.decode_seconds, hyp_path);
      }
    }
    out.flush();
    if (!ev.translated) return 0;
    try {
      std::string text;
      for (const auto& h : ev.hypotheses) text += h + "\n";
      write_text(hyp_path, text);
      // The sources and references as scored, beside the hypotheses (for sacrebleu or translate).
      for (const auto& [ext, lines] :
           {std::pair{".src", &split.sources}, std::pair{".ref", &split.references}}) {
        std::string all;
        for (const auto& l : *lines) all += l + "\n";
        write_text(r.dir / "eval" / (opt.split + ext), all);
      }
      write_text(r.dir / "eval" / (stem + ".json"), j.dump(2) + "\n");
    } catch (const std::exception& e) {  // util::FileError, or eval/ that cannot be made
      fmt::print(err, "normlab: error: {} (the scores above were not saved)\n", e.what());
      return kExitFailed;
    }
    return 0;
  });
}

// The layers --drop-layer names in a stack of n layers: "each", or indices (negative from the top),
// checked against the model's deepest stack (`deepest`): on an N≠M model an index past the
// shallower stack names a layer of the deeper one only. Each layer once, in the order first named.
std::vector<int> dropped_layers(const std::string& spec, int n, int deepest) {
  std::vector<int> out;
  if (spec == "each") {
    for (int i = 0; i < n; ++i) out.push_back(i);
    return out;
  }
  const auto bad = [&](const std::string& item) {
    return eval::RunInputError(
        fmt::format("--drop-layer: expected each or layer indices in [-{0}, {1}], got '{2}' (the "
                    "deepest stack's range)",
                    deepest, deepest - 1, item));
  };
  std::stringstream ss(spec);
  // "" or "3," would silently ablate nothing (or less than asked) and still rewrite the CSV.
  if (spec.empty() || spec.back() == ',') throw bad(spec);
  for (std::string item; std::getline(ss, item, ',');) {
    int i = 0;
    size_t used = 0;
    try {
      i = std::stoi(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || used != item.size() || i >= deepest || i < -deepest) throw bad(item);
    if (i >= n || i < -n) continue;  // past this (shallower) stack
    const int layer = i < 0 ? n + i : i;
    if (std::find(out.begin(), out.end(), layer) == out.end()) out.push_back(layer);
  }
  return out;
}

int ablate_command(const AblateOptions& opt, std::ostream& out, std::ostream& err) {
  return reporting_run_errors(err, [&]() -> int {
    if (fs::exists(fs::path(opt.model.run) / "sweep.json")) return ablate_sweep(opt, out, err);
    eval::OpenedRun r = open_model(opt.model, err);
    const data::Split& split = opt.split == "valid" ? r.ds.valid : r.ds.test;
    if (split.examples.empty())
      throw eval::RunInputError(
          fmt::format("{}: the run's data has no {} set", r.dir.string(), opt.split));
    TransformerModelImpl& model = *r.model;
    if (!opt.json)
      fmt::print(out,
                 "ablate {} ({}, {}): layers numbered from 0, as --drop-layer takes them (the "
                 "figures number them from 1)\n",
                 r.dir.string(), r.checkpoint, opt.split);
    // Progress on stderr, flushed (issue 59.9: a long ablation said nothing for minutes): one pass
    // over the split per layer, each as long as the first.
    const auto t0 = std::chrono::steady_clock::now();
    const double full = eval::split_nll(model, split, r.device, opt.batch_tokens);
    const double pass_s =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    int total = 0, deepest = 0;
    for (TransformerStack* stack : {&model.encoder, &model.decoder})
      if (*stack) deepest = std::max(deepest, int((*stack)->num_layers()));
    for (TransformerStack* stack : {&model.encoder, &model.decoder})
      if (*stack)
        total += int(dropped_layers(opt.drop_layer, int((*stack)->num_layers()), deepest).size());
    fmt::print(err,
               "ablate: all layers scored in {:.1f} s; {} layers to drop, about {:.0f} s more\n",
               pass_s, total, pass_s * total);
    err.flush();
    int done = 0;
    json rows = json::array();
    std::string csv = "stack,layer,nll,delta_nll,ppl\n";
    csv += fmt::format("none,-1,{:.17g},0,{:.17g}\n", full, std::exp(full));
    for (TransformerStack* stack : {&model.encoder, &model.decoder}) {
      if (!*stack) continue;
      const std::string name = to_string((*stack)->stack());
      for (int l : dropped_layers(opt.drop_layer, int((*stack)->num_layers()), deepest)) {
        TransformerLayerImpl& layer = (*stack)->layer(size_t(l));
        layer.set_skipped(true);
        const double nll = eval::split_nll(model, split, r.device, opt.batch_tokens);
        layer.set_skipped(false);
        rows.push_back({{"stack", name}, {"layer", l}, {"nll", nll}, {"delta_nll", nll - full}});
        csv +=
            fmt::format("{},{},{:.17g},{:.17g},{:.17g}\n", name, l, nll, nll - full, std::exp(nll));
        if (!opt.json) {
          fmt::print(out, "{} layer {:>3} dropped | nll {:.4f} | delta {:+.4f} | ppl {:.2f}\n",
                     name, l, nll, nll - full, std::exp(nll));
          out.flush();
        }
        const double spent =
            std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
        ++done;
        fmt::print(err, "ablate: {}/{} layers dropped, {:.0f} s elapsed, about {:.0f} s left\n",
                   done, total, spent, (spent - pass_s) / done * (total - done));
        err.flush();
      }
    }
    const fs::path file = r.dir / "eval" / fmt::format("ablate.{}.{}.csv", opt.split, r.tag);
    write_text(file, csv);
    if (opt.json) {
      out << json{{"run", r.dir.string()}, {"checkpoint", r.checkpoint},
                  {"split", opt.split},    {"nll", full},
                  {"layers", rows},        {"csv", file.string()}}
                 .dump()
          << "\n";
    } else {
      fmt::print(out, "{} | {} | all layers: nll {:.4f} | ppl {:.2f} | {}\n", opt.split,
                 r.checkpoint, full, std::exp(full), file.string());
    }
    return 0;
  });
}

int translate_command(const TranslateOptions& opt, std::istream& in, std::ostream& out,
                      std::ostream& err) {
  return reporting_run_errors(err, [&]() -> int {
    eval::OpenedRun r = open_model(opt.model, err);
    if (r.model->config().arch != Arch::EncDec)
      throw eval::RunInputError(
          fmt::format("{}: translate needs an encoder-decoder run, this one is a language model",
                      r.dir.string()));
    std::vector<std::vector<int32_t>> sources;
    for (std::string line; std::getline(in, line);) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      sources.push_back(r.ds.src_tokenizer->encode(line));
      sources.back().push_back(data::kEos);
    }
    for (const auto& h :
         eval::beam_search(*r.model, sources, r.device, beam_options(opt.decode, r.spec)))
      out << r.ds.tgt_tokenizer->decode(h.tokens) << '\n';
    return 0;
  });
}

// `forward --ids`: a line of token ids separated by spaces, each below the vocabulary.
static std::vector<int64_t> ids_of_line(const std::string& line, const std::string& file,
                                        int line_no, int64_t vocab) {
  std::vector<int64_t> ids;
  std::istringstream words(line);
  for (std::string w; words >> w;) {
    size_t used = 0;
    int64_t id = -1;
    try {
      id = std::stoll(w, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != w.size() || id < 0 || id >= vocab)
      throw eval::RunInputError(fmt::format(
          "{}:{}: '{}' is not a token id (--ids: whole numbers 0 … {} separated by spaces)", file,
          line_no, w, vocab - 1));
    ids.push_back(id);
  }
  return ids;
}

int forward_command(const ForwardOptions& opt, std::ostream& out, std::ostream& err) {
  return reporting_run_errors(err, [&]() -> int {
    std::ifstream in(opt.input, std::ios::binary);
    if (!in) throw eval::RunInputError(fmt::format("--input {}: cannot be read", opt.input));
    eval::OpenedRun r = open_model(opt.model, err);
    torch::NoGradGuard no_grad;
    const bool encdec = r.model->config().arch == Arch::EncDec;
    const auto& tok = *r.ds.tgt_tokenizer;
    json sentences = json::array();
    int line_no = 0;
    for (std::string line; std::getline(in, line);) {
      ++line_no;
      if (!line.empty() && line.back() == '\r') line.pop_back();
      json s;
      std::vector<int64_t> src, tgt;
      if (encdec) {
        const auto tab = line.find('\t');
        const std::string source = line.substr(0, tab),
                          prefix = tab == std::string::npos ? "" : line.substr(tab + 1);
        for (int32_t id : r.ds.src_tokenizer->encode(source)) src.push_back(id);
        src.push_back(data::kEos);
        tgt.push_back(data::kBos);
        for (int32_t id : tok.encode(prefix)) tgt.push_back(id);
        s["source"] = source;
        s["target_prefix"] = prefix;
        json st = json::array();
        for (int64_t id : src)
          st.push_back({{"id", id}, {"piece", piece(*r.ds.src_tokenizer, id)}});
        s["source_tokens"] = st;
      } else if (opt.ids) {
        tgt = ids_of_line(line, opt.input, line_no, r.model->config().tgt_vocab);
        s["ids"] = tgt;
      } else {
        for (int32_t id : tok.encode(line)) tgt.push_back(id);
        s["text"] = line;
      }
      if (!encdec && tgt.empty())
        throw eval::RunInputError(fmt::format("{}:{}: no tokens to run", opt.input, line_no));
      LayerOutputs layers;
      if (opt.hidden) r.model->set_observer(&layers);
      auto as_tensor = [&](const std::vector<int64_t>& v) {
        return torch::tensor(v, torch::kLong).view({1, int64_t(v.size())}).to(r.device);
      };
      const torch::Tensor logits = (encdec ? r.model->forward(as_tensor(src), as_tensor(tgt))
                                           : r.model->forward_lm(as_tensor(tgt)))
                                       .to(torch::kDouble)
                                       .cpu()[0];
      r.model->set_observer(nullptr);
      const torch::Tensor lprobs = torch::log_softmax(logits, -1);
      const int64_t k = std::min<int64_t>(opt.top_k, logits.size(1));
      const auto top = lprobs.topk(k, -1);
      const auto top_lp = std::get<0>(top), top_id = std::get<1>(top);
      json positions = json::array();
      for (int64_t i = 0; i < int64_t(tgt.size()); ++i) {
        json p = {{"input", {{"id", tgt[size_t(i)]}, {"piece", piece(tok, tgt[size_t(i)])}}}};
        if (i + 1 < int64_t(tgt.size())) {
          const int64_t next = tgt[size_t(i + 1)];
          p["next"] = {{"id", next},
                       {"piece", piece(tok, next)},
                       {"logit", logits[i][next].item<double>()},
                       {"logprob", lprobs[i][next].item<double>()}};
        }
        json tops = json::array();
        for (int64_t j = 0; j < k; ++j) {
          const int64_t id = top_id[i][j].item<int64_t>();
          tops.push_back({{"id", id},
                          {"piece", piece(tok, id)},
                          {"logit", logits[i][id].item<double>()},
                          {"logprob", top_lp[i][j].item<double>()}});
        }
        p["top"] = tops;
        positions.push_back(std::move(p));
      }
      s["positions"] = positions;
      if (opt.hidden) {
        if (encdec) s["hidden"]["encoder"] = matrices(layers.encoder);
        s["hidden"]["decoder"] = matrices(layers.decoder);
      }
      sentences.push_back(std::move(s));
    }
    json j = {{"run", r.dir.string()},
              {"checkpoint", r.checkpoint},
              {"arch", encdec ? "encdec" : "lm"},
              {"vocab", r.model->config().tgt_vocab},
              {"top_k", opt.top_k},
              {"sentences", sentences}};
    out << j.dump() << "\n";
    return 0;
  });
}

}  // namespace normlab
