// `normlab checkpoint convert RUN --trust-code`: a run's checkpoints of the old TorchScript format
// (*.pt, written by LibTorch's OutputArchive) rewritten as safetensors checkpoints. LibTorch's
// archive loader runs a class's __setstate__ from the archive's code/ while loading, so this is
// the one place normlab still opens such a file, and only when the user vouches for it.
#include <fmt/format.h>
#include <fmt/ostream.h>

#include <filesystem>
#include <sstream>

#include "commands/commands.h"
#include "eval/run_model.h"
#include "input_errors.h"
#include "normlab/plugins/registry.h"
#include "run/checkpoint.h"
#include "run/checksums.h"
#include "run/model_assembly.h"
#include "run/optimizer.h"
#include "torch_api.h"
#include "torch_compat.h"
#include "train/run_directory.h"

namespace fs = std::filesystem;

namespace normlab {
namespace {

// The layout normlab wrote before the safetensors format (read as it was read then).
NamedTensors legacy_read_named(torch::serialize::InputArchive& ar) {
  c10::IValue keys;
  ar.read("keys", keys);
  NamedTensors out;
  std::stringstream ss(keys.toStringRef());
  std::string k;
  while (std::getline(ss, k))
    if (!k.empty()) {
      torch::Tensor t;
      ar.read("t/" + k, t);
      out.emplace_back(k, t);
    }
  return out;
}

TrainingState legacy_load(const fs::path& path, TransformerModelImpl& model, FlatAdamW& optimizer) {
  TrainingState st;
  torch::serialize::InputArchive ar, m, o, s;
  ar.load_from(path.string(), torch::kCPU);
  ar.read("model", m);
  model.load(m);
  if (ar.try_read("optimizer", o)) {
    optimizer.torch::optim::AdamW::load(o);
    optimizer.moments_replaced();
  }
  ar.read("scheme", s);
  model.scheme().load_state(legacy_read_named(s));
  torch::Tensor rng;
  ar.read("rng_cpu", rng);
  compat::set_cpu_rng_state(compat::as_rng_state(rng));
  torch::Tensor cuda_rng;
  // The old format kept one GPU's generator: it becomes GPU 0's (the device of a one-GPU run).
  if (ar.try_read("rng_cuda", cuda_rng))
    compat::set_cuda_rng_state(torch::Device(torch::kCUDA, 0), compat::as_rng_state(cuda_rng));
  c10::IValue v;
  ar.read("updates", v);
  st.updates = v.toInt();
  ar.read("epoch", v);
  st.epoch = v.toInt();
  ar.read("batch_index", v);
  st.batch_index = v.toInt();
  ar.read("best_valid_nll", v);
  st.best_valid_nll = v.toDouble();
  ar.read("elapsed_s", v);
  st.elapsed_s = v.toDouble();
  if (ar.try_read("best_valid_bleu", v)) st.best_valid_bleu = v.toDouble();
  if (ar.try_read("loss_scale", v)) {
    st.loss_scale = v.toDouble();
    ar.read("loss_scale_good_steps", v);
    st.loss_scale_good_steps = v.toInt();
  }
  if (ar.try_read("stale_validations", v)) st.stale_validations = v.toInt();
  return st;
}

// A legacy file must still match the checksum it was recorded with (an unlisted one is taken as
// it was before: older runs had no SHA256SUMS).
void check_legacy_sum(const fs::path& file) {
  if (read_sums_file(file.parent_path() / "SHA256SUMS").count(file.filename().string()) == 0)
    return;
  if (const std::string problem = checksum_problem(file); !problem.empty())
    throw CheckpointError(fmt::format("checkpoint {}: {}", file.string(), problem));
}

}  // namespace

int checkpoint_convert_command(const CheckpointConvertOptions& opt, std::ostream& out,
                               std::ostream& err) {
  return reporting_input_errors(err, [&]() -> int {
    if (!opt.trust_code) {
      fmt::print(err,
                 "normlab: error: converting reads TorchScript archives, whose loader runs code "
                 "stored in the file; "
                 "pass --trust-code only for checkpoints whose origin you trust\n");
      return kExitBadInput;
    }
    const fs::path run = fs::path(opt.run).lexically_normal();
    const fs::path resolved = run / "manifest.resolved.toml";
    if (!fs::exists(resolved)) {
      fmt::print(err, "normlab: error: {} is not a run directory: {} not found\n", run.string(),
                 resolved.string());
      return kExitBadInput;
    }
    std::vector<fs::path> legacy;
    std::error_code ec;
    for (const auto& e : fs::directory_iterator(run / "checkpoints", ec))
      if (e.path().extension() == ".pt") legacy.push_back(e.path());
    std::sort(legacy.begin(), legacy.end());
    const bool setup = fs::exists(run / "scheme_setup.pt");
    if (legacy.empty() && !setup) {
      fmt::print(err, "normlab: error: {}: no *.pt checkpoint to convert\n",
                 (run / "checkpoints").string());
      return kExitBadInput;
    }

    const auto sets = eval::resolved_manifest_overrides(resolved, run);
    ExperimentSpec pre = load_manifest(resolved.string(), sets, nullptr);
    std::vector<fs::path> paths(opt.plugin_paths.begin(), opt.plugin_paths.end());
    for (const auto& p : pre.run.plugin_path) paths.push_back(fs::absolute(p));
    PluginRegistry registry(paths);
    const ExperimentSpec spec = load_manifest(resolved.string(), sets, &registry);
    std::ostringstream data_log;
    const data::Dataset ds = data::load_dataset(spec.data, data_log);
    const ModelSpec model_of_run = model_spec(spec, ds);
    RunDirectory dir(run, std::chrono::milliseconds(1000));  // nobody trains here meanwhile

    if (setup) {
      check_legacy_sum(run / "scheme_setup.pt");
      torch::serialize::InputArchive ar;
      ar.load_from((run / "scheme_setup.pt").string());
      save_scheme_state(run / "scheme_setup.safetensors", legacy_read_named(ar));
      fmt::print(out, "converted {} -> scheme_setup.safetensors\n",
                 (run / "scheme_setup.pt").string());
    }
    for (const fs::path& file : legacy) {
      check_legacy_sum(file);
      // A fresh model and optimizer per file: nothing of the previous file may leak into this one.
      TransformerModel model = assemble_model(model_of_run, registry).model;
      FlatAdamW optimizer(model->parameters(), torch::optim::AdamWOptions(spec.optim.lr)
                                                   .betas({spec.optim.beta1, spec.optim.beta2})
                                                   .eps(spec.optim.eps)
                                                   .weight_decay(spec.optim.weight_decay));
      TrainingState st;
      try {
        st = legacy_load(file, *model, optimizer);
      } catch (const c10::Error& e) {
        throw CheckpointError(
            fmt::format("checkpoint {}: cannot be read as a normlab TorchScript checkpoint ({})",
                        file.string(), e.what_without_backtrace()));
      }
      const std::string name = checkpoint_file_name(file.stem().string());
      dir.save_checkpoint(name,
                          [&](util::AtomicFile& f) { write_checkpoint(f, *model, optimizer, st); });
      fmt::print(out, "converted {} -> {} (update {})\n", file.string(), name, st.updates);
    }
    fmt::print(out, "the .pt files are left in place: delete them once `normlab eval {}` works\n",
               run.string());
    return 0;
  });
}

}  // namespace normlab
