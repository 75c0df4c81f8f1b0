// normlab scheme SDK — scheme parameters: declared by the plugin, resolved by the host.
#pragma once

#include <cstdint>
#include <map>
#include <stdexcept>
#include <string>

namespace normlab {

enum class ParamType { Bool, Int, Float, String };

inline const char* to_string(ParamType t) {
  switch (t) {
    case ParamType::Bool:
      return "bool";
    case ParamType::Int:
      return "int";
    case ParamType::Float:
      return "float";
    case ParamType::String:
      return "string";
  }
  return "?";
}

struct ParamValue {
  ParamType type = ParamType::String;
  bool b = false;
  int64_t i = 0;
  double f = 0.0;
  std::string s;

  static ParamValue of_bool(bool v) {
    ParamValue p;
    p.type = ParamType::Bool;
    p.b = v;
    return p;
  }
  static ParamValue of_int(int64_t v) {
    ParamValue p;
    p.type = ParamType::Int;
    p.i = v;
    p.f = double(v);
    return p;
  }
  static ParamValue of_float(double v) {
    ParamValue p;
    p.type = ParamType::Float;
    p.f = v;
    return p;
  }
  static ParamValue of_string(std::string v) {
    ParamValue p;
    p.type = ParamType::String;
    p.s = std::move(v);
    return p;
  }
};

// The resolved parameters of one scheme instance: every declared key is present (defaults filled).
// Reading a key that is not declared, or as the wrong type, throws naming the scheme and key.
class ParamView {
 public:
  ParamView() = default;
  ParamView(std::string scheme, std::map<std::string, ParamValue> values)
      : scheme_(std::move(scheme)), values_(std::move(values)) {}

  const std::string& scheme() const { return scheme_; }
  const std::map<std::string, ParamValue>& values() const { return values_; }

  bool flag(const std::string& key) const { return get(key, ParamType::Bool).b; }
  int64_t integer(const std::string& key) const { return get(key, ParamType::Int).i; }
  double number(const std::string& key) const {
    const ParamValue& v = find(key);
    if (v.type == ParamType::Int) return double(v.i);
    return get(key, ParamType::Float).f;
  }
  const std::string& text(const std::string& key) const { return get(key, ParamType::String).s; }

 private:
  const ParamValue& find(const std::string& key) const {
    auto it = values_.find(key);
    if (it == values_.end())
      throw std::invalid_argument("scheme '" + scheme_ + "': no parameter '" + key + "'");
    return it->second;
  }
  const ParamValue& get(const std::string& key, ParamType want) const {
    const ParamValue& v = find(key);
    if (v.type != want)
      throw std::invalid_argument("scheme '" + scheme_ + "': parameter '" + key + "' is " +
                                  to_string(v.type) + ", read as " + to_string(want));
    return v;
  }

  std::string scheme_;
  std::map<std::string, ParamValue> values_;
};

}  // namespace normlab
