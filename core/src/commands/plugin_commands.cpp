#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <nlohmann/json.hpp>
#include <ostream>

#include "commands/commands.h"
#include "normlab/sdk/scheme.h"

namespace normlab {
namespace {

std::string range_text(const ParamSpec& p) {
  if (!p.choices.empty()) return fmt::format("{}", fmt::join(p.choices, " | "));
  if (p.type != ParamType::Int && p.type != ParamType::Float) return "";
  auto num = [](double v) {
    return std::isinf(v) ? std::string(v < 0 ? "-inf" : "inf") : fmt::format("{:g}", v);
  };
  return "[" + num(p.min_value) + ", " + num(p.max_value) + "]";
}

}  // namespace

nlohmann::json param_json(const ParamValue& v) {
  switch (v.type) {
    case ParamType::Bool:
      return v.b;
    case ParamType::Int:
      return v.i;
    case ParamType::Float:
      return v.f;
    case ParamType::String:
      return v.s;
  }
  return nullptr;
}

std::map<std::string, ParamValue> typed_params(const PluginInfo& info,
                                               const std::map<std::string, std::string>& text) {
  std::map<std::string, ParamValue> out;
  for (const auto& [key, value] : text) {
    const ParamSpec* spec = info.param(key);
    if (!spec) {  // let resolve_params() produce the error that lists the known keys
      out[key] = ParamValue::of_string(value);
      continue;
    }
    try {
      out[key] = parse_param_text(spec->type, value);
    } catch (const std::invalid_argument& e) {
      throw PluginError(fmt::format("scheme '{}' parameter '{}': {}", info.name, key, e.what()));
    }
  }
  return out;
}

int plugins_list(const PluginRegistry& reg, std::ostream& out, std::ostream& err) {
  const auto plugins = reg.plugins();
  size_t w_name = 4, w_ver = 7, w_file = 4;
  for (const auto* p : plugins) {
    w_name = std::max(w_name, p->name.size());
    w_ver = std::max(w_ver, p->version.size());
    w_file = std::max(w_file, p->file.string().size());
  }
  fmt::print(out, "{:<{}}  {:<{}}  {:>3}  {:<{}}  {}\n", "NAME", w_name, "VERSION", w_ver, "ABI",
             "FILE", w_file, "DESCRIPTION");
  for (const auto* p : plugins)
    fmt::print(out, "{:<{}}  {:<{}}  {:>3}  {:<{}}  {}\n", p->name, w_name, p->version, w_ver,
               p->abi_version, p->file.string(), w_file, p->description);
  for (const auto& problem : reg.problems()) fmt::print(err, "warning: {}\n", problem);
  return reg.problems().empty() ? 0 : 1;
}

int plugins_show(const PluginRegistry& reg, const PluginShowOptions& opt, std::ostream& out) {
  const PluginInfo& info = reg.info(opt.name);
  SchemeHandle h = reg.create(opt.name, typed_params(info, opt.params), opt.geometry);
  // Plugin code: whatever it throws is that plugin's one-line error.
  std::vector<DerivedValue> derived;
  try {
    derived = h.scheme->derive();
  } catch (const std::exception& e) {
    throw PluginError(fmt::format("plugin {}: scheme '{}': derive() failed: {}", info.file.string(),
                                  info.name, e.what()));
  } catch (...) {
    throw PluginError(
        fmt::format("plugin {}: scheme '{}': derive() threw something that is not a "
                    "std::exception",
                    info.file.string(), info.name));
  }
  const ModelGeometry& g = opt.geometry;

  if (opt.json) {
    nlohmann::json j;
    j["name"] = info.name;
    j["version"] = info.version;
    j["abi"] = info.abi_version;
    j["file"] = info.file.string();
    j["description"] = info.description;
    j["equation"] = info.equation;
    j["torch_version"] = info.torch_version;
    j["geometry"] = {
        {"arch", to_string(g.arch)}, {"enc_layers", g.enc_layers}, {"dec_layers", g.dec_layers}};
    j["params"] = nlohmann::json::array();
    for (const auto& p : info.params) {
      nlohmann::json pj = {{"name", p.name},
                           {"type", to_string(p.type)},
                           {"default", param_json(p.default_value)},
                           {"help", p.help}};
      if (!p.choices.empty()) pj["choices"] = p.choices;
      if (p.type == ParamType::Int || p.type == ParamType::Float) {
        if (!std::isinf(p.min_value)) pj["min"] = p.min_value;
        if (!std::isinf(p.max_value)) pj["max"] = p.max_value;
      }
      j["params"].push_back(pj);
    }
    j["derived"] = nlohmann::json::array();
    for (const auto& d : derived)
      j["derived"].push_back(
          {{"name", d.name}, {"where", d.where}, {"value", d.value}, {"formula", d.formula}});
    out << j.dump(2) << "\n";
    return 0;
  }

  fmt::print(out, "{} {} — {}\n", info.name, info.version, info.description);
  fmt::print(out, "file:     {} (ABI {}, LibTorch {})\n", info.file.string(), info.abi_version,
             info.torch_version);
  fmt::print(out, "equation: {}\n\n", info.equation);
  if (info.params.empty()) {
    fmt::print(out, "parameters: none\n");
  } else {
    fmt::print(out, "{:<18} {:<7} {:<10} {:<26} {}\n", "PARAMETER", "TYPE", "DEFAULT", "ALLOWED",
               "MEANING");
    for (const auto& p : info.params)
      fmt::print(out, "{:<18} {:<7} {:<10} {:<26} {}\n", p.name, to_string(p.type),
                 format_param_value(p.default_value), range_text(p), p.help);
  }
  const std::string shape = g.arch == Arch::LM
                                ? fmt::format("lm, {} layers", g.dec_layers)
                                : fmt::format("encdec {}L-{}L", g.enc_layers, g.dec_layers);
  if (derived.empty()) {
    fmt::print(out, "\nderived for {}: nothing (no geometry-dependent constants)\n", shape);
  } else {
    fmt::print(out, "\nderived for {}:\n", shape);
    // Columns as wide as their longest entry, each under its own header (issue 27.15).
    size_t name_w = 4, where_w = 5;
    for (const auto& d : derived) {
      name_w = std::max(name_w, d.name.size());
      where_w = std::max(where_w, d.where.size());
    }
    fmt::print(out, "{:<{}}  {:<{}}  {:>12}  {}\n", "NAME", name_w, "WHERE", where_w, "VALUE",
               "FORMULA");
    for (const auto& d : derived)
      fmt::print(out, "{:<{}}  {:<{}}  {:>12.6g}  {}\n", d.name, name_w, d.where, where_w, d.value,
                 d.formula);
  }
  return 0;
}

}  // namespace normlab
