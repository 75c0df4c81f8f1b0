#include "checkpoint.h"

#include <fmt/format.h>

#include <sstream>

#include "torch_compat.h"

namespace fs = std::filesystem;

namespace normlab {
namespace {

// Through a writer function, not a path: LibTorch's own file writer throws from its destructor on
// a full disk, which aborts the process. AtomicFile::append never throws; finish() reports.
void write_archive(torch::serialize::OutputArchive& ar, util::AtomicFile& file) {
  ar.save_to([&file](const void* data, size_t size) -> size_t {
    file.append(data, size);
    return size;
  });
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

void write_checkpoint(util::AtomicFile& file, TransformerModelImpl& model, torch::optim::Optimizer& optimizer,
                      const TrainingState& state) {
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
  ar.write("best_valid_bleu", c10::IValue(state.best_valid_bleu));
  write_archive(ar, file);
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
    // The archive is mapped onto `device`; generator states must be CPU byte tensors again.
    compat::set_cpu_rng_state(compat::as_rng_state(rng));
    torch::Tensor cuda_rng;
    if (ar.try_read("rng_cuda", cuda_rng)) compat::set_cuda_rng_state(compat::as_rng_state(cuda_rng));
    st.updates = read_int(ar, "updates");
    st.epoch = read_int(ar, "epoch");
    st.batch_index = read_int(ar, "batch_index");
    c10::IValue v;
    ar.read("best_valid_nll", v);
    st.best_valid_nll = v.toDouble();
    ar.read("elapsed_s", v);
    st.elapsed_s = v.toDouble();
    if (ar.try_read("best_valid_bleu", v)) st.best_valid_bleu = v.toDouble();  // absent before 0.1.x
  } catch (const c10::Error& e) {
    throw std::runtime_error(fmt::format("checkpoint {}: cannot be read ({})", path.string(),
                                         e.what_without_backtrace()));
  }
  return st;
}

void load_model_weights(const fs::path& path, TransformerModelImpl& model, const torch::Device& device) {
  try {
    torch::serialize::InputArchive ar, m, s;
    ar.load_from(path.string(), device);
    ar.read("model", m);
    model.load(m);
    ar.read("scheme", s);
    model.scheme().load_state(read_named(s));
  } catch (const c10::Error& e) {
    throw std::runtime_error(fmt::format("checkpoint {}: cannot be read ({})", path.string(),
                                         e.what_without_backtrace()));
  }
}

void save_scheme_state(const fs::path& path, const NamedTensors& state) {
  torch::serialize::OutputArchive ar;
  write_named(ar, state);
  util::AtomicFile file(path);
  write_archive(ar, file);
  file.commit();
}

NamedTensors load_scheme_state(const fs::path& path) {
  torch::serialize::InputArchive ar;
  ar.load_from(path.string());
  return read_named(ar);
}

}  // namespace normlab
