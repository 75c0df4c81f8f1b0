#include "run_model.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cctype>
#include <chrono>
#include <cmath>
#include <nlohmann/json.hpp>
#include <regex>
#include <thread>

#include "normlab/plugins/registry.h"
#include "normlab/runtime_env.h"
#include "run/build_info.h"
#include "run/checkpoint.h"
#include "run/checksums.h"
#include "run/fused_self_check.h"
#include "run/label_smoothing.h"
#include "run/model_assembly.h"

namespace fs = std::filesystem;

namespace normlab::eval {
namespace {

// step_N.safetensors files of the run, oldest first, without step_0.safetensors (the
// initialization).
std::vector<std::pair<int64_t, fs::path>> step_checkpoints(const fs::path& dir) {
  static const std::regex step_name(R"(step_(\d+)\.safetensors)");
  std::vector<std::pair<int64_t, fs::path>> out;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec)) {
    std::smatch m;
    const std::string name = e.path().filename().string();
    if (std::regex_match(name, m, step_name) && std::stoll(m[1]) > 0)
      out.emplace_back(std::stoll(m[1]), e.path());
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::string available_checkpoints(const fs::path& dir) {
  std::vector<std::string> names;
  std::error_code ec;
  for (const auto& e : fs::directory_iterator(dir, ec))
    if (e.path().extension() == ".safetensors") names.push_back(e.path().filename().string());
  std::sort(names.begin(), names.end());
  return names.empty() ? "none" : fmt::format("{}", fmt::join(names, ", "));
}

}  // namespace

// The resolved manifest keeps paths as the trainer saw them: relative ones are relative to the
// working directory of `normlab train` (usually the one `normlab eval` runs in), not to the run
// directory, so they come back as --set overrides, which are taken from the working directory.
std::vector<std::string> resolved_manifest_overrides(const fs::path& resolved,
                                                     const fs::path& run_dir) {
  std::vector<std::string> sets;
  toml::table root;
  try {
    root = toml::parse_file(resolved.string());
  } catch (const toml::parse_error& e) {
    throw RunInputError(
        fmt::format("{}: cannot be parsed ({})", resolved.string(), e.description()));
  }
  auto quoted = [](const std::string& s) { return nlohmann::json(s).dump(); };
  for (const char* key : {"train_src", "train_tgt", "valid_src", "valid_tgt", "test_src",
                          "test_tgt", "train", "valid", "test", "cache_dir", "tokenizer.model"}) {
    const auto value = root.at_path(std::string("data.") + key).value<std::string>();
    if (value && !value->empty() && fs::path(*value).is_relative())
      sets.push_back(
          fmt::format("data.{}={}", key, quoted(fs::absolute(*value).lexically_normal().string())));
  }
  sets.push_back("run.out_dir=" + quoted(run_dir.string()));
  return sets;
}

void load_average(const std::vector<fs::path>& checkpoints, TransformerModelImpl& model) {
  if (checkpoints.empty())
    throw RunInputError("checkpoint averaging needs at least one checkpoint");
  torch::NoGradGuard no_grad;
  std::vector<std::pair<std::string, torch::Tensor>> sums;
  for (const auto& file : checkpoints) {
    load_model_weights(file, model);
    size_t i = 0;
    for (const auto& list : {model.named_parameters(), model.named_buffers()})
      for (const auto& item : list) {
        if (!item.value().is_floating_point()) continue;
        if (sums.size() <= i)
          sums.emplace_back(item.key(), torch::zeros_like(item.value(), torch::kDouble));
        sums[i].second.add_(item.value().to(torch::kDouble));
        ++i;
      }
  }
  // The model holds the last checkpoint (its scheme state and integer buffers); floats become the
  // mean.
  size_t i = 0;
  for (const auto& list : {model.named_parameters(), model.named_buffers()})
    for (const auto& item : list) {
      if (!item.value().is_floating_point()) continue;
      item.value().copy_(sums[i++].second / double(checkpoints.size()));
    }
}

std::vector<fs::path> run_plugin_paths(const fs::path& run_dir,
                                       const std::vector<std::string>& cli) {
  const fs::path resolved = run_dir / "manifest.resolved.toml";
  const ExperimentSpec pre =
      load_manifest(resolved.string(), resolved_manifest_overrides(resolved, run_dir), nullptr);
  std::vector<fs::path> paths(cli.begin(), cli.end());
  for (const auto& p : pre.run.plugin_path) paths.push_back(fs::absolute(p));
  return paths;
}

void check_run_data(const std::vector<fs::path>& checkpoints, const data::Dataset& ds,
                    bool other_run, bool all_tokens, std::ostream& log) {
  if (ds.identity.empty()) return;  // text tokenized here: cached by content, nothing to compare
  const nlohmann::json now = nlohmann::json::parse(ds.identity, nullptr, false);
  if (!now.is_object()) return;
  for (const fs::path& file : checkpoints) {
    const std::string saved_text = checkpoint_state(file).data_identity;
    const nlohmann::json saved =
        saved_text.empty() ? nlohmann::json() : nlohmann::json::parse(saved_text, nullptr, false);
    if (!saved.is_object()) {
      fmt::print(log,
                 "note: {} records no data identity (an older normlab's checkpoint): the data and "
                 "tokenizer are taken as the run's unchecked\n",
                 file.string());
      continue;
    }
    if (now.contains("tokenizer") && !saved.contains("tokenizer"))
      fmt::print(log,
                 "note: {} records no tokenizer (an older normlab's checkpoint): {} is taken as "
                 "the run's unchecked\n",
                 file.string(), now["tokenizer"].value("file", "?"));
    std::string change;
    if (other_run) {  // scored on this run's data: only its tokenizer must be this run's
      nlohmann::json was = {{"train_tokens", 0}}, is = was;
      if (saved.contains("tokenizer")) was["tokenizer"] = saved["tokenizer"];
      if (now.contains("tokenizer")) is["tokenizer"] = now["tokenizer"];
      change = data::data_identity_change(was.dump(), is.dump(), data::DataUse::Read);
    } else if (all_tokens && !saved.contains("valid") &&
               saved.value("train_tokens", int64_t(-1)) != now.value("train_tokens", int64_t(-2))) {
      throw RunInputError(fmt::format(
          "--all-tokens: {} validated on the held-out end of its train stream (no data.valid) and "
          "trained on the {} tokens before it; the whole split would score tokens it trained on",
          file.string(), saved.value("train_tokens", int64_t(-1))));
    } else {
      change = data::data_identity_change(saved_text, ds.identity, data::DataUse::Read);
    }
    if (!change.empty())
      throw RunInputError(
          fmt::format("{}: the run's data are not the data it trained on: {}; restore them",
                      file.string(), change));
  }
  // The shards' SHA-256s against shards.json, as training checks them beside its first updates:
  // a shard rewritten in place keeps its size (and shards.json its hash).
  if (ds.integrity)
    if (const std::string problem = ds.integrity->wait(); !problem.empty())
      throw RunInputError(problem);
}

OpenedRun open_run(const OpenRunOptions& opt, std::ostream& log) {
  OpenedRun r;
  r.dir = fs::path(opt.dir).lexically_normal();
  if (!fs::is_directory(r.dir))
    throw RunInputError(fmt::format("run directory {} not found", r.dir.string()));
  const fs::path resolved = r.dir / "manifest.resolved.toml";
  if (!fs::exists(resolved))
    throw RunInputError(
        fmt::format("{} is not a run directory: {} not found (written when `normlab train` starts)",
                    r.dir.string(), resolved.string()));
  PluginRegistry registry(run_plugin_paths(r.dir, opt.plugin_paths));
  r.spec =
      load_manifest(resolved.string(), resolved_manifest_overrides(resolved, r.dir), &registry);
  if (opt.all_tokens)  // every held-out block (in memory: shards' splits are read whole)
    r.spec.eval.valid_tokens = r.spec.data.valid_tokens = int64_t(1) << 50;

  // Which weights, checked before the data is loaded (that may take a while).
  const fs::path ckpt_dir = r.dir / "checkpoints";
  std::vector<fs::path> files;
  const std::string& c = opt.checkpoint;
  static const std::regex step_re(R"(step_(\d+))"), avg_re(R"(avg:(\d+))");
  constexpr int64_t kMaxAveraged = 100000;  // far more step_N files than any run keeps
  std::smatch m;
  bool external_file = false;
  auto missing = [&](const fs::path& f) {
    return RunInputError(fmt::format("checkpoint {} not found (in {}: {}){}", f.string(),
                                     ckpt_dir.string(), available_checkpoints(ckpt_dir),
                                     legacy_checkpoint_hint(r.dir)));
  };
  if (c.empty()) {
    r.tag = fs::exists(ckpt_dir / "best.safetensors") ? "best" : "last";
    files.push_back(ckpt_dir / (r.tag + ".safetensors"));
  } else if (c == "best" || c == "last" || std::regex_match(c, m, step_re)) {
    r.tag = c;
    files.push_back(ckpt_dir / (c + ".safetensors"));
  } else if (std::regex_match(c, m, avg_re)) {
    const std::string digits = m[1];
    if (digits.size() > 6 || std::stoll(digits) < 1 || std::stoll(digits) > kMaxAveraged)
      throw RunInputError(fmt::format(
          "--checkpoint {}: expected avg:K with K from 1 to {} (the newest K step_N.safetensors)",
          c, kMaxAveraged));
    const int64_t k = std::stoll(digits);
    auto steps = step_checkpoints(ckpt_dir);
    if (int64_t(steps.size()) < k)
      throw RunInputError(
          fmt::format("--checkpoint avg:{}: needs {} step_N.safetensors (N > 0) in {}, found {} "
                      "(run.checkpoint_keep_last keeps more)",
                      k, k, ckpt_dir.string(), steps.size()));
    for (size_t i = steps.size() - size_t(k); i < steps.size(); ++i)
      files.push_back(steps[i].second);
    r.tag = fmt::format("avg{}", k);
  } else if (fs::path(c).extension() == ".safetensors" ||
             fs::path(c).extension() == ".pt") {  // .pt: refused with a hint
    files.push_back(c);
    r.tag = fs::path(c).stem().string();
    // A file of another run (or anywhere else): its results are named by where it came from and
    // its update, never as this run's own best/last (issue 42.6).
    std::error_code ec;
    const fs::path parent = fs::weakly_canonical(fs::absolute(fs::path(c)).parent_path(), ec);
    if (parent != fs::weakly_canonical(fs::absolute(ckpt_dir), ec)) external_file = true;
  } else {
    throw RunInputError(fmt::format(
        "--checkpoint: expected best, last, step_N, avg:K or a .safetensors file, got '{}'", c));
  }
  for (const auto& f : files) {
    if (!fs::exists(f) && !fs::is_symlink(f)) throw missing(f);
    verify_checksum(f, opt.allow_unverified);
    check_checkpoint_header(f);  // a wrong file is refused before the data is loaded
  }
  if (external_file) {
    // "<run folder>.<stem>.u<updates>": the other run's name, the file's stem and its update.
    const fs::path abs = fs::absolute(files[0]).lexically_normal();
    fs::path run = abs.parent_path();
    if (run.filename() == "checkpoints") run = run.parent_path();
    std::string origin = run.filename().string();
    for (char& ch : origin)
      if (!(std::isalnum(static_cast<unsigned char>(ch)) || ch == '-' || ch == '_')) ch = '_';
    r.tag = fmt::format("{}.{}.u{}", origin.empty() ? "file" : origin, r.tag,
                        checkpoint_updates(files[0]));
  }

  const std::string device = opt.device.empty() ? r.spec.run.device : opt.device;
  if (const std::string problem = device_problem(device); !problem.empty())
    throw RunInputError(fmt::format(
        "device {}{}", problem,
        opt.device.empty() ? fmt::format(" (the run's [run] device; choose another with --device)")
                           : ""));
  r.device = torch::Device(device);
  at::set_num_threads(opt.threads > 0          ? opt.threads
                      : r.spec.run.threads > 0 ? int(r.spec.run.threads)
                                               : usable_threads());

  r.ds = data::load_dataset(r.spec.data, log);
  check_run_data(files, r.ds, external_file, opt.all_tokens, log);
  r.model = assemble_model(model_spec(r.spec, r.ds), registry, r.device).model;
  if (files.size() == 1) {
    load_model_weights(files[0], *r.model);
    r.checkpoint = files[0].string();
  } else {
    load_average(files, *r.model);
    std::vector<std::string> names;
    for (const auto& f : files) names.push_back(f.filename().string());
    r.checkpoint = fmt::format("average of {}", fmt::join(names, ", "));
  }
  r.model->eval();
  // The fused kernels a GPU runs this model with, checked as `normlab train` checks them (issue
  // 57.3): eval, ablate, forward and translate take them too. Inference: float32, no AdamW.
  FusedOpsUsed used = fused_ops_used(r.model->config());
  used.adamw = false;
  report_fused_self_check(self_check_fused_ops(r.device, at::kFloat, used), r.device, log);
  return r;
}

double split_nll(TransformerModelImpl& model, const data::Split& split, const torch::Device& device,
                 int64_t batch_tokens, int64_t* target_tokens) {
  torch::NoGradGuard no_grad;
  const bool was_training = model.is_training();
  model.eval();
  data::BatchPlan plan(split, batch_tokens, 1, /*shuffle=*/false);
  double nll = 0;
  int64_t tokens = 0;
  for (const auto& idx : plan.epoch(0)) {
    const data::Batch b = plan.make(idx);
    auto make = [&](const std::vector<int64_t>& v, int64_t len) {
      return torch::tensor(v, torch::kLong).view({b.size, len}).to(device);
    };
    const torch::Tensor logits =
        b.src.empty() ? model.forward_lm(make(b.tgt_in, b.tgt_len))
                      : model.forward(make(b.src, b.src_len), make(b.tgt_in, b.tgt_len));
    nll += label_smoothed_loss(logits, make(b.tgt_out, b.tgt_len), 0.0, split.pad_id)
               .nll.item<double>();
    tokens += b.target_tokens;
  }
  model.train(was_training);
  if (target_tokens) *target_tokens = tokens;
  return nll / double(std::max<int64_t>(tokens, 1));
}

SplitEvaluation evaluate_split(TransformerModelImpl& model, const data::Dataset& ds,
                               const data::Split& split, const std::string& name,
                               const torch::Device& device, const BeamOptions& beam) {
  SplitEvaluation ev;
  ev.split = name;
  ev.sentences = int64_t(split.examples.size());
  ev.nll = split_nll(model, split, device, beam.batch_tokens, &ev.target_tokens);
  if (model.config().arch == Arch::EncDec && !split.references.empty()) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<std::vector<int32_t>> sources;
    for (const auto& ex : split.examples) sources.push_back(ex.src);
    for (const auto& h : beam_search(model, sources, device, beam))
      ev.hypotheses.push_back(ds.tgt_tokenizer->decode(h.tokens));
    ev.decode_seconds =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    ev.bleu = corpus_bleu(ev.hypotheses, split.references);
    ev.chrf = corpus_chrf(ev.hypotheses, split.references);
    ev.translated = true;
  }
  return ev;
}

std::string bleu_line(const BleuScore& s) {
  const std::string text = s.to_string();  // "BLEU = …"
  return fmt::format("BLEU|{}{}", bleu_signature(), text.substr(text.find(' ')));
}

std::string chrf_line(const ChrfScore& s) {
  return fmt::format("chrF2|{} = {:.2f}", chrf_signature(), s.score);
}

}  // namespace normlab::eval
