// The plugin registry: finds scheme plugins, reads their metadata without calling scheme code,
// checks the ABI, resolves parameters and creates schemes by name.
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

  // NORMLAB_PLUGIN_PATH entries, then the built-in directory (build tree or install prefix).
  static std::vector<std::filesystem::path> default_search_paths();

  // A plugin file that fails to load throws PluginError; inside a directory scan such a file
  // is recorded in problems() and skipped.
  void add_path(const std::filesystem::path& path);

  std::vector<const PluginInfo*> plugins() const;  // sorted by name
  const std::vector<std::string>& problems() const { return problems_; }
  const std::vector<std::filesystem::path>& searched() const { return searched_; }

  // Throws PluginError for an unknown name (listing the known ones) or a name two files provide.
  const PluginInfo& info(const std::string& name) const;
  // Checks given parameters against the declared ones and fills defaults.
  ParamView resolve_params(const std::string& name,
                           const std::map<std::string, ParamValue>& given) const;
  SchemeHandle create(const std::string& name, const std::map<std::string, ParamValue>& given,
                      const ModelGeometry& geometry) const;

 private:
  struct Entry;
  void load_file(const std::filesystem::path& file);
  std::vector<std::shared_ptr<Entry>> entries_;
  std::map<std::string, std::vector<std::shared_ptr<Entry>>> by_name_;
  std::vector<std::string> problems_;
  std::vector<std::filesystem::path> searched_;
};

// "true" → Bool, "4000" → Int, "0.5" → Float, as `type` demands; throws std::invalid_argument.
ParamValue parse_param_text(ParamType type, const std::string& text);
std::string format_param_value(const ParamValue& v);

}  // namespace normlab
