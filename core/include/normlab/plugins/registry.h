// The plugin registry: finds scheme plugins, reads their metadata from the library file without
// loading it (no plugin code runs while scanning), checks the ABI, resolves parameters, and loads
// a plugin only when one of its schemes is created. Plugin folders and files must be owned by the
// current user or root and not be world-writable (see docs/design.md, "Plugin trust rules").
#pragma once

#include <filesystem>
#include <map>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

#include "normlab/plugins/scheme_handle.h"
#include "normlab/sdk/geometry.h"
#include "normlab/sdk/params.h"

namespace normlab {

// A one-line error about a plugin or a scheme name; names the file where there is one.
class PluginError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct ParamSpec {
  std::string name;
  ParamType type = ParamType::String;
  ParamValue default_value;
  std::vector<std::string> choices;  // strings: allowed values; empty = any
  double min_value = -1.0 / 0.0, max_value = 1.0 / 0.0;
  std::string help;
};

struct PluginInfo {
  std::string name, version, description, equation, torch_version;
  std::filesystem::path file;
  int abi_version = 0;
  bool cxx11_abi = true;
  std::vector<ParamSpec> params;

  const ParamSpec* param(const std::string& key) const;
};

class PluginRegistry {
 public:
  // Scans `paths` (directories or plugin files) first, then, with `use_default_paths`,
  // NORMLAB_PLUGIN_PATH and the built-in plugin directory.
  explicit PluginRegistry(const std::vector<std::filesystem::path>& paths = {},
                          bool use_default_paths = true);
  ~PluginRegistry();
  PluginRegistry(const PluginRegistry&) = delete;
  PluginRegistry& operator=(const PluginRegistry&) = delete;

  // NORMLAB_PLUGIN_PATH's absolute entries, then the built-in directory (build tree or install
  // prefix). Relative and empty entries are never used: they would depend on the working directory.
  static std::vector<std::filesystem::path> default_search_paths();
  // NORMLAB_PLUGIN_PATH's absolute entries alone.
  static std::vector<std::filesystem::path> environment_paths();

  // The environment variable `--allow-unsafe-plugin-path` sets (so sweep workers inherit it):
  // with "1", unsafe plugin folders and files are accepted with a warning on stderr.
  static constexpr const char* kAllowUnsafeEnv = "NORMLAB_ALLOW_UNSAFE_PLUGIN_PATH";

  // A plugin file that is refused (unsafe, unreadable metadata, wrong ABI…) throws PluginError;
  // inside a directory scan such a file is recorded in problems() and skipped.
  void add_path(const std::filesystem::path& path);

  std::vector<const PluginInfo*> plugins() const;  // sorted by name
  const std::vector<std::string>& problems() const { return problems_; }
  const std::vector<std::filesystem::path>& searched() const { return searched_; }

  // Throws PluginError for an unknown name (listing the known ones) or a name two files provide.
  const PluginInfo& info(const std::string& name) const;
  // Checks given parameters against the declared ones and fills defaults.
  ParamView resolve_params(const std::string& name,
                           const std::map<std::string, ParamValue>& given) const;
  // Loads the scheme's plugin on first use (a load failure or a throwing factory, std or not,
  // becomes a PluginError naming the file).
  SchemeHandle create(const std::string& name, const std::map<std::string, ParamValue>& given,
                      const ModelGeometry& geometry) const;
  // Whether the plugin providing `name` has been loaded (dlopen'ed) by this registry.
  bool is_loaded(const std::string& name) const;

 private:
  struct Entry;
  void scan_file(const std::filesystem::path& file);
  Entry& entry(const std::string& name) const;
  static void load(Entry& entry);
  std::vector<std::shared_ptr<Entry>> entries_;
  std::map<std::string, std::vector<std::shared_ptr<Entry>>> by_name_;
  std::vector<std::string> problems_;
  std::vector<std::filesystem::path> searched_;
  std::vector<std::string> refused_;  // "path (why)", for the unknown-scheme error
  std::vector<std::string> missing_;  // paths given that do not exist, for the same error
};

// "true" → Bool, "4000" → Int, "0.5" → Float, as `type` demands; throws std::invalid_argument.
ParamValue parse_param_text(ParamType type, const std::string& text);
std::string format_param_value(const ParamValue& v);

}  // namespace normlab
