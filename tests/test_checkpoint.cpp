// Checkpoints are data (issue 27 items 1-3, 8): the safetensors reader refuses every malformed
// header naming the file, a TorchScript archive is refused unread, a checkpoint of another model
// is refused with the difference named, randomly mutated checkpoints never crash or hang, and
// `checkpoint convert --trust-code` turns an old archive into an equal safetensors checkpoint.
#include <fmt/format.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <tuple>

#include "commands/commands.h"
#include "eval/run_model.h"
#include "normlab/manifest/experiment.h"
#include "normlab/train/run_events.h"
#include "normlab/train/trainer.h"
#include "run/checkpoint.h"
#include "run/optimizer.h"
#include "test_support.h"
#include "torch_compat.h"
#include "train/checkpoint_writer.h"
#include "util/atomic_file.h"
#include "util/owned_dir.h"
#include "util/safetensors.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_checkpoint {

using namespace normlab;
namespace fs = std::filesystem;
using json = nlohmann::json;

namespace {

fs::path fresh_dir(const std::string& name) { return test::fresh_dir("normlab_ckpt", name); }
using test::slurp;

void write_bytes(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

// A model with its optimizer, after `updates` AdamW steps on random gradients.
struct Trained {
  TransformerModel model{nullptr};
  std::unique_ptr<FlatAdamW> optimizer;
};

Trained trained(const std::string& scheme, const ModelConfig& cfg, int updates, uint64_t seed) {
  torch::manual_seed(seed);
  Trained t;
  t.model = test::make_model(scheme, cfg);
  t.optimizer =
      std::make_unique<FlatAdamW>(t.model->parameters(), torch::optim::AdamWOptions(1e-3));
  for (int u = 0; u < updates; ++u) {
    t.optimizer->zero_grad();
    for (auto& p : t.model->parameters()) p.mutable_grad().copy_(torch::randn_like(p));
    t.optimizer->step();
    t.model->on_update(u + 1);
  }
  return t;
}

fs::path save(Trained& t, const fs::path& file, const TrainingState& st = {}) {
  util::AtomicFile f(file);
  write_checkpoint(f, *t.model, *t.optimizer, st);
  f.commit();
  return file;
}

// The message of the CheckpointError that `f` throws ("" when it throws none).
template <class F>
std::string refusal(F&& f) {
  try {
    f();
  } catch (const CheckpointError& e) {
    return e.what();
  }
  return "";
}

// A safetensors file from a header text and data bytes.
std::string safetensors_bytes(const std::string& header, const std::string& data) {
  const uint64_t n = header.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + header + data;
}

// A small copy-task manifest in `d`, its run in d/run.
fs::path copy_manifest(const fs::path& d, const std::string& scheme, int64_t max_updates,
                       int64_t eval_interval, int64_t test_beam) {
  const fs::path manifest = d / "m.toml";
  std::ofstream(manifest) << fmt::format(R"([model]
d_model = 16
ffn_dim = 32
heads = 2
enc_layers = 1
dec_layers = 1
dropout = 0.1
[scheme]
name = "{2}"
[data]
task = "copy"
synthetic_vocab = 10
synthetic_min_len = 3
synthetic_max_len = 6
synthetic_train = 200
synthetic_valid = 20
cache_dir = "{0}/cache"
[optim]
max_tokens = 128
max_updates = {3}
[eval]
interval = {4}
bleu = false
test_beam = {5}
[run]
out_dir = "{1}"
log_interval = 1
checkpoint_interval = 10
threads = 1
)",
                                         d.string(), (d / "run").string(), scheme, max_updates,
                                         eval_interval, test_beam);
  return manifest;
}

std::vector<json> records(const fs::path& run) {
  std::vector<json> out;
  std::ifstream f(run / "train.jsonl");
  std::string line;
  while (std::getline(f, line))
    if (!line.empty()) out.push_back(json::parse(line));
  return out;
}

int64_t count_records(const std::vector<json>& rs, const std::string& kind, int64_t update) {
  int64_t n = 0;
  for (const auto& r : rs)
    n += r.value("kind", "") == kind && r.value("update", int64_t(-1)) == update;
  return n;
}

void set_status(const fs::path& run, const std::string& status) {
  json st = json::parse(slurp(run / "status.json"));
  st["status"] = status;
  write_bytes(run / "status.json", st.dump());
}

// Fails the run at update `at` (as a kill before the branch's next checkpoint would end it).
struct FailAt : RunObserver {
  int64_t at;
  explicit FailAt(int64_t u) : at(u) {}
  void after_step(int64_t u) override {
    if (u == at) throw std::runtime_error("stopped by the test");
  }
};

}  // namespace

TEST_SUITE("checkpoint") {
  TEST_CASE(
      "the end phase is recorded once: a resume at max_updates logs no second valid or test "
      "record") {
    const fs::path d = fresh_dir("endphase");
    const fs::path m = copy_manifest(d, "pre-ln", 20, 20, 2);
    const ExperimentSpec spec = load_manifest(m.string(), {}, &test::builtin_registry());
    std::ostringstream sink;
    REQUIRE(train(spec, test::builtin_registry(), sink).status == "completed");
    const fs::path run = d / "run";
    REQUIRE(count_records(records(run), "valid", 20) == 1);
    REQUIRE(count_records(records(run), "test", 20) == 1);
    // Killed just before the final status.json write: everything else is on disk.
    set_status(run, "interrupted");
    std::ostringstream again;
    CHECK(train(spec, test::builtin_registry(), again).status == "completed");
    INFO(again.str());
    CHECK(count_records(records(run), "valid", 20) == 1);
    CHECK(count_records(records(run), "test", 20) == 1);
    // Killed during the test decode: the valid record is there, the test record is not.
    std::vector<json> rs = records(run);
    std::string kept;
    for (const auto& r : rs)
      if (r.value("kind", "") != "test") kept += r.dump() + "\n";
    write_bytes(run / "train.jsonl", kept);
    set_status(run, "interrupted");
    std::ostringstream third;
    CHECK(train(spec, test::builtin_registry(), third).status == "completed");
    CHECK(count_records(records(run), "valid", 20) == 1);
    CHECK(count_records(records(run), "test", 20) == 1);
    CHECK(json::parse(slurp(run / "status.json"))["status"] == "completed");
  }

  TEST_CASE("temporaries a killed writer left are removed by the next run; a live process's stay") {
    const fs::path d = fresh_dir("leftovers");
    const fs::path m = copy_manifest(d, "pre-ln", 10, 0, 0);
    const fs::path run = d / "run";
    util::claim_directory(run, "run", "test");  // the run folder the killed writer had made
    fs::create_directories(run / "checkpoints");
    const pid_t dead = ::fork();
    if (dead == 0) ::_exit(0);
    ::waitpid(dead, nullptr, 0);
    const fs::path stale = run / "checkpoints" / fmt::format("last.safetensors.tmp.{}.0", dead);
    const fs::path stale_status = run / fmt::format("status.json.tmp.{}.3", dead);
    const fs::path live =
        run / "checkpoints" / fmt::format("best.safetensors.tmp.{}.1", ::getppid());
    for (const auto& f : {stale, stale_status, live}) write_bytes(f, std::string(4096, 'x'));
    std::ostringstream sink;
    REQUIRE(train(load_manifest(m.string(), {}, &test::builtin_registry()),
                  test::builtin_registry(), sink)
                .status == "completed");
    CHECK_FALSE(fs::exists(stale));
    CHECK_FALSE(fs::exists(stale_status));
    CHECK(fs::exists(live));
  }

  TEST_CASE(
      "--resume-from leaves no gap: a branch that fails before its next checkpoint resumes from "
      "the branch") {
    const fs::path d = fresh_dir("branch");
    const fs::path m = copy_manifest(d, "pre-ln", 20, 10, 0);
    std::ostringstream sink;
    REQUIRE(train(load_manifest(m.string(), {}, &test::builtin_registry()),
                  test::builtin_registry(), sink)
                .status == "completed");
    const fs::path run = d / "run";
    REQUIRE(fs::exists(run / "checkpoints" / "step_10.safetensors"));
    const ExperimentSpec longer =
        load_manifest(m.string(), {"optim.max_updates=30"}, &test::builtin_registry());
    // The branch from update 10 fails at update 12, before its next checkpoint (20).
    FailAt fail(12);
    TrainControl branch;
    branch.resume_from = (run / "checkpoints" / "step_10.safetensors").string();
    branch.observers = {&fail};
    CHECK_THROWS(train(longer, test::builtin_registry(), sink, branch));
    // A plain rerun continues the branch, from update 10: every update and validation logged once.
    std::ostringstream rerun;
    REQUIRE(train(longer, test::builtin_registry(), rerun).status == "completed");
    CHECK(rerun.str().find("at update 10") != std::string::npos);
    const std::vector<json> rs = records(run);
    for (int64_t u = 1; u <= 30; ++u) {
      INFO("update ", u);
      CHECK(count_records(rs, "train", u) == 1);
    }
    for (int64_t u : {10, 20, 30}) CHECK(count_records(rs, "valid", u) == 1);
  }

  TEST_CASE("a checkpoint round-trips weights, AdamW moments, scheme state, RNG and counters") {
    const fs::path d = fresh_dir("roundtrip");
    const ModelConfig cfg = test::small_config(Arch::EncDec, 2, 2);
    Trained a = trained("branchnorm", cfg, 3, 1);
    TrainingState st;
    st.updates = 3;
    st.epoch = 2;
    st.batch_index = 7;
    st.elapsed_s = 12.5;
    st.best_valid_bleu = 31.25;
    st.stale_validations = 1;  // best_valid_nll stays infinite: JSON null, read back as inf
    torch::manual_seed(99);
    const torch::Tensor rng = compat::cpu_rng_state().clone();
    save(a, d / "a.safetensors", st);

    Trained b = trained("branchnorm", cfg, 0, 2);
    torch::manual_seed(5);
    const TrainingState got =
        load_checkpoint(d / "a.safetensors", *b.model, *b.optimizer, torch::kCPU);
    CHECK(got.updates == 3);
    CHECK(got.epoch == 2);
    CHECK(got.batch_index == 7);
    CHECK(got.elapsed_s == 12.5);
    CHECK(got.best_valid_bleu == 31.25);
    CHECK(got.stale_validations == 1);
    CHECK(std::isinf(got.best_valid_nll));
    CHECK(got.loss_scale == -1);
    CHECK(torch::equal(compat::cpu_rng_state(), rng));
    const auto pa = a.model->named_parameters(), pb = b.model->named_parameters();
    REQUIRE(pa.size() == pb.size());
    for (size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i].key());
      CHECK(torch::equal(pa[i].value(), pb[i].value()));
      const auto& sa = static_cast<torch::optim::AdamWParamState&>(
          *a.optimizer->state().at(compat::optimizer_state_key(pa[i].value())));
      const auto& sb = static_cast<torch::optim::AdamWParamState&>(
          *b.optimizer->state().at(compat::optimizer_state_key(pb[i].value())));
      CHECK(torch::equal(sa.exp_avg(), sb.exp_avg()));
      CHECK(torch::equal(sa.exp_avg_sq(), sb.exp_avg_sq()));
      CHECK(sb.step() == 3);
    }
    // BranchNorm's α clock came back with the file.
    CHECK(b.model->scheme().state().at(0).second.item<int64_t>() ==
          a.model->scheme().state().at(0).second.item<int64_t>());
    // One more identical update keeps both equal: the moments were packed back into the flat
    // buffer.
    for (Trained* t : {&a, &b}) {
      torch::manual_seed(7);
      t->optimizer->zero_grad();
      for (auto& p : t->model->parameters()) p.mutable_grad().copy_(torch::randn_like(p));
      t->optimizer->step();
    }
    for (size_t i = 0; i < pa.size(); ++i) CHECK(torch::equal(pa[i].value(), pb[i].value()));

    // The file is plain safetensors: its header names every tensor, the counters are JSON.
    util::SafetensorsReader r(d / "a.safetensors");
    CHECK(r.meta("format") == "normlab.checkpoint");
    CHECK(json::parse(r.meta("training_state"))["updates"] == 3);
    CHECK(r.has("rng/cpu"));
    CHECK(r.has("optimizer/exp_avg_sq/" + pa[0].key()));
  }

  TEST_CASE(
      "a checkpoint of another model is refused, naming the difference, before anything changes") {
    const fs::path d = fresh_dir("othermodel");
    Trained base = trained("pre-ln", test::small_config(Arch::EncDec, 2, 2, 16, 2, 32), 1, 1);
    TrainingState at1;  // its one optimizer step is one update
    at1.updates = 1;
    const fs::path file = save(base, d / "base.safetensors", at1);
    struct Case {
      const char* what;
      ModelConfig cfg;
      std::string scheme, expect;
    };
    const std::vector<Case> cases = {
        {"ffn", test::small_config(Arch::EncDec, 2, 2, 16, 2, 64), "pre-ln",
         "ffn_dim 32 in the checkpoint, 64 in this run"},
        {"heads", test::small_config(Arch::EncDec, 2, 2, 16, 4, 32), "pre-ln",
         "heads 2 in the checkpoint, 4 in this run"},
        {"layers", test::small_config(Arch::EncDec, 3, 2, 16, 2, 32), "pre-ln",
         "enc_layers 2 in the checkpoint, 3"},
        {"scheme", test::small_config(Arch::EncDec, 2, 2, 16, 2, 32), "post-ln",
         "scheme \"pre-ln\" in the checkpoint"},
    };
    for (const auto& c : cases) {
      INFO(c.what);
      Trained other = trained(c.scheme, c.cfg, 0, 3);
      const torch::Tensor before = other.model->parameters()[0].clone();
      const std::string why =
          refusal([&] { load_checkpoint(file, *other.model, *other.optimizer, torch::kCPU); });
      CHECK(why.find(file.string()) != std::string::npos);
      CHECK(why.find(c.expect) != std::string::npos);
      CHECK(why.find('\n') == std::string::npos);
      CHECK(torch::equal(before, other.model->parameters()[0]));
      CHECK(refusal([&] { load_model_weights(file, *other.model); }).find(c.expect) !=
            std::string::npos);
    }

    // Same identity, a hand-made tensor of another shape (the fused FFN once read such an
    // fc1.weight out of bounds): refused by name and shape.
    util::SafetensorsReader r(file);
    util::TensorList tensors;
    std::string fc1;
    for (const auto& [name, e] : r.entries()) {
      torch::Tensor t = r.read(name);
      if (fc1.empty() && name.rfind("model/", 0) == 0 &&
          name.find("fc1.weight") != std::string::npos) {
        fc1 = name;
        t = torch::zeros({65536, 1});
      }
      tensors.emplace_back(name, t);
    }
    REQUIRE_FALSE(fc1.empty());
    {
      util::AtomicFile f(d / "crafted.safetensors");
      util::write_safetensors(f, tensors, r.metadata());
      f.commit();
    }
    Trained same = trained("pre-ln", test::small_config(Arch::EncDec, 2, 2, 16, 2, 32), 0, 4);
    const std::string why =
        refusal([&] { load_model_weights(d / "crafted.safetensors", *same.model); });
    CHECK(why.find(fc1 + " is F32 [65536, 1] in the checkpoint, F32 [32, 16] in this run") !=
          std::string::npos);
    // A tensor the model does not have, and one missing.
    tensors.emplace_back("model/encoder.extra.weight", torch::zeros({2}));
    tensors.erase(tensors.begin());
    {
      util::AtomicFile f(d / "crafted2.safetensors");
      util::write_safetensors(f, tensors, r.metadata());
      f.commit();
    }
    const std::string why2 =
        refusal([&] { load_model_weights(d / "crafted2.safetensors", *same.model); });
    CHECK(why2.find("missing") != std::string::npos);
    CHECK(why2.find("model/encoder.extra.weight is not in this run's model") != std::string::npos);
  }

  // Issue 42.5: a Mix-LN α = 1 checkpoint evaluated in an α = 0 run was accepted and reported a
  // third model's nll: the identity now holds the scheme's version and every parameter, and ε.
  TEST_CASE("a checkpoint of the same shapes but other scheme parameters or norm eps is refused") {
    const fs::path d = fresh_dir("identity");
    const ModelConfig cfg = test::small_config(Arch::LM, 0, 2, 16, 2, 32);
    torch::manual_seed(1);
    Trained a;
    a.model = test::make_model("mix-ln", cfg, {{"alpha", ParamValue::of_float(1.0)}});
    a.optimizer =
        std::make_unique<FlatAdamW>(a.model->parameters(), torch::optim::AdamWOptions(1e-3));
    const fs::path file = save(a, d / "alpha1.safetensors");
    TransformerModel other =
        test::make_model("mix-ln", cfg, {{"alpha", ParamValue::of_float(0.0)}});
    const torch::Tensor before = other->parameters()[0].clone();
    const std::string why = refusal([&] { load_model_weights(file, *other); });
    CHECK(why.find("scheme_params {\"alpha\":\"1\"} in the checkpoint, {\"alpha\":\"0\"} in "
                   "this run") != std::string::npos);
    CHECK(torch::equal(before, other->parameters()[0]));
    // The same parameters load.
    TransformerModel same = test::make_model("mix-ln", cfg, {{"alpha", ParamValue::of_float(1.0)}});
    CHECK(refusal([&] { load_model_weights(file, *same); }) == "");
    // Another ε.
    ModelConfig eps = cfg;
    eps.norm.eps = 1e-6;
    TransformerModel other_eps =
        test::make_model("mix-ln", eps, {{"alpha", ParamValue::of_float(1.0)}});
    CHECK(refusal([&] { load_model_weights(file, *other_eps); })
              .find("norm_eps 1e-05 in the "
                    "checkpoint, 1e-06") != std::string::npos);
    // The identity lists the plugin's version.
    util::SafetensorsReader r(file);
    const json id = json::parse(r.meta("model"));
    CHECK(id["scheme_version"] == a.model->scheme_handle().version);
    CHECK_FALSE(id["scheme_version"].get<std::string>().empty());
    CHECK(id["scheme_params"]["alpha"] == "1");
  }

  // Issue 42.4: global_batches = 2^62 made a resume hang, updates = 10^18 was accepted and logged.
  TEST_CASE("a checkpoint's counters are range-checked, alone and against the run") {
    const fs::path d = fresh_dir("counters");
    const ModelConfig cfg = test::small_config(Arch::EncDec, 1, 1, 8, 2, 16);
    Trained src = trained("pre-ln", cfg, 2, 1);
    TrainingState st;
    st.updates = 2, st.epoch = 0, st.batch_index = 2, st.global_batches = 1;
    const fs::path good = save(src, d / "good.safetensors", st);
    Trained dst = trained("pre-ln", cfg, 0, 2);
    REQUIRE(refusal([&] { load_checkpoint(good, *dst.model, *dst.optimizer, torch::kCPU); }) == "");
    // Edits the training_state JSON of `good` into a new file.
    auto forged = [&](const std::string& key, const json& value) {
      util::SafetensorsReader r(good);
      util::TensorList tensors;
      for (const auto& [name, e] : r.entries()) tensors.emplace_back(name, r.read(name));
      auto meta = r.metadata();
      json ts = json::parse(meta["training_state"]);
      ts[key] = value;
      meta["training_state"] = ts.dump();
      const fs::path f = d / ("forged_" + key + ".safetensors");
      util::AtomicFile out(f);
      util::write_safetensors(out, tensors, meta);
      out.commit();
      return f;
    };
    const std::vector<std::tuple<std::string, json, std::string>> cases = {
        {"global_batches", int64_t(1) << 62, "training_state.global_batches"},
        {"updates", int64_t(1000000000000000000), "training_state.updates"},
        {"world_size", -3, "training_state.world_size"},
        {"optimizer_step", 3, "training_state.optimizer_step"},  // more steps than updates
        {"stale_validations", 9, "training_state.stale_validations"},
        {"elapsed_s", -1.0, "training_state.elapsed_s"},
        {"best_valid_bleu", 250.0, "training_state.best_valid_bleu"},
        {"best_valid_nll", -2.0, "training_state.best_valid_nll"},
        {"loss_scale", 0.0, "training_state.loss_scale"},
        {"epoch", int64_t(1) << 40, "training_state.epoch"},
    };
    for (const auto& [key, value, expect] : cases) {
      CAPTURE(key);
      const fs::path f = forged(key, value);
      const std::string why =
          refusal([&] { load_checkpoint(f, *dst.model, *dst.optimizer, torch::kCPU); });
      CHECK(why.find(expect) != std::string::npos);
      CHECK(why.find(f.string()) != std::string::npos);
      CHECK(refusal([&] { checkpoint_state(f); }).find(expect) != std::string::npos);
    }
    // A perfect corpus BLEU as bleu.cpp (and sacreBLEU) computes it, exp(Σ4 ln 100 / 4), is a hair
    // above 100: the run's own checkpoints stay readable (they were refused, hostile review).
    double log_sum = 0;
    for (int n = 0; n < 4; ++n) log_sum += std::log(100.0);
    const double perfect = std::exp(log_sum / 4);
    REQUIRE(perfect > 100.0);
    CHECK(checkpoint_state(forged("best_valid_bleu", perfect)).best_valid_bleu == perfect);
    CHECK(refusal([&] {
            checkpoint_state(forged("best_valid_bleu", 100.001));
          }).find("training_state.best_valid_bleu") != std::string::npos);
    // Against the run: past max_updates, an epoch out of reach, a batch index past an epoch.
    const TrainingState ok = checkpoint_state(good);
    CHECK(refusal([&] { check_resume_state(good, ok, 10, 5); }) == "");
    CHECK(refusal([&] {
            check_resume_state(good, ok, 1, 5);
          }).find("updates 2 is past this run's optim.max_updates 1") != std::string::npos);
    CHECK(refusal([&] {
            check_resume_state(good, ok, 10, 1);
          }).find("batch_index 2 is past the 1 batches") != std::string::npos);
    TrainingState far = ok;
    far.epoch = 7;
    CHECK(refusal([&] {
            check_resume_state(good, far, 10, 5);
          }).find("epoch 7 cannot be reached in 2 updates") != std::string::npos);
    // A generator state of another size.
    {
      util::SafetensorsReader r(good);
      util::TensorList tensors;
      for (const auto& [name, e] : r.entries())
        tensors.emplace_back(
            name, name == "rng/cpu" ? r.read(name).narrow(0, 0, 16).clone() : r.read(name));
      util::AtomicFile out(d / "rng.safetensors");
      util::write_safetensors(out, tensors, r.metadata());
      out.commit();
    }
    CHECK(refusal([&] {
            load_checkpoint(d / "rng.safetensors", *dst.model, *dst.optimizer, torch::kCPU);
          }).find("rng/cpu is U8 [16] in the checkpoint") != std::string::npos);
  }

  TEST_CASE("malformed safetensors headers are refused with one line naming the file") {
    const fs::path d = fresh_dir("headers");
    const std::string four_floats(16, '\0');
    struct Case {
      const char* what;
      std::string bytes, expect;
    };
    const std::vector<Case> cases = {
        {"empty", "", "too short"},
        {"length past the end", std::string("\xff\xff\xff\xff\0\0\0\0", 8) + "{}", "does not fit"},
        {"not JSON", safetensors_bytes("{\"a\": [1, 2", ""), "not a JSON object"},
        {"a list", safetensors_bytes("[1, 2, 3]  ", ""), "not a JSON object"},
        {"deep nesting", safetensors_bytes(std::string(5000, '[') + std::string(5000, ']'), ""),
         "nests deeper"},
        {"unknown dtype",
         safetensors_bytes(R"({"x":{"dtype":"F128","shape":[1],"data_offsets":[0,16]}})",
                           four_floats),
         "dtype \"F128\""},
        {"negative size",
         safetensors_bytes(R"({"x":{"dtype":"F32","shape":[-4],"data_offsets":[0,16]}})",
                           four_floats),
         "shape entry -4"},
        {"size mismatch",
         safetensors_bytes(R"({"x":{"dtype":"F32","shape":[5],"data_offsets":[0,16]}})",
                           four_floats),
         "needs 20 bytes"},
        {"beyond the file",
         safetensors_bytes(R"({"x":{"dtype":"F32","shape":[8],"data_offsets":[0,32]}})",
                           four_floats),
         "beyond the file"},
        {"overflowing shape",
         safetensors_bytes(
             R"({"x":{"dtype":"F32","shape":[281474976710656,281474976710656],"data_offsets":[0,16]}})",
             four_floats),
         "needs"},
        {"overlap",
         safetensors_bytes(
             R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]},"y":{"dtype":"F32","shape":[2],"data_offsets":[8,16]}})",
             four_floats),
         "overlap"},
        {"extra field",
         safetensors_bytes(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16],"code":"x"}})",
                           four_floats),
         "expected an object with dtype"},
        {"metadata not strings", safetensors_bytes(R"({"__metadata__":{"format":3}})", ""),
         "not a string"},
        {"bool bytes",
         safetensors_bytes(
             R"({"__metadata__":{"format":"normlab.scheme_state"},"b":{"dtype":"BOOL","shape":[2],"data_offsets":[0,2]}})",
             std::string("\x01\x07", 2)),
         "bytes other than 0 and 1"},
        {"not normlab's", safetensors_bytes(R"({"__metadata__":{"format":"pt"}})", ""),
         "not a normlab.scheme_state file"},
    };
    for (const auto& c : cases) {
      INFO(c.what);
      const fs::path file = d / "bad.safetensors";
      write_bytes(file, c.bytes);
      const std::string why = refusal([&] { load_scheme_state(file); });
      CHECK(why.find(file.string()) != std::string::npos);
      CHECK(why.find(c.expect) != std::string::npos);
      CHECK(why.find('\n') == std::string::npos);
    }
    const std::string dir = refusal([&] { load_scheme_state(d); });
    CHECK(dir.find("a folder, not a checkpoint file") != std::string::npos);
  }

  TEST_CASE("a TorchScript archive is refused unread, with how to convert a trusted one") {
    const fs::path d = fresh_dir("torchscript");
    torch::serialize::OutputArchive ar;
    ar.write("updates", c10::IValue(int64_t(5)));
    ar.save_to((d / "old.safetensors").string());
    Trained t = trained("pre-ln", test::small_config(Arch::LM, 0, 2), 0, 1);
    for (const auto& load : std::vector<std::function<void()>>{
             [&] { load_checkpoint(d / "old.safetensors", *t.model, *t.optimizer, torch::kCPU); },
             [&] { load_model_weights(d / "old.safetensors", *t.model); },
             [&] { load_scheme_state(d / "old.safetensors"); }}) {
      const std::string why = refusal(load);
      CHECK(why.find((d / "old.safetensors").string()) != std::string::npos);
      CHECK(why.find("TorchScript") != std::string::npos);
      CHECK(why.find("normlab checkpoint convert RUN --trust-code") != std::string::npos);
    }
  }

  TEST_CASE("randomly mutated checkpoints load or are refused: no crash, no hang, no other error") {
    // NORMLAB_CHECKPOINT_FUZZ_SECONDS runs it longer (docs/reliability.md: 5 minutes were clean).
    const char* env = std::getenv("NORMLAB_CHECKPOINT_FUZZ_SECONDS");
    const double seconds = env ? std::atof(env) : 15.0;
    const fs::path d = fresh_dir("mutate");
    const ModelConfig cfg = test::small_config(Arch::EncDec, 1, 1, 8, 2, 16);
    Trained src = trained("admin", cfg, 2, 1);
    TrainingState at2;
    at2.updates = 2, at2.batch_index = 2, at2.global_batches = 1;
    const std::string good = slurp(save(src, d / "good.safetensors", at2));
    uint64_t header_len = 0;
    std::memcpy(&header_len, good.data(), 8);
    Trained dst = trained("admin", cfg, 0, 2);
    std::mt19937_64 gen(20261125);
    auto uniform = [&](uint64_t n) {
      return std::uniform_int_distribution<uint64_t>(0, n - 1)(gen);
    };
    int64_t loaded = 0, refused = 0, runs = 0;
    const auto t0 = std::chrono::steady_clock::now();
    while (std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() < seconds) {
      std::string bytes = good;
      std::string what;
      bool must_refuse = false;
      switch (uniform(6)) {
        case 0: {  // truncated
          bytes.resize(uniform(bytes.size()));
          what = fmt::format("truncated to {}", bytes.size());
          break;
        }
        case 1: {  // bytes flipped in the header, where the structure is
          for (uint64_t k = 0, n = 1 + uniform(4); k < n; ++k)
            bytes[8 + uniform(header_len)] ^= char(1 << uniform(8));
          what = "header bytes flipped";
          break;
        }
        case 2: {  // bytes flipped anywhere (the length field included)
          for (uint64_t k = 0, n = 1 + uniform(8); k < n; ++k)
            bytes[uniform(bytes.size())] ^= char(1 << uniform(8));
          what = "bytes flipped";
          break;
        }
        case 3: {  // two tensors' entries swapped (names keep their places, the rest moves)
          json h = json::parse(bytes.substr(8, header_len));
          std::vector<std::string> names;
          for (const auto& [k, v] : h.items())
            if (k != "__metadata__") names.push_back(k);
          const std::string a = names[uniform(names.size())], b = names[uniform(names.size())];
          std::swap(h[a], h[b]);
          std::string text = h.dump();
          text.append(header_len > text.size() ? header_len - text.size() : 0, ' ');
          const uint64_t n = text.size();
          bytes = std::string(reinterpret_cast<const char*>(&n), 8) + text +
                  good.substr(8 + header_len);
          what = "swapped " + a + " and " + b;
          break;
        }
        case 4: {  // a counter or an identity field set to an edge value (issue 42.4, 42.5)
          json h = json::parse(bytes.substr(8, header_len));
          json& meta = h["__metadata__"];
          const bool counter = uniform(2) == 0;
          json inner = json::parse(meta[counter ? "training_state" : "model"].get<std::string>());
          std::vector<std::string> keys;
          for (const auto& [k, v] : inner.items()) keys.push_back(k);
          const std::string key = keys[uniform(keys.size())];
          const std::vector<json> edges = {
              int64_t(-1), int64_t(1) << 62, int64_t(1000000000000000000), 1e308, 0.5, "x",
              nullptr,     json::object()};
          const json value = edges[uniform(edges.size())];
          // A changed identity is another model; a counter beyond any bound is forged.
          const bool integer_counter = key == "updates" || key == "epoch" || key == "batch_index" ||
                                       key == "world_size" || key == "global_batches" ||
                                       key == "optimizer_step" || key == "stale_validations";
          must_refuse = counter
                            ? integer_counter && value.is_number_integer() &&
                                  (value.get<int64_t>() < 0 || value.get<int64_t>() > (1LL << 40))
                            : value != inner[key];
          inner[key] = value;
          meta[counter ? "training_state" : "model"] = inner.dump();
          std::string text = h.dump();
          const uint64_t n = text.size();
          bytes = std::string(reinterpret_cast<const char*>(&n), 8) + text +
                  good.substr(8 + header_len);
          what = fmt::format("{} {} = {}", counter ? "training_state" : "model", key, value.dump());
          break;
        }
        default: {  // a metadata value replaced by a random number or string
          json h = json::parse(bytes.substr(8, header_len));
          json& meta = h["__metadata__"];
          const std::vector<std::string> keys = {"format", "layout", "model", "training_state"};
          const std::string key = keys[uniform(keys.size())];
          std::string v = meta[key].get<std::string>();
          if (!v.empty()) v[uniform(v.size())] = "0123456789-e.\"{}[]:,x"[uniform(21)];
          meta[key] = v;
          std::string text = h.dump();
          const uint64_t n = text.size();
          bytes = std::string(reinterpret_cast<const char*>(&n), 8) + text +
                  good.substr(8 + header_len);
          what = "metadata " + key + " = " + v;
        }
      }
      write_bytes(d / "m.safetensors", bytes);
      ++runs;
      try {
        load_checkpoint(d / "m.safetensors", *dst.model, *dst.optimizer, torch::kCPU);
        ++loaded;
        if (must_refuse) FAIL_CHECK(what, ": loaded, but it had to be refused");
      } catch (const CheckpointError& e) {
        ++refused;
        if (std::string(e.what()).find((d / "m.safetensors").string()) == std::string::npos)
          FAIL_CHECK(what, ": ", e.what());
      } catch (const std::exception& e) {
        FAIL_CHECK(what, ": not a CheckpointError: ", e.what());
      }
    }
    MESSAGE(runs, " mutated checkpoints in ", seconds, " s: ", loaded, " loaded, ", refused,
            " refused");
    CHECK(runs > 50);
    CHECK(refused > 0);
    CHECK(loaded > 0);  // the unmutated parts load: the refusals are the mutations
  }

  TEST_CASE(
      "checkpoint convert: --trust-code required; an old archive becomes the same checkpoint in "
      "safetensors") {
    const fs::path d = fresh_dir("convert");
    const fs::path run = d / "run";
    const fs::path manifest = copy_manifest(d, "branchnorm", 4, 0, 0);
    std::ostringstream sink;
    const ExperimentSpec spec = load_manifest(manifest.string(), {}, &test::builtin_registry());
    REQUIRE(train(spec, test::builtin_registry(), sink).status == "completed");
    const fs::path ckpts = run / "checkpoints";

    std::ostringstream out, err, log;
    CheckpointConvertOptions opt;
    opt.run = run.string();
    opt.plugin_paths = {NORMLAB_TEST_PLUGIN_DIR};
    // The run's model with its optimizer state from one of its checkpoints.
    struct Loaded {
      eval::OpenedRun opened;
      std::unique_ptr<FlatAdamW> optimizer;
      TrainingState st;
    };
    auto open = [&](const fs::path& file) {
      Loaded l;
      l.opened = eval::open_run(
          {run.string(), file.string(), "cpu", {NORMLAB_TEST_PLUGIN_DIR}, false}, log);
      l.optimizer = std::make_unique<FlatAdamW>(l.opened.model->parameters(),
                                                torch::optim::AdamWOptions(1e-3));
      l.st = load_checkpoint(file, *l.opened.model, *l.optimizer, torch::kCPU);
      return l;
    };
    {
      // The old layout (normlab before the safetensors format), saved as the old writer did.
      Loaded l = open(ckpts / "last.safetensors");
      torch::serialize::OutputArchive ar, m, o2, s;
      l.opened.model->save(m);
      ar.write("model", m);
      l.optimizer->torch::optim::AdamW::save(o2);
      ar.write("optimizer", o2);
      std::string keys;
      for (const auto& [k, t] : l.opened.model->scheme().state()) {
        keys += k + "\n";
        s.write("t/" + k, t);
      }
      s.write("keys", c10::IValue(keys));
      ar.write("scheme", s);
      ar.write("rng_cpu", compat::cpu_rng_state());
      ar.write("updates", c10::IValue(l.st.updates));
      ar.write("epoch", c10::IValue(l.st.epoch));
      ar.write("batch_index", c10::IValue(l.st.batch_index));
      ar.write("best_valid_nll", c10::IValue(l.st.best_valid_nll));
      ar.write("elapsed_s", c10::IValue(l.st.elapsed_s));
      ar.save_to((ckpts / "old.pt").string());
    }
    CHECK(checkpoint_convert_command(opt, out, err) == kExitBadInput);
    CHECK(err.str().find("--trust-code") != std::string::npos);
    CHECK_FALSE(fs::exists(ckpts / "old.safetensors"));

    opt.trust_code = true;
    err.str("");
    REQUIRE(checkpoint_convert_command(opt, out, err) == 0);
    INFO(out.str(), err.str());
    REQUIRE(fs::exists(ckpts / "old.safetensors"));
    CHECK(checksum_problem(ckpts / "old.safetensors") == "");
    // Converted = original: every parameter, every moment, the counters and the α clock.
    Loaded a = open(ckpts / "last.safetensors"), b = open(ckpts / "old.safetensors");
    CHECK(a.st.updates == b.st.updates);
    CHECK(a.st.epoch == b.st.epoch);
    CHECK(a.st.batch_index == b.st.batch_index);
    const auto pa = a.opened.model->named_parameters(), pb = b.opened.model->named_parameters();
    for (size_t i = 0; i < pa.size(); ++i) {
      INFO(pa[i].key());
      CHECK(torch::equal(pa[i].value(), pb[i].value()));
      const auto& ma = static_cast<torch::optim::AdamWParamState&>(
          *a.optimizer->state().at(compat::optimizer_state_key(pa[i].value())));
      const auto& mb = static_cast<torch::optim::AdamWParamState&>(
          *b.optimizer->state().at(compat::optimizer_state_key(pb[i].value())));
      CHECK(torch::equal(ma.exp_avg_sq(), mb.exp_avg_sq()));
      CHECK(ma.step() == mb.step());
    }
    CHECK(torch::equal(a.opened.model->scheme().state().at(0).second,
                       b.opened.model->scheme().state().at(0).second));
  }

  TEST_CASE(
      "a checkpoint snapshot is a copy: training after it leaves the written file as it was") {
    // One slab holds this model's buffers; 1 KiB slabs hold a few each, and a bigger tensor (the
    // 50 x 8 embeddings, 1,600 bytes) one of its own.
    for (const int64_t slab_bytes : {kSnapshotSlabBytes, int64_t(1024)}) {
      CAPTURE(slab_bytes);
      const fs::path d = fresh_dir("snapshot");
      const ModelConfig cfg = test::small_config(Arch::EncDec, 1, 1, 8, 2, 16);
      Trained t = trained("pre-ln", cfg, 2, 7);
      TrainingState st;
      st.updates = 2;
      torch::manual_seed(11);  // the CPU generator's state is in both files
      save(t, d / "direct.safetensors", st);
      CheckpointContents snap;
      // Buffers made ahead (on the writer's thread as a run starts) are the ones the first snapshot
      // fills: the weights, both moments of every parameter. They are views into slabs of host
      // memory, packed in order (64-byte aligned): no pinned allocation per tensor (issue 43.2).
      allocate_snapshot_buffers(snap, snapshot_buffer_specs(*t.model), false, slab_bytes);
      std::map<std::string, const void*> prepared;
      std::map<const void*, int64_t> slabs;  // slab → its bytes
      int64_t oversize = 0;
      for (const auto& [name, tensor] : snap.tensors) {
        prepared[name] = tensor.data_ptr();
        CHECK(tensor.is_contiguous());
        CHECK(reinterpret_cast<uintptr_t>(tensor.data_ptr()) % 64 == 0);
        slabs[tensor.storage().data()] = int64_t(tensor.storage().nbytes());
        oversize += int64_t(tensor.nbytes()) > slab_bytes;
      }
      int64_t padded = 0, slab_total = 0;
      for (const auto& [name, tensor] : snap.tensors)
        padded += (int64_t(tensor.nbytes()) + 63) / 64 * 64;
      for (const auto& [ptr, bytes] : slabs) {
        slab_total += bytes;
        CHECK(bytes <= std::max(slab_bytes, padded));
      }
      CHECK(slab_total == padded);  // nothing rounded up
      if (slab_bytes == kSnapshotSlabBytes) {
        CHECK(slabs.size() == 1);
      } else {
        CHECK(oversize >= 1);
        CHECK(slabs.size() >= size_t(padded / slab_bytes));
        CHECK(slabs.size() < prepared.size());
      }
      torch::manual_seed(11);
      take_checkpoint_snapshot(snap, *t.model, *t.optimizer, st);
      std::vector<const void*> buffers;
      size_t filled = 0;
      for (const auto& [name, tensor] : snap.tensors) {
        buffers.push_back(tensor.data_ptr());
        if (name.rfind("model/", 0) != 0 && name.rfind("optimizer/", 0) != 0) continue;
        CAPTURE(name);
        CHECK(prepared.count(name) == 1);
        CHECK(prepared[name] == tensor.data_ptr());
        ++filled;
      }
      CHECK(filled == prepared.size());
      CHECK(filled > 2 * t.model->parameters().size());
      // Training goes on while the snapshot is written.
      torch::NoGradGuard no_grad;
      for (auto& p : t.model->parameters()) p.add_(1.0);
      t.optimizer->step();
      {
        util::AtomicFile f(d / "snapshot.safetensors");
        write_checkpoint(f, snap);
        f.commit();
      }
      CHECK(slurp(d / "snapshot.safetensors") == slurp(d / "direct.safetensors"));
      // The next snapshot reuses the buffers (no new host memory per checkpoint) and holds the new
      // weights.
      take_checkpoint_snapshot(snap, *t.model, *t.optimizer, st);
      REQUIRE(snap.tensors.size() == buffers.size());
      for (size_t i = 0; i < buffers.size(); ++i)
        CHECK(snap.tensors[i].second.data_ptr() == buffers[i]);
      const at::Tensor first = t.model->parameters().front();
      CHECK(torch::equal(snap.tensors.front().second, first));
    }
  }

  TEST_CASE("a failed background write surfaces at the next checkpoint; the previous file stays") {
    const fs::path d = fresh_dir("writer_failure");
    const fs::path target = d / "last.safetensors";
    write_bytes(target, "previous");
    CheckpointWriter writer;
    writer.submit(nullptr, [&](const CheckpointContents&) {
      util::AtomicFile f(target);
      f.append("half of a new checkpoint");
      throw util::FileError("cannot write " + target.string() + ": No space left on device");
    });
    // The next checkpoint's snapshot waits for the writes before it: the error surfaces there.
    std::string error;
    bool taken = false;
    try {
      writer.submit([&](CheckpointContents&) { taken = true; }, [](const CheckpointContents&) {});
    } catch (const util::FileError& e) {
      error = e.what();
    }
    CHECK(error.find("No space left on device") != std::string::npos);
    CHECK_FALSE(taken);
    CHECK(slurp(target) == "previous");
    // Reported once: the next checkpoint goes ahead; a failure of a link reports at the end of the
    // run, and what was queued behind it does not run.
    bool linked = false;
    writer.submit([&](CheckpointContents&) { taken = true; }, [](const CheckpointContents&) {});
    writer.submit(nullptr, [&](const CheckpointContents&) {
      throw util::FileError("cannot link: Input/output error");
    });
    error.clear();
    try {  // the failure surfaces at this submit or at the end, whichever comes after it
      writer.submit(nullptr, [&](const CheckpointContents&) { linked = true; });
      writer.finish();
    } catch (const util::FileError& e) {
      error = e.what();
    }
    CHECK(taken);
    CHECK(error.find("Input/output error") != std::string::npos);
    CHECK_FALSE(linked);  // dropped: a link behind a failed write would publish the wrong file
    writer.finish();
    size_t files = 0;
    for ([[maybe_unused]] const auto& e : fs::directory_iterator(d)) ++files;
    CHECK(files == 1);  // no temporary left behind
  }

  TEST_CASE("a run's best and last of the same update are one file; the end reports its phases") {
    const fs::path d = fresh_dir("best_is_last");
    const fs::path run = d / "run";
    // Validation at update 4, the last: best.safetensors, then last.safetensors of the same point.
    const fs::path manifest = copy_manifest(d, "pre-ln", 4, 4, 0);
    std::ostringstream out;
    const ExperimentSpec spec = load_manifest(manifest.string(), {}, &test::builtin_registry());
    REQUIRE(train(spec, test::builtin_registry(), out).status == "completed");
    INFO(out.str());
    const fs::path ckpts = run / "checkpoints";
    REQUIRE(fs::exists(ckpts / "best.safetensors"));
    CHECK(fs::equivalent(ckpts / "best.safetensors", ckpts / "last.safetensors"));
    CHECK(checksum_problem(ckpts / "best.safetensors") == "");
    CHECK(checksum_problem(ckpts / "last.safetensors") == "");
    CHECK(checkpoint_updates(ckpts / "last.safetensors") == 4);
    CHECK(out.str().find("time: setup ") != std::string::npos);
    CHECK(out.str().find("checkpoints held the update loop") != std::string::npos);
  }

  // Issue 66.7: the tokenizer's SHA-256 is part of the data identity a checkpoint keeps; one from
  // before the record (no "tokenizer") is no change, another tokenizer or none is.
  TEST_CASE(
      "data identity: another tokenizer is a change; a checkpoint without the record is not") {
    using nlohmann::json;
    const json file = {{"file", "s/shard_00000.bin"}, {"bytes", 64}, {"sha256", "ab"}};
    json old = {{"format", "normlab"}, {"train", json::array({file})}, {"train_tokens", 32}};
    json now = old;
    now["tokenizer"] = {{"file", "s/tokenizer.model"}, {"sha256", "1234567890abcdef"}};
    CHECK(normlab::data::data_identity_change(old.dump(), now.dump()).empty());
    json other = now;
    other["tokenizer"]["sha256"] = "fedcba0987654321";
    const std::string change = normlab::data::data_identity_change(now.dump(), other.dump());
    CHECK(change.find("tokenizer s/tokenizer.model (SHA-256 fedcba098765…) is not the run's") !=
          std::string::npos);
    CHECK(change.find("1234567890ab") != std::string::npos);
    CHECK(normlab::data::data_identity_change(now.dump(), old.dump()).find("names no tokenizer") !=
          std::string::npos);
    CHECK(normlab::data::data_identity_change(now.dump(), now.dump()).empty());
  }

}  // TEST_SUITE

}  // namespace normlab_test_checkpoint
