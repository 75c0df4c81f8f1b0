// libFuzzer target: the manifest loader (core/src/manifest/manifest.cpp) on arbitrary bytes.
// Input: the manifest text, optionally followed by a line "#--set" and one override per line
// (what `--set` passes). Every input must either load or throw ManifestError; a loaded manifest's
// dump must load again to the same dump. Anything else — a crash, a sanitizer report, another
// exception type — is a finding. No plugin registry: the scheme name is not resolved (null).
#include <unistd.h>

#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <exception>
#include <filesystem>
#include <fstream>
#include <string>
#include <string_view>
#include <vector>

#include "normlab/manifest/experiment.h"
#include "normlab/plugins/registry.h"

namespace {

namespace fs = std::filesystem;

const fs::path& scratch_dir() {
  static const fs::path dir = [] {
    fs::path d =
        fs::temp_directory_path() / ("normlab_manifest_fuzz_" + std::to_string(::getpid()));
    fs::create_directories(d);
    return d;
  }();
  return dir;
}

void write(const fs::path& p, std::string_view text) {
  std::ofstream f(p, std::ios::binary | std::ios::trunc);
  f.write(text.data(), std::streamsize(text.size()));
}

[[noreturn]] void finding(const std::string& what) {
  std::fprintf(stderr, "manifest_fuzzer: %s\n", what.c_str());
  std::abort();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::vector<std::string> overrides;
  constexpr std::string_view kMarker = "\n#--set\n";
  if (const size_t at = input.find(kMarker); at != std::string_view::npos) {
    std::string_view rest = input.substr(at + kMarker.size());
    input = input.substr(0, at);
    while (!rest.empty()) {
      const size_t nl = rest.find('\n');
      overrides.emplace_back(rest.substr(0, nl));
      rest = nl == std::string_view::npos ? std::string_view() : rest.substr(nl + 1);
    }
  }
  const fs::path manifest = scratch_dir() / "m.toml";
  write(manifest, input);
  normlab::ExperimentSpec spec;
  try {
    spec = normlab::load_manifest(manifest.string(), overrides, nullptr);
  } catch (const normlab::ManifestError&) {
    return 0;  // bad input, reported as it should be
  } catch (const std::exception& e) {
    finding(std::string("not a ManifestError: ") + e.what());
  }
  // A valid manifest's resolved dump is itself a valid manifest describing the same experiment.
  const std::string dump = normlab::dump_manifest(spec);
  write(manifest, dump);  // the same path: the dump names its source
  try {
    const std::string dump2 =
        normlab::dump_manifest(normlab::load_manifest(manifest.string(), {}, nullptr));
    if (dump2 != dump) finding("the dump of the dump differs:\n" + dump + "\n----\n" + dump2);
  } catch (const std::exception& e) {
    finding(std::string("the dump does not load: ") + e.what() + "\n" + dump);
  }
  return 0;
}

// load_manifest reaches the registry only when given one; the fuzzer passes none, so these are
// never called (defined here so that the target links without the plugin loader and LibTorch).
namespace normlab {
const PluginInfo& PluginRegistry::info(const std::string&) const { finding("registry used"); }
ParamView PluginRegistry::resolve_params(const std::string&,
                                         const std::map<std::string, ParamValue>&) const {
  finding("registry used");
}
}  // namespace normlab
