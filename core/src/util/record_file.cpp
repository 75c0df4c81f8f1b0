#include "util/record_file.h"

#include <fmt/format.h>

#include <cerrno>
#include <cstring>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>

#include "util/atomic_file.h"

namespace fs = std::filesystem;

namespace normlab::util {

JsonlLog::JsonlLog(const fs::path& path) : path_(path), f_(path, std::ios::app) { check(); }

void JsonlLog::write(const nlohmann::json& j) {
  f_ << j.dump() << '\n';
  f_.flush();
  check();
}

void JsonlLog::check() {
  if (!f_)
    throw FileError(fmt::format("cannot write {}: {}", path_.string(), std::strerror(errno)));
}

nlohmann::json read_json_file(const fs::path& path) {
  std::ifstream f(path);
  if (!f) return nlohmann::json();
  return nlohmann::json::parse(f, nullptr, /*allow_exceptions=*/false);
}

std::optional<nlohmann::json> find_record(const fs::path& file, const std::string& kind,
                                          int64_t update) {
  std::ifstream in(file);
  std::optional<nlohmann::json> found;
  std::string line;
  while (std::getline(in, line)) {
    auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (j.is_object() && j.value("kind", "") == kind && j.contains("update") &&
        j["update"].is_number_integer() && j["update"].get<int64_t>() == update)
      found = std::move(j);
  }
  return found;
}

void drop_records_after(const fs::path& file, int64_t update) {
  if (!fs::exists(file)) return;
  std::ifstream in(file);
  const bool csv = file.extension() == ".csv";
  std::ostringstream kept, dropped;
  std::string line;
  bool first = true, changed = false;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    bool keep = true;
    if (csv && first) {
      keep = true;  // the header
    } else if (csv) {
      const auto comma = line.find(',');
      try {
        keep = std::stoll(line.substr(0, comma)) <= update;
      } catch (const std::exception&) {
        keep = false;  // a line cut by a kill
      }
    } else {
      const auto j = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
      keep = j.is_object() && j.contains("update") && j["update"].is_number_integer() &&
             j["update"].get<int64_t>() <= update;
    }
    first = false;
    if (keep)
      kept << line << '\n';
    else {
      dropped << line << '\n';
      changed = true;
    }
  }
  if (!changed) return;
  // Nothing written is lost: the dropped rows go to <stem>.discarded<ext>.
  fs::path discarded = file;
  discarded.replace_filename(file.stem().string() + ".discarded" + file.extension().string());
  std::ofstream(discarded, std::ios::app) << dropped.str();
  write_file_atomically(file, kept.str());
}

}  // namespace normlab::util
