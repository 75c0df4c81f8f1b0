// Append-only record files of a run (train.jsonl, analysis.csv/.jsonl): one record per line,
// flushed as written, and cut back to a checkpoint when a run resumes. No LibTorch here.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json_fwd.hpp>
#include <optional>
#include <string>

namespace normlab::util {

// Appends one JSON object per line, flushed, so a killed run keeps everything logged; a failed
// write (full disk) throws FileError with the path and the cause.
class JsonlLog {
 public:
  explicit JsonlLog(const std::filesystem::path& path);
  void write(const nlohmann::json& j);

 private:
  void check();
  std::filesystem::path path_;
  std::ofstream f_;
};

// Rewrites a JSONL or CSV record file (atomically) without the rows whose "update" is greater than
// `update` (or that a kill cut short); they are appended to <stem>.discarded<ext>. A missing file
// is left missing. For CSV, the first line is the header and stays.
void drop_records_after(const std::filesystem::path& file, int64_t update);

// The JSON value of a whole file (status.json, sweep.json); null when the file is missing or is not
// JSON (a reader then says what it lacks).
nlohmann::json read_json_file(const std::filesystem::path& path);

// The last JSONL record of `file` with this "kind" and "update" (a resumed run's end phase: what
// was already logged for the final update is not logged again); nullopt when there is none.
std::optional<nlohmann::json> find_record(const std::filesystem::path& file,
                                          const std::string& kind, int64_t update);

}  // namespace normlab::util
