// Recipe fidelity (issue 45): which parameters weight decay reaches (optim.no_decay), counted by
// hand from the parameters' names and shapes, and checked by one AdamW step whose result is known
// in closed form.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <torch/torch.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <sstream>
#include <string>

#include "normlab/manifest/experiment.h"
#include "normlab/model/norm.h"
#include "normlab/plugins/registry.h"
#include "normlab/train/trainer.h"
#include "run/optimizer.h"
#include "run/weight_decay.h"
#include "speed_levers.h"
#include "test_support.h"
#include "train/lr_schedule_change.h"
#include "train/update_step.h"
#include "util/safetensors.h"

// This file's own namespace: the unity build compiles several test files as one.
namespace normlab_test_recipes {

using namespace normlab;
namespace fs = std::filesystem;

namespace {

ModelConfig llama(int layers) {
  ModelConfig cfg = test::small_config(Arch::LM, 0, layers, 16, 2, 24);
  cfg.family = Family::Llama;
  cfg.norm = NormSpec::of(NormKind::RMSNorm);
  return cfg;
}

bool contains(const std::string& s, const std::string& part) {
  return s.find(part) != std::string::npos;
}

// Decayed elements counted from names and shapes alone: matrices decay, vectors do not, and with
// `skip_scheme` neither do the parameters whose names mark them as the scheme's.
int64_t expected_decayed(TransformerModelImpl& m, bool vectors_too,
                         const std::vector<std::string>& scheme_marks) {
  int64_t n = 0;
  for (const auto& item : m.named_parameters()) {
    bool decays = vectors_too || item.value().dim() >= 2;
    for (const auto& mark : scheme_marks) decays = decays && !contains(item.key(), mark);
    n += decays ? item.value().numel() : 0;
  }
  return n;
}

}  // namespace

TEST_SUITE("recipes") {
  TEST_CASE("optim.no_decay: the llama default skips vectors and every scheme parameter") {
    // mHC's φ are matrices of the scheme's own: vectors+scheme skips them, vectors decays them.
    TransformerModel m = test::make_model("mhc", llama(2));
    const DecayPlan automatic = plan_weight_decay(*m, "auto");
    CHECK(automatic.rule == "vectors+scheme");
    const std::vector<std::string> mhc_marks = {"_mhc_"};
    CHECK(automatic.decayed_elements == expected_decayed(*m, false, mhc_marks));
    CHECK(plan_weight_decay(*m, "vectors").decayed_elements == expected_decayed(*m, false, {}));
    CHECK(plan_weight_decay(*m, "vectors").decayed_elements > automatic.decayed_elements);
    const DecayPlan all = plan_weight_decay(*m, "nothing");
    CHECK(all.decayed_elements == all.elements);
    CHECK(all.decayed_tensors == all.tensors);
    // nGPT's eigen learning rates and scales (vectors) and its norms: none decays. Its s_qk, the
    // q/k norms' gain, is stored [heads, 1, d_k] and decayed before issue 60.2.
    TransformerModel ngpt = test::make_model("ngpt", llama(2));
    const DecayPlan n = plan_weight_decay(*ngpt, "auto");
    int64_t matrices = 0, norm_gains_3d = 0;
    for (const auto& item : ngpt->named_parameters()) {
      const bool norm = contains(item.key(), "_norm.");
      norm_gains_3d += norm && item.value().dim() >= 2;
      matrices += item.value().dim() >= 2 && !norm ? item.value().numel() : 0;
    }
    CHECK(norm_gains_3d > 0);
    CHECK(n.decayed_elements == matrices);
    CHECK(
        contains(n.summary(0.1), fmt::format("on {} of {} tensors", n.decayed_tensors, n.tensors)));
  }

  TEST_CASE("issue 60.2: no scheme's norm gains, scalars or own parameters decay on llama (auto)") {
    // By role: every parameter of a norm module, of the scheme, or of fewer than 2 dims.
    int schemes = 0;
    for (const PluginInfo* info : test::builtin_registry().plugins()) {
      CAPTURE(info->name);
      std::map<std::string, ParamValue> params;
      if (info->name == "branchnorm") params["T"] = ParamValue::of_int(50);
      TransformerModel m = test::make_model(info->name, llama(2), params);
      const DecayPlan plan = plan_weight_decay(*m, "auto");
      std::set<const void*> exempt;
      for (const auto& t : m->scheme_parameters()) exempt.insert(t.unsafeGetTensorImpl());
      for (const auto& mod : m->named_modules("", /*include_self=*/false))
        if (mod.value()->as<NormImpl>())
          for (const auto& t : mod.value()->parameters()) exempt.insert(t.unsafeGetTensorImpl());
      size_t i = 0;
      for (const auto& item : m->named_parameters()) {
        CAPTURE(item.key());
        const bool role =
            item.value().dim() < 2 || exempt.count(item.value().unsafeGetTensorImpl());
        if (const auto chosen = m->scheme().weight_decay(item.key()))
          CHECK(plan.decays[i] == *chosen);  // the scheme's own word (SDK) comes first
        else if (role)
          CHECK_FALSE(plan.decays[i]);
        else
          CHECK(plan.decays[i]);
        ++i;
      }
      ++schemes;
    }
    CHECK(schemes >= 20);
  }

  TEST_CASE("optim.no_decay: the transformer family decays everything by default (fairseq)") {
    TransformerModel m = test::make_model("admin", test::small_config(Arch::EncDec, 2, 2));
    const DecayPlan p = plan_weight_decay(*m, "auto");
    CHECK(p.rule == "nothing");
    CHECK(p.decayed_elements == p.elements);
    // Admin's ω are the scheme's: skipped by vectors+scheme with the norms' gains and the biases.
    CHECK(plan_weight_decay(*m, "vectors+scheme").decayed_elements ==
          expected_decayed(*m, false, {"_omega"}));
  }

  TEST_CASE("a scheme decides its parameters' decay through the SDK (Scheme::weight_decay)") {
    PluginRegistry registry({fs::path(NORMLAB_TEST_SDK_PLUGIN_DIR) / "decay_choice"});
    const ModelConfig cfg = llama(2);
    TransformerModel m(cfg, registry.create("decay-choice", {}, cfg.geometry()));
    const DecayPlan p = plan_weight_decay(*m, "vectors+scheme");
    const auto params = m->named_parameters();
    int64_t decided = 0;
    for (size_t i = 0; i < params.size(); ++i) {
      const std::string& name = params[i].key();
      INFO(name);
      if (name.rfind("decoder.layers.0.", 0) == 0 && contains(name, "_gate")) {
        CHECK(p.decays[i]);  // a scheme parameter (and a vector) it wants decayed
        ++decided;
      } else if (name == "decoder.embed_tokens.weight") {
        CHECK_FALSE(p.decays[i]);  // a matrix it does not
        ++decided;
      } else if (contains(name, "_gate")) {
        CHECK_FALSE(p.decays[i]);
      }
    }
    CHECK(decided == 3);  // layer 0's two gates and the embedding
    CHECK(p.scheme_decisions == 3);
    // "nothing" (fairseq) is the manifest's word: every parameter decays.
    CHECK(plan_weight_decay(*m, "nothing").decayed_elements == p.elements);
  }

  TEST_CASE("one AdamW step with zero gradients moves a decayed weight by exactly lr·wd") {
    const double lr = 0.01, wd = 0.1;
    for (const bool flat : {true, false}) {
      INFO("flat buffer: " << flat);
      speed_levers().flat_adamw = flat;
      TransformerModel m = test::make_model("pre-ln", llama(1));
      const DecayPlan plan = plan_weight_decay(*m, "auto");
      std::vector<torch::Tensor> before;
      for (const auto& p : m->parameters()) before.push_back(p.detach().clone());
      FlatAdamW opt(m->parameters(), torch::optim::AdamWOptions(lr).weight_decay(wd), plan.decays);
      CHECK(opt.flat() == flat);
      opt.zero_grad();
      for (auto& p : m->parameters())
        if (!p.grad().defined()) p.mutable_grad() = torch::zeros_like(p);
      opt.step();  // m = v = 0: the Adam term is 0, only the decay moves a weight
      const auto params = m->named_parameters();
      const float factor = float(1 - lr * wd);
      for (size_t i = 0; i < params.size(); ++i) {
        INFO(params[i].key());
        const torch::Tensor want = plan.decays[i] ? before[i] * factor : before[i];
        CHECK(torch::equal(params[i].value().detach(), want));
      }
      // An RMSNorm gain (1 at init) stays exactly 1; it would be 1 - lr·wd = 0.999 if decayed.
      CHECK(m->named_parameters()["decoder.layers.0.self_attn_norm.weight"]
                .detach()
                .eq(1.0f)
                .all()
                .item<bool>());
      CHECK(opt.decayed_elements() == plan.decayed_elements);
    }
    speed_levers().flat_adamw = true;
  }

  TEST_CASE("normlab train states the weight decay groups in its model lines") {
    const fs::path d = test::fresh_dir("normlab_recipes", "train_line");
    const fs::path manifest = test::tiny_llama_manifest(d, "pre-ln", 1, 1, 0.1);
    for (const std::string rule : {"auto", "nothing"}) {
      const ExperimentSpec spec = load_manifest(
          manifest.string(),
          {"optim.no_decay=\"" + rule + "\"", "run.out_dir=\"" + (d / rule).string() + "\""},
          &test::builtin_registry());
      std::ostringstream out;
      REQUIRE(train(spec, test::builtin_registry(), out).status == "completed");
      INFO(out.str());
      CHECK(contains(out.str(), "optimizer: AdamW, weight decay 0.1 on "));
      CHECK(
          contains(out.str(), rule == "auto" ? "no_decay = vectors+scheme" : "no_decay = nothing"));
    }
  }

  TEST_CASE("a run from before optim.no_decay resumes with no_decay = nothing, its old recipe") {
    const fs::path d = test::fresh_dir("normlab_recipes", "old_run");
    const fs::path manifest = test::tiny_llama_manifest(d, "pre-ln", 1, 2, 0.1);
    std::ostringstream out;
    // A constant lr: extending the run changes no lr (a cosine one would be refused, issue 59.4).
    const std::string constant = "optim.lr_schedule=\"constant\"";
    REQUIRE(train(load_manifest(manifest.string(), {constant}, &test::builtin_registry()),
                  test::builtin_registry(), out)
                .status == "completed");
    // As a normlab before the key wrote it: no no_decay line.
    const fs::path resolved = d / "run" / "manifest.resolved.toml";
    std::string text = test::slurp(resolved), kept;
    std::istringstream lines(text);
    for (std::string line; std::getline(lines, line);)
      if (line.rfind("no_decay = ", 0) != 0) kept += line + "\n";
    REQUIRE(kept.size() < text.size());
    std::ofstream(resolved) << kept;
    std::string refusal;
    try {
      train(load_manifest(manifest.string(), {constant, "optim.max_updates=4"},
                          &test::builtin_registry()),
            test::builtin_registry(), out);
    } catch (const ManifestError& e) {
      refusal = e.what();
    }
    CHECK(refusal.find("belongs to another experiment") != std::string::npos);
    const ExperimentSpec old_recipe = load_manifest(
        manifest.string(), {constant, "optim.max_updates=4", "optim.no_decay=\"nothing\""},
        &test::builtin_registry());
    std::ostringstream resumed;
    CHECK(train(old_recipe, test::builtin_registry(), resumed).status == "completed");
    CHECK(resumed.str().find("resuming") != std::string::npos);
    CHECK(resumed.str().find("no_decay = nothing") != std::string::npos);
  }

  TEST_CASE("wsd schedule: warm-up, lr until the last decay_updates, then 1-sqrt or linear decay") {
    OptimSection o;
    o.lr = 1e-3;
    o.warmup_updates = 10;
    o.max_updates = 110;
    o.min_lr_ratio = 0.1;
    o.lr_schedule = "wsd";
    o.decay_updates = 40;  // decay from update 70 to 110
    CHECK(learning_rate(o, 5) == doctest::Approx(5e-4));
    CHECK(learning_rate(o, 50) == doctest::Approx(1e-3));
    CHECK(learning_rate(o, 70) == doctest::Approx(1e-3));
    CHECK(learning_rate(o, 80) == doctest::Approx(1e-4 + 0.9e-3 * (1 - std::sqrt(0.25))));
    CHECK(learning_rate(o, 110) == doctest::Approx(1e-4));
    o.decay_shape = "linear";
    CHECK(learning_rate(o, 80) == doctest::Approx(1e-4 + 0.9e-3 * 0.75));
    o.decay_updates = 0;  // a fifth of max_updates: from update 88
    CHECK(learning_rate(o, 88) == doctest::Approx(1e-3));
    CHECK(learning_rate(o, 99) == doctest::Approx(1e-4 + 0.9e-3 * 0.5));
  }

  TEST_CASE(
      "issue 69.3: wsd_hagele2024 gives each update the lr of Hägele et al.'s own scheduler, final "
      "factor 0 unless min_lr_ratio is given") {
    // The authors' wsd_schedule (github.com/epfml/schedules-and-scaling src/optim/utils.py, as
    // src/main.py calls it: init_div_factor 100) written out from its formula: the factor of step
    // s, which torch's LambdaLR gives the update after s optimizer steps.
    struct Theirs {
      int64_t n_iterations, n_warmup;
      double final_lr_factor, fract_decay;
      std::string decay_type;  // linear | sqrt
      double operator()(int64_t step) const {
        const int64_t n_anneal_steps = int64_t(fract_decay * double(n_iterations));
        const int64_t n_hold = n_iterations - n_anneal_steps;
        const double t = double(step);
        if (step < n_warmup) return t / double(n_warmup) + (1 - t / double(n_warmup)) / 100.0;
        if (step < n_hold) return 1.0;
        if (step < n_iterations) {
          const double x = (t - double(n_hold)) / double(n_anneal_steps);
          return final_lr_factor +
                 (1 - final_lr_factor) * (1 - (decay_type == "sqrt" ? std::sqrt(x) : x));
        }
        return final_lr_factor;
      }
    };
    const fs::path d = test::fresh_dir("normlab_recipes", "wsd_hagele2024");
    const fs::path manifest = test::tiny_llama_manifest(d, "pre-ln", 1, 4, 0.0);
    auto load = [&](std::vector<std::string> sets) {
      sets.push_back("optim.lr_schedule=\"wsd_hagele2024\"");
      return load_manifest(manifest.string(), sets, &test::builtin_registry()).optim;
    };
    // The recipe's defaults: a 1-sqrt cooldown of a fifth of the updates to 0.
    const OptimSection paper =
        load({"optim.lr=0.002", "optim.max_updates=100", "optim.warmup_updates=10"});
    CHECK(paper.min_lr_ratio == 0);
    CHECK(paper.decay_shape == "1-sqrt");
    CHECK(load({"optim.min_lr_ratio=0.1"}).min_lr_ratio == 0.1);  // given: kept
    CHECK(load_manifest(manifest.string(), {"optim.lr_schedule=\"wsd\""}, &test::builtin_registry())
              .optim.min_lr_ratio == 0.1);  // plain wsd keeps its default
    struct Case {
      std::vector<std::string> sets;
      Theirs theirs;
    };
    const std::vector<Case> cases = {
        {{"optim.max_updates=100", "optim.warmup_updates=10"}, {100, 10, 0.0, 0.2, "sqrt"}},
        {{"optim.max_updates=100", "optim.warmup_updates=10", "optim.decay_updates=30",
          "optim.decay_shape=\"linear\""},
         {100, 10, 0.0, 0.3, "linear"}},
        {{"optim.max_updates=50", "optim.warmup_updates=5", "optim.decay_updates=25",
          "optim.min_lr_ratio=0.1"},
         {50, 5, 0.1, 0.5, "sqrt"}},
        {{"optim.max_updates=7", "optim.warmup_updates=0"}, {7, 0, 0.0, 0.2, "sqrt"}},
        {{"optim.max_updates=4", "optim.warmup_updates=3"}, {4, 3, 0.0, 0.2, "sqrt"}},  // no decay
    };
    for (const Case& c : cases) {
      std::vector<std::string> sets = c.sets;
      sets.push_back("optim.lr=0.002");
      const OptimSection o = load(sets);
      for (int64_t u = 1; u <= o.max_updates + 2; ++u) {
        INFO(fmt::format("{} update {}", fmt::join(c.sets, " "), u));
        CHECK(learning_rate(o, u) == doctest::Approx(0.002 * c.theirs(u - 1)).epsilon(1e-12));
      }
    }
    // By hand: update 1 at lr/100; the cooldown's first update (81) still at lr, its last (100)
    // at lr·(1 − √(19/20)), not 0; update 11 the first at lr.
    CHECK(learning_rate(paper, 1) == doctest::Approx(0.002 / 100));
    CHECK(learning_rate(paper, 10) == doctest::Approx(0.002 * (0.9 + 0.1 / 100)));
    CHECK(learning_rate(paper, 11) == 0.002);
    CHECK(learning_rate(paper, 81) == 0.002);
    CHECK(learning_rate(paper, 100) == doctest::Approx(0.002 * (1 - std::sqrt(19.0 / 20))));
    CHECK(learning_rate(paper, 100) > 0);

    // The resume checks: a checkpoint records the schedule by name, and a change of any key that
    // moves the lr of an update done is refused.
    const OptimSection recorded = schedule_from_record(lr_schedule_record(paper), OptimSection{});
    CHECK(recorded.lr_schedule == "wsd_hagele2024");
    CHECK(recorded.min_lr_ratio == 0);
    CHECK(first_lr_change(paper, recorded, 100) == 0);
    OptimSection plain = paper;
    plain.lr_schedule = "wsd";
    std::string refusal;
    try {
      check_lr_schedule_change("m.toml", paper, plain, 5, "the run it resumes at update 5");
    } catch (const ManifestError& e) {
      refusal = e.what();
    }
    CHECK(refusal.find("optim.lr_schedule \"wsd_hagele2024\" → \"wsd\" changes the wsd_hagele2024 "
                       "schedule of the run it resumes at update 5: the lr of update 1") !=
          std::string::npos);
    OptimSection longer = paper;  // extended before its cooldown: every update done keeps its lr
    longer.max_updates = 200;
    CHECK(first_lr_change(paper, longer, 81) == 0);  // the cooldown's first update is at lr
    CHECK(first_lr_change(paper, longer, 82) == 82);
    OptimSection floor = paper;  // another final factor moves the cooldown's lrs only
    floor.min_lr_ratio = 0.1;
    CHECK(first_lr_change(paper, floor, 81) == 0);
    CHECK(first_lr_change(paper, floor, 100) == 82);
  }

  TEST_CASE(
      "wsd: a decay longer than the run or overlapping the warm-up is refused, naming the key") {
    // Before, wsd silently shortened the decay to start after the warm-up and wsd_hagele2024 jumped
    // from the warm-up into the middle of its cooldown.
    const fs::path d = test::fresh_dir("normlab_recipes", "wsd_span");
    const fs::path manifest = test::tiny_llama_manifest(d, "pre-ln", 1, 4, 0.0);
    const auto refusal = [&](std::vector<std::string> sets) {
      try {
        load_manifest(manifest.string(), sets, &test::builtin_registry());
      } catch (const ManifestError& e) {
        return std::string(e.what());
      }
      return std::string();
    };
    for (const std::string schedule : {"wsd", "wsd_hagele2024"}) {
      CAPTURE(schedule);
      const std::string s = "optim.lr_schedule=\"" + schedule + "\"";
      const std::string longer = refusal({s, "optim.max_updates=10", "optim.decay_updates=11"});
      CHECK(longer.find("[optim] decay_updates: expected at most max_updates = 10") !=
            std::string::npos);
      CHECK(longer.rfind("--set optim.decay_updates: ", 0) == 0);  // where the value came from
      const std::string overlap =
          refusal({s, "optim.max_updates=10", "optim.decay_updates=4", "optim.warmup_updates=7"});
      CHECK(overlap.find("[optim] warmup_updates: the warm-up (7 updates) and the " + schedule +
                         " decay (decay_updates = 4) overlap") != std::string::npos);
      // The default decay (a fifth of max_updates) is named as such.
      CHECK(refusal({s, "optim.max_updates=10", "optim.warmup_updates=9"})
                .find("the default decay of a fifth of max_updates (2)") != std::string::npos);
      // Warm-up and decay that just fit are taken.
      CHECK(refusal({s, "optim.max_updates=10", "optim.decay_updates=4", "optim.warmup_updates=6"})
                .empty());
    }
  }

  TEST_CASE(
      "issue 59.4: more max_updates on resume is refused where the lr would jump (cosine), "
      "taken where it would not (wsd before its decay)") {
    const fs::path d = test::fresh_dir("normlab_recipes", "extend");
    const fs::path manifest = test::tiny_llama_manifest(d, "pre-ln", 1, 4, 0.0);
    std::ostringstream out;
    const auto load = [&](std::vector<std::string> sets) {
      return load_manifest(manifest.string(), sets, &test::builtin_registry());
    };
    REQUIRE(train(load({}), test::builtin_registry(), out).status == "completed");  // cosine
    std::string refusal;
    try {
      train(load({"optim.max_updates=6"}), test::builtin_registry(), out);
    } catch (const ManifestError& e) {
      refusal = e.what();
    }
    CHECK(refusal.find("optim.max_updates 4 → 6 changes the cosine schedule of the run it resumes "
                       "at update 4") != std::string::npos);
    CHECK(refusal.find("lr_schedule = \"wsd\"") != std::string::npos);
    // The refusal left the run as it was: the same extension is refused again.
    refusal.clear();
    try {
      train(load({"optim.max_updates=6"}), test::builtin_registry(), out);
    } catch (const ManifestError& e) {
      refusal = e.what();
    }
    CHECK(refusal.find("changes the cosine schedule") != std::string::npos);
    // wsd with its decay not begun at update 4 (max 4, a fifth of it: no decay yet) extends.
    const fs::path w = test::fresh_dir("normlab_recipes", "extend_wsd");
    const fs::path wsd = test::tiny_llama_manifest(w, "pre-ln", 1, 4, 0.0);
    const std::vector<std::string> schedule = {"optim.lr_schedule=\"wsd\""};
    REQUIRE(train(load_manifest(wsd.string(), schedule, &test::builtin_registry()),
                  test::builtin_registry(), out)
                .status == "completed");
    std::vector<std::string> longer = schedule;
    longer.push_back("optim.max_updates=10");
    std::ostringstream resumed;
    const TrainOutcome o = train(load_manifest(wsd.string(), longer, &test::builtin_registry()),
                                 test::builtin_registry(), resumed);
    CHECK(o.status == "completed");
    CHECK(resumed.str().find("resuming") != std::string::npos);
  }

  TEST_CASE("mHC: the first and the last sublayer's mixing never learn (docs/schemes/mhc.md)") {
    // Issue 45.4, pinned so that a change of the expansion (copies), the reduction (sum) or the
    // Sinkhorn order (columns last) is noticed: layer 1's attention sees n equal streams, and the
    // last FFN's streams are summed while every H_res column sums to 1.
    const fs::path d = test::fresh_dir("normlab_recipes", "mhc_frozen");
    const ExperimentSpec spec = load_manifest(
        test::tiny_llama_manifest(d, "mhc", 3, 30, 0.0).string(), {}, &test::builtin_registry());
    std::ostringstream out;
    REQUIRE(train(spec, test::builtin_registry(), out).status == "completed");
    util::SafetensorsReader ckpt(d / "run" / "checkpoints" / "last.safetensors");
    auto param = [&](const std::string& name) { return ckpt.read("model/decoder.layers." + name); };
    const float alpha0 = 0.01f;
    for (const std::string frozen : {"0.self_attn_mhc_", "2.ffn_mhc_"}) {
      INFO(frozen);
      CHECK(param(frozen + "b_res").eq(0).all().item<bool>());
      CHECK(param(frozen + "phi_res").eq(0).all().item<bool>());
      CHECK(param(frozen + "alpha_res").eq(alpha0).all().item<bool>());
    }
    const torch::Tensor b_post = param("2.ffn_mhc_b_post");
    CHECK(b_post.eq(b_post[0]).all().item<bool>());  // H_post equal across streams
    // The sublayers in between do learn their mixing: the checks above can fail.
    CHECK(param("1.self_attn_mhc_b_res").abs().max().item<float>() > 0);
    CHECK(param("1.self_attn_mhc_alpha_res").ne(alpha0).all().item<bool>());
  }
}

}  // namespace normlab_test_recipes
