// Tidy analysis records (update, metric, stack, layer, sublayer, value), written as the run goes
// to analysis.csv and/or analysis.jsonl and TensorBoard, flushed after every probe step.
#pragma once

#include <cstdint>
#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

namespace normlab::analysis {

class TensorBoardWriter;

struct Record {
  int64_t update = 0;
  std::string metric;    // grad_norm, update_norm, … (docs/analysis.md)
  std::string stack;     // encoder | decoder | model
  int layer = -1;        // 0-based layer index; -1: not a layer (embeddings, output, totals)
  std::string sublayer;  // self_attn | cross_attn | ffn | <norm name>[.in|.out] | output | all | …
  double value = 0.0;
};

// Which record files a MetricLog writes ([analysis] formats).
struct RecordFormats {
  bool csv = true, jsonl = false, tensorboard = false;
};

class MetricLog {
 public:
  // Appends to <dir>/analysis.{jsonl,csv} (those `formats` names); rows of updates after
  // `keep_until` (a resumed run's checkpoint) are dropped first (util::drop_records_after), so a
  // resumed run neither loses nor repeats records.
  MetricLog(const std::filesystem::path& dir, RecordFormats formats, int64_t keep_until);
  ~MetricLog();

  void write(const Record& r);
  // A TensorBoard-only scalar (training curves), when TensorBoard output is on.
  void scalar(const std::string& tag, int64_t step, double value);
  void flush();

 private:
  std::ofstream jsonl_, csv_;
  std::unique_ptr<TensorBoardWriter> tb_;
};

}  // namespace normlab::analysis
