// The stability frontier's search (normlab/sweep/frontier.h) driven by synthetic stability
// predicates: no training, no LibTorch, so it runs in milliseconds.
#include <doctest/doctest.h>

#include <cmath>
#include <map>
#include <stdexcept>

#include "normlab/sweep/frontier.h"

using namespace normlab::frontier;

namespace {

// Runs the search to the end, "training" every trial it asks for with `stable(lr, seed)`, as the
// command does round by round. Returns the final search and counts the trials.
struct Simulation {
  std::map<std::pair<double, int>, Trial> done;
  int rounds = 0;
};
template <class Pred>
CellSearch simulate(const std::vector<double>& grid, int bisect, const std::vector<int>& seeds,
                    Pred stable, Simulation* sim) {
  auto lookup = [&](double lr, int seed) -> std::optional<Trial> {
    auto it = sim->done.find({lr, seed});
    if (it == sim->done.end()) return std::nullopt;
    return it->second;
  };
  for (;;) {
    CellSearch s = search_cell(grid, bisect, seeds, lookup);
    if (s.needed.empty()) return s;
    ++sim->rounds;
    REQUIRE(sim->rounds < 100);
    for (const double lr : s.needed)
      for (const int seed : seeds) {
        REQUIRE(sim->done.count({lr, seed}) == 0);  // never the same trial twice
        const bool ok = stable(lr, seed);
        // A stable trial ends lower the closer it is to lr 0.01; an unstable one diverged (NaN).
        sim->done[{lr, seed}] =
            Trial{ok, 5.0, ok ? 2.0 + std::fabs(std::log10(lr) + 2) : std::nan("")};
      }
  }
}

}  // namespace

TEST_SUITE("frontier") {
  TEST_CASE("the half-decade grid runs from lr_min by factors of sqrt(10) up to lr_max") {
    const auto g = half_decade_grid(3e-4, 3e-1);
    REQUIRE(g.size() == 7);
    CHECK(g.front() == doctest::Approx(3e-4));
    CHECK(g[1] == doctest::Approx(9.487e-4));
    CHECK(g.back() == doctest::Approx(3e-1));
    for (size_t i = 1; i < g.size(); ++i)
      CHECK(g[i] / g[i - 1] == doctest::Approx(std::sqrt(10.0)).epsilon(1e-3));
    CHECK(half_decade_grid(1e-3, 5e-3).size() == 2);  // 1e-3, 3.162e-3; 1e-2 is past the end
    CHECK(round_lr(0.0009486832980505138) == 0.0009487);
  }

  TEST_CASE("bad --lr ranges are one clear message") {
    CHECK_THROWS_WITH_AS(parse_lr_range("3e-1:3e-4"), doctest::Contains("expected MIN < MAX"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(parse_lr_range("0.001"), doctest::Contains("expected MIN:MAX"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(parse_lr_range("-1:2"), doctest::Contains("positive"),
                         std::invalid_argument);
    CHECK_THROWS_WITH_AS(parse_lr_range("1e-3:x"), doctest::Contains("expected MIN:MAX"),
                         std::invalid_argument);
    const auto r = parse_lr_range("3e-4:3e-1");
    CHECK(r.min == 3e-4);
    CHECK(r.max == 3e-1);
  }

  TEST_CASE("a threshold at 0.013 is found within the bisection resolution") {
    const auto grid = half_decade_grid(3e-4, 3e-1);
    for (const int steps : {0, 1, 3, 6}) {
      CAPTURE(steps);
      Simulation sim;
      const auto s = simulate(
          grid, steps, {1, 2}, [](double lr, int) { return lr < 0.013; }, &sim);
      REQUIRE(s.verdict == Verdict::Frontier);
      REQUIRE(s.max_stable_lr);
      REQUIRE(s.min_unstable_lr);
      CHECK(*s.max_stable_lr < 0.013);
      CHECK(*s.min_unstable_lr >= 0.013);
      // Each step halves the bracket in log space (up to the 4-digit rounding).
      const double resolution = std::pow(10.0, 0.5 / std::pow(2.0, steps));
      CHECK(*s.min_unstable_lr / *s.max_stable_lr <= resolution * 1.001);
      CHECK(s.bisect_done == steps);
      // The grid (every lr, every seed) in one round, then one midpoint per round.
      CHECK(sim.rounds == 1 + steps);
      CHECK(sim.done.size() == 2 * (grid.size() + size_t(steps)));
      CHECK(!s.non_monotone);
    }
  }

  TEST_CASE("an lr is stable only when every seed is") {
    const auto grid = half_decade_grid(3e-4, 3e-1);
    Simulation sim;
    // Seed 2 breaks earlier (0.004) than seed 1 (0.05): the frontier is seed 2's.
    const auto s = simulate(
        grid, 4, {1, 2}, [](double lr, int seed) { return lr < (seed == 1 ? 0.05 : 0.004); }, &sim);
    REQUIRE(s.verdict == Verdict::Frontier);
    CHECK(*s.max_stable_lr < 0.004);
    CHECK(*s.min_unstable_lr >= 0.004);
  }

  TEST_CASE("a non-monotone predicate: the frontier is the first unstable lr from below, flagged") {
    const auto grid = half_decade_grid(3e-4, 3e-1);
    Simulation sim;
    // Unstable only in [0.002, 0.005): the grid point 0.003 fails, 0.0095 and above train again.
    const auto s = simulate(
        grid, 2, {1, 2}, [](double lr, int) { return !(lr >= 0.002 && lr < 0.005); }, &sim);
    REQUIRE(s.verdict == Verdict::Frontier);
    CHECK(s.non_monotone);
    CHECK(*s.max_stable_lr < 0.002);
    CHECK(*s.min_unstable_lr >= 0.002);
    CHECK(*s.min_unstable_lr <= 0.003);
  }

  TEST_CASE("all stable and none stable are verdicts, not a frontier value") {
    const auto grid = half_decade_grid(3e-4, 3e-1);
    {
      Simulation sim;
      const auto s = simulate(
          grid, 3, {1, 2}, [](double, int) { return true; }, &sim);
      CHECK(s.verdict == Verdict::AllStable);
      CHECK(verdict_name(s.verdict) == "all_stable");
      CHECK(!s.min_unstable_lr);
      CHECK(*s.max_stable_lr == grid.back());
      CHECK(sim.rounds == 1);  // nothing to bisect
    }
    {
      Simulation sim;
      const auto s = simulate(
          grid, 3, {1, 2}, [](double, int) { return false; }, &sim);
      CHECK(s.verdict == Verdict::NoneStable);
      CHECK(verdict_name(s.verdict) == "none_stable");
      CHECK(!s.max_stable_lr);
      CHECK(*s.min_unstable_lr == grid.front());
      CHECK(sim.rounds == 1);
    }
  }

  TEST_CASE(
      "the search resumes from recorded trials: a partial record asks only for what is missing") {
    const auto grid = half_decade_grid(3e-4, 3e-1);
    Simulation sim;
    auto pred = [](double lr, int) { return lr < 0.013; };
    simulate(grid, 2, {1, 2}, pred, &sim);
    // Forget one seed of the first midpoint: the search asks for exactly that lr again.
    const double mid = round_lr(std::sqrt(grid[3] * grid[4]));
    REQUIRE(sim.done.erase({mid, 2}) == 1);
    auto lookup = [&](double lr, int seed) -> std::optional<Trial> {
      auto it = sim.done.find({lr, seed});
      if (it == sim.done.end()) return std::nullopt;
      return it->second;
    };
    const auto s = search_cell(grid, 2, {1, 2}, lookup);
    CHECK(s.verdict == Verdict::Searching);
    REQUIRE(s.needed.size() == 1);
    CHECK(s.needed[0] == mid);
    CHECK(s.lr_sensitivity);  // the grid is complete
    // The best L(lr): 2.0 at lr 0.009487, the grid point nearest 0.01 (see simulate()).
    REQUIRE(s.best_loss);
    CHECK(*s.best_loss == doctest::Approx(2.0 + std::fabs(std::log10(0.009487) + 2)));
  }

  TEST_CASE("LR sensitivity: mean over the grid of min(final, initial) minus the best") {
    // Three lrs, two seeds, initial loss 5: finals (2, 2.2), (3, 3), diverged (counts as 5).
    const std::vector<std::vector<Trial>> per_lr = {{{true, 5, 2.0}, {true, 5, 2.2}},
                                                    {{true, 5, 3.0}, {true, 5, 3.0}},
                                                    {{false, 5, std::nan("")}, {false, 5, 7.0}}};
    // L = 2.1, 3, 5; mean 3.3667; best 2.1.
    CHECK(lr_sensitivity(per_lr) == doctest::Approx((2.1 + 3 + 5) / 3 - 2.1));
    // A stable trial that ends above its initial loss is clipped to it.
    CHECK(lr_sensitivity({{{true, 5, 2.0}}, {{true, 5, 9.0}}}) == doctest::Approx(1.5));
    // Flat: the same loss everywhere is insensitive.
    CHECK(lr_sensitivity({{{true, 5, 2.0}}, {{true, 5, 2.0}}}) == doctest::Approx(0));
    const auto l = clipped_losses(per_lr);
    REQUIRE(l.size() == 3);
    CHECK(l[0] == doctest::Approx(2.1));
    CHECK(l[2] == doctest::Approx(5.0));
  }

}  // TEST_SUITE
