// Registry errors with real broken plugin files built by the test suite.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>
#include <sstream>

#include "commands/commands.h"
#include "test_support.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_registry {

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

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

fs::path bad_plugin(const std::string& name) {
  return fs::path(NORMLAB_TEST_BAD_PLUGIN_DIR) / name / ("normlab_" + name + ".so");
}

fs::path temp_dir(const std::string& name) {
  fs::path d =
      fs::temp_directory_path() / ("normlab_test_" + name + "_" + std::to_string(::getpid()));
  fs::remove_all(d);
  fs::create_directories(d);
  fs::permissions(d, fs::perms(0755));
  return d;
}

std::vector<std::string> names_of(const PluginRegistry& reg) {
  std::vector<std::string> out;
  for (const auto* p : reg.plugins()) out.push_back(p->name);
  return out;
}

bool has(const std::vector<std::string>& v, const std::string& x) {
  return std::find(v.begin(), v.end(), x) != v.end();
}

// Sets an environment variable for one scope (the fixtures' trace file, the unsafe override).
struct ScopedEnv {
  std::string name;
  std::optional<std::string> old;
  ScopedEnv(std::string n, const std::string& value) : name(std::move(n)) {
    if (const char* v = std::getenv(name.c_str())) old = v;
    ::setenv(name.c_str(), value.c_str(), 1);
  }
  ~ScopedEnv() { old ? ::setenv(name.c_str(), old->c_str(), 1) : ::unsetenv(name.c_str()); }
};

std::string read_text(const fs::path& p) {
  std::ifstream in(p);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

TEST_SUITE("registry") {
  TEST_CASE("the 22 built-in schemes are found with their metadata") {
    auto& reg = test::builtin_registry();
    CHECK(reg.problems().empty());
    std::vector<std::string> names;
    for (const auto* p : reg.plugins()) names.push_back(p->name);
    // One scheme per folder of plugins/ (tests/CMakeLists.txt), nothing missing, nothing else.
    CHECK(fmt::format("{}", fmt::join(names, ", ")) == NORMLAB_TEST_SCHEMES);
    CHECK(names.size() >= 22);
    const auto& bn = reg.info("branchnorm");
    CHECK(bn.abi_version == NORMLAB_ABI_VERSION);
    CHECK(contains(bn.equation, "alpha_t"));
    REQUIRE(bn.param("T") != nullptr);
    CHECK(bn.param("T")->default_value.i == 4000);
  }

  TEST_CASE("unknown scheme lists the known ones") {
    auto msg = error_of([] { test::builtin_registry().info("post_ln"); });
    CHECK(contains(msg, "unknown scheme 'post_ln'"));
    CHECK(contains(msg, std::string("known: ") + NORMLAB_TEST_SCHEMES));
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
    CHECK(scan.plugins().size() == test::builtin_registry().plugins().size());
  }

  TEST_CASE("a plugin built against another LibTorch names both versions") {
    auto msg = error_of([] { PluginRegistry reg({bad_plugin("wrong_torch")}, false); });
    CHECK(contains(msg, bad_plugin("wrong_torch").string()));
    CHECK(contains(msg,
                   "built against LibTorch 0.9.0, but this normlab uses LibTorch " TORCH_VERSION));
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
    CHECK(contains(msg, "not a normlab plugin (no .normlab_plugin metadata section)"));
  }

  TEST_CASE("a plugin built by the previous SDK is told to rebuild") {
    auto msg = error_of([] { PluginRegistry reg({bad_plugin("old_sdk")}, false); });
    CHECK(contains(msg, bad_plugin("old_sdk").string()));
    CHECK(contains(msg, "built for an older normlab SDK"));
    CHECK(contains(msg, "rebuild"));
  }

  TEST_CASE("scanning runs no plugin code; a command loads only the plugin it uses") {
    fs::path d = temp_dir("trace");
    ScopedEnv trace("NORMLAB_TEST_PLUGIN_TRACE", (d / "trace.txt").string());
    PluginRegistry reg({bad_plugin("init_marker").parent_path(), NORMLAB_TEST_PLUGIN_DIR}, false);
    CHECK(reg.problems().empty());
    const auto names = names_of(reg);
    CHECK(names.size() == test::builtin_registry().plugins().size() + 1);  // + init-marker
    CHECK(has(names, "init-marker"));
    CHECK(reg.info("init-marker").version == "1.0.0");
    CHECK_FALSE(fs::exists(d / "trace.txt"));
    std::ostringstream out, err;
    CHECK(plugins_list(reg, out, err) == 0);
    CHECK(contains(out.str(), "init-marker"));
    CHECK_FALSE(fs::exists(d / "trace.txt"));
    for (const auto& n : names) CHECK_FALSE(reg.is_loaded(n));

    const auto g = test::small_config(Arch::LM, 0, 2).geometry();
    reg.create("deepnorm", {}, g);
    CHECK(reg.is_loaded("deepnorm"));
    CHECK_FALSE(reg.is_loaded("init-marker"));
    CHECK_FALSE(reg.is_loaded("branchnorm"));
    CHECK_FALSE(fs::exists(d / "trace.txt"));
    // The fixture does leave its trace once its scheme is used.
    reg.create("init-marker", {}, g);
    CHECK(reg.is_loaded("init-marker"));
    CHECK(contains(read_text(d / "trace.txt"), "init_marker: static initializer ran"));
    fs::remove_all(d);
  }

  TEST_CASE("a wrong-ABI plugin is refused before its initializer runs") {
    fs::path d = temp_dir("abi_trace");
    ScopedEnv trace("NORMLAB_TEST_PLUGIN_TRACE", (d / "trace.txt").string());
    auto msg = error_of([] { PluginRegistry reg({bad_plugin("wrong_abi_init")}, false); });
    CHECK(contains(msg, bad_plugin("wrong_abi_init").string()));
    CHECK(contains(msg, "built for normlab plugin ABI 999, but this normlab has ABI " +
                            std::to_string(NORMLAB_ABI_VERSION)));
    PluginRegistry scan({bad_plugin("wrong_abi_init").parent_path()}, false);
    REQUIRE(scan.problems().size() == 1);
    CHECK(scan.plugins().empty());
    CHECK_FALSE(fs::exists(d / "trace.txt"));
    fs::remove_all(d);
  }

  TEST_CASE(
      "plugins that throw 42 (no std::exception): listing shows everyone, each use is one error") {
    PluginRegistry reg({bad_plugin("throws_42").parent_path(),
                        bad_plugin("init_throws").parent_path(), NORMLAB_TEST_PLUGIN_DIR},
                       false);
    CHECK(reg.problems().empty());
    std::ostringstream out, err;
    CHECK(plugins_list(reg, out, err) == 0);
    CHECK(contains(out.str(), "throws-42"));
    CHECK(contains(out.str(), "init-throws"));
    CHECK(contains(out.str(), "deepnorm"));
    CHECK(names_of(reg).size() == test::builtin_registry().plugins().size() + 2);

    const auto g = test::small_config(Arch::LM, 0, 2).geometry();
    auto msg = error_of([&] { reg.create("throws-42", {}, g); });
    CHECK(contains(msg, bad_plugin("throws_42").string()));
    CHECK(contains(msg,
                   "scheme 'throws-42' could not be created (it threw something that is not a "
                   "std::exception)"));
    CHECK(msg.find('\n') == std::string::npos);

    PluginShowOptions show;
    show.name = "throws-42";
    show.params = {{"fail", "derive"}};
    std::ostringstream shown;
    msg = error_of([&] { plugins_show(reg, show, shown); });
    CHECK(contains(msg, bad_plugin("throws_42").string()));
    CHECK(contains(msg, "derive() threw something that is not a std::exception"));
    // The others are unaffected.
    CHECK(reg.create("pre-ln", {}, g).scheme != nullptr);
  }

  TEST_CASE("world-writable plugin folders and files are refused; the override warns and accepts") {
    fs::path d = temp_dir("world_writable");
    fs::copy_file(fs::path(NORMLAB_TEST_PLUGIN_DIR) / "normlab_post_ln.so",
                  d / "normlab_post_ln.so");
    fs::permissions(d, fs::perms(0777));
    {
      PluginRegistry reg({d}, false);
      REQUIRE(reg.problems().size() == 1);
      CHECK(contains(reg.problems()[0], "plugin folder " + d.string() +
                                            ": refused, it is world-writable (mode 0777)"));
      CHECK(contains(reg.problems()[0], "--allow-unsafe-plugin-path"));
      CHECK(reg.plugins().empty());
      auto msg = error_of([&] { reg.info("post-ln"); });
      CHECK(contains(msg, "refused: " + d.string() + " (unsafe folder)"));
    }
    {
      ScopedEnv allow(PluginRegistry::kAllowUnsafeEnv, "1");
      PluginRegistry reg({d}, false);
      CHECK(reg.problems().empty());
      CHECK(names_of(reg) == std::vector<std::string>{"post-ln"});
    }
    // A world-writable file in a safe folder.
    fs::permissions(d, fs::perms(0755));
    fs::permissions(d / "normlab_post_ln.so", fs::perms(0666));
    auto msg = error_of([&] { PluginRegistry reg({d / "normlab_post_ln.so"}, false); });
    CHECK(contains(msg, "plugin " + (d / "normlab_post_ln.so").string() +
                            ": refused, it is world-writable (mode 0666)"));
    fs::remove_all(d);
  }

  TEST_CASE("a symlink to a plugin file owned by another user is refused") {
    fs::path d = temp_dir("symlink"), foreign = temp_dir("foreign");
    fs::copy_file(fs::path(NORMLAB_TEST_PLUGIN_DIR) / "normlab_post_ln.so",
                  foreign / "normlab_post_ln.so");
    const passwd* nobody = ::getpwnam("nobody");
    if (::geteuid() != 0 || !nobody ||
        ::chown((foreign / "normlab_post_ln.so").c_str(), nobody->pw_uid, nobody->pw_gid) != 0) {
      MESSAGE("skipped: cannot chown a file to nobody here");
      fs::remove_all(d);
      fs::remove_all(foreign);
      return;
    }
    fs::create_symlink(foreign / "normlab_post_ln.so", d / "normlab_post_ln.so");
    PluginRegistry reg({d}, false);
    REQUIRE(reg.problems().size() == 1);
    CHECK(contains(reg.problems()[0], "plugin " + (d / "normlab_post_ln.so").string() +
                                          ": refused, it is a symlink to " +
                                          (foreign / "normlab_post_ln.so").string() +
                                          ", which is owned by nobody"));
    CHECK(reg.plugins().empty());
    auto msg = error_of([&] { PluginRegistry one({d / "normlab_post_ln.so"}, false); });
    CHECK(contains(msg, "owned by nobody"));
    fs::remove_all(d);
    fs::remove_all(foreign);
  }

  TEST_CASE("NORMLAB_PLUGIN_PATH never makes the working directory a plugin folder") {
    fs::path d = temp_dir("cwd");
    fs::create_directories(d / "plugins");
    fs::copy_file(fs::path(NORMLAB_TEST_PLUGIN_DIR) / "normlab_post_ln.so",
                  d / "plugins" / "normlab_planted.so");
    fs::copy_file(fs::path(NORMLAB_TEST_PLUGIN_DIR) / "normlab_post_ln.so",
                  d / "normlab_planted.so");
    const fs::path old_cwd = fs::current_path();
    fs::current_path(d);
    ScopedEnv env("NORMLAB_PLUGIN_PATH", "plugins::.:");
    PluginRegistry reg({}, true);
    fs::current_path(old_cwd);
    for (const auto* p : reg.plugins()) CHECK_FALSE(contains(p->file.string(), "normlab_planted"));
    bool warned = false;
    for (const auto& p : reg.problems()) {
      CHECK_FALSE(contains(p, "provided by two plugins"));
      warned = warned || contains(p, "NORMLAB_PLUGIN_PATH entry 'plugins' ignored");
    }
    CHECK(warned);
    for (const auto& p : PluginRegistry::default_search_paths()) CHECK(p.is_absolute());
    fs::remove_all(d);
  }

  TEST_CASE("a damaged metadata section is one error, not a crash") {
    fs::path d = temp_dir("damaged");
    std::string bytes = read_text(fs::path(NORMLAB_TEST_PLUGIN_DIR) / "normlab_branchnorm.so");
    const auto at = bytes.find("NLPLUGIN");
    REQUIRE(at != std::string::npos);
    std::string damaged_size = bytes, damaged_params = bytes;
    damaged_size[at + 12] = char(0xff);    // total_size
    damaged_params[at + 20] = char(0x7f);  // num_params
    std::ofstream(d / "a.so", std::ios::binary) << damaged_size;
    std::ofstream(d / "b.so", std::ios::binary) << damaged_params;
    for (const char* f : {"a.so", "b.so"}) {
      auto msg = error_of([&] { PluginRegistry reg({d / f}, false); });
      CHECK(contains(msg, (d / f).string()));
      CHECK(contains(msg, "damaged metadata section .normlab_plugin"));
    }
    fs::remove_all(d);
  }

  TEST_CASE("a factory that throws") {
    PluginRegistry reg({bad_plugin("throwing_factory")}, false);
    auto msg = error_of([&] { reg.create("throwing", {}, ModelGeometry{}); });
    CHECK(contains(msg, bad_plugin("throwing_factory").string()));
    CHECK(contains(msg, "could not be created: this scheme refuses to be built"));
  }

  TEST_CASE("a FIFO named .so is refused without blocking") {
    fs::path d = temp_dir("fifo");
    REQUIRE(::mkfifo((d / "normlab_fifo.so").c_str(), 0600) == 0);
    auto msg = error_of([&] { PluginRegistry reg({d / "normlab_fifo.so"}, false); });
    CHECK(contains(msg, (d / "normlab_fifo.so").string() + ": not a regular file"));
    fs::remove_all(d);
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
    CHECK(contains(m,
                   "scheme 'branchnorm' has no parameter 'TT' (known: schedule, T, k, alpha_min)"));
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
      model = TransformerModel(
          test::small_config(Arch::LM, 0, 2),
          reg.create("deepnorm", {}, test::small_config(Arch::LM, 0, 2).geometry()));
    }
    auto out = model->forward_lm(torch::randint(1, 50, {2, 5}, torch::kLong));
    CHECK(out.sizes() == torch::IntArrayRef({2, 5, 50}));
  }

}  // TEST_SUITE

}  // namespace normlab_test_registry
