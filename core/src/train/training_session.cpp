#include "training_session.h"

#include <fmt/format.h>
#include <fmt/ostream.h>
#include <unistd.h>

#include <algorithm>
#include <cmath>
#include <fstream>
#include <iostream>
#include <limits>
#include <map>
#include <optional>
#include <random>
#include <sstream>
#include <thread>

#include "lr_schedule_change.h"
#include "memory_estimate.h"
#include "normlab/plugins/registry.h"
#include "normlab/runtime_env.h"
#include "run/build_info.h"
#include "run/fused_self_check.h"
#include "run/model_assembly.h"
#include "run/weight_decay.h"
#include "run_recipe.h"
#include "util/atomic_file.h"

namespace fs = std::filesystem;

namespace normlab {
namespace {

at::ScalarType run_dtype(const std::string& dtype) {
  return dtype == "bf16" ? at::kBFloat16 : dtype == "fp16" ? at::kHalf : at::kFloat;
}

// Issue 57.3: before anything trains, each fused operation the run takes against ATen on its
// device; a failing one is turned off for the run and said. Returns env.json's record of it (null
// where it did not run).
nlohmann::json check_fused_ops(const TrainingSession& s, std::ostream& out) {
  const FusedSelfCheck c =
      self_check_fused_ops(s.device, run_dtype(s.spec.run.dtype), fused_ops_used(s.mcfg));
  report_fused_self_check(c, s.device, out);
  if (!c.ran) return c.skipped.empty() ? nlohmann::json() : nlohmann::json{{"skipped", c.skipped}};
  nlohmann::json ops = nlohmann::json::object();
  for (const FusedOpCheck& op : c.ops)
    ops[op.op] = !op.ok                 ? "off: " + op.error
                 : op.unchecked.empty() ? std::string("ok")
                                        : "not checked: " + op.unchecked;
  return {{"seconds", c.seconds}, {"ops", ops}};
}

// Tokens of the longest sequence a batch can hold (a side plus BOS), for the memory estimate.
int64_t longest_sequence(const data::Split& split) {
  if (split.blocks) return split.blocks->block_tokens();
  size_t n = 0;
  for (const auto& ex : split.examples) n = std::max({n, ex.src.size(), ex.tgt.size()});
  return int64_t(n) + 1;
}

// Admin-style setup pass on the first training batch, once per run; its result is kept in the run
// directory and restored with every checkpoint (a resumed run restores it too: its observers see
// θ_0 before the checkpoint is loaded).
void scheme_setup_pass(TrainingSession& s) {
  const fs::path setup_path = s.run->path() / "scheme_setup.safetensors";
  if (!s.model->scheme().needs_setup_pass()) return;
  if (fs::exists(setup_path)) s.model->scheme().load_state(load_scheme_state(setup_path));
  if (s.resuming || !s.model->scheme().needs_setup_pass()) return;
  if (!s.leader())
    throw std::runtime_error(fmt::format("{}: rank 0 did not write it", setup_path.string()));
  DeviceBatch b = to_device(s.train_plan->make_batch(s.train_plan->batch(0, 0)), s.device);
  s.model->run_setup_pass([&] { forward(*s.model, b); });
  save_scheme_state(setup_path, s.model->scheme().state());
  fmt::print(s.out, "scheme setup pass done ({})\n", setup_path.string());
}

// The SHA-256 of a split's examples in memory: each side's length and tokens, in order.
std::string examples_sha256(const data::Split& split) {
  util::Sha256 h;
  for (const data::Example& e : split.examples)
    for (const std::vector<int32_t>* part : {&e.src, &e.tgt}) {
      const uint64_t n = part->size();
      h.update(&n, sizeof n);
      h.update(part->data(), n * sizeof(int32_t));
    }
  return h.hex();
}

// How the run cuts its training data into batches: a checkpoint's position (epoch, batch) means
// these batches of these examples only. `plan` is what the batches hold (BatchPlan::fingerprint:
// another optim.max_tokens that cuts the same batches is the same batching); `examples` the SHA-256
// of the training examples' tokens where they are in memory (text and synthetic data: a corpus
// edited on disk, another tokenizer or data key; token shards have their own record, `data`).
std::string batching_record(const TrainingSession& s) {
  return nlohmann::json{{"max_tokens", s.spec.optim.max_tokens},
                        {"seed", s.spec.run.seed},
                        {"batches_per_epoch", s.train_plan->batches_per_epoch()},
                        {"plan", s.train_plan->fingerprint()},
                        {"examples", s.ds.train.blocks ? "" : examples_sha256(s.ds.train)}}
      .dump();
}

// The validation examples, by content, and the first n of them BLEU is decoded on during training
// (eval.bleu_max_sentences; 0: no BLEU): "best" and eval.patience compare validations of these
// only.
std::string validation_record(const TrainingSession& s) {
  const data::Split& valid = s.ds.valid;
  const bool bleu = s.spec.eval.bleu && s.mcfg.arch == Arch::EncDec && !valid.references.empty();
  const int64_t all = int64_t(valid.examples.size()), most = s.spec.eval.bleu_max_sentences;
  return nlohmann::json{{"examples", all},
                        {"sha256", examples_sha256(valid)},
                        {"bleu_sentences", !bleu      ? 0
                                           : most > 0 ? std::min(all, most)
                                                      : all}}
      .dump();
}

// A checkpoint's batching or validation record as written: an object whose `fields` are whole
// numbers of at least `least` (a record from before it: null). Anything else is refused by name.
nlohmann::json checked_record(const fs::path& from, const char* key, const std::string& text,
                              std::initializer_list<std::pair<const char*, int64_t>> numbers,
                              std::initializer_list<const char*> texts) {
  if (text.empty()) return nullptr;
  const nlohmann::json j = nlohmann::json::parse(text, nullptr, false);
  constexpr int64_t kMost = int64_t(1) << 62;
  std::string bad;
  if (!j.is_object()) bad = "not a JSON object";
  for (const auto& [field, least] : numbers)
    if (bad.empty() && (!j.contains(field) || !j[field].is_number_integer() ||
                        j[field].get<int64_t>() < least || j[field].get<int64_t>() > kMost))
      bad = fmt::format("{}: expected a whole number from {} to 2^62", field, least);
  for (const char* field : texts) {
    if (!bad.empty()) break;
    const std::string v =
        j.value(field, nlohmann::json()).is_string() ? j[field].get<std::string>() : "";
    const bool hex = std::string(field) == "sha256";
    if (hex ? v.size() != 64 || v.find_first_not_of("0123456789abcdef") != std::string::npos
            : v.empty() || v.size() > 64 ||
                  std::any_of(v.begin(), v.end(), [](char c) { return c < 0x20 || c > 0x7e; }))
      bad = fmt::format("{}: expected {}", field,
                        hex ? "64 hexadecimal digits" : "a short printable text");
  }
  if (!bad.empty())
    throw CheckpointError(
        fmt::format("{}: __metadata__.{} is malformed ({})", from.string(), key, bad));
  return j;
}

// What differs between the checkpoint's batching and this run's, in the manifest's words; empty:
// the same batches (or not recorded).
std::string batching_change(const nlohmann::json& saved, const nlohmann::json& now) {
  const auto examples = [](const nlohmann::json& j) { return j.value("examples", std::string()); };
  if (saved.is_null() ||
      (saved["plan"] == now["plan"] && saved["seed"] == now["seed"] &&
       saved["batches_per_epoch"] == now["batches_per_epoch"] && examples(saved) == examples(now)))
    return {};
  std::string out;
  const auto add = [&](const std::string& what) { out += (out.empty() ? "" : "; ") + what; };
  if (saved["max_tokens"] != now["max_tokens"])
    add(fmt::format("optim.max_tokens was {}, now {}", saved["max_tokens"].dump(),
                    now["max_tokens"].dump()));
  if (saved["seed"] != now["seed"])
    add(fmt::format("run.seed was {}, now {}", saved["seed"].dump(), now["seed"].dump()));
  if (saved["batches_per_epoch"] != now["batches_per_epoch"])
    add(fmt::format("an epoch was {} batches, now {}", saved["batches_per_epoch"].dump(),
                    now["batches_per_epoch"].dump()));
  if (saved["plan"] != now["plan"])
    add(fmt::format("the batches hold {}, the checkpoint's {}", now["plan"].get<std::string>(),
                    saved["plan"].get<std::string>()));
  if (examples(saved) != examples(now))
    add("the training examples are not the checkpoint's (a corpus edited, another tokenizer, or "
        "another data key)");
  return out;
}

// A resume's data, batches and records against the checkpoint `from`: refused (CheckpointError,
// before the run writes a file) unless --allow-data-change, then said when `say`. Returns whether
// the checkpoint's batch is past this run's (shorter) epoch.
bool check_resume_data(TrainingSession& s, const fs::path& from, const TrainingState& ck,
                       bool allow_data_change, bool say) {
  // The position in the data means nothing on other data (issue 56.4) ...
  if (const std::string change = data::data_identity_change(ck.data_identity, s.ds.identity);
      !change.empty()) {
    if (!allow_data_change)
      throw CheckpointError(fmt::format(
          "{}: this run's data are not the data it trained on: {}; restore them, or pass "
          "--allow-data-change to resume at its position in these",
          from.string(), change));
    if (say) fmt::print(s.out, "resume: on other data (--allow-data-change): {}\n", change);
  }
  // ... nor in other batches: a branch with another optim.max_tokens skipped or repeated data.
  const nlohmann::json saved_batching =
      checked_record(from, "batching", ck.batching,
                     {{"max_tokens", 1}, {"seed", 0}, {"batches_per_epoch", 1}}, {"plan"});
  if (saved_batching.is_object() && saved_batching.contains("examples")) {
    const nlohmann::json& x = saved_batching["examples"];  // "" (token shards) or a SHA-256
    const std::string v = x.is_string() ? x.get<std::string>() : "?";
    if (!v.empty() &&
        (v.size() != 64 || v.find_first_not_of("0123456789abcdef") != std::string::npos))
      throw CheckpointError(
          fmt::format("{}: __metadata__.batching is malformed (examples: expected \"\" or 64 "
                      "hexadecimal digits)",
                      from.string()));
  }
  const nlohmann::json saved_validation = checked_record(
      from, "validation", ck.validation, {{"examples", 0}, {"bleu_sentences", 0}}, {"sha256"});
  // A checkpoint of an older normlab on a branch: nothing to compare with, and said.
  if (say && (saved_batching.is_null() || saved_validation.is_null()) &&
      fs::absolute(from).lexically_normal().parent_path().parent_path() !=
          fs::absolute(s.run->path()).lexically_normal())
    fmt::print(s.out, "resume: {} records no {} (an older normlab): {} not checked\n",
               from.string(),
               saved_batching.is_null() && saved_validation.is_null() ? "batching or validation"
               : saved_batching.is_null()                             ? "batching"
                                                                      : "validation",
               saved_batching.is_null()
                   ? "that this branch cuts its data into the checkpoint's batches "
                     "(optim.max_tokens, run.seed) is"
                   : "that this branch validates on the checkpoint's examples (eval.valid_tokens, "
                     "the valid data) is");
  bool past_epoch = false;
  if (std::string change = batching_change(saved_batching, nlohmann::json::parse(s.st.batching));
      !change.empty()) {
    // The key that made other examples, from the checkpoint's run's manifest beside it.
    const std::string data_key = manifest_section_change(
        fs::absolute(from).parent_path().parent_path(), s.resolved_text, "data");
    if (!data_key.empty()) change += "; " + data_key;
    if (!allow_data_change)
      throw CheckpointError(fmt::format(
          "{}: this run's batches are not the checkpoint's ({}): its position (epoch {}, batch "
          "{}) would mean nothing in them; resume with the checkpoint's values, or pass "
          "--allow-data-change to resume at that position anyway",
          from.string(), change, ck.epoch + 1, ck.batch_index));
    if (say) fmt::print(s.out, "resume: in other batches (--allow-data-change): {}\n", change);
    past_epoch = ck.batch_index > s.train_plan->batches_per_epoch();
  }
  check_resume_state(
      from, ck, s.spec.optim.max_updates,
      past_epoch ? std::numeric_limits<int64_t>::max() : s.train_plan->batches_per_epoch());
  return past_epoch;
}

void resume(TrainingSession& s, const fs::path& from, bool allow_data_change) {
  // This run's records (start_session), kept over the checkpoint's state loaded below.
  const std::string batching = s.st.batching, validation = s.st.validation;
  const bool past_epoch =
      check_resume_data(s, from, checkpoint_state(from), allow_data_change, /*say=*/true);
  s.st = load_checkpoint(from, *s.model, *s.optimizer, s.device);
  if (past_epoch) {  // allowed above: the next epoch's first batch
    fmt::print(s.out, "resume: batch {} is past this run's epoch of {} batches: from epoch {}\n",
               s.st.batch_index, s.train_plan->batches_per_epoch(), s.st.epoch + 2);
    s.st.epoch += 1;
    s.st.batch_index = 0;
  }
  // A best valid nll (and BLEU) of other validation examples is no yardstick (eval.valid_tokens
  // or the valid data changed on a branch): best and patience start afresh; a best BLEU of another
  // subset (eval.bleu_max_sentences) neither: the best BLEU does.
  if (!s.st.validation.empty() && s.st.validation != validation) {
    const nlohmann::json was = nlohmann::json::parse(s.st.validation, nullptr, false),
                         now = nlohmann::json::parse(validation);
    const auto field = [&](const char* key) {
      return was.is_object() ? was.value(key, nlohmann::json()) : nlohmann::json();
    };
    if (field("examples") != now["examples"] || field("sha256") != now["sha256"]) {
      fmt::print(s.out,
                 "resume: validation on other examples than the checkpoint's ({} examples, the "
                 "checkpoint's {}{}): the best valid score and eval.patience start afresh\n",
                 now["examples"].dump(), field("examples").dump(),
                 field("examples") == now["examples"] ? ", other content" : "");
      s.st.best_valid_nll = std::numeric_limits<double>::infinity();
      s.st.best_valid_bleu = -1;
      s.st.stale_validations = 0;
    } else if (s.st.best_valid_bleu >= 0) {
      fmt::print(s.out,
                 "resume: BLEU on the first {} validation sentences, the checkpoint's on {} "
                 "(eval.bleu_max_sentences): the best BLEU starts afresh\n",
                 now["bleu_sentences"].dump(), field("bleu_sentences").dump());
      s.st.best_valid_bleu = -1;
    }
  }
  // What the next checkpoints train on, and with which lrs.
  s.st.data_identity = s.ds.identity;
  s.st.lr_schedule = lr_schedule_record(s.spec.optim);
  s.st.batching = batching;
  s.st.validation = validation;
  if (s.st.loss_scale > 0) s.loss_scaler.restore(s.st.loss_scale, s.st.loss_scale_good_steps);
  fmt::print(s.out, "resuming {} at update {} (epoch {}, batch {}) from {}\n",
             s.run->path().string(), s.st.updates, s.st.epoch + 1, s.st.batch_index, from.string());
  if (!s.batches_per_update_changed.empty())
    fmt::print(s.out, "resume: this run takes {} (env.json: resume_batches_per_update)\n",
               s.batches_per_update_changed);
  // A branch (--resume-from an older checkpoint) becomes last.safetensors before the records after
  // it move aside, so a failure or kill before the branch's next checkpoint resumes the branch
  // again, never the abandoned last with a gap in train.jsonl.
  if (s.leader() && fs::absolute(from).lexically_normal() !=
                        fs::absolute(s.run->checkpoint("last.safetensors")).lexically_normal())
    s.save_last(/*with_step=*/false,
                /*gather=*/false);  // rank 0 alone: the loaded moments are whole
}

// env.json's record of a data-parallel job.
nlohmann::json distributed_environment(const ProcessGroup& g) {
  nlohmann::json ranks = nlohmann::json::array();
  for (const RankInfo& r : g.ranks())
    ranks.push_back({{"rank", r.rank}, {"host", r.host}, {"pid", r.pid}, {"device", r.device}});
  return {
      {"world_size", g.world()},
      {"backend", g.backend()},
      {"launcher", g.env().launcher},
      {"timeout_s", double(g.timeout().count()) / 1000.0},
      {"ranks", ranks},
      {"dropout_streams",
       "before update u every rank seeds its generators with rank_stream_seed(run.seed, rank, u) "
       "(splitmix64 of the three): distinct per rank, the same again on a resume"}};
}

// Batches per update over all ranks. A resume by another number of ranks than wrote the checkpoint
// is refused unless allowed; then the checkpoint's batches per update are shared by this job's
// ranks. With the same ranks, the manifest's optim.update_freq is what runs (issue 42.2: a branch
// with another update_freq trained with the checkpoint's); `changed` says what the checkpoint had.
int64_t global_batches_for(const ExperimentSpec& spec, const RunDirectory& run,
                           const TrainControl& control, int world, std::string* changed) {
  const int64_t wanted = spec.optim.update_freq * world;
  const fs::path from = control.resume_from.empty() ? run.checkpoint("last.safetensors")
                                                    : fs::path(control.resume_from);
  TrainingState ck;
  try {
    if (!fs::exists(from)) return wanted;
    ck = checkpoint_state(from);
  } catch (const std::exception&) {
    return wanted;  // start_session reports an unreadable checkpoint, with the run's status
  }
  const int64_t had =
      ck.global_batches > 0 ? ck.global_batches : spec.optim.update_freq * ck.world_size;
  if (ck.world_size == world) {
    if (had != wanted)
      *changed = fmt::format(
          "{} batches per update (optim.update_freq {} x {} rank(s)), where the checkpoint's run "
          "took {}",
          wanted, spec.optim.update_freq, world, had);
    return wanted;
  }
  if (!control.allow_world_size_change)
    throw CheckpointError(fmt::format(
        "{}: written by a job of {} rank(s) ({} batches per update); this job has {}: run it with "
        "{} rank(s){}",
        from.string(), ck.world_size, had, world, ck.world_size,
        had % world == 0
            ? fmt::format(", or pass --allow-world-size-change to resume with {} batches per "
                          "update shared by the {} ranks",
                          had, world)
            : fmt::format(" (its {} batches per update cannot be shared equally by {} ranks, so "
                          "--allow-world-size-change cannot help: a number of ranks that divides "
                          "{})",
                          had, world, had)));
  if (had % world != 0)
    throw CheckpointError(
        fmt::format("{}: its {} batches per update cannot be shared equally by {} ranks; choose a "
                    "number of ranks that divides {}",
                    from.string(), had, world, had));
  return had;
}

// env.json records a --resume-from that changed the batches per update (issue 42.2).
void record_batches_change(TrainingSession& s) {
  if (s.batches_per_update_changed.empty()) return;
  nlohmann::json env = nlohmann::json::parse(s.env_text);
  env["resume_batches_per_update"] = s.batches_per_update_changed;
  s.env_text = env.dump(2) + "\n";
}

// 16 hex digits naming a training segment (one process's part of a run), for env.json and its
// checkpoints; from the system's entropy, so the run's random streams are untouched.
std::string new_segment_id() {
  std::random_device entropy;
  const uint64_t id = (uint64_t(entropy()) << 32) ^ uint64_t(entropy());
  return fmt::format("{:016x}", id);
}

// The segment records an env.json holds — its discarded, earlier and current ones — each a JSON
// object; what cannot be read goes to `lost`.
void read_segment_records(const fs::path& source, std::vector<nlohmann::json>& pool,
                          std::vector<bool>& was_discarded, std::vector<std::string>& lost) {
  std::ifstream in{source, std::ios::binary};
  const bool opened = in.is_open();
  nlohmann::json old = nlohmann::json::parse(in, nullptr, /*allow_exceptions=*/false);
  if (!opened) {
    lost.push_back(source.string() + " is missing");
  } else if (!old.is_object()) {
    lost.push_back(source.string() + " is not an env.json normlab wrote");
  } else {
    for (const char* list : {"discarded_segments", "earlier_segments"}) {
      if (!old.contains(list)) continue;
      if (!old[list].is_array()) {
        lost.push_back(fmt::format("{}: {} is not a list", source.string(), list));
      } else {
        for (auto& r : old[list]) {
          if (r.is_object()) {
            pool.push_back(std::move(r));
            was_discarded.push_back(std::string(list) == "discarded_segments");
          } else
            lost.push_back(
                fmt::format("{}: an entry of {} is not a record", source.string(), list));
        }
      }
      old.erase(list);
    }
    pool.push_back(std::move(old));
    was_discarded.push_back(false);
  }
}

// A resumed run keeps the provenance of the segments before it: env.json describes the segment now
// running (resumed_at_update, resumed_from, resumed_from_segment), and earlier_segments holds the
// records of the segments whose updates it continues, oldest first — each may have run on another
// machine, LibTorch or thread count. The checkpoint names the segment that wrote it, and each
// record the segment it resumed from: the chain back from the checkpoint's segment, through this
// run's env.json or — a branch into a new folder — that of the run the checkpoint belongs to.
// In this run's own folder the records off that chain move to discarded_segments (their updates
// went to train.discarded.jsonl). Checkpoints of a normlab before segment ids: the segments that
// started before the resume point. What cannot be read is said, and kept in earlier_segments_lost.
void keep_earlier_segments(TrainingSession& s, const fs::path& checkpoint,
                           const TrainingState& ck) {
  nlohmann::json env = nlohmann::json::parse(s.env_text);
  env["resumed_at_update"] = ck.updates;
  env["resumed_from"] = fs::absolute(checkpoint).lexically_normal().string();
  const bool id_ok = ck.segment.size() == 16 &&
                     ck.segment.find_first_not_of("0123456789abcdef") == std::string::npos;
  if (id_ok) env["resumed_from_segment"] = ck.segment;
  fs::path source = s.run->path() / "env.json";
  const bool own = fs::exists(source);
  if (!own && checkpoint.parent_path().filename() == "checkpoints")
    source = checkpoint.parent_path().parent_path() / "env.json";
  else if (!own)
    source.clear();  // a checkpoint outside a run folder: no earlier records to look for
  std::vector<std::string> lost;
  std::vector<nlohmann::json> pool;  // every record the source holds
  std::vector<bool> was_discarded;   // before segment ids, a discarded record is never taken
  if (!source.empty()) read_segment_records(source, pool, was_discarded, lost);
  const auto id_of = [](const nlohmann::json& r, const char* key) {
    const auto it = r.find(key);
    return it != r.end() && it->is_string() ? it->get<std::string>() : std::string();
  };
  const auto find = [&](const std::string& id) {
    for (size_t i = 0; i < pool.size(); ++i)
      if (!id.empty() && id_of(pool[i], "segment") == id) return i;
    return pool.size();
  };
  // The chain back from the checkpoint's segment; a record that is ambiguous (an id twice), a
  // loop or a missing link is said, and then the records are taken by update, as before ids.
  std::vector<bool> on_chain(pool.size(), false);
  std::vector<size_t> chain;            // newest first
  bool by_update = ck.segment.empty();  // a checkpoint from before segment ids: silently
  if (!by_update && !id_ok) {
    lost.push_back(fmt::format("{}: __metadata__.segment is not 16 lowercase hex digits",
                               checkpoint.string()));
    by_update = true;
  }
  std::map<std::string, int> times;
  for (const auto& r : pool)
    if (const std::string id = id_of(r, "segment"); !id.empty() && ++times[id] == 2) {
      lost.push_back(fmt::format("{}: segment {} is recorded twice", source.string(), id));
      by_update = true;
    }
  if (!by_update && !pool.empty()) {
    for (size_t i = find(ck.segment); !by_update;) {
      if (i == pool.size()) {
        lost.push_back(fmt::format(
            "{}: segment {} is not recorded", source.string(),
            chain.empty() ? ck.segment : id_of(pool[chain.back()], "resumed_from_segment")));
        by_update = true;
      } else if (on_chain[i]) {
        lost.push_back(fmt::format("{}: the segments resume from each other in a loop (at {})",
                                   source.string(), id_of(pool[i], "segment")));
        by_update = true;
      } else {
        on_chain[i] = true;
        chain.push_back(i);
        const std::string parent = id_of(pool[i], "resumed_from_segment");
        if (parent.empty()) break;  // the run's first segment
        i = find(parent);
      }
    }
  }
  if (by_update) {
    chain.clear();
    std::fill(on_chain.begin(), on_chain.end(), false);
    for (size_t i = pool.size(); i-- > 0;) {  // the segments that started before the resume point
      const auto start = pool[i].find("resumed_at_update");
      if (was_discarded[i]) continue;
      if (start == pool[i].end() ||
          (start->is_number_integer() && start->get<int64_t>() < ck.updates)) {
        on_chain[i] = true;
        chain.push_back(i);
      }
    }
  }
  nlohmann::json earlier = nlohmann::json::array(), discarded = nlohmann::json::array();
  for (auto i = chain.rbegin(); i != chain.rend(); ++i) earlier.push_back(pool[*i]);
  if (own)
    for (size_t i = 0; i < pool.size(); ++i)
      if (!on_chain[i]) discarded.push_back(pool[i]);
  if (!earlier.empty()) env["earlier_segments"] = std::move(earlier);
  if (!discarded.empty()) env["discarded_segments"] = std::move(discarded);
  if (!lost.empty()) {
    env["earlier_segments_lost"] = lost;
    for (const std::string& why : lost)
      fmt::print(s.out,
                 "warning: {}; the records of the segments before this one may be incomplete\n",
                 why);
  }
  s.env_text = env.dump(2) + "\n";
}

// The start message rank 0 posts to the others once its run directory is ready: "ok", the
// batches per update and the checkpoint to resume from; "finished", the exit code and status; or
// "error" and the message.
void await_leader(TrainingSession& s, OpenedSession& opened, std::optional<fs::path>& resume_from) {
  const std::string msg = s.group->await("start");
  std::istringstream in(msg);
  std::string kind, line;
  std::getline(in, kind);
  if (kind == "error")
    throw std::runtime_error(fmt::format("rank 0 could not start: {}", msg.substr(6)));
  std::getline(in, line);
  if (kind == "finished") {
    TrainOutcome o;
    o.exit_code = std::stoi(line);
    std::getline(in, o.status);
    opened.finished = o;
    return;
  }
  s.global_batches = std::stoll(line);
  if (std::getline(in, line) && !line.empty()) resume_from = fs::path(line);
}

}  // namespace

void post_start_failure(ProcessGroup* group, const std::string& what) noexcept {
  if (!group || !group->leader()) return;
  try {
    group->post("start", "error\n" + what, /*last=*/true);
  } catch (...) {
  }
}

double TrainingSession::eta_seconds() const {
  const double run_secs = std::chrono::duration<double>(Clock::now() - t_start).count();
  const double rate = double(st.updates - first_update) / std::max(run_secs, 1e-9);
  int64_t left = spec.optim.max_updates - st.updates;
  if (spec.optim.max_epochs > 0) {
    const int64_t per_epoch = train_plan->batches_per_epoch();
    left = std::min(left, (spec.optim.max_epochs - st.epoch) * per_epoch - st.batch_index);
  }
  return rate > 0 ? double(std::max<int64_t>(left, 0)) / rate : -1.0;
}

TrainingState TrainingSession::snapshot() const {
  TrainingState snap = st;
  snap.elapsed_s = elapsed();
  snap.world_size = world();
  snap.global_batches = global_batches;
  if (fp16)
    snap.loss_scale = loss_scaler.scale(), snap.loss_scale_good_steps = loss_scaler.good_steps();
  return snap;
}

bool TrainingSession::same_point_everywhere(const std::optional<TrainingState>& saved,
                                            const TrainingState& now) const {
  const bool same = saved && same_training_point(*saved, now);
  // A sharded optimizer gathers its moments for a write: every rank takes the same branch.
  if (group && optimizer->sharded()) return group->max(same ? 0 : 1) == 0;
  return same;
}

void TrainingSession::save_last(bool with_step, bool gather) {
  const TrainingState snap = snapshot();
  const int64_t updates = st.updates, keep = spec.run.checkpoint_keep_last;
  RunDirectory* dir = run.get();
  if (same_point_everywhere(best_state, snap)) {
    // best.safetensors holds this very point (a final validation found it best): one file.
    if (leader())
      checkpoints->submit(nullptr, [dir, updates, with_step, keep](const CheckpointContents&) {
        dir->link_checkpoint("best.safetensors", "last.safetensors");
        dir->finish_last(updates, with_step, keep);
      });
  } else {
    if (gather) optimizer->gather_moments();  // sharded: every rank's part, on every rank
    if (leader())
      checkpoints->submit(
          [&](CheckpointContents& c) { take_checkpoint_snapshot(c, *model, *optimizer, snap); },
          [dir, updates, with_step, keep](const CheckpointContents& c) {
            dir->save_last(updates, with_step, keep,
                           [&](util::AtomicFile& f) { write_checkpoint(f, c); });
          });
    if (gather) optimizer->release_moments();
  }
  last_state = snap;
  saved_at = st.updates;
}

void TrainingSession::save_best() {
  const TrainingState snap = snapshot();
  RunDirectory* dir = run.get();
  if (same_point_everywhere(last_state, snap)) {
    if (leader())
      checkpoints->submit(nullptr, [dir](const CheckpointContents&) {
        dir->link_checkpoint("last.safetensors", "best.safetensors");
      });
  } else {
    optimizer->gather_moments();
    if (leader())
      checkpoints->submit(
          [&](CheckpointContents& c) { take_checkpoint_snapshot(c, *model, *optimizer, snap); },
          [dir](const CheckpointContents& c) {
            dir->save_checkpoint("best.safetensors",
                                 [&](util::AtomicFile& f) { write_checkpoint(f, c); });
          });
    optimizer->release_moments();
  }
  best_state = snap;
}

void TrainingSession::finish_checkpoints() { checkpoints->finish(); }

bool TrainingSession::leader() const { return !group || group->leader(); }
int TrainingSession::world() const { return group ? group->world() : 1; }

TrainingSession::UpdateBatches TrainingSession::next_batches() {
  UpdateBatches u;
  const int64_t rank = group ? group->rank() : 0;
  const int64_t per_epoch = train_plan->batches_per_epoch();
  // Shards: every integrity failure found beside training (a shard's SHA-256) ends the run.
  if (ds.integrity)
    if (const std::string problem = ds.integrity->problem(); !problem.empty())
      throw std::runtime_error(problem);  // a failed run (exit 1), not bad input
  while (u.taken < global_batches) {
    if (spec.optim.max_epochs > 0 && st.epoch >= spec.optim.max_epochs) break;
    if (st.batch_index >= per_epoch) {
      ++st.epoch;
      st.batch_index = 0;
      continue;
    }
    const bool mine = u.taken % world() == rank;
    if (!mine && ds.train.blocks) {
      // Another rank's batch of full blocks: its tokens are known without reading it, so each rank
      // reads only its own share of the shards.
      u.tokens += int64_t(train_plan->batch(st.epoch, st.batch_index).size()) *
                  (ds.train.blocks->block_tokens() - 1);
      ++u.taken;
      ++st.batch_index;
      continue;
    }
    double waited = 0;
    const auto t0 = Clock::now();
    data::Batch b;
    try {
      b = prefetch ? prefetch->take(st.epoch, st.batch_index, u.taken, &waited)
                   : train_plan->make_batch(train_plan->batch(st.epoch, st.batch_index));
    } catch (const data::DataError& e) {  // a bad token in a shard: the run fails (exit 1)
      throw std::runtime_error(e.what());
    }
    u.data_seconds += prefetch ? waited : std::chrono::duration<double>(Clock::now() - t0).count();
    u.tokens += b.target_tokens;  // every rank's, for the loss normalisation
    if (mine) u.mine.push_back(to_device(b, device, ds.pad_id));
    ++u.taken;
    ++st.batch_index;
  }
  return u;
}

void TrainingSession::request_stop(std::string status, std::string note, int exit_code) {
  if (!stop) stop = Stop{std::move(status), std::move(note), exit_code};
}

namespace {

// AdamW with the manifest's weight decay groups (optim.no_decay); returns the console line saying
// which parameters decay.
std::string make_optimizer(TrainingSession& s) {
  const OptimSection& o = s.spec.optim;
  const DecayPlan decay = plan_weight_decay(*s.model, o.no_decay);
  s.optimizer = std::make_unique<FlatAdamW>(s.model->parameters(),
                                            torch::optim::AdamWOptions(o.lr)
                                                .betas({o.beta1, o.beta2})
                                                .eps(o.eps)
                                                .weight_decay(o.weight_decay),
                                            decay.decays);
  return fmt::format("optimizer: AdamW, {}\n", decay.summary(o.weight_decay));
}

// The console's model line: body, size, scheme, parameters, threads, device.
std::string model_line(const ExperimentSpec& spec, const ModelConfig& m,
                       const AssembledModel& assembled, int threads) {
  return fmt::format(
      "model: {}{} {} d={} ffn={} heads={}{}, scheme {} ({}), {} parameters, {} thread(s), {}\n",
      spec.model.arch,
      m.family == Family::Transformer ? "" : fmt::format(" {}", to_string(m.family)),
      m.arch == Arch::LM ? fmt::format("{}L", m.dec_layers)
                         : fmt::format("{}L-{}L", m.enc_layers, m.dec_layers),
      m.d_model, m.ffn_dim, m.heads,
      m.kv_head_count() == m.heads ? "" : fmt::format(" ({} k/v)", m.kv_head_count()),
      assembled.scheme_name, assembled.scheme_file, assembled.parameters, threads, spec.run.device);
}

}  // namespace

namespace {
// The model, with a scheme's refusal of model.qk_norm said as the manifest's error (issue 67.1).
AssembledModel assemble_checked(const ExperimentSpec& spec, const ModelSpec& model,
                                const PluginRegistry& registry, const torch::Device& device) {
  try {
    return assemble_model(model, registry, device);
  } catch (const QkNormConflict& e) {
    throw ManifestError(fmt::format("{}: [model] qk_norm = \"{}\": scheme \"{}\": {}", spec.source,
                                    spec.model.qk_norm, spec.scheme.name, e.what()));
  }
}
}  // namespace

// finished_run, and a finished run is not trained again: an explicit --resume-from is said unused.
std::optional<TrainOutcome> finished_run_said(const ExperimentSpec& spec, const fs::path& dir,
                                              const std::string& resolved, std::ostream& out,
                                              const TrainControl& control) {
  std::optional<TrainOutcome> done = finished_run(spec, dir, resolved, out);
  if (done && !control.resume_from.empty())
    fmt::print(out,
               "--resume-from {} not used: to train from it, raise optim.max_updates past {} or "
               "branch into another [run] out_dir\n",
               control.resume_from, done->updates);
  return done;
}

OpenedSession open_session(const ExperimentSpec& spec, const PluginRegistry& registry,
                           std::ostream& out, const TrainControl& control) {
  OpenedSession opened;
  const fs::path dir = spec.run.out_dir;
  const std::string resolved = resolved_manifest_text(spec);
  const bool leader = !control.group || control.group->leader();
  if (leader && (opened.finished = finished_run_said(spec, dir, resolved, out, control))) {
    if (control.group)
      control.group->post(
          "start",
          fmt::format("finished\n{}\n{}", opened.finished->exit_code, opened.finished->status),
          /*last=*/true);
    return opened;
  }
  auto s = std::make_unique<TrainingSession>(spec, out);
  s->resolved_text = resolved;
  s->tty = isatty(STDOUT_FILENO) && &out == &std::cout;
  // Threads: LibTorch defaults to 1 here; PERF: with OpenMP OpenBLAS use all cores in LibTorch.
  // A job's ranks on one machine share its cores.
  const int local_ranks = control.group ? control.group->env().local_world : 1;
  const int threads =
      spec.run.threads > 0 ? int(spec.run.threads) : std::max(1, usable_threads() / local_ranks);
  at::set_num_threads(threads);
  // runtime_env.h says why; on a GPU the kept inputs are device memory, and mapping every host
  // block from 1 MiB up made deepnet-1000L's update 23 % slower (H200: 27.6 against 22.5 s).
  if (spec.run.activation_checkpointing && spec.run.device == "cpu")
    tune_malloc_for_checkpointing();
  else
    tune_malloc();
  // Checked before torch::Device parses it: LibTorch's errors carry a whole stack trace.
  if (const std::string problem = device_problem(spec.run.device); !problem.empty())
    throw ManifestError(fmt::format("{}: [run] device: {}", spec.source, problem));
  s->device = torch::Device(spec.run.device);
  // Each rank of a job on CUDA takes the GPU of its local rank.
  if (control.group && spec.run.device == "cuda")
    s->device = torch::Device(torch::kCUDA, control.group->env().local_rank);
  s->group = control.group;
  // TF32 is process-wide in LibTorch: each run sets it (a CPU run has no cuBLAS to set).
  if (s->device.is_cuda()) at::globalContext().setAllowTF32CuBLAS(spec.run.tf32);
  s->global_batches = spec.optim.update_freq * s->world();

  torch::manual_seed(uint64_t(spec.run.seed));
  const auto data_start = TrainingSession::Clock::now();
  s->ds = data::load_dataset(spec.data, out);
  const double data_seconds =
      std::chrono::duration<double>(TrainingSession::Clock::now() - data_start).count();
  fmt::print(out, "data: {}\n", s->ds.summary);
  const ModelSpec model = model_spec(spec, s->ds);
  s->mcfg = model.config;
  {
    const TrainingMemoryOptions memory{
        spec.run.activation_checkpointing, spec.run.dtype != "fp32",
        longest_sequence(s->ds.train),     spec.run.shard_optimizer ? s->world() : 1,
        spec.run.device == "cpu",          resident_bytes()};
    const double available = available_memory_bytes(spec.run.device);
    if (!spec.run.allow_oversize) {
      const std::string problem = oversize_problem(spec.source, s->mcfg, spec.optim.max_tokens,
                                                   available, spec.run.device, memory);
      if (!problem.empty()) throw ManifestError(problem);
    }
    fmt::print(out, "memory: {}\n",
               memory_summary(s->mcfg, spec.optim.max_tokens, available, memory));
  }
  const AssembledModel assembled = assemble_checked(spec, model, registry, s->device);
  s->model = assembled.model;
  s->model->set_activation_checkpointing(spec.run.activation_checkpointing);
  const int64_t n_params = assembled.parameters;
  s->uniform_loss = std::log(double(s->ds.tgt_vocab));
  s->divergence_nll = spec.run.divergence_loss > 0 ? spec.run.divergence_loss : 3 * s->uniform_loss;
  const auto optimizer_start = TrainingSession::Clock::now();
  const std::string optimizer_line = make_optimizer(*s);
  if (spec.run.shard_optimizer && s->world() > 1) s->optimizer->shard(*s->group);
  s->setup_phases = fmt::format(
      "data {:.2f} s, model built on {} {:.2f} s, moved to {} {:.2f} s, optimizer {:.2f} s",
      data_seconds, assembled.built_on.str(), assembled.build_seconds, s->device.str(),
      assembled.move_seconds,
      std::chrono::duration<double>(TrainingSession::Clock::now() - optimizer_start).count());
  s->fp16 = spec.run.dtype == "fp16";
  nlohmann::json env = run_environment(spec, registry, assembled.scheme_name, assembled.scheme_file,
                                       threads, n_params);
  env["init_device"] = assembled.built_on.str();  // whose generator drew the initial weights
  env["tf32"] = s->device.is_cuda() && at::globalContext().allowTF32CuBLAS();
  env["fused_self_check"] = check_fused_ops(*s, out);
  if (s->group) env["distributed"] = distributed_environment(*s->group);
  s->segment_id = new_segment_id();
  env["segment"] = s->segment_id;
  s->env_text = env.dump(2) + "\n";
  s->model_line = model_line(spec, s->mcfg, assembled, threads) + optimizer_line;
  if (s->group)
    s->model_line +=
        fmt::format("data-parallel: {} ranks ({}), each on its share of the update's batches\n",
                    s->world(), s->group->backend());

  s->progress.max_updates = spec.optim.max_updates;
  if (!leader) {  // rank 0 holds the run directory; the others read what it says
    s->run = std::make_unique<RunDirectory>(RunDirectory::reader(dir));
    await_leader(*s, opened, s->resume_point);
    if (!opened.finished) opened.session = std::move(s);
    return opened;
  }
  // Everything above only read: a manifest, data, plugin or size error leaves no run directory.
  // A folder that is not a run (the user's, or /) is refused before anything is written into it;
  // a run that finished while we waited for its lock is not trained again.
  claim_run_directory(dir, fmt::format("{}: [run] out_dir", spec.source));
  s->run = std::make_unique<RunDirectory>(dir, control.lock_wait);
  if ((opened.finished = finished_run_said(spec, dir, resolved, out, control))) {
    if (control.group)
      control.group->post(
          "start",
          fmt::format("finished\n{}\n{}", opened.finished->exit_code, opened.finished->status),
          /*last=*/true);
    return opened;
  }
  s->global_batches =
      global_batches_for(spec, *s->run, control, s->world(), &s->batches_per_update_changed);
  record_batches_change(*s);

  opened.session = std::move(s);
  return opened;
}

// The manifest.resolved.toml of the run directory `checkpoint` was saved in (a normlab run
// directory holding it in checkpoints/), or "" when it lies elsewhere. Never the directory being
// resumed into: that one says what the new manifest wants, not what the checkpoint trained with.
std::string checkpoint_run_manifest(const fs::path& checkpoint) {
  const fs::path file = fs::absolute(checkpoint).lexically_normal();
  const fs::path run = file.parent_path().parent_path();
  if (file.parent_path().filename() != "checkpoints" || !fs::exists(run / "run.lock")) return "";
  std::ifstream f(run / "manifest.resolved.toml", std::ios::binary);
  std::stringstream text;
  text << f.rdbuf();
  return text.str();
}

// The lr schedule may change on a resume (optim.max_updates, a wsd decay's keys; on a branch into
// another directory, any key), but never the lr of an update the run has done: a cosine decay
// re-stretched, or a wsd decay changed midway, would make its lr jump (issues 59.4, 66.2). What
// the run did is the schedule its checkpoint records; a checkpoint older than that record is
// compared with its own run directory's manifest.resolved.toml (read before this resume rewrites
// it). With neither, nothing says what the run did: refused unless `allow_unverified`. Every
// resume path comes here: the run directory's last checkpoint, --resume-from, sweep workers
// (run-one), each job's rank 0.
void check_schedule_on_resume(const ExperimentSpec& spec, const fs::path& from,
                              const TrainingState& ck, bool branch, bool allow_unverified,
                              std::ostream& out) {
  const std::optional<OptimSection> was =
      ck.lr_schedule.empty()
          ? schedule_from_resolved_manifest(checkpoint_run_manifest(from), spec.optim)
          : schedule_from_record(ck.lr_schedule, spec.optim);
  if (!was) {
    const std::string unknown = fmt::format(
        "checkpoint {} (update {}) records no lr schedule (saved before normlab recorded it in "
        "__metadata__.lr_schedule) and lies in no run directory whose manifest.resolved.toml "
        "says one, so whether [optim] keeps the lr of its updates cannot be checked",
        from.string(), ck.updates);
    if (!allow_unverified)
      throw ManifestError(fmt::format(
          "{}: {}; resume from it inside its run directory (<out_dir>/checkpoints/), or, with the "
          "[optim] it trained with, pass --allow-unverified",
          spec.source, unknown));
    fmt::print(out, "note: {}; resuming anyway (--allow-unverified)\n", unknown);
    return;
  }
  check_lr_schedule_change(spec.source, *was, spec.optim, ck.updates,
                           branch ? fmt::format("the checkpoint it resumes from ({}, update {})",
                                                from.string(), ck.updates)
                                  : fmt::format("the run it resumes at update {}", ck.updates));
}

void start_session(TrainingSession& s, const TrainControl& control) {
  const ExperimentSpec& spec = s.spec;
  s.train_plan =
      std::make_unique<data::BatchPlan>(s.ds.train, spec.optim.max_tokens, uint64_t(spec.run.seed),
                                        /*shuffle=*/true, spec.data.sampling == "sequential");
  // What the next checkpoints record, and what a resume compares with the checkpoint's.
  s.st.batching = batching_record(s);
  s.st.validation = validation_record(s);
  if (s.leader()) {
    s.resume_point = s.run->resume_point(control.resume_from, control.allow_unverified);
    if (s.resume_point) {
      // A checkpoint that cannot be read fails the run (status.json says so) ...
      const TrainingState ck = checkpoint_state(*s.resume_point);
      // ... while a refused schedule comes before anything is written: the run's status.json
      // stays as it was (a completed run stays completed), as for a manifest of another experiment.
      s.status_kept = true;
      check_schedule_on_resume(spec, *s.resume_point, ck, !control.resume_from.empty(),
                               control.allow_unverified, s.out);
      // A checkpoint past max_updates, of other data, in other batches or of another model too.
      check_resume_data(s, *s.resume_point, ck, control.allow_data_change, /*say=*/false);
      check_checkpoint_model(*s.resume_point, *s.model);
      s.status_kept = false;
      keep_earlier_segments(s, *s.resume_point, ck);
    }
    s.run->write_file("manifest.resolved.toml", s.resolved_text);
    s.run->write_file("env.json", s.env_text);
  }
  const std::optional<fs::path> resume_from = s.resume_point;
  s.resuming = resume_from.has_value();
  // Two updates' batches ready (this rank reads only every world-th, but makes them all).
  if (s.ds.train.blocks)
    s.prefetch = std::make_unique<BatchPrefetcher>(*s.train_plan, 2 * s.global_batches / s.world(),
                                                   s.world(), s.group ? s.group->rank() : 0);
  s.valid_plan =
      std::make_unique<data::BatchPlan>(s.ds.valid, spec.optim.max_tokens, uint64_t(spec.run.seed),
                                        /*shuffle=*/false);
  s.valid_batches = s.valid_plan->epoch(0);
  fmt::print(s.out, "{}", s.model_line);
  if (std::getenv("NORMLAB_OMP_CHOICE"))  // how idle OpenMP threads wait, and why
    fmt::print(s.out, "OpenMP wait policy: {}\n", omp_choice_for(spec.run.threads));
  scheme_setup_pass(s);
  s.st.data_identity = s.ds.identity;
  s.st.lr_schedule = lr_schedule_record(spec.optim);
  // The initialization itself (after Admin's profile), for init studies without training.
  if (s.leader() && !s.resuming && spec.run.save_initial && s.st.updates == 0) {
    s.run->save_checkpoint("step_0.safetensors", [&](util::AtomicFile& f) {
      write_checkpoint(f, *s.model, *s.optimizer, s.st);
    });
    fmt::print(s.out, "initialization saved ({})\n",
               s.run->checkpoint("step_0.safetensors").string());
  }
  // Here the model is still θ_0 (same seed; a resumed run has not loaded its checkpoint yet).
  s.events->on_model_ready({spec, *s.model, s.run->path(), [&s](int64_t n) {
                              std::vector<int32_t> idx;
                              const size_t all = s.ds.valid.examples.size();
                              for (int32_t i = 0; i < int32_t(std::min<size_t>(all, size_t(n)));
                                   ++i)
                                idx.push_back(i);
                              const DeviceBatch b = to_device(s.valid_plan->make(idx), s.device);
                              return ExampleBatch{b.src, b.tgt_in, s.ds.pad_id};
                            }});
  if (s.resuming) resume(s, *resume_from, control.allow_data_change);
  s.st.segment = s.segment_id;  // the checkpoints this process writes
  s.progress.updates = s.st.updates;
  s.progress.epoch = s.epoch_now();
  s.progress.elapsed_s = s.st.elapsed_s;
  s.t_start = TrainingSession::Clock::now();
  s.first_update = s.st.updates;
  if (s.group) {
    if (s.leader())
      s.group->post("start", fmt::format("ok\n{}\n{}", s.global_batches,
                                         resume_from ? resume_from->string() : ""));
    // Every rank starts from rank 0's weights (as DDP does), whatever a rank's initialisation did.
    std::vector<torch::Tensor> tensors;
    for (const auto& p : s.model->parameters()) tensors.push_back(p.data());
    for (const auto& b : s.model->buffers()) tensors.push_back(b.data());
    s.group->broadcast(tensors);
  }
}

}  // namespace normlab
