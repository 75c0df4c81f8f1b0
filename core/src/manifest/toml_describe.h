// How a TOML value is named in error messages ("got integer 3", "got an array of 2"), and how a
// manifest file is read, shared by the manifest loader and the sweep expansion so both speak alike.
#pragma once

#include <fmt/format.h>
#include <toml++/toml.h>

#include <cstdint>
#include <filesystem>
#include <string>

#include "normlab/manifest/experiment.h"

namespace normlab {

// The manifest's TOML tree; ManifestError naming the path when it is missing, not a regular file
// (toml++ reads a directory as an empty manifest: every default, no error) or not valid TOML.
inline toml::table parse_manifest_file(const std::string& path) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  if (!std::filesystem::exists(status))
    throw ManifestError(fmt::format("{}: no such manifest file", path));
  if (std::filesystem::is_directory(status))
    throw ManifestError(fmt::format("{}: is a directory, expected a manifest file (.toml)", path));
  if (!std::filesystem::is_regular_file(status))
    throw ManifestError(
        fmt::format("{}: not a regular file, expected a manifest file (.toml)", path));
  try {
    return toml::parse_file(path);
  } catch (const toml::parse_error& e) {
    throw ManifestError(fmt::format("{}:{}:{}: TOML syntax error: {}", path, e.source().begin.line,
                                    e.source().begin.column, e.description()));
  }
}

inline std::string describe_toml_value(const toml::node& n) {
  switch (n.type()) {
    case toml::node_type::string:
      return fmt::format("string \"{}\"", *n.value<std::string>());
    case toml::node_type::integer:
      return fmt::format("integer {}", *n.value<int64_t>());
    case toml::node_type::floating_point:
      return fmt::format("float {}", *n.value<double>());
    case toml::node_type::boolean:
      return fmt::format("bool {}", *n.value<bool>() ? "true" : "false");
    case toml::node_type::table:
      return "a table";
    case toml::node_type::array:
      return fmt::format("an array of {}", n.as_array()->size());
    default:
      return "a date/time";
  }
}

}  // namespace normlab
