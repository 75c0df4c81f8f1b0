// The stability frontier's search: half-decade grid, log-space bisection, LR sensitivity.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <stdexcept>
#include <string>

#include "normlab/sweep/frontier.h"

namespace normlab::frontier {
namespace {

bool parse_positive(const std::string& s, double* v) {
  try {
    size_t used = 0;
    *v = std::stod(s, &used);
    return used == s.size() && std::isfinite(*v) && *v > 0;
  } catch (const std::exception&) {
    return false;
  }
}

}  // namespace

LrRange parse_lr_range(const std::string& text) {
  const auto colon = text.find(':');
  LrRange r;
  if (colon == std::string::npos || !parse_positive(text.substr(0, colon), &r.min) ||
      !parse_positive(text.substr(colon + 1), &r.max))
    throw std::invalid_argument(
        fmt::format("--lr '{}': expected MIN:MAX, two positive numbers (e.g. 3e-4:3e-1)", text));
  if (!(r.min < r.max))
    throw std::invalid_argument(fmt::format("--lr '{}': expected MIN < MAX", text));
  if (r.max > 10)
    throw std::invalid_argument(
        fmt::format("--lr '{}': expected MAX <= 10 (optim.lr's range)", text));
  return r;
}

double round_lr(double lr) { return std::stod(fmt::format("{:.4g}", lr)); }

std::vector<double> half_decade_grid(double lr_min, double lr_max) {
  std::vector<double> grid;
  // A relative tolerance so that 3e-4 → 3e-1 ends on 3e-1 despite rounding.
  for (int k = 0;; ++k) {
    const double lr = lr_min * std::pow(10.0, 0.5 * k);
    if (lr > lr_max * (1 + 1e-9)) break;
    grid.push_back(round_lr(lr));
  }
  return grid;
}

std::string verdict_name(Verdict v) {
  switch (v) {
    case Verdict::Searching:
      return "searching";
    case Verdict::Frontier:
      return "frontier";
    case Verdict::AllStable:
      return "all_stable";
    case Verdict::NoneStable:
      return "none_stable";
  }
  return "?";
}

std::vector<double> clipped_losses(const std::vector<std::vector<Trial>>& per_lr) {
  std::vector<double> clipped;
  for (const auto& trials : per_lr) {
    if (trials.empty()) continue;
    double sum = 0;
    for (const auto& t : trials)
      sum += t.stable && std::isfinite(t.final_loss) ? std::min(t.final_loss, t.initial_loss)
                                                     : t.initial_loss;
    clipped.push_back(sum / double(trials.size()));
  }
  return clipped;
}

double lr_sensitivity(const std::vector<std::vector<Trial>>& per_lr) {
  const std::vector<double> clipped = clipped_losses(per_lr);
  if (clipped.empty()) return 0;
  double mean = 0;
  for (const double c : clipped) mean += c;
  mean /= double(clipped.size());
  return mean - *std::min_element(clipped.begin(), clipped.end());
}

CellSearch search_cell(const std::vector<double>& grid, int bisect_steps,
                       const std::vector<int>& seeds, const TrialLookup& lookup) {
  CellSearch out;
  // Every seed of lr known: its trials; else nullopt.
  auto trials_at = [&](double lr) -> std::optional<std::vector<Trial>> {
    std::vector<Trial> ts;
    for (const int seed : seeds) {
      const auto t = lookup(lr, seed);
      if (!t) return std::nullopt;
      ts.push_back(*t);
    }
    return ts;
  };
  auto all_stable = [](const std::vector<Trial>& ts) {
    return std::all_of(ts.begin(), ts.end(), [](const Trial& t) { return t.stable; });
  };

  std::vector<std::vector<Trial>> per_lr;
  for (const double lr : grid) {
    auto ts = trials_at(lr);
    if (!ts)
      out.needed.push_back(lr);
    else
      per_lr.push_back(std::move(*ts));
  }
  if (!out.needed.empty()) return out;
  out.lr_sensitivity = lr_sensitivity(per_lr);
  const std::vector<double> clipped = clipped_losses(per_lr);
  if (!clipped.empty()) out.best_loss = *std::min_element(clipped.begin(), clipped.end());

  size_t first_unstable = grid.size();
  for (size_t i = 0; i < grid.size() && first_unstable == grid.size(); ++i)
    if (!all_stable(per_lr[i])) first_unstable = i;
  if (first_unstable == grid.size()) {
    out.verdict = Verdict::AllStable;
    out.max_stable_lr = grid.back();
    return out;
  }
  for (size_t j = first_unstable + 1; j < grid.size(); ++j)
    out.non_monotone = out.non_monotone || all_stable(per_lr[j]);
  out.min_unstable_lr = grid[first_unstable];
  if (first_unstable == 0) {
    out.verdict = Verdict::NoneStable;
    return out;
  }
  double lo = grid[first_unstable - 1], hi = grid[first_unstable];
  out.max_stable_lr = lo;
  for (int step = 0; step < bisect_steps; ++step) {
    const double mid = round_lr(std::sqrt(lo * hi));
    if (!(mid > lo && mid < hi)) break;  // the 4-digit rounding leaves nothing in between
    const auto ts = trials_at(mid);
    if (!ts) {
      out.needed.push_back(mid);
      return out;
    }
    (all_stable(*ts) ? lo : hi) = mid;
    out.max_stable_lr = lo;
    out.min_unstable_lr = hi;
    ++out.bisect_done;
  }
  out.verdict = Verdict::Frontier;
  return out;
}

}  // namespace normlab::frontier
