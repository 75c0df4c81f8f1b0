// OLMo 2's spike score of a training series (Team OLMo, "2 OLMo 2 Furious", arXiv:2501.00656):
// the percentage of values at least 7 standard deviations away from the mean of the values before
// them, at most 1000 of them. docs/analysis.md#loss-spikes states the definition and edge cases.
#pragma once

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <nlohmann/json_fwd.hpp>
#include <string>
#include <vector>

namespace normlab {

struct SpikeScoreRule {
  size_t window = 1000;      // previous values averaged (the paper's rolling window)
  double sigmas = 7;         // distance, in standard deviations of the window
  size_t min_previous = 20;  // values before one scores (fewer: not scored)
};

struct SpikeScore {
  double percent = -1;  // 100 · spikes / scored; -1 when nothing was scored
  int64_t spikes = 0, scored = 0;
  std::vector<size_t> at;  // the spikes' indices in the series
};

// Non-finite values are skipped: neither scored nor in any window.
SpikeScore spike_score(const std::vector<double>& series, const SpikeScoreRule& rule = {});

// The spike scores of a run: the training cross-entropy (`nll`) and the gradient norm (`gnorm`) of
// train.jsonl's "train" records, in file order.
struct RunSpikeScores {
  SpikeScore loss, gnorm;
};
struct TrainSeries {
  std::vector<double> nll, gnorm;
  // Adds one train.jsonl record (any but a "train" record is ignored; a missing number is NaN).
  void add(const nlohmann::json& record);
  void add_line(const std::string& line);
  RunSpikeScores scores() const { return {spike_score(nll), spike_score(gnorm)}; }
};
RunSpikeScores run_spike_scores(const std::filesystem::path& train_jsonl);

}  // namespace normlab
