// Downstream tasks in the loop (issue 58.4): eval.tasks scored every eval.tasks_interval updates
// (0: at each validation) and at the final validation, on the first eval.tasks_limit items of
// each, as `normlab eval --tasks` scores them (eval/task_eval.h: the same cut to max_length, the
// same long-item warning). Publishes on_tasks: a train.jsonl record per task, after the
// validation's of its update, with its own wall time.
#include <fmt/format.h>

#include <chrono>

#include "eval/task_eval.h"
#include "standard_observers.h"
#include "train/training_session.h"

namespace normlab {
namespace {

using json = nlohmann::json;

class TaskEvaluationObserver final : public TrainingObserver {
 public:
  void on_start(TrainingSession& s) override {
    if (!s.spec.eval.tasks.empty() && s.mcfg.arch != Arch::LM)
      throw std::runtime_error(
          "[eval] tasks: downstream tasks score language models (model.arch = \"lm\"); this is a "
          "translation model");
    // Every file read and checked now, with all that scoring it would refuse (the shots, the
    // tokenizer, each item's encoding): a bad one stops the run before its first update.
    tokens_ = eval::task_tokens(s.ds);
    try {
      for (const std::string& path : s.spec.eval.tasks)
        files_.push_back(eval::read_task_file(path, s.mcfg.tgt_vocab));
      eval::check_task_names(files_, "[eval] tasks");
      for (const eval::TaskFile& f : files_) {
        const std::vector<int64_t> tokens =
            eval::check_task(tokens_.tok, tokens_.eot, f, options(s));
        // Once, at the start: items far longer than the training block cost quadratically.
        if (const std::string w = eval::long_items_warning(f, tokens, s.spec.data.lm_block);
            !w.empty())
          fmt::print(s.out, "[eval] tasks: {}\n", w);
      }
    } catch (const std::exception& e) {
      throw std::runtime_error(fmt::format("[eval] tasks: {}", e.what()));
    }
  }
  // The tasks of a validation are scored once every observer has seen it (after_update and
  // on_training_done run after the validation's): its record comes first in train.jsonl and on
  // the console, as with a tasks_interval (issue 68.7).
  void after_update(TrainingSession& s) override {
    const int64_t every = s.spec.eval.tasks_interval;
    if (validated_ || (every > 0 && s.st.updates % every == 0)) run(s);
  }
  void on_validation(TrainingSession& s, const Validation& v) override {
    if (s.spec.eval.tasks_interval == 0 || v.final) validated_ = true;
  }
  void on_training_done(TrainingSession& s) override {
    if (validated_) run(s);
  }

 private:
  static eval::TaskOptions options(const TrainingSession& s) {
    eval::TaskOptions opt;
    opt.shots = int(s.spec.eval.tasks_shots);
    opt.shots_key = "eval.tasks_shots =";
    opt.limit = s.spec.eval.tasks_limit;
    opt.max_length = eval::harness_max_length(s.spec.data.lm_block);
    return opt;
  }

  void run(TrainingSession& s) {
    validated_ = false;
    if (files_.empty() || done_at_ == s.st.updates) return;
    done_at_ = s.st.updates;
    const eval::TaskOptions opt = options(s);
    TaskScores scores;
    for (const eval::TaskFile& f : files_) {
      const eval::TaskResult t =
          eval::evaluate_task(*s.model, tokens_.tok, tokens_.eot, f, opt, s.device);
      json r = eval::task_metrics(t);  // its "kind" (multiple_choice | last_word) as task_kind
      r["task_kind"] = r["kind"];
      r.update({{"kind", "task"},
                {"update", s.st.updates},
                {"task", t.name},
                {"shots", opt.shots},
                {"elapsed_s", s.elapsed()}});
      if (s.st.tokens >= 0) r["tokens"] = s.st.tokens;  // trained on so far
      scores.records.push_back(std::move(r));
      scores.average_acc += t.acc / double(files_.size());
      scores.seconds += t.seconds;
    }
    s.model->train();
    s.publish([&](TrainingObserver& o) { o.on_tasks(s, scores); });
  }

  std::vector<eval::TaskFile> files_;
  eval::TaskTokens tokens_;
  int64_t done_at_ = -1;
  bool validated_ = false;  // a validation asked for the tasks, not yet scored
};

}  // namespace

std::unique_ptr<TrainingObserver> make_task_evaluation() {
  return std::make_unique<TaskEvaluationObserver>();
}

}  // namespace normlab
