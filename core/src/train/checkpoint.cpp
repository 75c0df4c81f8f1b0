#include "checkpoint.h"

#include <fmt/format.h>

#include <sstream>

#include "torch_compat.h"

namespace fs = std::filesystem;

namespace normlab {
namespace {

void write_archive_atomically(torch::serialize::OutputArchive& ar, const fs::path& path) {
  fs::create_directories(path.parent_path());
  const fs::path tmp = path.string() + ".tmp";
  ar.save_to(tmp.string());
  fs::rename(tmp, path);  // atomic on POSIX: readers see the old or the new file, never half
}

void write_named(torch::serialize::OutputArchive& ar, const NamedTensors& state) {
  std::string keys;
  for (const auto& [k, t] : state) {
    keys += k + "\n";
    ar.write("t/" + k, t.detach().cpu());
  }
  ar.write("keys", c10::IValue(keys));
}

NamedTensors read_named(torch::serialize::InputArchive& ar) {
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

int64_t read_int(torch::serialize::InputArchive& ar, const char* key) {
  c10::IValue v;
  ar.read(key, v);
  return v.toInt();
}

}  // namespace

void save_checkpoint(const fs::path& path, TransformerModelImpl& model,
                     torch::optim::Optimizer& optimizer, const TrainingState& state) {
  torch::serialize::OutputArchive ar, m, o, s;
  model.save(m);
  ar.write("model", m);
  optimizer.save(o);
  ar.write("optimizer", o);
  write_named(s, model.scheme().state());
  ar.write("scheme", s);
  ar.write("rng_cpu", compat::cpu_rng_state());
  if (auto cuda_rng = compat::cuda_rng_state(); cuda_rng.defined()) ar.write("rng_cuda", cuda_rng);
  ar.write("updates", c10::IValue(state.updates));
  ar.write("epoch", c10::IValue(state.epoch));
  ar.write("batch_index", c10::IValue(state.batch_index));
  ar.write("best_valid_nll", c10::IValue(state.best_valid_nll));
  ar.write("elapsed_s", c10::IValue(state.elapsed_s));
  write_archive_atomically(ar, path);
}

TrainingState load_checkpoint(const fs::path& path, TransformerModelImpl& model,
                              torch::optim::Optimizer& optimizer, const torch::Device& device) {
  TrainingState st;
  try {
    torch::serialize::InputArchive ar, m, o, s;
    ar.load_from(path.string(), device);
    ar.read("model", m);
    model.load(m);
    ar.read("optimizer", o);
    optimizer.load(o);
    ar.read("scheme", s);
    model.scheme().load_state(read_named(s));
    torch::Tensor rng;
    ar.read("rng_cpu", rng);
    compat::set_cpu_rng_state(rng.cpu());
    torch::Tensor cuda_rng;
    if (ar.try_read("rng_cuda", cuda_rng)) compat::set_cuda_rng_state(cuda_rng);
    st.updates = read_int(ar, "updates");
    st.epoch = read_int(ar, "epoch");
    st.batch_index = read_int(ar, "batch_index");
    c10::IValue v;
    ar.read("best_valid_nll", v);
    st.best_valid_nll = v.toDouble();
    ar.read("elapsed_s", v);
    st.elapsed_s = v.toDouble();
  } catch (const c10::Error& e) {
    throw std::runtime_error(fmt::format("checkpoint {}: cannot be read ({})", path.string(),
                                         e.what_without_backtrace()));
  }
  return st;
}

void save_scheme_state(const fs::path& path, const NamedTensors& state) {
  torch::serialize::OutputArchive ar;
  write_named(ar, state);
  write_archive_atomically(ar, path);
}

NamedTensors load_scheme_state(const fs::path& path) {
  torch::serialize::InputArchive ar;
  ar.load_from(path.string());
  return read_named(ar);
}

}  // namespace normlab
