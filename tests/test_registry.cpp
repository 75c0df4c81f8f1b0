// Registry errors with real broken plugin files built by the test suite.
#include <filesystem>
#include <fstream>

#include "test_support.h"

using namespace normlab;
namespace fs = std::filesystem;

namespace {

std::string error_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const PluginError& e) {
    return e.what();
  }
  return "";
}

bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

fs::path bad_plugin(const std::string& name) {
  return fs::path(NORMLAB_TEST_BAD_PLUGIN_DIR) / name / ("normlab_" + name + ".so");
}

fs::path temp_dir(const std::string& name) {
  fs::path d = fs::temp_directory_path() / ("normlab_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  return d;
}

}  // namespace

TEST_SUITE("registry") {

TEST_CASE("the ten built-in schemes are found with their metadata") {
  auto& reg = test::builtin_registry();
  CHECK(reg.problems().empty());
  std::vector<std::string> names;
  for (const auto* p : reg.plugins()) names.push_back(p->name);
  CHECK(names == std::vector<std::string>{"admin", "b2t", "branchnorm", "deepnorm", "ds-init", "post-ln",
                                          "post-ln-init", "pre-ln", "rezero", "sandwich-ln"});
  const auto& bn = reg.info("branchnorm");
  CHECK(bn.abi_version == NORMLAB_ABI_VERSION);
  CHECK(contains(bn.equation, "alpha_t"));
  REQUIRE(bn.param("T") != nullptr);
  CHECK(bn.param("T")->default_value.i == 4000);
}

TEST_CASE("unknown scheme lists the known ones") {
  auto msg = error_of([] { test::builtin_registry().info("post_ln"); });
  CHECK(contains(msg, "unknown scheme 'post_ln'"));
  CHECK(contains(msg, "known: admin, b2t, branchnorm, deepnorm, ds-init, post-ln, post-ln-init, pre-ln, rezero, sandwich-ln"));
}

TEST_CASE("two plugins with one name: an error naming both files") {
  fs::path a = temp_dir("dup_a"), b = temp_dir("dup_b");
  fs::path src = fs::path(NORMLAB_TEST_PLUGIN_DIR) / "normlab_post_ln.so";
  fs::copy_file(src, a / "normlab_post_ln.so");
  fs::copy_file(src, b / "normlab_post_ln_copy.so");
  PluginRegistry reg({a, b}, false);
  auto msg = error_of([&] { reg.info("post-ln"); });
  CHECK(contains(msg, "provided by two plugins"));
  CHECK(contains(msg, (a / "normlab_post_ln.so").string()));
  CHECK(contains(msg, (b / "normlab_post_ln_copy.so").string()));
  REQUIRE(reg.problems().size() == 1);
  // Scanning one directory twice is not a duplicate.
  PluginRegistry same({a, a}, false);
  CHECK(same.problems().empty());
  fs::remove_all(a);
  fs::remove_all(b);
}

TEST_CASE("ABI mismatch names both numbers") {
  auto msg = error_of([] { PluginRegistry reg({bad_plugin("wrong_abi")}, false); });
  CHECK(contains(msg, bad_plugin("wrong_abi").string()));
  CHECK(contains(msg, "ABI 999"));
  CHECK(contains(msg, "ABI " + std::to_string(NORMLAB_ABI_VERSION)));
  // In a directory scan the same file is a recorded problem, not a failure of the scan.
  PluginRegistry scan({bad_plugin("wrong_abi").parent_path(), NORMLAB_TEST_PLUGIN_DIR}, false);
  REQUIRE(scan.problems().size() == 1);
  CHECK(contains(scan.problems()[0], "ABI 999"));
  CHECK(scan.plugins().size() == 10);
}

TEST_CASE("a plugin built against another LibTorch names both versions") {
  auto msg = error_of([] { PluginRegistry reg({bad_plugin("wrong_torch")}, false); });
  CHECK(contains(msg, bad_plugin("wrong_torch").string()));
  CHECK(contains(msg, "built against LibTorch 0.9.0, but this normlab uses LibTorch " TORCH_VERSION));
}

TEST_CASE("a text file named .so is not a loadable library") {
  fs::path d = temp_dir("text");
  std::ofstream(d / "normlab_fake.so") << "this is not ELF\n";
  auto msg = error_of([&] { PluginRegistry reg({d / "normlab_fake.so"}, false); });
  CHECK(contains(msg, (d / "normlab_fake.so").string()));
  CHECK(contains(msg, "not a loadable library"));
  fs::remove_all(d);
}

TEST_CASE("a library without the entry points") {
  auto msg = error_of([] { PluginRegistry reg({bad_plugin("no_entry_point")}, false); });
  CHECK(contains(msg, bad_plugin("no_entry_point").string()));
  CHECK(contains(msg, "missing entry point(s) normlab_abi_version, normlab_plugin_info, normlab_create_scheme"));
}

TEST_CASE("a factory that throws") {
  PluginRegistry reg({bad_plugin("throwing_factory")}, false);
  auto msg = error_of([&] { reg.create("throwing", {}, ModelGeometry{}); });
  CHECK(contains(msg, bad_plugin("throwing_factory").string()));
  CHECK(contains(msg, "could not be created: this scheme refuses to be built"));
}

TEST_CASE("a missing plugin path is reported") {
  PluginRegistry reg({"/nonexistent/normlab/plugins"}, false);
  REQUIRE(reg.problems().size() == 1);
  CHECK(contains(reg.problems()[0], "/nonexistent/normlab/plugins: does not exist"));
}

TEST_CASE("scheme parameters: unknown, mistyped, out of range, not a choice") {
  auto& reg = test::builtin_registry();
  auto err = [&](const std::string& scheme, const std::string& key, ParamValue v) {
    return error_of([&] { reg.resolve_params(scheme, {{key, v}}); });
  };
  auto m = err("branchnorm", "TT", ParamValue::of_int(3));
  CHECK(contains(m, "scheme 'branchnorm' has no parameter 'TT' (known: schedule, T, k, alpha_min)"));
  m = err("branchnorm", "T", ParamValue::of_string("4000"));
  CHECK(contains(m, "scheme 'branchnorm' parameter 'T': expected int, got string \"4000\""));
  m = err("branchnorm", "T", ParamValue::of_int(0));
  CHECK(contains(m, "scheme 'branchnorm' parameter 'T': expected a value in [1, inf], got 0"));
  m = err("branchnorm", "schedule", ParamValue::of_string("cosine"));
  CHECK(contains(m, "expected one of linear | exp | sigmoid, got \"cosine\""));
  m = err("deepnorm", "torchscale_compat", ParamValue::of_int(1));
  CHECK(contains(m, "expected bool, got int 1"));
  // An int where a float is declared is accepted; defaults are filled.
  auto view = reg.resolve_params("branchnorm", {{"k", ParamValue::of_int(3)}});
  CHECK(view.number("k") == 3.0);
  CHECK(view.integer("T") == 4000);
  CHECK(view.text("schedule") == "linear");
  CHECK_THROWS_WITH_AS(view.flag("T"), "scheme 'branchnorm': parameter 'T' is int, read as bool",
                       std::invalid_argument);
}

TEST_CASE("a scheme keeps its plugin loaded after the registry is gone") {
  TransformerModel model{nullptr};
  {
    PluginRegistry reg({NORMLAB_TEST_PLUGIN_DIR}, false);
    model = TransformerModel(test::small_config(Arch::LM, 0, 2),
                             reg.create("deepnorm", {}, test::small_config(Arch::LM, 0, 2).geometry()));
  }
  auto out = model->forward_lm(torch::randint(1, 50, {2, 5}, torch::kLong));
  CHECK(out.sizes() == torch::IntArrayRef({2, 5, 50}));
}

}  // TEST_SUITE
