#include "train/spike_score.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

namespace normlab {

SpikeScore spike_score(const std::vector<double>& series, const SpikeScoreRule& rule) {
  SpikeScore out;
  std::vector<size_t> finite;  // indices of the finite values: the series scored
  for (size_t i = 0; i < series.size(); ++i)
    if (std::isfinite(series[i])) finite.push_back(i);
  if (finite.empty()) return out;
  // Sliding sums of (x − shift): the window's mean and variance without a pass over it. They are
  // taken afresh about the window's median once per window, and when a value leaves that dwarfs
  // what stays (a huge early gradient norm), whose rounding would swamp the variance left.
  const size_t window = std::max<size_t>(rule.window, 1);
  double shift = series[finite[0]], sum = 0, sum_sq = 0;
  std::vector<double> scratch;
  auto resum = [&](size_t from, size_t to) {  // finite[from, to): the window
    scratch.clear();
    for (size_t j = from; j < to; ++j) scratch.push_back(series[finite[j]]);
    std::nth_element(scratch.begin(), scratch.begin() + scratch.size() / 2, scratch.end());
    shift = scratch[scratch.size() / 2];
    sum = sum_sq = 0;
    for (size_t j = from; j < to; ++j) {
      const double d = series[finite[j]] - shift;
      sum += d, sum_sq += d * d;
    }
  };
  for (size_t k = 0; k < finite.size(); ++k) {
    const size_t n = std::min(k, window);  // the previous values in the window
    if (n > 0 && k % window == 0) resum(k - n, k);
    const double x = series[finite[k]] - shift;
    if (n >= rule.min_previous && n > 0) {
      const double mean = sum / double(n);
      const double var = std::max(0.0, sum_sq / double(n) - mean * mean);
      const double distance = std::abs(x - mean);
      ++out.scored;
      if (distance > 0 && distance >= rule.sigmas * std::sqrt(var)) {
        ++out.spikes;
        out.at.push_back(finite[k]);
      }
    }
    sum += x, sum_sq += x * x;
    if (k >= window) {  // the oldest value leaves the window
      const double old = series[finite[k - window]] - shift;
      sum -= old, sum_sq -= old * old;
      if (old * old > 1e6 * sum_sq) resum(k + 1 - window, k + 1);
    }
  }
  if (out.scored > 0) out.percent = 100.0 * double(out.spikes) / double(out.scored);
  return out;
}

void TrainSeries::add_line(const std::string& line) {
  add(nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false));
}

void TrainSeries::add(const nlohmann::json& j) {
  if (!j.is_object() || j.value("kind", "") != "train") return;
  auto number = [&](const char* key) {
    const auto it = j.find(key);
    return it != j.end() && it->is_number() ? it->get<double>()
                                            : std::numeric_limits<double>::quiet_NaN();
  };
  nll.push_back(number("nll"));
  gnorm.push_back(number("gnorm"));
}

RunSpikeScores run_spike_scores(const std::filesystem::path& train_jsonl) {
  TrainSeries s;
  std::ifstream f(train_jsonl);
  for (std::string line; std::getline(f, line);) s.add_line(line);
  return s.scores();
}

}  // namespace normlab
