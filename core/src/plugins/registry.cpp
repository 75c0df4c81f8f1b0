#include "normlab/plugins/registry.h"

#include <fmt/format.h>
#include <fmt/ranges.h>
#include <pwd.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <boost/dll/runtime_symbol_info.hpp>
#include <boost/dll/shared_library.hpp>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>

#include "elf_section.h"
#include "normlab/sdk/plugin.h"

#ifndef NORMLAB_BUILD_LIBDIR
#define NORMLAB_BUILD_LIBDIR ""
#define NORMLAB_BUILD_PLUGIN_DIR ""
#endif

namespace fs = std::filesystem;

namespace normlab {

// What a plugin file was when it was scanned: loading refuses a file replaced since.
struct FileIdentity {
  dev_t dev = 0;
  ino_t ino = 0;
  off_t size = 0;
  std::int64_t mtime_ns = 0;
  bool operator==(const FileIdentity& o) const {
    return dev == o.dev && ino == o.ino && size == o.size && mtime_ns == o.mtime_ns;
  }
};

struct PluginRegistry::Entry {
  PluginInfo info;
  FileIdentity identity;
  std::mutex load_mutex;
  std::shared_ptr<boost::dll::shared_library> lib;  // loaded by the first create()
  SchemeFactory* factory = nullptr;
};

namespace {

constexpr const char* kFactorySymbol = "normlab_create_scheme";
constexpr const char* kOldSdkSymbol = "normlab_plugin_info";  // ABI 1 kept its metadata here
constexpr std::size_t kMaxMetadataBytes = 1 << 20;
constexpr std::uint32_t kMaxParams = 10000;

FileIdentity identity_of(const fs::path& file) {
  struct stat st {};
  FileIdentity id;
  if (::stat(file.c_str(), &st) != 0) return id;
  id.dev = st.st_dev;
  id.ino = st.st_ino;
  id.size = st.st_size;
  id.mtime_ns = std::int64_t(st.st_mtim.tv_sec) * 1000000000 + st.st_mtim.tv_nsec;
  return id;
}

bool unsafe_paths_allowed() {
  const char* v = std::getenv(PluginRegistry::kAllowUnsafeEnv);
  return v && std::strcmp(v, "1") == 0;
}

std::string user_text(uid_t uid) {
  const passwd* pw = ::getpwuid(uid);
  return pw ? fmt::format("{} (uid {})", pw->pw_name, uid) : fmt::format("uid {}", uid);
}

// Why `path` (a plugin folder or file) must not be trusted, or "" when it may: a plugin runs with
// the user's rights, so nobody but the user (or root) may be able to change what gets loaded.
std::string unsafe_reason(const fs::path& path) {
  struct stat st {
  }, lst{};
  if (::stat(path.c_str(), &st) != 0) return "";  // missing or unreadable: reported when read
  const bool is_link = ::lstat(path.c_str(), &lst) == 0 && S_ISLNK(lst.st_mode);
  std::error_code ec;
  const std::string subject =
      is_link ? fmt::format("it is a symlink to {}, which", fs::canonical(path, ec).string())
              : "it";
  const uid_t me = ::geteuid();
  if (st.st_uid != me && st.st_uid != 0)
    return fmt::format("{} is owned by {}, neither you ({}) nor root", subject,
                       user_text(st.st_uid), user_text(me));
  if (st.st_mode & S_IWOTH)
    return fmt::format("{} is world-writable (mode {:04o})", subject, st.st_mode & 07777);
  return "";
}

// Throws PluginError for an unsafe path unless --allow-unsafe-plugin-path was given, which
// accepts it with a warning on stderr.
void check_trust(const fs::path& path, const char* what) {
  const std::string why = unsafe_reason(path);
  if (why.empty()) return;
  if (unsafe_paths_allowed()) {
    fmt::print(stderr, "normlab: warning: {} {}: {}; used anyway (--allow-unsafe-plugin-path)\n",
               what, path.string(), why);
    return;
  }
  throw PluginError(
      fmt::format("{} {}: refused, {}; fix the ownership/permissions or pass "
                  "--allow-unsafe-plugin-path",
                  what, path.string(), why));
}

std::vector<std::string> plugin_path_env_entries() {
  std::vector<std::string> out;
  if (const char* env = std::getenv("NORMLAB_PLUGIN_PATH")) {
    std::stringstream ss(env);
    std::string item;
    while (std::getline(ss, item, ':'))
      if (!item.empty()) out.push_back(item);
  }
  return out;
}

bool is_plugin_candidate(const fs::path& p) {
  return p.extension() == ".so" && fs::is_regular_file(p);
}

ParamType parse_type(const std::string& t, const fs::path& file, const std::string& key) {
  if (t == "bool") return ParamType::Bool;
  if (t == "int") return ParamType::Int;
  if (t == "float") return ParamType::Float;
  if (t == "string") return ParamType::String;
  throw PluginError(
      fmt::format("plugin {}: parameter '{}' has unknown type '{}'", file.string(), key, t));
}

std::vector<std::string> split_choices(const char* c) {
  std::vector<std::string> out;
  if (!c || !*c) return out;
  std::stringstream ss(c);
  std::string item;
  while (std::getline(ss, item, '|')) out.push_back(item);
  return out;
}

// The ".normlab_plugin" record (normlab/sdk/detail/plugin_info.h), every offset checked: the file
// is not trusted until it passes.
PluginInfo parse_metadata(const fs::path& file, const std::string& rec) {
  auto damaged = [&](const std::string& why) {
    return PluginError(
        fmt::format("plugin {}: damaged metadata section {} ({}); rebuild the plugin",
                    file.string(), NORMLAB_METADATA_SECTION, why));
  };
  auto u32 = [&](std::size_t offset) {
    std::uint32_t v;
    std::memcpy(&v, rec.data() + offset, sizeof v);
    return v;
  };
  if (rec.size() < metadata::kPrefixSize ||
      std::memcmp(rec.data(), metadata::kMagic, sizeof metadata::kMagic) != 0)
    throw damaged("no normlab record in it");
  // Version negotiation before anything else is read: other ABIs may lay out the rest differently.
  const std::uint32_t abi = u32(8);
  if (abi != NORMLAB_ABI_VERSION)
    throw PluginError(
        fmt::format("plugin {}: built for normlab plugin ABI {}, but this normlab has ABI {}; "
                    "rebuild the plugin",
                    file.string(), abi, NORMLAB_ABI_VERSION));
  if (rec.size() < metadata::kHeaderSize) throw damaged("too short");
  const std::uint32_t total = u32(12), cxx11 = u32(16), n = u32(20), strings_at = u32(24),
                      strings_size = u32(28);
  if (total != rec.size())
    throw damaged(fmt::format("{} bytes, but the record says {}; export one scheme per plugin",
                              rec.size(), total));
  if (n > kMaxParams) throw damaged(fmt::format("{} parameters", n));
  const std::size_t ranges = metadata::ranges_size(nullptr, int(n));
  if (strings_at != metadata::kHeaderSize + ranges * sizeof(double) || strings_at > total ||
      strings_size > total - strings_at)
    throw damaged("inconsistent layout");
  std::vector<std::string> texts;
  const std::size_t wanted = metadata::kTextsPerScheme + metadata::kTextsPerParam * std::size_t(n);
  std::size_t at = strings_at;
  const std::size_t end = std::size_t(strings_at) + strings_size;
  while (texts.size() < wanted) {
    const void* nul = at < end ? std::memchr(rec.data() + at, '\0', end - at) : nullptr;
    if (!nul) throw damaged("a text runs past the record");
    const std::size_t len = std::size_t(static_cast<const char*>(nul) - (rec.data() + at));
    texts.emplace_back(rec.data() + at, len);
    at += len + 1;
  }
  if (cxx11 != _GLIBCXX_USE_CXX11_ABI)
    throw PluginError(
        fmt::format("plugin {}: built with _GLIBCXX_USE_CXX11_ABI={}, normlab with {}",
                    file.string(), cxx11, _GLIBCXX_USE_CXX11_ABI));
  PluginInfo info;
  info.name = texts[0];
  info.version = texts[1];
  info.description = texts[2];
  info.equation = texts[3];
  info.torch_version = texts[4];
  info.file = file;
  info.abi_version = int(abi);
  info.cxx11_abi = cxx11 != 0;
  // Major.minor must match: LibTorch's C++ API and ABI change between minor versions.
  auto major_minor = [](const std::string& v) { return v.substr(0, v.find('.', v.find('.') + 1)); };
  if (major_minor(info.torch_version) != major_minor(TORCH_VERSION))
    throw PluginError(
        fmt::format("plugin {}: built against LibTorch {}, but this normlab uses LibTorch {}; "
                    "rebuild the plugin",
                    file.string(), info.torch_version.empty() ? "(unknown)" : info.torch_version,
                    TORCH_VERSION));
  if (info.name.empty())
    throw PluginError(fmt::format("plugin {}: metadata has an empty scheme name", file.string()));
  for (std::uint32_t i = 0; i < n; ++i) {
    const std::string* t = &texts[metadata::kTextsPerScheme + metadata::kTextsPerParam * i];
    ParamSpec spec;
    spec.name = t[0];
    spec.type = parse_type(t[1], file, spec.name);
    try {
      spec.default_value = parse_param_text(spec.type, t[2]);
    } catch (const std::exception& e) {
      throw PluginError(fmt::format("plugin {}: default of parameter '{}': {}", file.string(),
                                    spec.name, e.what()));
    }
    spec.choices = split_choices(t[3].c_str());
    std::memcpy(&spec.min_value, rec.data() + metadata::kHeaderSize + (2 * i) * sizeof(double),
                sizeof(double));
    std::memcpy(&spec.max_value, rec.data() + metadata::kHeaderSize + (2 * i + 1) * sizeof(double),
                sizeof(double));
    spec.help = t[4];
    info.params.push_back(std::move(spec));
  }
  return info;
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
    case ParamType::Bool:
      return v.b ? "true" : "false";
    case ParamType::Int:
      return std::to_string(v.i);
    case ParamType::Float:
      return fmt::format("{:g}", v.f);
    case ParamType::String:
      return "\"" + v.s + "\"";
  }
  return "?";
}

PluginRegistry::PluginRegistry(const std::vector<fs::path>& paths, bool use_default_paths) {
  for (const auto& p : paths) add_path(p);
  if (!use_default_paths) return;
  for (const auto& entry : plugin_path_env_entries())
    if (fs::path(entry).is_relative()) {
      problems_.push_back(
          fmt::format("NORMLAB_PLUGIN_PATH entry '{}' ignored: relative paths would be "
                      "searched in the working directory; use an absolute path",
                      entry));
      refused_.push_back(entry + " (relative NORMLAB_PLUGIN_PATH entry)");
    }
  for (const auto& p : default_search_paths()) add_path(p);
}

PluginRegistry::~PluginRegistry() = default;

std::vector<fs::path> PluginRegistry::environment_paths() {
  std::vector<fs::path> out;
  for (const auto& entry : plugin_path_env_entries())
    if (fs::path(entry).is_absolute()) out.emplace_back(entry);
  return out;
}

std::vector<fs::path> PluginRegistry::default_search_paths() {
  std::vector<fs::path> out = environment_paths();
  fs::path builtin = builtin_plugin_dir();
  if (!builtin.empty()) out.push_back(builtin);
  return out;
}

void PluginRegistry::add_path(const fs::path& path) {
  std::error_code ec;
  if (fs::is_directory(path, ec)) {
    try {
      check_trust(path, "plugin folder");
    } catch (const PluginError& err) {
      problems_.push_back(err.what());
      refused_.push_back(path.string() + " (unsafe folder)");
      return;
    }
    searched_.push_back(path);
    std::vector<fs::path> files;
    for (const auto& e : fs::directory_iterator(path, ec))
      if (is_plugin_candidate(e.path())) files.push_back(e.path());
    std::sort(files.begin(), files.end());
    for (const auto& f : files) {
      try {
        scan_file(f);
      } catch (const PluginError& err) {
        problems_.push_back(err.what());
        refused_.push_back(f.string());
      }
    }
    return;
  }
  if (!fs::exists(path, ec)) {
    // A missing default directory is normal (nothing installed there); a missing explicit
    // file is not, but both reach here: report, never crash.
    problems_.push_back(fmt::format("plugin path {}: does not exist", path.string()));
    missing_.push_back(path.string());
    return;
  }
  searched_.push_back(path);
  scan_file(path);
}

// Reads the plugin's metadata from the file; nothing in the file is loaded or run.
void PluginRegistry::scan_file(const fs::path& file) {
  const fs::path canonical = fs::weakly_canonical(file);
  for (const auto& e : entries_)
    if (fs::weakly_canonical(e->info.file) == canonical) return;  // the same file seen twice

  check_trust(file, "plugin");
  std::error_code ec;
  if (!fs::is_regular_file(file, ec))  // a FIFO would block the read below
    throw PluginError(fmt::format("plugin {}: not a regular file", file.string()));
  const FileIdentity identity = identity_of(file);
  std::optional<std::string> record, dynamic_names;
  try {
    record = read_elf_section(file, NORMLAB_METADATA_SECTION, kMaxMetadataBytes);
    dynamic_names = read_elf_section(file, ".dynstr", std::size_t(1) << 26);
  } catch (const std::exception& e) {
    throw PluginError(
        fmt::format("plugin {}: not a loadable library ({})", file.string(), e.what()));
  }
  auto names_symbol = [&](const char* symbol) {
    return dynamic_names &&
           dynamic_names->find('\0' + std::string(symbol) + '\0') != std::string::npos;
  };
  if (!record) {
    if (names_symbol(kOldSdkSymbol))
      throw PluginError(
          fmt::format("plugin {}: built for an older normlab SDK (no {} metadata section); "
                      "rebuild it against this normlab (plugin ABI {})",
                      file.string(), NORMLAB_METADATA_SECTION, NORMLAB_ABI_VERSION));
    throw PluginError(fmt::format("plugin {}: not a normlab plugin (no {} metadata section)",
                                  file.string(), NORMLAB_METADATA_SECTION));
  }
  auto entry = std::make_shared<Entry>();
  entry->info = parse_metadata(file, *record);
  entry->identity = identity;
  if (!names_symbol(kFactorySymbol))
    throw PluginError(
        fmt::format("plugin {}: missing entry point {}", file.string(), kFactorySymbol));
  const std::string& name = entry->info.name;
  entries_.push_back(entry);
  by_name_[name].push_back(entry);
  if (by_name_[name].size() == 2)
    problems_.push_back(fmt::format("scheme '{}' is provided by two plugins: {} and {}", name,
                                    by_name_[name][0]->info.file.string(), file.string()));
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
    throw PluginError(fmt::format(
        "unknown scheme '{}' (known: {}; searched: {}{}{})", name,
        known.empty() ? std::string("none") : fmt::format("{}", fmt::join(known, ", ")),
        where.empty() ? "nothing" : where,
        missing_.empty() ? "" : fmt::format("; not found: {}", fmt::join(missing_, ", ")),
        refused_.empty() ? "" : fmt::format("; refused: {}", fmt::join(refused_, ", "))));
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
      throw PluginError(fmt::format(
          "scheme '{}' has no parameter '{}' (known: {})", name, key,
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
        throw PluginError(
            fmt::format("scheme '{}' parameter '{}': expected a value in [{:g}, {:g}], got {:g}",
                        name, key, spec->min_value, spec->max_value, x));
    }
    values[key] = value;
  }
  return ParamView(name, std::move(values));
}

PluginRegistry::Entry& PluginRegistry::entry(const std::string& name) const {
  info(name);  // the errors for an unknown or ambiguous name
  return *by_name_.at(name).front();
}

bool PluginRegistry::is_loaded(const std::string& name) const {
  auto it = by_name_.find(name);
  if (it == by_name_.end()) return false;
  std::lock_guard<std::mutex> lock(it->second.front()->load_mutex);
  return it->second.front()->factory != nullptr;
}

// The first use of a plugin: the only place its code gets loaded.
void PluginRegistry::load(Entry& entry) {
  std::lock_guard<std::mutex> lock(entry.load_mutex);
  if (entry.factory) return;
  const fs::path& file = entry.info.file;
  check_trust(file, "plugin");
  if (!(identity_of(file) == entry.identity))
    throw PluginError(fmt::format(
        "plugin {}: the file changed since it was scanned; run the command again", file.string()));
  try {
    entry.lib = std::make_shared<boost::dll::shared_library>(boost::dll::fs::path(file.string()),
                                                             boost::dll::load_mode::rtld_now);
    entry.factory = &entry.lib->get_alias<SchemeFactory>(kFactorySymbol);
  } catch (const std::exception& e) {
    entry.lib.reset();
    entry.factory = nullptr;
    throw PluginError(fmt::format("plugin {}: cannot be loaded ({})", file.string(), e.what()));
  }
}

SchemeHandle PluginRegistry::create(const std::string& name,
                                    const std::map<std::string, ParamValue>& given,
                                    const ModelGeometry& geometry) const {
  ParamView params = resolve_params(name, given);
  Entry& e = entry(name);
  load(e);
  Scheme* raw = nullptr;
  try {
    raw = (*e.factory)(params, geometry);
  } catch (const std::exception& ex) {
    throw PluginError(fmt::format("plugin {}: scheme '{}' could not be created: {}",
                                  e.info.file.string(), name, ex.what()));
  } catch (...) {
    throw PluginError(
        fmt::format("plugin {}: scheme '{}' could not be created (it threw something "
                    "that is not a std::exception)",
                    e.info.file.string(), name));
  }
  if (!raw)
    throw PluginError(
        fmt::format("plugin {}: scheme '{}' factory returned nothing", e.info.file.string(), name));
  // The deleter keeps the library loaded for as long as the scheme lives.
  auto lib = e.lib;
  SchemeHandle h;
  h.scheme = std::shared_ptr<Scheme>(raw, [lib](Scheme* s) { delete s; });
  h.name = name;
  h.file = e.info.file.string();
  h.version = e.info.version;
  for (const auto& [key, v] : params.values())
    h.params[key] = v.type == ParamType::Float ? fmt::format("{}", v.f) : format_param_value(v);
  return h;
}

}  // namespace normlab
