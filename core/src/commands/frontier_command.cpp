// `normlab frontier`: per scheme and depth, the largest peak learning rate that trains K updates
// without divergence. The search (grid, bisection, sensitivity) is normlab/sweep/frontier.h; this
// file turns its decisions into trials, runs them with the sweep driver (worker processes,
// --jobs, run locks, resume) and writes frontier.json / frontier.csv.
#include <fmt/format.h>
#include <fmt/ostream.h>
#include <fmt/ranges.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <ostream>
#include <set>
#include <sstream>

#include "commands/commands.h"
#include "input_errors.h"
#include "normlab/manifest/experiment.h"
#include "normlab/sweep/frontier.h"
#include "normlab/sweep/sweep.h"
#include "util/atomic_file.h"
#include "util/owned_dir.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace normlab {
namespace {

constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
// A trial whose training nll rises above this times its initial nll has diverged.
constexpr double kSpikeFactor = 1.1;

std::string lr_text(double lr) { return fmt::format("{:.4g}", lr); }

// What a trial's run directory says once it has finished (completed or diverged).
struct TrialRecord {
  std::string id, status, note;
  double lr = 0;
  int seed = 0;
  int64_t updates = 0;
  double initial_loss = kNaN;  // training nll of update 1 (the initialization: before any step)
  double final_loss = kNaN;    // mean training nll of the last tenth of the updates
  double peak_loss = kNaN;     // highest training nll after update 1
  bool stable = false;
};

struct Cell {
  std::string scheme;
  int64_t depth = 0;
  frontier::CellSearch search;
  std::map<std::pair<double, int>, TrialRecord> trials;  // finished trials read so far
};

class Frontier {
 public:
  Frontier(const FrontierOptions& opt, std::ostream& out) : opt_(opt), out_(out) {}

  int run() {
    validate_options();
    load_base();
    for (const auto& s : opt_.schemes)
      for (const auto d : opt_.depths) cells_.push_back(Cell{s, d, {}, {}});
    for (int round = 0;; ++round) {
      std::vector<std::pair<size_t, double>> todo;  // (cell, lr) with a seed not finished
      for (size_t c = 0; c < cells_.size(); ++c) {
        search(cells_[c]);
        for (const double lr : cells_[c].search.needed) todo.emplace_back(c, lr);
      }
      if (todo.empty()) break;
      SweepPlan plan = trial_plan(todo);
      if (opt_.dry_run) {
        print_dry_run(plan, round);
        return 0;
      }
      claim_folder();
      fmt::print(out_, "[frontier] round {}: {} trial(s) of {} lr value(s) to finish\n", round + 1,
                 plan.runs.size(), todo.size());
      out_.flush();
      SweepDriverOptions d;
      d.jobs = opt_.jobs;
      d.retry_failed = opt_.retry_failed;
      d.plugin_paths = opt_.plugin_paths;
      const std::string manifest = fs::absolute(opt_.manifest).lexically_normal().string();
      // Each trial is a `normlab train` of the base manifest with --set, the trial's keys last.
      d.worker_args = [&](const SweepRun& r) {
        std::vector<std::string> args = {"train", manifest};
        for (const auto& o : opt_.overrides) args.insert(args.end(), {"--set", o});
        for (const auto& o : r.overrides) args.insert(args.end(), {"--set", o});
        return args;
      };
      const int rc = run_sweep(plan, d, out_);
      if (rc != 0) {
        write_results();
        fmt::print(out_, "[frontier] stopped: {}; {} and frontier.csv hold what is known so far\n",
                   rc == 130 ? "interrupted (run the same command to resume)" : "a trial failed",
                   json_path());
        return rc;
      }
      if (round > 1000) throw std::runtime_error("the frontier search does not advance (a bug)");
    }
    if (opt_.dry_run) {
      fmt::print(out_,
                 "frontier of {}: every trial the search needs has finished (nothing to run)\n",
                 opt_.manifest);
      print_table(false);
      return 0;
    }
    write_results();
    print_table(true);
    return 0;
  }

 private:
  void validate_options() {
    if (opt_.schemes.empty()) throw ManifestError("--schemes: expected at least one scheme name");
    if (opt_.depths.empty()) throw ManifestError("--depths: expected at least one depth");
    for (const auto d : opt_.depths)
      if (d < 1)
        throw ManifestError(
            fmt::format("--depths: expected layer counts of at least 1, got {}", d));
    if (opt_.seeds.empty()) throw ManifestError("--seeds: expected at least one seed");
    for (const auto s : opt_.seeds)
      if (s < 0)
        throw ManifestError(fmt::format("--seeds: expected seeds of at least 0, got {}", s));
    if (std::set<int64_t>(opt_.seeds.begin(), opt_.seeds.end()).size() != opt_.seeds.size())
      throw ManifestError("--seeds: a seed is listed twice");
    if (std::set<int64_t>(opt_.depths.begin(), opt_.depths.end()).size() != opt_.depths.size())
      throw ManifestError("--depths: a depth is listed twice");
    if (std::set<std::string>(opt_.schemes.begin(), opt_.schemes.end()).size() !=
        opt_.schemes.size())
      throw ManifestError("--schemes: a scheme is listed twice");
    if (opt_.updates < 1)
      throw ManifestError(fmt::format("--updates {}: expected at least 1", opt_.updates));
    if (opt_.bisect < 0)
      throw ManifestError(fmt::format("--bisect {}: expected 0 or more", opt_.bisect));
    if (opt_.jobs < 1)
      throw ManifestError(fmt::format("--jobs {}: expected at least 1", opt_.jobs));
    try {
      range_ = frontier::parse_lr_range(opt_.lr);
    } catch (const std::invalid_argument& e) {
      throw ManifestError(e.what());
    }
    grid_ = frontier::half_decade_grid(range_.min, range_.max);
    if (grid_.size() < 2)
      throw ManifestError(fmt::format(
          "--lr '{}': expected a range of at least half a decade (MAX >= MIN x 3.17)", opt_.lr));
    // The keys each trial sets itself.
    for (const auto& o : opt_.overrides) {
      const std::string key = o.substr(0, o.find('='));
      for (const char* own : {"scheme", "model.enc_layers", "model.dec_layers", "optim.lr",
                              "optim.max_updates", "run.seed", "run.out_dir", "run.log_interval"})
        if (key == own || key.rfind(std::string(own) + ".", 0) == 0)
          throw ManifestError(fmt::format(
              "--set {}: the frontier sets {} for every trial (use --schemes, --depths, --lr, "
              "--seeds, --updates, --out)",
              o, own));
    }
  }

  void load_base() {
    std::vector<fs::path> paths(opt_.plugin_paths.begin(), opt_.plugin_paths.end());
    const ExperimentSpec pre = load_manifest(opt_.manifest, opt_.overrides, nullptr);
    for (const auto& p : pre.run.plugin_path) {
      fs::path pp(p);
      paths.push_back(pp.is_relative() ? fs::path(opt_.manifest).parent_path() / pp : pp);
    }
    registry_.emplace(paths);
    for (const auto& s : opt_.schemes) {
      try {
        registry_->info(s);
      } catch (const PluginError& e) {
        throw ManifestError(fmt::format("--schemes: {}", e.what()));
      }
    }
    base_ = load_manifest(opt_.manifest, opt_.overrides, &*registry_);
    lm_ = base_.model.arch == "lm";
    dir_ = opt_.out.empty() ? base_.run.out_dir : opt_.out;
    if (base_.optim.warmup_updates >= opt_.updates)
      throw ManifestError(fmt::format(
          "{}: [optim] warmup_updates = {} but --updates {}: the peak learning rate would "
          "never be reached; expected warmup_updates < --updates",
          opt_.manifest, base_.optim.warmup_updates, opt_.updates));
    if (fs::exists(fs::path(dir_) / "sweep.json"))
      throw ManifestError(
          fmt::format("{}: a sweep directory (sweep.json); choose another --out", dir_));
  }

  // The frontier folder is normlab's (new, empty, marked, or an older frontier.json's), never a
  // user's folder; checked before the first write.
  void claim_folder() const {
    util::claim_directory(dir_, "frontier",
                          fmt::format("{}: frontier folder (--out)", opt_.manifest),
                          [](const fs::path& d) { return fs::exists(d / "frontier.json"); });
  }

  std::string trial_id(const Cell& c, double lr, int seed) const {
    return fmt::format("{}_L{}_lr{}_seed{}", c.scheme, c.depth, lr_text(lr), seed);
  }

  // A trial's manifest keys on top of the base manifest and --set.
  std::vector<std::string> trial_keys(const Cell& c, double lr, int seed,
                                      const std::string& id) const {
    std::vector<std::string> o = {fmt::format("scheme={{name = {}}}", json(c.scheme).dump())};
    if (!lm_) o.push_back(fmt::format("model.enc_layers={}", c.depth));
    o.push_back(fmt::format("model.dec_layers={}", c.depth));
    o.push_back(fmt::format("optim.lr={:.6e}", lr));
    o.push_back(fmt::format("optim.max_updates={}", opt_.updates));
    o.push_back(fmt::format("run.seed={}", seed));
    o.push_back("run.log_interval=1");  // the loss of update 1 and of every update after it
    o.push_back("run.out_dir=" +
                json(fs::absolute(fs::path(dir_) / id).lexically_normal().string()).dump());
    return o;
  }

  // The unfinished trials of the (cell, lr) pairs the search needs now, each validated.
  SweepPlan trial_plan(const std::vector<std::pair<size_t, double>>& todo) {
    SweepPlan plan;
    plan.manifest = opt_.manifest;
    plan.name = "frontier";
    plan.dir = dir_;
    for (const auto& [c, lr] : todo) {
      for (const auto seed : opt_.seeds) {
        if (read_trial(cells_[c], lr, int(seed))) continue;  // finished: reused
        SweepRun r;
        r.index = int(plan.runs.size());
        r.id = trial_id(cells_[c], lr, int(seed));
        r.dir = r.id;
        r.overrides = trial_keys(cells_[c], lr, int(seed), r.id);
        std::vector<std::string> all = opt_.overrides;
        all.insert(all.end(), r.overrides.begin(), r.overrides.end());
        ExperimentSpec spec;
        try {
          spec = load_manifest(opt_.manifest, all, &*registry_);
        } catch (const ManifestError& e) {
          throw ManifestError(fmt::format("{} (frontier trial '{}')", e.what(), r.id));
        }
        plan.max_updates.push_back(spec.optim.max_updates);
        plan.threads.push_back(spec.run.threads);
        plan.runs.push_back(std::move(r));
      }
    }
    return plan;
  }

  // The finished trial at (lr, seed) of a cell, read from its run directory (nullopt otherwise).
  std::optional<TrialRecord> read_trial(Cell& c, double lr, int seed) {
    if (auto it = c.trials.find({lr, seed}); it != c.trials.end()) return it->second;
    TrialRecord t;
    t.id = trial_id(c, lr, seed);
    t.lr = lr;
    t.seed = seed;
    const fs::path dir = fs::path(dir_) / t.id;
    if (!fs::exists(dir / "status.json")) return std::nullopt;
    const RunState st = read_run_state(dir.string());
    const bool finished = (st.status == "completed" && st.updates >= opt_.updates) ||
                          st.status == "stopped_early" || st.status == "diverged";
    if (!finished) return std::nullopt;
    t.status = st.status;
    t.note = st.note;
    t.updates = st.updates;
    std::ifstream f(dir / "train.jsonl");
    std::string line;
    std::vector<std::pair<int64_t, double>> nll;
    while (std::getline(f, line)) {
      const json j = json::parse(line, nullptr, false);
      if (j.is_object() && j.value("kind", "") == "train" && j.contains("nll") &&
          j["nll"].is_number())
        nll.emplace_back(j.value("update", int64_t(0)), j["nll"].get<double>());
    }
    for (const auto& [u, v] : nll)
      if (u == 1) t.initial_loss = v;
    // The highest logged training nll after update 1 (a diverged trial's too, before it stopped).
    for (const auto& [u, v] : nll)
      if (u > 1 && !(t.peak_loss >= v)) t.peak_loss = v;  // NaN (none yet) compares false
    if (st.status == "diverged") {
      t.stable = false;
    } else {
      // The mean of the last tenth (at least the last update) smooths one noisy batch.
      const int64_t from = t.updates - std::max<int64_t>(1, t.updates / 10);
      double sum = 0;
      int n = 0;
      for (const auto& [u, v] : nll)
        if (u > from) sum += v, ++n;
      t.final_loss = n > 0 ? sum / n : kNaN;
      if (!std::isfinite(t.initial_loss) || n == 0)
        throw ManifestError(fmt::format(
            "{}: no training loss of update 1 or of the last updates; was the trial made "
            "by another command? (move it away)",
            (dir / "train.jsonl").string()));
      // A loss spike above the untrained model's loss is a divergence the trainer's 3·ln V limit
      // misses: the run may creep back under its initial loss but has lost what it learned
      // (seen at the top of the grid; the 10% margin is above batch-to-batch noise).
      t.stable = t.final_loss < t.initial_loss && !(t.peak_loss > kSpikeFactor * t.initial_loss);
    }
    c.trials[{lr, seed}] = t;
    return t;
  }

  void search(Cell& c) {
    auto lookup = [&](double lr, int seed) -> std::optional<frontier::Trial> {
      const auto t = read_trial(c, lr, seed);
      if (!t) return std::nullopt;
      double initial = t->initial_loss;
      // A trial that diverged at update 1 logged no loss; update 1's loss does not depend on the
      // lr (it is computed before the first step), so any trial of the same seed gives it.
      for (const auto& [key, other] : c.trials)
        if (!std::isfinite(initial) && key.second == seed) initial = other.initial_loss;
      return frontier::Trial{t->stable, initial, t->final_loss};
    };
    std::vector<int> seeds(opt_.seeds.begin(), opt_.seeds.end());
    c.search = frontier::search_cell(grid_, opt_.bisect, seeds, lookup);
  }

  std::string json_path() const { return (fs::path(dir_) / "frontier.json").string(); }

  static json number_or_null(const std::optional<double>& v) {
    return v && std::isfinite(*v) ? json(*v) : json(nullptr);
  }
  static json number_or_null(double v) { return std::isfinite(v) ? json(v) : json(nullptr); }

  std::string definition() const {
    return fmt::format(
        "a trial (one lr, one seed, {} updates) is unstable when the trainer marks it diverged (a "
        "non-finite loss or gradient, or a training nll above run.divergence_loss), when its "
        "training "
        "nll at any update rises above {} x its initial nll (update 1: the untrained model), or "
        "when "
        "its final training nll (mean of the last tenth of the updates) is not below the initial "
        "one; "
        "an lr is stable when every seed is",
        opt_.updates, kSpikeFactor);
  }

  void write_results() {
    json cells = json::array();
    std::ostringstream csv;
    csv << "scheme,depth,verdict,max_stable_lr,min_unstable_lr,lr_sensitivity,best_loss,non_"
           "monotone,trials,seeds\n";
    for (const auto& c : cells_) {
      json trials = json::array();
      for (const auto& [key, t] : c.trials)
        trials.push_back({{"id", t.id},
                          {"lr", t.lr},
                          {"seed", t.seed},
                          {"status", t.status},
                          {"stable", t.stable},
                          {"updates", t.updates},
                          {"initial_loss", number_or_null(t.initial_loss)},
                          {"final_loss", number_or_null(t.final_loss)},
                          {"peak_loss", number_or_null(t.peak_loss)},
                          {"note", t.note}});
      const auto& s = c.search;
      cells.push_back({{"scheme", c.scheme},
                       {"depth", c.depth},
                       {"verdict", frontier::verdict_name(s.verdict)},
                       {"max_stable_lr", number_or_null(s.max_stable_lr)},
                       {"min_unstable_lr", number_or_null(s.min_unstable_lr)},
                       {"lr_sensitivity", number_or_null(s.lr_sensitivity)},
                       {"best_loss", number_or_null(s.best_loss)},
                       {"non_monotone", s.non_monotone},
                       {"bisect_done", s.bisect_done},
                       {"trials", trials}});
      auto cell_text = [](const std::optional<double>& v) {
        return v ? fmt::format("{:.6g}", *v) : std::string();
      };
      csv << fmt::format("{},{},{},{},{},{},{},{},{},{}\n", c.scheme, c.depth,
                         frontier::verdict_name(s.verdict), cell_text(s.max_stable_lr),
                         cell_text(s.min_unstable_lr), cell_text(s.lr_sensitivity),
                         cell_text(s.best_loss), s.non_monotone ? "true" : "false", c.trials.size(),
                         opt_.seeds.size());
    }
    const json j = {
        {"manifest", fs::absolute(opt_.manifest).lexically_normal().string()},
        {"dir", dir_},
        {"arch", base_.model.arch},
        {"layers_key", lm_ ? "model.dec_layers" : "model.enc_layers = model.dec_layers"},
        {"schemes", opt_.schemes},
        {"depths", opt_.depths},
        {"seeds", opt_.seeds},
        {"updates", opt_.updates},
        {"lr_min", range_.min},
        {"lr_max", range_.max},
        {"grid", grid_},
        {"bisect", opt_.bisect},
        {"sets", opt_.overrides},
        {"definition", definition()},
        {"cells", cells}};
    claim_folder();
    util::write_file_atomically(json_path(), j.dump(2) + "\n");
    util::write_file_atomically(fs::path(dir_) / "frontier.csv", csv.str());
  }

  void print_table(bool wrote) {
    fmt::print(
        out_,
        "frontier of {} ({} updates, seeds {}, lr grid {} … {}, {} bisection step(s)) in {}\n",
        opt_.manifest, opt_.updates, fmt::join(opt_.seeds, ","), lr_text(grid_.front()),
        lr_text(grid_.back()), opt_.bisect, dir_);
    size_t w = 6;
    for (const auto& s : opt_.schemes) w = std::max(w, s.size());
    fmt::print(out_, "{:<{}}  {:>5}  {:>13}  {:>15}  {:>14}  {:>9}  {:>6}  {}\n", "scheme", w,
               "depth", "max stable lr", "min unstable lr", "lr sensitivity", "best loss", "trials",
               "verdict");
    for (const auto& c : cells_) {
      const auto& s = c.search;
      std::string verdict;
      switch (s.verdict) {
        case frontier::Verdict::AllStable:
          verdict = fmt::format("all stable: frontier above {}", lr_text(grid_.back()));
          break;
        case frontier::Verdict::NoneStable:
          verdict = fmt::format("none stable: frontier below {}", lr_text(grid_.front()));
          break;
        default:
          verdict = frontier::verdict_name(s.verdict);
      }
      if (s.non_monotone) verdict += " (non-monotone: a larger grid lr was stable again)";
      auto num = [](const std::optional<double>& v, int digits) {
        return v ? fmt::format("{:.{}g}", *v, digits) : std::string("-");
      };
      fmt::print(out_, "{:<{}}  {:>5}  {:>13}  {:>15}  {:>14}  {:>9}  {:>6}  {}\n", c.scheme, w,
                 c.depth, num(s.max_stable_lr, 4), num(s.min_unstable_lr, 4),
                 num(s.lr_sensitivity, 3), num(s.best_loss, 3), c.trials.size(), verdict);
    }
    if (wrote)
      fmt::print(out_, "wrote {} and {}\n", json_path(),
                 (fs::path(dir_) / "frontier.csv").string());
  }

  void print_dry_run(const SweepPlan& plan, int round) {
    fmt::print(out_,
               "frontier of {}: {} scheme(s) x {} depth(s), lr grid {} ({} values), seeds {}, {} "
               "updates, {} "
               "bisection step(s), in {}\n",
               opt_.manifest, opt_.schemes.size(), opt_.depths.size(),
               fmt::join(grid_.begin(), grid_.end(), ","), grid_.size(), fmt::join(opt_.seeds, ","),
               opt_.updates, opt_.bisect, dir_);
    fmt::print(
        out_,
        "next: round {}, {} trial(s) (every one validated); later rounds depend on their results\n",
        round + 1, plan.runs.size());
    for (const auto& r : plan.runs) {
      const RunState s = read_run_state((fs::path(dir_) / r.dir).string());
      fmt::print(out_, "  {:<11}  {}\n", s.status == "pending" ? "new" : s.status, r.id);
    }
  }

  const FrontierOptions& opt_;
  std::ostream& out_;
  std::optional<PluginRegistry> registry_;
  ExperimentSpec base_;
  bool lm_ = false;
  std::string dir_;
  frontier::LrRange range_;
  std::vector<double> grid_;
  std::vector<Cell> cells_;
};

}  // namespace

int frontier_command(const FrontierOptions& opt, std::ostream& out, std::ostream& err) {
  return reporting_input_errors(err, [&] { return Frontier(opt, out).run(); });
}

}  // namespace normlab
