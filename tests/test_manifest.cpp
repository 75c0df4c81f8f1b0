// Manifest validation: a table of bad manifests, each with the message it must produce.
#include <unistd.h>

#include <filesystem>
#include <fstream>

#include "normlab/manifest/experiment.h"
#include "normlab/sweep/sweep.h"
#include "test_support.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_manifest {

using namespace normlab;
namespace fs = std::filesystem;

namespace {

fs::path scratch() {
  static fs::path d = [] {
    fs::path p = fs::temp_directory_path() / ("normlab_manifest_" + std::to_string(::getpid()));
    fs::create_directories(p);
    return p;
  }();
  return d;
}

fs::path write_manifest(const std::string& name, const std::string& text) {
  fs::path p = scratch() / name;
  std::ofstream(p) << text;
  return p;
}

const char* kValid = R"([model]
arch = "encdec"
d_model = 32
heads = 2
ffn_dim = 64
enc_layers = 2
dec_layers = 2

[scheme]
name = "branchnorm"
T = 100

[data]
task = "copy"

[optim]
lr = 1e-3
max_updates = 10
)";

std::string error_of(const std::string& text, const std::vector<std::string>& sets = {}) {
  const fs::path p = write_manifest("m.toml", text);
  try {
    load_manifest(p.string(), sets, &test::builtin_registry());
  } catch (const ManifestError& e) {
    return e.what();
  }
  return "(no error)";
}

// `kValid` with `from` replaced by `to`.
std::string with(const std::string& from, const std::string& to) {
  std::string s = kValid;
  const auto pos = s.find(from);
  REQUIRE_MESSAGE(pos != std::string::npos, from);
  return s.replace(pos, from.size(), to);
}

}  // namespace

TEST_SUITE("manifest") {
  TEST_CASE("bad manifests give file:line:column, the key and what was expected") {
    const std::string f = (scratch() / "m.toml").string();
    std::ofstream(scratch() / "here.en") << "a\n";
    struct Case {
      std::string name, text;
      std::vector<std::string> sets;
      std::string message;
    };
    const std::vector<Case> cases = {
        {"TOML syntax", with("[optim]", "[optim"), {}, f + ":16:7: TOML syntax error"},
        {"unknown table", with("[optim]", "[optimizer]"), {}, "unknown top-level key 'optimizer'"},
        {"top-level key",
         std::string("seed = 3\n") + kValid,
         {},
         f + ":1:8: unknown top-level key 'seed'"},
        {"unknown key",
         with("d_model = 32", "dmodel = 32"),
         {},
         f + ":3:10: [model] unknown key 'dmodel' (known: arch, d_model, ffn_dim"},
        {"wrong type",
         with("d_model = 32", "d_model = \"32\""),
         {},
         f + ":3:11: [model] d_model: expected integer in [1, 65536], got string \"32\""},
        {"float for int",
         with("d_model = 32", "d_model = 32.0"),
         {},
         "[model] d_model: expected integer in [1, 65536], got float 32"},
        {"dropout out of range",
         with("dec_layers = 2", "dec_layers = 2\ndropout = 1.5"),
         {},
         f + ":8:11: [model] dropout: expected float in [0, 0.999], got float 1.5"},
        {"bad choice",
         with("arch = \"encdec\"", "arch = \"decoder\""),
         {},
         f + ":2:8: [model] arch: expected one of encdec | lm, got string \"decoder\""},
        {"heads",
         with("heads = 2", "heads = 3"),
         {},
         f + ":4:9: [model] heads: expected a divisor of d_model = 32, got 3"},
        {"unknown scheme",
         with("name = \"branchnorm\"", "name = \"branch-norm\""),
         {},
         f + ":10:8: [scheme] name: unknown scheme 'branch-norm' (known: " NORMLAB_TEST_SCHEMES},
        {"unknown scheme parameter",
         with("T = 100", "TT = 100"),
         {},
         f + ":11:6: [scheme] scheme 'branchnorm' has no parameter 'TT' (known: schedule, T, k, "
             "alpha_min)"},
        {"scheme parameter type",
         with("T = 100", "T = \"100\""),
         {},
         f + ":11:5: [scheme] scheme 'branchnorm' parameter 'T': expected int, got string \"100\""},
        {"scheme parameter range",
         with("T = 100", "T = 0"),
         {},
         "[scheme] scheme 'branchnorm' parameter 'T': expected a value in [1, inf], got 0"},
        {"scheme parameter choice",
         with("T = 100", "schedule = \"cosine\""),
         {},
         "parameter 'schedule': expected one of linear | exp | sigmoid, got \"cosine\""},
        {"missing file",
         with("task = \"copy\"", "task = \"translation\"\ntrain_src = \"nope.en\""),
         {},
         f + ":15:13: [data] train_src: file not found: " + (scratch() / "nope.en").string()},
        {"required file",
         with("task = \"copy\"", "task = \"translation\"\ntrain_src = \"here.en\""),
         {},
         "[data] train_tgt: required for task = \"translation\""},
        {"task needs arch",
         with("task = \"copy\"", "task = \"synthetic-lm\""),
         {},
         f + ":2:8: [model] arch: task \"synthetic-lm\" needs arch = \"lm\", got \"encdec\""},
        {"non-positive lr",
         with("lr = 1e-3", "lr = 0"),
         {},
         f + ":17:6: [optim] lr: expected float in (0, 10], got integer 0"},
        {"device",
         with("max_updates = 10", "max_updates = 10\n[run]\ndevice = \"gpu\""),
         {},
         "[run] device: expected cpu, cuda or cuda:N, got \"gpu\""},
        // The fuzzer's toml++ finding (tests/fuzz/CMakeLists.txt): still a clean syntax error here.
        {"non-ASCII outside a string",
         "\xca\x9d = 1\n",
         {},
         f + ":1:1: TOML syntax error: Error while parsing root table: expected keys, tables, "
             "whitespace or comments, saw '\xca\x9d'"},
        {"device index",
         with("max_updates = 10", "max_updates = 10\n[run]\ndevice = \"cuda:x\""),
         {},
         "[run] device: expected cpu, cuda or cuda:N, got \"cuda:x\""},
        {"tokenizer type",
         with("task = \"copy\"",
              "task = \"copy\"\n[data.tokenizer]\nmodel_type = \"sentencepiece\""),
         {},
         "[data.tokenizer] model_type: expected one of unigram | bpe | char | word"},
        {"min > max",
         with("task = \"copy\"", "task = \"copy\"\nsynthetic_min_len = 9\nsynthetic_max_len = 4"),
         {},
         "[data] synthetic_min_len: expected at most synthetic_max_len = 4, got 9"},
        {"--set unknown section",
         kValid,
         {"modle.d_model=3"},
         "--set modle.d_model=3: unknown section [modle]"},
        {"--set bad value",
         kValid,
         {"optim.max_updates=many"},
         "--set optim.max_updates: [optim] max_updates: expected integer in [1, inf], got string "
         "\"many\""},
        {"--set malformed",
         kValid,
         {"max_updates"},
         "--set max_updates: expected section.key=value"},
        // manifest_fuzz found it: a bare word or key that is not UTF-8 (a Latin-1 byte) was kept,
        // and its dump read back as other characters.
        {"--set not UTF-8",
         kValid,
         {"scheme.schedule=take\xA9N"},
         "--set: expected UTF-8 text, got byte 0xA9 at offset 20 of \"scheme.schedule=take…\""},
        {"--set key not UTF-8",
         kValid,
         {"scheme.dev\xFF\xFF=1"},
         "--set: expected UTF-8 text, got byte 0xFF at offset 10 of \"scheme.dev…\""},
        {"quoted scheme parameter",
         with("T = 100", "\"T\\t'x\" = 100"),
         {},
         f + ":11:11: [scheme] parameter \"T\\t'x\": expected a name of letters, digits, '_' or "
             "'-'"},
        {"--set scheme parameter",
         kValid,
         {"scheme.d\t'=1"},
         "--set scheme.d\t': [scheme] parameter \"d\\t'\": expected a name of letters"},
        {"--set table not UTF-8",
         kValid,
         {"scheme={name = \"x\xDFw\"}"},
         "--set: expected UTF-8 text, got byte 0xDF at offset 17 of \"scheme={name = \"x…\""},
        {"test pair",
         with("task = \"copy\"", "task = \"copy\"\ntest_src = \"here.en\""),
         {},
         "[data] test_src/test_tgt: expected both or neither"},
        // Issue 19: the new keys of [eval] and [analysis].
        {"analysis format",
         kValid,
         {"analysis.formats=[\"csv\", \"parquet\"]"},
         "--set analysis.formats: [analysis] formats: expected a list of csv | jsonl | "
         "tensorboard, got \"parquet\""},
        {"no analysis format",
         kValid,
         {"analysis.formats=[]"},
         "--set analysis.formats: [analysis] formats: expected at least one of \"csv\", \"jsonl\", "
         "\"tensorboard\", got an empty list"},
        {"patience",
         kValid,
         {"eval.patience=-1"},
         "--set eval.patience: [eval] patience: expected integer in [0, inf], got integer -1"},
        {"bleu_after_updates",
         kValid,
         {"eval.bleu_after_updates=1.5"},
         "[eval] bleu_after_updates: expected integer in [0, inf], got float 1.5"},
    };
    CHECK(cases.size() >= 15);
    for (const auto& c : cases) {
      CAPTURE(c.name);
      const std::string msg = error_of(c.text, c.sets);
      INFO("got: " << msg);
      CHECK(msg.find(c.message) != std::string::npos);
    }
    CHECK(error_of(kValid) == "(no error)");
  }

  TEST_CASE("a missing manifest file") {
    try {
      load_manifest("/nonexistent/x.toml", {}, nullptr);
      FAIL("no error");
    } catch (const ManifestError& e) {
      CHECK(std::string(e.what()) == "/nonexistent/x.toml: no such manifest file");
    }
  }

  TEST_CASE("a directory is not a manifest (it used to train every default)") {
    const fs::path dir = scratch() / "a_run_dir";
    fs::create_directories(dir);
    const std::string expected =
        dir.string() + ": is a directory, expected a manifest file (.toml)";
    try {
      load_manifest(dir.string(), {}, nullptr);
      FAIL("no error");
    } catch (const ManifestError& e) {
      CHECK(std::string(e.what()) == expected);
    }
    try {
      plan_sweep(dir.string(), {}, nullptr);
      FAIL("no error");
    } catch (const ManifestError& e) {
      CHECK(std::string(e.what()) == expected);
    }
  }

  TEST_CASE("defaults filled, --set applied, the dump reads back to the same experiment") {
    const fs::path p = write_manifest("ok.toml", kValid);
    ExperimentSpec s = load_manifest(
        p.string(), {"optim.lr=0.002", "scheme.schedule=\"exp\"", "data.tokenizer.vocab_size=500"},
        &test::builtin_registry());
    CHECK(s.optim.lr == 0.002);
    CHECK(s.optim.warmup_updates == 4000);  // default
    CHECK(s.scheme.params.at("schedule").s == "exp");
    CHECK(s.scheme.params.at("k").f == 5.0);  // scheme default filled
    CHECK(s.data.tokenizer.vocab_size == 500);
    CHECK(s.run.out_dir == "runs/ok");
    const std::string dump = dump_manifest(s);
    const fs::path q = write_manifest("dumped.toml", dump);
    ExperimentSpec again = load_manifest(q.string(), {}, &test::builtin_registry());
    CHECK(dump_manifest(again).substr(dump_manifest(again).find('\n', dump.find("# source"))) ==
          dump.substr(dump.find('\n', dump.find("# source"))));
    // Floats in their shortest exact form (issue 27.15: beta1 = 0.90000000000000002), and an
    // awkward one still reads back bitwise.
    INFO(dump);
    CHECK(dump.find("beta1 = 0.9\n") != std::string::npos);
    CHECK(dump.find("lr = 0.002\n") != std::string::npos);
    CHECK(dump.find("0000000") == std::string::npos);
    ExperimentSpec odd =
        load_manifest(p.string(), {"optim.lr=3.0000000000000004e-4"}, &test::builtin_registry());
    const fs::path r = write_manifest("dumped_odd.toml", dump_manifest(odd));
    CHECK(load_manifest(r.string(), {}, &test::builtin_registry()).optim.lr == odd.optim.lr);
  }

  // Issue 19.4: fairseq users write [checkpoint] keep_last / save_best; they were refused as an
  // unknown table. They are the [run] checkpoint_* keys under another name.
  TEST_CASE("[checkpoint] keep_last / save_best / interval are the [run] checkpoint_* keys") {
    const std::string m =
        std::string(kValid) + "\n[checkpoint]\nkeep_last = 5\nsave_best = \"bleu\"\ninterval = 7\n";
    const fs::path p = write_manifest("checkpoint_alias.toml", m);
    ExperimentSpec s = load_manifest(p.string(), {}, &test::builtin_registry());
    CHECK(s.run.checkpoint_keep_last == 5);
    CHECK(s.run.checkpoint_save_best == "bleu");
    CHECK(s.run.checkpoint_interval == 7);
    // The resolved manifest writes the canonical [run] keys and reads back the same.
    const std::string dump = dump_manifest(s);
    CHECK(dump.find("[checkpoint]") == std::string::npos);
    CHECK(dump.find("checkpoint_keep_last = 5") != std::string::npos);
    // --set of either spelling overrides the file's.
    CHECK(load_manifest(p.string(), {"checkpoint.keep_last=1"}, &test::builtin_registry())
              .run.checkpoint_keep_last == 1);
    CHECK(load_manifest(p.string(), {"run.checkpoint_keep_last=3"}, &test::builtin_registry())
              .run.checkpoint_keep_last == 3);
    CHECK(load_manifest(write_manifest("plain.toml", kValid).string(),
                        {"checkpoint.save_best=\"none\""}, &test::builtin_registry())
              .run.checkpoint_save_best == "none");
    // Values are checked as the [run] key's; both spellings in the file, or an unknown key, is an
    // error.
    CHECK(error_of(std::string(kValid) + "\n[checkpoint]\nsave_best = \"loss\"\n")
              .find("[run] checkpoint_save_best: expected one of") != std::string::npos);
    const std::string twice = error_of(
        std::string(kValid) + "\n[run]\ncheckpoint_keep_last = 2\n[checkpoint]\nkeep_last = 4\n");
    INFO(twice);
    CHECK(twice.find("m.toml:23:13: [checkpoint] keep_last and " + (scratch() / "m.toml").string() +
                     ":21:24 [run] checkpoint_keep_last "
                     "give the same setting twice") != std::string::npos);
    const std::string unknown = error_of(std::string(kValid) + "\n[checkpoint]\nkeep_best = 4\n");
    CHECK(unknown.find((scratch() / "m.toml").string() + ":") == 0);
    CHECK(unknown.find(
              "[checkpoint] unknown key 'keep_best' (known: keep_last, save_best, interval") !=
          std::string::npos);
    CHECK(check_manifest_key("checkpoint.keep_last").empty());
    CHECK(check_manifest_key("checkpoint.keep").find("[checkpoint] has no key 'keep'") !=
          std::string::npos);
  }

  TEST_CASE("docs/manifests.md's manifest reference is the generated one") {
    std::ifstream f(NORMLAB_TEST_SOURCE_DIR "/docs/manifests.md");
    std::stringstream ss;
    ss << f.rdbuf();
    const std::string readme = ss.str();
    const std::string begin = "<!-- manifest-reference:begin -->\n",
                      end = "<!-- manifest-reference:end -->";
    const auto b = readme.find(begin), e = readme.find(end);
    REQUIRE(b != std::string::npos);
    REQUIRE(e != std::string::npos);
    INFO("regenerate with: normlab manifest reference");
    CHECK(readme.substr(b + begin.size(), e - b - begin.size()) == manifest_reference_markdown());
  }

  TEST_CASE(
      "data.dataset: the task and files come from the named dataset, checked when the manifest "
      "loads") {
    const std::string named = with("task = \"copy\"", "dataset = \"multi30k\"\npair = \"de-en\"");
    const ExperimentSpec spec =
        load_manifest(write_manifest("named.toml", named).string(), {}, &test::builtin_registry());
    CHECK(spec.data.task == "translation");
    CHECK(spec.data.train_src.empty());  // filled when the data is loaded (fetched on first use)
    // The resolved manifest (what the run directory keeps) reads back.
    const ExperimentSpec again =
        load_manifest(write_manifest("named_dump.toml", dump_manifest(spec)).string(), {},
                      &test::builtin_registry());
    CHECK(again.data.dataset == "multi30k");
    CHECK(again.data.pair == "de-en");
    CHECK(error_of(with("task = \"copy\"", "dataset = \"multi31k\""))
              .find("[data] dataset: dataset 'multi31k': unknown") != std::string::npos);
    CHECK(error_of(with("task = \"copy\"", "dataset = \"multi30k\"\npair = \"fr-en\""))
              .find("[data] pair: dataset \"multi30k\" has en-de or de-en") != std::string::npos);
    CHECK(error_of(with("task = \"copy\"", "dataset = \"multi30k\"\ntask = \"lm\""))
              .find("is a translation dataset") != std::string::npos);
    CHECK(error_of(with("task = \"copy\"", "dataset = \"multi30k\"\ntrain_src = \"named.toml\""))
              .find("not with dataset") != std::string::npos);
  }

}  // TEST_SUITE

}  // namespace normlab_test_manifest
