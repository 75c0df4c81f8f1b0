// [sweep] parsing and expansion: axes (a product), zipped axes, exclusions, run ids, sweep.json.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <sstream>

#include "manifest/toml_describe.h"
#include "normlab/plugins/registry.h"
#include "normlab/sweep/sweep.h"
#include "train/run_directory.h"
#include "train/run_recipe.h"
#include "util/atomic_file.h"
#include "util/owned_dir.h"

namespace fs = std::filesystem;
using ojson = nlohmann::ordered_json;

namespace normlab {
namespace {

std::string where(const std::string& file, const toml::node& n) {
  return fmt::format("{}:{}:{}", file, n.source().begin.line, n.source().begin.column);
}

std::string toml_quoted(const std::string& s) {
  std::string q = "\"";
  for (const char c : s) {
    if (c == '"' || c == '\\')
      q += '\\', q += c;
    else if (static_cast<unsigned char>(c) < 0x20)
      q += fmt::format("\\u{:04x}", int(c));
    else
      q += c;
  }
  return q + "\"";
}

std::string key_literal(const std::string& k) {
  const bool bare = !k.empty() && std::all_of(k.begin(), k.end(), [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '_' || c == '-';
  });
  return bare ? k : toml_quoted(k);
}

// A value in TOML syntax, as an override carries it: 0.0005 (not 0.00050000000000000001), 2.0.
std::string literal(const toml::node& n) {
  if (n.is_string()) return toml_quoted(*n.value<std::string>());
  if (n.is_integer()) return fmt::format("{}", *n.value<int64_t>());
  if (n.is_boolean()) return *n.value<bool>() ? "true" : "false";
  if (n.is_floating_point()) {
    const double x = *n.value<double>();
    if (std::isnan(x)) return "nan";
    if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
    std::string s = fmt::format("{}", x);
    if (s.find_first_of(".e") == std::string::npos) s += ".0";
    return s;
  }
  if (const toml::array* a = n.as_array()) {
    std::vector<std::string> parts;
    for (const auto& e : *a) parts.push_back(literal(e));
    return fmt::format("[{}]", fmt::join(parts, ", "));
  }
  if (const toml::table* t = n.as_table()) {
    std::vector<std::string> parts;
    for (const auto& [k, v] : *t)
      parts.push_back(key_literal(std::string(k.str())) + " = " + literal(v));
    return fmt::format("{{{}}}", fmt::join(parts, ", "));
  }
  return "?";
}

// Value text for ids and tables: strings without quotes.
std::string text(const toml::node& n) {
  return n.is_string() ? *n.value<std::string>() : literal(n);
}

bool safe_char(char c) {
  return std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-';
}

// Filesystem-safe id text: every character outside [A-Za-z0-9._-] becomes '-'.
std::string id_text(std::string s) {
  for (char& c : s)
    if (!safe_char(c)) c = '-';
  return s;
}

bool is_manifest_section(const std::string& key) {
  const auto& s = manifest_sections();
  return std::find(s.begin(), s.end(), key) != s.end();
}

std::string short_key(const std::string& key) {
  if (key == "scheme.name") return "";  // the scheme name says what it is
  return key.substr(key.rfind('.') + 1);
}

// One key's value in one row of an axis.
struct Element {
  std::vector<std::pair<std::string, std::string>> overrides;             // (override, origin)
  std::vector<std::tuple<std::string, std::string, std::string>> values;  // (key, text, literal)
  std::string value_text;  // the id's value part: label, scheme variant, or the value
  bool from_table = false;
};

struct Axis {
  std::vector<std::string> keys;
  bool has_id = false;
  std::string id;
  std::vector<std::vector<Element>> rows;  // per value, per key
};

class SweepReader {
 public:
  explicit SweepReader(std::string file) : file_(std::move(file)) {}

  [[noreturn]] void fail(const toml::node& n, const std::string& msg) const {
    throw ManifestError(fmt::format("{}: [sweep] {}", where(file_, n), msg));
  }

  Element element(const std::string& key, const toml::node& v, const std::string& what) const {
    Element e;
    if (!is_manifest_section(key)) {
      if (v.is_table()) fail(v, fmt::format("{}: expected a value for {}, got a table", what, key));
      e.overrides.emplace_back(key + "=" + literal(v), where(file_, v));
      e.values.emplace_back(key, text(v), literal(v));
      e.value_text = id_text(text(v));
      return e;
    }
    const toml::table* t = v.as_table();
    if (!t)
      fail(v, fmt::format("{}: expected a table of [{}] keys{}, got {}", what, key,
                          key == "scheme" ? " such as {name = \"deepnorm\"}" : "",
                          describe_toml_value(v)));
    e.from_table = true;
    std::string label;
    if (const toml::node* l = t->get("label")) {
      const std::string given = l->value<std::string>().value_or("");
      if (!l->is_string() || given.empty() || !std::all_of(given.begin(), given.end(), safe_char))
        fail(*l,
             fmt::format(
                 "{}: label: expected a non-empty string of letters, digits, '.', '_', '-', got {}",
                 what, describe_toml_value(*l)));
      label = *l->value<std::string>();
    }
    toml::table rest;
    std::vector<std::string> derived;
    for (const auto& [k, node] : *t) {
      const std::string name(k.str());
      if (name == "label") continue;
      const std::string dotted = key + "." + name;
      if (const std::string bad = check_manifest_key(dotted); !bad.empty())
        fail(node, fmt::format("{}: {}: {}", what, name, bad));
      if (node.is_table())
        fail(node, fmt::format("{}: {}: expected a value, got a table", what, name));
      rest.insert(name, node);
      e.values.emplace_back(dotted, text(node), literal(node));
      if (key == "scheme") {
        if (name != "name") derived.push_back(id_text(text(node)));
      } else {
        derived.push_back(name + "=" + id_text(text(node)));
        e.overrides.emplace_back(dotted + "=" + literal(node), where(file_, node));
      }
    }
    if (key == "scheme") {
      const toml::node* name = t->get("name");
      if (!name || !name->is_string())
        fail(v,
             fmt::format("{}: expected a string `name` (the scheme) in each scheme table, got {}",
                         what, name ? describe_toml_value(*name) : "none"));
      derived.insert(derived.begin(), id_text(*name->value<std::string>()));
      // The scheme table replaces [scheme]: a variant's parameters belong to it alone.
      e.overrides.emplace_back("scheme=" + literal(rest), where(file_, v));
      e.value_text = label.empty() ? fmt::format("{}", fmt::join(derived, "-")) : label;
    } else {
      if (rest.empty()) fail(v, fmt::format("{}: expected at least one [{}] key", what, key));
      e.value_text = label.empty() ? fmt::format("{}", fmt::join(derived, "_")) : label;
    }
    e.values.emplace_back(key, e.value_text, toml_quoted(e.value_text));
    return e;
  }

  std::vector<Axis> axes(const toml::table& sweep) const {
    const toml::node* axes_node = sweep.get("axis");
    if (!axes_node)
      fail(sweep,
           "axis: expected at least one [[sweep.axis]] table with key = \"section.key\" and values "
           "= [...]");
    const toml::array* arr = axes_node->as_array();
    if (!arr || arr->empty() || !arr->is_homogeneous(toml::node_type::table))
      fail(*axes_node, fmt::format("axis: expected [[sweep.axis]] tables, got {}",
                                   describe_toml_value(*axes_node)));
    std::vector<Axis> out;
    std::vector<std::pair<std::string, const toml::node*>> seen;  // key, where
    for (size_t a = 0; a < arr->size(); ++a) {
      const toml::table& t = *(*arr)[a].as_table();
      const std::string name = fmt::format("axis {}", a + 1);
      for (const auto& [k, node] : t) {
        const std::string key(k.str());
        if (key != "key" && key != "zip" && key != "values" && key != "id")
          fail(node, fmt::format("{}: unknown key '{}' (known: key, zip, values, id)", name, key));
      }
      Axis axis;
      const toml::node* key = t.get("key");
      const toml::node* zip = t.get("zip");
      if (bool(key) == bool(zip))
        fail(t, fmt::format(
                    "{}: expected either key = \"section.key\" or zip = [\"section.key\", ...]",
                    name));
      if (key) {
        if (!key->is_string())
          fail(*key, fmt::format("{}: key: expected a string \"section.key\", got {}", name,
                                 describe_toml_value(*key)));
        axis.keys.push_back(*key->value<std::string>());
      } else {
        const toml::array* z = zip->as_array();
        if (!z || z->size() < 2 || !z->is_homogeneous(toml::node_type::string))
          fail(*zip, fmt::format("{}: zip: expected an array of at least 2 keys, got {}", name,
                                 describe_toml_value(*zip)));
        for (const auto& k : *z) axis.keys.push_back(*k.value<std::string>());
      }
      const toml::node& key_node = key ? *key : *zip;
      for (const auto& k : axis.keys) {
        if (!is_manifest_section(k)) {
          if (const std::string bad = check_manifest_key(k); !bad.empty())
            fail(key_node, fmt::format("{}: '{}' is not a manifest key: {}", name, k, bad));
        }
        if (k == "run.out_dir")
          fail(
              key_node,
              fmt::format(
                  "{}: run.out_dir cannot vary: each run's directory is <sweep directory>/<run id>",
                  name));
        for (const auto& [other, at] : seen) {
          const bool overlap = other == k ||
                               (is_manifest_section(other) && k.rfind(other + ".", 0) == 0) ||
                               (is_manifest_section(k) && other.rfind(k + ".", 0) == 0);
          if (overlap)
            fail(key_node, fmt::format("{}: '{}' overlaps '{}' of the axis at {}", name, k, other,
                                       where(file_, *at)));
        }
        seen.emplace_back(k, &key_node);
      }
      if (const toml::node* id = t.get("id")) {
        const std::string given = id->value<std::string>().value_or("");
        if (!id->is_string() || !std::all_of(given.begin(), given.end(), safe_char))
          fail(*id, fmt::format("{}: id: expected a string of letters, digits, '.', '_', '-' (\"\" "
                                "for none), got {}",
                                name, describe_toml_value(*id)));
        axis.has_id = true;
        axis.id = *id->value<std::string>();
      }
      const toml::node* values = t.get("values");
      if (!values) fail(t, fmt::format("{}: values: expected a non-empty array, got none", name));
      const toml::array* va = values->as_array();
      if (!va || va->empty())
        fail(*values, fmt::format("{} ({}): values: expected a non-empty array, got {}", name,
                                  fmt::join(axis.keys, ", "), describe_toml_value(*values)));
      for (size_t i = 0; i < va->size(); ++i) {
        const toml::node& v = (*va)[i];
        const std::string what =
            fmt::format("{} ({}): values[{}]", name, fmt::join(axis.keys, ", "), i);
        std::vector<Element> row;
        if (axis.keys.size() == 1) {
          row.push_back(element(axis.keys[0], v, what));
        } else {
          const toml::array* r = v.as_array();
          if (!r || r->size() != axis.keys.size())
            fail(v, fmt::format("{}: expected an array of {} values, one per zip key ({}), got {}",
                                what, axis.keys.size(), fmt::join(axis.keys, ", "),
                                describe_toml_value(v)));
          for (size_t j = 0; j < r->size(); ++j)
            row.push_back(element(axis.keys[j], (*r)[j], what));
        }
        // Two values of one axis with the same id text would give two runs one id.
        for (size_t j = 0; j < axis.rows.size(); ++j) {
          bool same = true;
          for (size_t k = 0; k < row.size(); ++k)
            same = same && row[k].value_text == axis.rows[j][k].value_text;
          if (same)
            fail(v,
                 fmt::format(
                     "{}: gives the same id text as values[{}] ('{}'); give them distinct labels",
                     what, j, row.size() == 1 ? row[0].value_text : "…"));
        }
        axis.rows.push_back(std::move(row));
      }
      out.push_back(std::move(axis));
    }
    return out;
  }

 private:
  std::string file_;
};

// The id component of row `r` of an axis, from the keys whose value varies along the axis.
// A zipped axis whose scheme tables differ in every row (a recipe per scheme: zip = ["scheme",
// "optim"]) is named by the scheme alone: pre-ln_seed1, not pre-ln_warmup_updates=30_…_seed1.
std::optional<size_t> naming_scheme(const Axis& axis) {
  const auto at = std::find(axis.keys.begin(), axis.keys.end(), "scheme");
  if (axis.keys.size() < 2 || at == axis.keys.end()) return std::nullopt;
  const size_t k = size_t(at - axis.keys.begin());
  std::set<std::string> texts;
  for (const auto& row : axis.rows) texts.insert(row[k].value_text);
  if (texts.size() != axis.rows.size()) return std::nullopt;
  return k;
}

std::string component(const Axis& axis, size_t r) {
  if (axis.rows.size() < 2) return "";
  std::vector<std::string> parts;
  const std::optional<size_t> by_scheme = naming_scheme(axis);
  for (size_t k = 0; k < axis.keys.size(); ++k) {
    if (by_scheme && k != *by_scheme) continue;
    bool varies = false;
    for (const auto& row : axis.rows) varies |= row[k].value_text != axis.rows[0][k].value_text;
    if (!varies) continue;
    const Element& e = axis.rows[r][k];
    if (axis.has_id) {
      parts.push_back(e.value_text);
    } else {
      const std::string prefix = e.from_table ? "" : short_key(axis.keys[k]);
      parts.push_back(prefix.empty() ? e.value_text : prefix + "=" + e.value_text);
    }
  }
  if (parts.empty()) return "";
  if (!axis.has_id) return fmt::format("{}", fmt::join(parts, "_"));
  return axis.id + fmt::format("{}", fmt::join(parts, "-"));  // id = "L": L18-18
}

bool value_matches(const toml::node& want, const std::string& text) {
  if (const toml::array* any = want.as_array()) {
    for (const auto& w : *any)
      if (value_matches(w, text)) return true;
    return false;
  }
  if (want.is_number()) {
    char* end = nullptr;
    const double x = std::strtod(text.c_str(), &end);
    return end && *end == '\0' && !text.empty() && x == *want.value<double>();
  }
  return text == ::normlab::text(want);
}

void flatten(const toml::table& t, const std::string& prefix,
             std::vector<std::pair<std::string, const toml::node*>>& out) {
  for (const auto& [k, node] : t) {
    const std::string key =
        prefix.empty() ? std::string(k.str()) : prefix + "." + std::string(k.str());
    if (const toml::table* sub = node.as_table())
      flatten(*sub, key, out);
    else
      out.emplace_back(key, &node);
  }
}

std::string iso8601_now() {
  const std::time_t t = std::time(nullptr);
  char buf[64];
  std::strftime(buf, sizeof buf, "%Y-%m-%dT%H:%M:%S%z", std::localtime(&t));
  return buf;
}

ojson json_value(const std::string& lit) {
  try {
    toml::table t = toml::parse("v = " + lit);
    const toml::node& n = *t.get("v");
    if (n.is_integer()) return *n.value<int64_t>();
    if (n.is_floating_point()) return *n.value<double>();
    if (n.is_boolean()) return *n.value<bool>();
    if (n.is_string()) return *n.value<std::string>();
  } catch (const toml::parse_error&) {
  }
  return lit;
}

// The product of the axes, first axis slowest.
std::vector<SweepRun> expand_product(const std::vector<Axis>& axes, const toml::table& sweep,
                                     SweepReader& reader) {
  size_t total = 1;
  for (const auto& a : axes) total *= a.rows.size();
  if (total > 1000000)
    reader.fail(sweep, fmt::format("axis: the product has {} runs (more than 1000000)", total));
  std::vector<SweepRun> all;
  std::vector<size_t> pick(axes.size(), 0);
  for (size_t n = 0; n < total; ++n) {
    size_t rest = n;
    for (size_t a = axes.size(); a-- > 0;) {
      pick[a] = rest % axes[a].rows.size();
      rest /= axes[a].rows.size();
    }
    SweepRun run;
    std::vector<std::string> parts;
    for (size_t a = 0; a < axes.size(); ++a) {
      for (const Element& e : axes[a].rows[pick[a]]) {
        for (const auto& [o, at] : e.overrides) {
          run.overrides.push_back(o);
          run.origins.push_back(at);
        }
        for (const auto& [key, txt, lit] : e.values) {
          run.values[key] = txt;
          run.literals[key] = lit;
        }
      }
      if (std::string c = component(axes[a], pick[a]); !c.empty()) parts.push_back(std::move(c));
    }
    run.id = parts.empty() ? "run" : fmt::format("{}", fmt::join(parts, "_"));
    all.push_back(std::move(run));
  }

  return all;
}

// Exclusions: a run matching every key of one [[sweep.exclude]] table is dropped.
std::vector<bool> excluded_runs(const toml::table& sweep, const std::vector<SweepRun>& all,
                                SweepReader& reader) {
  std::set<std::string> known;
  for (const auto& run : all)
    for (const auto& [k, v] : run.values) known.insert(k);
  std::vector<bool> dropped(all.size(), false);
  if (const toml::node* ex = sweep.get("exclude")) {
    const toml::array* arr = ex->as_array();
    if (!arr || !arr->is_homogeneous(toml::node_type::table))
      reader.fail(*ex, fmt::format("exclude: expected [[sweep.exclude]] tables, got {}",
                                   describe_toml_value(*ex)));
    for (size_t i = 0; i < arr->size(); ++i) {
      const toml::table& t = *(*arr)[i].as_table();
      std::vector<std::pair<std::string, const toml::node*>> conds;
      flatten(t, "", conds);
      if (conds.empty())
        reader.fail(
            t, fmt::format("exclude {}: expected at least one \"section.key\" = value", i + 1));
      for (const auto& [key, node] : conds) {
        if (!known.count(key))
          reader.fail(*node,
                      fmt::format("exclude {}: '{}' is not varied by any axis (axis keys: {})",
                                  i + 1, key, fmt::join(known, ", ")));
        if (node->is_array() && !node->as_array()->empty() && node->as_array()->front().is_array())
          reader.fail(
              *node,
              fmt::format(
                  "exclude {}: {}: expected a value or an array of values, got nested arrays",
                  i + 1, key));
      }
      bool any = false;
      for (size_t r = 0; r < all.size(); ++r) {
        bool match = true;
        for (const auto& [key, node] : conds) {
          auto it = all[r].values.find(key);
          match = match && it != all[r].values.end() && value_matches(*node, it->second);
        }
        if (match) dropped[r] = true, any = true;
      }
      if (!any) reader.fail(t, fmt::format("exclude {}: matches no run of the expansion", i + 1));
    }
  }
  return dropped;
}

}  // namespace

std::string sweep_dir(const std::string& manifest, const std::vector<std::string>& overrides) {
  return plan_sweep(manifest, overrides, nullptr).dir;
}

SweepPlan plan_sweep(const std::string& manifest, const std::vector<std::string>& overrides,
                     const PluginRegistry* registry) {
  toml::table root = parse_manifest_file(manifest);
  const toml::node* sweep_node = root.get("sweep");
  if (!sweep_node || !sweep_node->is_table())
    throw ManifestError(
        fmt::format("{}: [sweep]: expected a [sweep] table with [[sweep.axis]] tables "
                    "(a manifest without one runs with `normlab train`)",
                    manifest));
  const toml::table& sweep = *sweep_node->as_table();
  SweepReader reader(manifest);
  for (const auto& [k, node] : sweep) {
    const std::string key(k.str());
    if (key != "name" && key != "axis" && key != "exclude")
      reader.fail(node, fmt::format("unknown key '{}' (known: name, axis, exclude)", key));
  }

  SweepPlan plan;
  plan.manifest = manifest;
  plan.sets = overrides;
  plan.name = fs::path(manifest).stem().string();
  if (const toml::node* n = sweep.get("name")) {
    if (!n->is_string() || n->value<std::string>()->empty())
      reader.fail(
          *n, fmt::format("name: expected a non-empty string, got {}", describe_toml_value(*n)));
    plan.name = *n->value<std::string>();
  }
  const std::vector<Axis> axes = reader.axes(sweep);
  // The user's --set must not fight an axis.
  for (const auto& o : overrides) {
    const std::string key = o.substr(0, o.find('='));
    for (const auto& axis : axes)
      for (const auto& k : axis.keys)
        if (k == key || (is_manifest_section(k) && key.rfind(k + ".", 0) == 0) ||
            (is_manifest_section(key) && k.rfind(key + ".", 0) == 0))
          throw ManifestError(fmt::format(
              "--set {}: {} is varied by [[sweep.axis]] '{}' in {}; change the axis instead", o,
              key, k, manifest));
  }

  std::vector<SweepRun> all = expand_product(axes, sweep, reader);
  const std::vector<bool> dropped = excluded_runs(sweep, all, reader);
  std::map<std::string, int> by_id;
  for (size_t r = 0; r < all.size(); ++r) {
    if (dropped[r]) continue;
    SweepRun run = std::move(all[r]);
    run.index = int(plan.runs.size());
    run.dir = run.id;
    if (auto it = by_id.find(run.id); it != by_id.end())
      throw ManifestError(fmt::format(
          "{}: [sweep] runs {} and {} both get the id '{}' ({} vs {}); give the scheme "
          "tables distinct labels or the axes an id",
          manifest, it->second, run.index, run.id,
          fmt::join(plan.runs[size_t(it->second)].overrides, " "), fmt::join(run.overrides, " ")));
    by_id[run.id] = run.index;
    plan.runs.push_back(std::move(run));
  }
  if (plan.runs.empty()) reader.fail(sweep, "exclude: every run of the expansion is excluded");

  // The sweep directory and plugin paths: the base manifest with the first run's values (the
  // base alone need not be valid, e.g. when an axis sets d_model and heads together).
  {
    ManifestLoadOptions opt;
    opt.ignore_tables = {"sweep"};
    opt.override_origins = plan.runs[0].origins;
    std::vector<std::string> first = plan.runs[0].overrides;
    first.insert(first.end(), overrides.begin(), overrides.end());
    ExperimentSpec base;
    try {
      base = load_manifest(manifest, first, nullptr, opt);
    } catch (const ManifestError& e) {
      throw ManifestError(fmt::format("{} (sweep run 0 '{}')", e.what(), plan.runs[0].id));
    }
    plan.dir = base.run.out_dir;
    for (const auto& p : base.run.plugin_path)
      plan.plugin_paths.push_back(
          fs::path(p).is_relative() ? (fs::path(manifest).parent_path() / p).string() : p);
  }

  plan.max_updates.assign(plan.runs.size(), 0);
  plan.threads.assign(plan.runs.size(), 0);
  if (registry) {
    for (const auto& run : plan.runs) {
      try {
        const ExperimentSpec spec = load_sweep_run(plan, run, {}, registry);
        plan.max_updates[size_t(run.index)] = spec.optim.max_updates;
        plan.threads[size_t(run.index)] = spec.run.threads;
        // A run already in the sweep's folder was trained under this manifest: a changed base
        // manifest left finished runs "finished" and mixed two experiments in one report.
        const std::string dir = run_directory(plan, run);
        if (const std::string change = run_manifest_change(dir, resolved_manifest_text(spec));
            !change.empty())
          throw ManifestError(fmt::format(
              "{}: {} holds this run trained under another manifest ({}); a changed experiment "
              "needs its own sweep folder: another [run] out_dir (or --set run.out_dir=...)",
              manifest, dir, change));
      } catch (const ManifestError& e) {
        throw ManifestError(fmt::format("{} (sweep run {} '{}')", e.what(), run.index, run.id));
      }
    }
  }
  return plan;
}

std::vector<SweepRun> expand_sweep(const std::string& manifest,
                                   const std::vector<std::string>& overrides) {
  std::vector<fs::path> paths;
  for (const auto& p : plan_sweep(manifest, overrides, nullptr).plugin_paths) paths.emplace_back(p);
  PluginRegistry registry(paths);
  return plan_sweep(manifest, overrides, &registry).runs;
}

std::string run_directory(const SweepPlan& plan, const SweepRun& run) {
  return (fs::path(plan.dir) / run.dir).string();
}

std::vector<std::string> run_overrides(const SweepPlan& plan, const SweepRun& run,
                                       const std::vector<std::string>& extra) {
  std::vector<std::string> o = run.overrides;
  o.insert(o.end(), plan.sets.begin(), plan.sets.end());
  o.insert(o.end(), extra.begin(), extra.end());
  o.push_back("run.out_dir=" + toml_quoted(run_directory(plan, run)));
  return o;
}

ExperimentSpec load_sweep_run(const SweepPlan& plan, const SweepRun& run,
                              const std::vector<std::string>& extra,
                              const PluginRegistry* registry) {
  ManifestLoadOptions opt;
  opt.ignore_tables = {"sweep"};
  opt.override_origins = run.origins;
  return load_manifest(plan.manifest, run_overrides(plan, run, extra), registry, opt);
}

std::string sweep_json_text(const SweepPlan& plan, const std::string& created) {
  ojson j;
  j["manifest"] = fs::absolute(plan.manifest).lexically_normal().string();
  j["name"] = plan.name;
  j["created"] = created;
  j["sets"] = plan.sets;
  j["runs"] = ojson::array();
  for (const auto& run : plan.runs) {
    ojson values = ojson::object();
    for (const auto& [k, lit] : run.literals) values[k] = json_value(lit);
    j["runs"].push_back({{"index", run.index},
                         {"id", run.id},
                         {"dir", run.dir},
                         {"overrides", run.overrides},
                         {"values", values}});
  }
  return j.dump(2) + "\n";
}

void claim_sweep_directory(const SweepPlan& plan) {
  util::claim_directory(plan.dir, "sweep",
                        fmt::format("{}: sweep folder ([run] out_dir)", plan.manifest),
                        [](const fs::path& d) {
                          return fs::exists(d / "sweep.json") || fs::exists(d / "sweep.lock");
                        });
}

std::string sync_sweep_json(const SweepPlan& plan) {
  const fs::path path = fs::path(plan.dir) / "sweep.json";
  claim_sweep_directory(plan);
  if (!fs::exists(path)) {
    util::write_file_atomically(path, sweep_json_text(plan, iso8601_now()));
    return fmt::format("wrote {} ({} runs)", path.string(), plan.runs.size());
  }
  std::ifstream f(path);
  const ojson old = ojson::parse(f, nullptr, /*allow_exceptions=*/false);
  if (!old.is_object() || !old.contains("runs") || !old["runs"].is_array())
    throw ManifestError(fmt::format(
        "{}: not a sweep.json written by normlab; move it away or choose another [run] out_dir",
        path.string()));
  std::map<std::string, const SweepRun*> now;
  for (const auto& run : plan.runs) now[run.id] = &run;
  for (const auto& r : old["runs"]) {
    const std::string id = r.value("id", "");
    auto it = now.find(id);
    const std::string hint = fmt::format(
        "; this sweep directory holds the runs of another expansion: choose another "
        "[run] out_dir (--set run.out_dir=...) or move {} away",
        plan.dir);
    if (it == now.end())
      throw ManifestError(fmt::format("{}: run '{}' of {} is not in the expansion of {} any more{}",
                                      plan.manifest, id, path.string(), plan.manifest, hint));
    if (r.value("overrides", std::vector<std::string>{}) != it->second->overrides)
      throw ManifestError(
          fmt::format("{}: run '{}' of {} had the overrides {}, the expansion now gives {}{}",
                      plan.manifest, id, path.string(), r.value("overrides", ojson::array()).dump(),
                      ojson(it->second->overrides).dump(), hint));
    if (r.value("dir", "") != it->second->dir)
      throw ManifestError(fmt::format("{}: run '{}' of {} had the directory '{}', now '{}'{}",
                                      plan.manifest, id, path.string(), r.value("dir", ""),
                                      it->second->dir, hint));
  }
  bool same_order = old["runs"].size() == plan.runs.size();
  for (size_t i = 0; same_order && i < plan.runs.size(); ++i)
    same_order = old["runs"][i].value("id", "") == plan.runs[i].id;
  if (same_order && old.value("sets", std::vector<std::string>{}) == plan.sets) return "";
  util::write_file_atomically(path, sweep_json_text(plan, old.value("created", iso8601_now())));
  const size_t added = plan.runs.size() - old["runs"].size();
  return added > 0 ? fmt::format("{}: {} runs added to the {} already there", path.string(), added,
                                 old["runs"].size())
                   : fmt::format("{}: updated (--set overrides {})", path.string(),
                                 ojson(plan.sets).dump());
}

}  // namespace normlab
