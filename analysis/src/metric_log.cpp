#include "normlab/analysis/metric_log.h"

#include <fmt/format.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "normlab/analysis/tensorboard_writer.h"
#include "util/record_file.h"

namespace fs = std::filesystem;

namespace normlab::analysis {
namespace {

constexpr const char* kCsvHeader = "update,metric,stack,layer,sublayer,value";

std::string tensorboard_tag(const Record& r) {
  std::string tag = r.metric + "/" + r.stack;
  if (r.layer >= 0) tag += "/" + std::to_string(r.layer);
  if (!r.sublayer.empty()) tag += "/" + r.sublayer;
  return tag;
}

// CSV field quoting (RFC 4180) for names that might hold a comma or quote.
std::string csv_field(const std::string& s) {
  if (s.find_first_of(",\"\n") == std::string::npos) return s;
  std::string q = "\"";
  for (char c : s) q += c == '"' ? std::string("\"\"") : std::string(1, c);
  return q + "\"";
}

}  // namespace

MetricLog::MetricLog(const fs::path& dir, RecordFormats formats, int64_t keep_until) {
  fs::create_directories(dir);
  const fs::path jsonl = dir / "analysis.jsonl", csv = dir / "analysis.csv";
  util::drop_records_after(jsonl, keep_until);
  util::drop_records_after(csv, keep_until);
  const bool new_csv = !fs::exists(csv) || fs::file_size(csv) == 0;
  if (formats.jsonl) jsonl_.open(jsonl, std::ios::app);
  if (formats.csv) csv_.open(csv, std::ios::app);
  if ((formats.jsonl && !jsonl_) || (formats.csv && !csv_))
    throw std::runtime_error(fmt::format("cannot write analysis records in {}", dir.string()));
  if (formats.csv && new_csv) csv_ << kCsvHeader << '\n';
  if (formats.tensorboard) tb_ = std::make_unique<TensorBoardWriter>(dir / "tensorboard");
}

MetricLog::~MetricLog() { flush(); }

void MetricLog::write(const Record& r) {
  if (jsonl_.is_open()) {
    nlohmann::json j = {{"update", r.update}, {"metric", r.metric},     {"stack", r.stack},
                        {"layer", r.layer},   {"sublayer", r.sublayer}, {"value", r.value}};
    // JSON has no NaN/inf: a non-finite value is written as null (CSV keeps nan/inf).
    if (!std::isfinite(r.value)) j["value"] = nullptr;
    jsonl_ << j.dump() << '\n';
  }
  if (csv_.is_open())
    csv_ << fmt::format("{},{},{},{},{},{:.9g}\n", r.update, r.metric, r.stack, r.layer,
                        csv_field(r.sublayer), r.value);
  if (tb_) tb_->scalar(tensorboard_tag(r), r.update, r.value);
}

void MetricLog::scalar(const std::string& tag, int64_t step, double value) {
  if (tb_) tb_->scalar(tag, step, value);
}

void MetricLog::flush() {
  if (jsonl_.is_open()) jsonl_.flush();
  if (csv_.is_open()) csv_.flush();
  if (tb_) tb_->flush();
}

}  // namespace normlab::analysis
