// How a TOML value is named in error messages ("got integer 3", "got an array of 2"), shared by
// the manifest loader and the sweep expansion so both speak alike.
#pragma once

#include <fmt/format.h>

#include <cstdint>
#include <string>
#include <toml++/toml.h>

namespace normlab {

inline std::string describe_toml_value(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string: return fmt::format("string \"{}\"", *n.value<std::string>());
    case toml::node_type::integer: return fmt::format("integer {}", *n.value<int64_t>());
    case toml::node_type::floating_point: return fmt::format("float {}", *n.value<double>());
    case toml::node_type::boolean: return fmt::format("bool {}", *n.value<bool>() ? "true" : "false");
    case toml::node_type::table: return "a table";
    case toml::node_type::array: return fmt::format("an array of {}", n.as_array()->size());
    default: return "a date/time";
  }
}

}  // namespace normlab
