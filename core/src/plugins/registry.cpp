#include "normlab/plugins/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <boost/dll/library_info.hpp>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cstdlib>
#include <sstream>

#include "normlab/sdk/plugin.h"

#ifndef NORMLAB_BUILD_LIBDIR
#define NORMLAB_BUILD_LIBDIR ""
#define NORMLAB_BUILD_PLUGIN_DIR ""
#endif

namespace fs = std::filesystem;

namespace normlab {

struct PluginRegistry::Entry {
  PluginInfo info;
  std::shared_ptr<boost::dll::shared_library> lib;
  SchemeFactory* factory = nullptr;
};

namespace {

constexpr const char* kAbiSymbol = "normlab_abi_version";
constexpr const char* kInfoSymbol = "normlab_plugin_info";
constexpr const char* kFactorySymbol = "normlab_create_scheme";

bool is_plugin_candidate(const fs::path& p) {
  return p.extension() == ".so" && fs::is_regular_file(p);
}

ParamType parse_type(const std::string& t, const fs::path& file, const std::string& key) {
  if (t == "bool") return ParamType::Bool;
  if (t == "int") return ParamType::Int;
  if (t == "float") return ParamType::Float;
  if (t == "string") return ParamType::String;
  throw PluginError(fmt::format("plugin {}: parameter '{}' has unknown type '{}'", file.string(), key, t));
}

std::vector<std::string> split_choices(const char* c) {
  std::vector<std::string> out;
  if (!c || !*c) return out;
  std::stringstream ss(c);
  std::string item;
  while (std::getline(ss, item, '|')) out.push_back(item);
  return out;
}

// Host build-tree detection: the library's own location tells build tree from install prefix.
fs::path builtin_plugin_dir() {
  boost::system::error_code ec;
  fs::path self = boost::dll::this_line_location(ec).string();
  if (ec) return {};
  fs::path libdir = self.parent_path().lexically_normal();
  std::error_code fec;
  if (*NORMLAB_BUILD_LIBDIR && fs::equivalent(libdir, NORMLAB_BUILD_LIBDIR, fec))
    return NORMLAB_BUILD_PLUGIN_DIR;
  return libdir / "normlab" / "plugins";
}

}  // namespace

const ParamSpec* PluginInfo::param(const std::string& key) const {
  for (const auto& p : params)
    if (p.name == key) return &p;
  return nullptr;
}

ParamValue parse_param_text(ParamType type, const std::string& text) {
  auto fail = [&]() -> ParamValue {
    throw std::invalid_argument(fmt::format("'{}' is not a valid {}", text, to_string(type)));
  };
  switch (type) {
    case ParamType::Bool:
      if (text == "true") return ParamValue::of_bool(true);
      if (text == "false") return ParamValue::of_bool(false);
      return fail();
    case ParamType::Int: {
      size_t pos = 0;
      try {
        long long v = std::stoll(text, &pos);
        if (pos == text.size()) return ParamValue::of_int(v);
      } catch (const std::exception&) {
      }
      return fail();
    }
    case ParamType::Float: {
      size_t pos = 0;
      try {
        double v = std::stod(text, &pos);
        if (pos == text.size()) return ParamValue::of_float(v);
      } catch (const std::exception&) {
      }
      return fail();
    }
    case ParamType::String:
      return ParamValue::of_string(text);
  }
  return fail();
}

std::string format_param_value(const ParamValue& v) {
  switch (v.type) {
    case ParamType::Bool: return v.b ? "true" : "false";
    case ParamType::Int: return std::to_string(v.i);
    case ParamType::Float: return fmt::format("{:g}", v.f);
    case ParamType::String: return "\"" + v.s + "\"";
  }
  return "?";
}

PluginRegistry::PluginRegistry(const std::vector<fs::path>& paths, bool use_default_paths) {
  for (const auto& p : paths) add_path(p);
  if (use_default_paths)
    for (const auto& p : default_search_paths()) add_path(p);
}

PluginRegistry::~PluginRegistry() = default;

std::vector<fs::path> PluginRegistry::default_search_paths() {
  std::vector<fs::path> out;
  if (const char* env = std::getenv("NORMLAB_PLUGIN_PATH")) {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ':'))
      if (!item.empty()) out.emplace_back(item);
  }
  fs::path builtin = builtin_plugin_dir();
  if (!builtin.empty()) out.push_back(builtin);
  return out;
}

void PluginRegistry::add_path(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    searched_.push_back(path);
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (is_plugin_candidate(e.path())) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      try {
        load_file(f);
      } catch (const PluginError& err) {
        problems_.push_back(err.what());
      }
    }
    return;
  }
  if (!fs::exists(path, ec)) {
    // A missing default directory is normal (nothing installed there); a missing explicit
    // file is not, but both reach here: report, never crash.
    problems_.push_back(fmt::format("plugin path {}: does not exist", path.string()));
    return;
  }
  searched_.push_back(path);
  load_file(path);
}

void PluginRegistry::load_file(const fs::path& file) {
  const fs::path canonical = fs::weakly_canonical(file);
  for (const auto& e : entries_)
    if (fs::weakly_canonical(e->info.file) == canonical) return;  // the same file seen twice

  // Entry points first, from the symbol table alone: nothing in the file runs yet.
  std::vector<std::string> symbols;
  try {
    boost::dll::library_info li(boost::dll::fs::path(file.string()), /*throw_if_not_native=*/true);
    symbols = li.symbols();
  } catch (const std::exception& e) {
    throw PluginError(fmt::format("plugin {}: not a loadable library ({})", file.string(), e.what()));
  }
  std::vector<std::string> missing;
  for (const char* s : {kAbiSymbol, kInfoSymbol, kFactorySymbol})
    if (std::find(symbols.begin(), symbols.end(), s) == symbols.end()) missing.emplace_back(s);
  if (!missing.empty())
    throw PluginError(fmt::format("plugin {}: not a normlab plugin, missing entry point(s) {}",
                                  file.string(), fmt::join(missing, ", ")));

  auto entry = std::make_shared<Entry>();
  try {
    entry->lib = std::make_shared<boost::dll::shared_library>(
        boost::dll::fs::path(file.string()), boost::dll::load_mode::rtld_now);
  } catch (const std::exception& e) {
    throw PluginError(fmt::format("plugin {}: cannot be loaded ({})", file.string(), e.what()));
  }
  // Version negotiation before anything else is read.
  const int abi = entry->lib->get_alias<const int>(kAbiSymbol);
  if (abi != NORMLAB_ABI_VERSION)
    throw PluginError(fmt::format(
        "plugin {}: built for normlab plugin ABI {}, but this normlab has ABI {}; rebuild the plugin",
        file.string(), abi, NORMLAB_ABI_VERSION));
  const normlab_plugin_info& raw = entry->lib->get_alias<const normlab_plugin_info>(kInfoSymbol);
  if (raw.cxx11_abi != _GLIBCXX_USE_CXX11_ABI)
    throw PluginError(fmt::format("plugin {}: built with _GLIBCXX_USE_CXX11_ABI={}, normlab with {}",
                                  file.string(), raw.cxx11_abi, _GLIBCXX_USE_CXX11_ABI));
  // Major.minor must match: LibTorch's C++ API and ABI change between minor versions.
  const std::string plugin_torch = raw.torch_version ? raw.torch_version : "";
  auto major_minor = [](const std::string& v) { return v.substr(0, v.find('.', v.find('.') + 1)); };
  if (major_minor(plugin_torch) != major_minor(TORCH_VERSION))
    throw PluginError(fmt::format("plugin {}: built against LibTorch {}, but this normlab uses LibTorch {}; rebuild the plugin",
                                  file.string(), plugin_torch.empty() ? "(unknown)" : plugin_torch, TORCH_VERSION));
  PluginInfo& info = entry->info;
  auto str = [](const char* s) { return std::string(s ? s : ""); };
  info.name = str(raw.name);
  if (info.name.empty())
    throw PluginError(fmt::format("plugin {}: metadata has an empty scheme name", file.string()));
  info.version = str(raw.version);
  info.description = str(raw.description);
  info.equation = str(raw.equation);
  info.torch_version = str(raw.torch_version);
  info.file = file;
  info.abi_version = abi;
  info.cxx11_abi = raw.cxx11_abi != 0;
  for (int i = 0; i < raw.num_params; ++i) {
    const normlab_param_info& p = raw.params[i];
    ParamSpec spec;
    spec.name = str(p.name);
    spec.type = parse_type(str(p.type), file, spec.name);
    try {
      spec.default_value = parse_param_text(spec.type, str(p.default_value));
    } catch (const std::exception& e) {
      throw PluginError(fmt::format("plugin {}: default of parameter '{}': {}", file.string(),
                                    spec.name, e.what()));
    }
    spec.choices = split_choices(p.choices);
    spec.min_value = p.min_value;
    spec.max_value = p.max_value;
    spec.help = str(p.help);
    info.params.push_back(std::move(spec));
  }
  entry->factory = &entry->lib->get_alias<SchemeFactory>(kFactorySymbol);
  entries_.push_back(entry);
  by_name_[info.name].push_back(entry);
  if (by_name_[info.name].size() == 2)
    problems_.push_back(fmt::format("scheme '{}' is provided by two plugins: {} and {}", info.name,
                                    by_name_[info.name][0]->info.file.string(), file.string()));
}

std::vector<const PluginInfo*> PluginRegistry::plugins() const {
  std::vector<const PluginInfo*> out;
  for (const auto& e : entries_) out.push_back(&e->info);
  std::stable_sort(out.begin(), out.end(),
                   [](const PluginInfo* a, const PluginInfo* b) { return a->name < b->name; });
  return out;
}

const PluginInfo& PluginRegistry::info(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) {
    std::vector<std::string> known;
    for (const auto& [n, _] : by_name_) known.push_back(n);
    std::string where;
    for (const auto& p : searched_) where += (where.empty() ? "" : ", ") + p.string();
    throw PluginError(fmt::format("unknown scheme '{}' (known: {}; searched: {})", name,
                                  known.empty() ? std::string("none") : fmt::format("{}", fmt::join(known, ", ")),
                                  where.empty() ? "nothing" : where));
  }
  if (it->second.size() > 1)
    throw PluginError(fmt::format("scheme '{}' is provided by two plugins: {} and {}", name,
                                  it->second[0]->info.file.string(),
                                  it->second[1]->info.file.string()));
  return it->second.front()->info;
}

ParamView PluginRegistry::resolve_params(const std::string& name,
                                         const std::map<std::string, ParamValue>& given) const {
  const PluginInfo& info = this->info(name);
  std::map<std::string, ParamValue> values;
  for (const auto& spec : info.params) values[spec.name] = spec.default_value;
  for (const auto& [key, v] : given) {
    const ParamSpec* spec = info.param(key);
    if (!spec) {
      std::vector<std::string> known;
      for (const auto& p : info.params) known.push_back(p.name);
      throw PluginError(fmt::format("scheme '{}' has no parameter '{}' (known: {})", name, key,
                                    known.empty() ? std::string("none") : fmt::format("{}", fmt::join(known, ", "))));
    }
    ParamValue value = v;
    const bool int_as_float = spec->type == ParamType::Float && v.type == ParamType::Int;
    if (int_as_float) value = ParamValue::of_float(double(v.i));
    if (value.type != spec->type)
      throw PluginError(fmt::format("scheme '{}' parameter '{}': expected {}, got {} {}", name, key,
                                    to_string(spec->type), to_string(v.type),
                                    format_param_value(v)));
    if (spec->type == ParamType::String && !spec->choices.empty() &&
        std::find(spec->choices.begin(), spec->choices.end(), value.s) == spec->choices.end())
      throw PluginError(fmt::format("scheme '{}' parameter '{}': expected one of {}, got \"{}\"",
                                    name, key, fmt::join(spec->choices, " | "), value.s));
    if (spec->type == ParamType::Int || spec->type == ParamType::Float) {
      const double x = spec->type == ParamType::Int ? double(value.i) : value.f;
      if (!(x >= spec->min_value && x <= spec->max_value))
        throw PluginError(fmt::format("scheme '{}' parameter '{}': expected a value in [{:g}, {:g}], got {:g}",
                                      name, key, spec->min_value, spec->max_value, x));
    }
    values[key] = value;
  }
  return ParamView(name, std::move(values));
}

SchemeHandle PluginRegistry::create(const std::string& name,
                                    const std::map<std::string, ParamValue>& given,
                                    const ModelGeometry& geometry) const {
  ParamView params = resolve_params(name, given);
  const auto& entry = by_name_.at(name).front();
  Scheme* raw = nullptr;
  try {
    raw = (*entry->factory)(params, geometry);
  } catch (const std::exception& e) {
    throw PluginError(fmt::format("plugin {}: scheme '{}' could not be created: {}",
                                  entry->info.file.string(), name, e.what()));
  } catch (...) {
    throw PluginError(fmt::format("plugin {}: scheme '{}' could not be created (unknown exception)",
                                  entry->info.file.string(), name));
  }
  if (!raw)
    throw PluginError(fmt::format("plugin {}: scheme '{}' factory returned nothing",
                                  entry->info.file.string(), name));
  // The deleter keeps the library loaded for as long as the scheme lives.
  auto lib = entry->lib;
  SchemeHandle h;
  h.scheme = std::shared_ptr<Scheme>(raw, [lib](Scheme* s) { delete s; });
  h.name = name;
  h.file = entry->info.file.string();
  return h;
}

}  // namespace normlab
