#include "util/owned_dir.h"

#include <fmt/format.h>

#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <vector>

#include "util/atomic_file.h"

namespace fs = std::filesystem;

namespace normlab::util {

std::string owner_kind(const fs::path& dir) {
  std::ifstream f(dir / kOwnerMarker);
  if (!f) return "";
  std::stringstream text;
  text << f.rdbuf();
  const auto j = nlohmann::json::parse(text.str(), nullptr, /*allow_exceptions=*/false);
  if (!j.is_object() || !j.contains("normlab") || !j["normlab"].is_string()) return "";
  return j["normlab"].get<std::string>();
}

std::string claim_problem(const fs::path& dir, const std::string& kind,
                          const std::function<bool(const fs::path&)>& legacy) {
  std::error_code ec;
  const auto st = fs::symlink_status(dir, ec);
  if (ec || st.type() == fs::file_type::not_found) return "";
  if (!fs::is_directory(dir, ec)) return "exists and is not a folder";
  std::vector<std::string> names;
  size_t count = 0;
  for (fs::directory_iterator it(dir, ec), end; !ec && it != end; it.increment(ec)) {
    if (++count <= 3) names.push_back(it->path().filename().string());
  }
  if (ec) return fmt::format("cannot be read: {}", ec.message());
  if (count == 0) return "";
  const std::string owner = owner_kind(dir);
  if (owner == kind) return "";
  if (!owner.empty())
    return fmt::format("is a normlab {} folder, not a {} folder ({} says \"{}\")", owner, kind,
                       kOwnerMarker, owner);
  if (legacy && legacy(dir)) return "";
  std::string some;
  for (size_t i = 0; i < names.size(); ++i) some += (i ? ", " : "") + names[i];
  return fmt::format(
      "is neither empty nor a folder normlab made (it holds {} entr{}, e.g. {}, and no {}); "
      "nothing was written: choose a new or empty folder",
      count, count == 1 ? "y" : "ies", some, kOwnerMarker);
}

void claim_directory(const fs::path& dir, const std::string& kind, const std::string& what,
                     const std::function<bool(const fs::path&)>& legacy) {
  if (const std::string problem = claim_problem(dir, kind, legacy); !problem.empty())
    throw DirectoryClaimError(fmt::format("{} {}: {}", what, dir.string(), problem));
  std::error_code ec;
  fs::create_directories(dir, ec);
  if (ec)
    throw DirectoryClaimError(
        fmt::format("{} {}: cannot create it: {}", what, dir.string(), ec.message()));
  if (owner_kind(dir) == kind) return;
  try {
    write_file_atomically(dir / kOwnerMarker, nlohmann::json{{"normlab", kind}}.dump() + "\n");
  } catch (const FileError& e) {
    throw DirectoryClaimError(fmt::format("{} {}: {}", what, dir.string(), e.what()));
  }
}

}  // namespace normlab::util
