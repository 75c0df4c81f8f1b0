// The stability frontier's search (`normlab frontier`): per scheme and depth, the largest peak
// learning rate that trains without divergence. Pure logic, no LibTorch and no files: the command
// supplies what each trial (lr, seed) did, so the decisions are recomputed from the recorded
// trials on every rerun (resume), and a test drives it with a synthetic stability predicate.
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

namespace normlab::frontier {

// "3e-4:3e-1" → {3e-4, 3e-1}; throws std::invalid_argument saying what was expected.
struct LrRange {
  double min = 0, max = 0;
};
LrRange parse_lr_range(const std::string& text);

// The value trials use for `lr`: 4 significant digits, so a trial's id, its manifest and every
// rerun's search name the same number.
double round_lr(double lr);

// lr_min·10^(k/2), k = 0, 1, … up to lr_max (rounded; lr_max itself only when it is on the grid).
std::vector<double> half_decade_grid(double lr_min, double lr_max);

// What one finished trial did. Unstable: the trainer marked it diverged, or its final training
// loss is not below its initial loss. final_loss is NaN for a diverged trial.
struct Trial {
  bool stable = false;
  double initial_loss = 0;
  double final_loss = 0;
};
// The recorded trial at (lr, seed); nullopt while it has not finished.
using TrialLookup = std::function<std::optional<Trial>(double lr, int seed)>;

enum class Verdict {
  Searching,   // trials still to run (`needed`)
  Frontier,    // max_stable_lr < frontier <= min_unstable_lr, both set
  AllStable,   // every grid lr stable: the frontier is above the range (min_unstable_lr unset)
  NoneStable,  // the smallest grid lr is unstable: below the range (max_stable_lr unset)
};
std::string verdict_name(Verdict v);  // searching | frontier | all_stable | none_stable

struct CellSearch {
  Verdict verdict = Verdict::Searching;
  std::optional<double> max_stable_lr, min_unstable_lr;  // the bracket so far
  // A grid lr above the first unstable one was stable again. The frontier is still the first
  // unstable grid lr from below (training at any lr up to max_stable_lr worked).
  bool non_monotone = false;
  std::vector<double> needed;            // lrs to run next (every seed), in order
  int bisect_done = 0;                   // bisection steps whose midpoint was decided
  std::optional<double> lr_sensitivity;  // once the whole grid is known
  // The best of the grid's L(lr) (see lr_sensitivity): a low sensitivity means little when this
  // is high (a model that trains at no lr is insensitive too).
  std::optional<double> best_loss;
};

// The search of one cell: first every grid lr with every seed (stable at an lr = stable for
// every seed), then up to `bisect_steps` bisections in log space between the largest stable grid
// lr below the first unstable one and that unstable one.
CellSearch search_cell(const std::vector<double>& grid, int bisect_steps,
                       const std::vector<int>& seeds, const TrialLookup& lookup);

// Wortsman et al. 2023's LR sensitivity over the grid: with L(lr) the mean over seeds of
// min(final loss, initial loss) (a diverged trial counts as its initial loss),
// mean over the grid of L(lr) − min over the grid of L(lr). `per_lr` holds each grid lr's trials.
double lr_sensitivity(const std::vector<std::vector<Trial>>& per_lr);
// L(lr) per grid lr (the lrs without trials left out).
std::vector<double> clipped_losses(const std::vector<std::vector<Trial>>& per_lr);

}  // namespace normlab::frontier
