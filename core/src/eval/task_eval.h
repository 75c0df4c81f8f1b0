// Downstream evaluation (issue 58): zero- and few-shot multiple-choice and last-word tasks, scored
// as lm-evaluation-harness scores them (lm_eval/api/model.py and models/huggingface.py:
// _encode_pair, _loglikelihood_tokens; api/task.py: process_results, acc / acc_norm).
//
// A task is a JSONL file, one item a line (docs/downstream.md):
//   {"context": str, "choices": [str, …], "gold": int}     multiple choice: acc, acc_norm
//   {"context": str, "continuation": str}                  last word (LAMBADA): greedy match, ppl
//   {"contexts": [str, …], "continuation": str, "gold": int} partial scoring (Winogrande): each
//                                                          context with the one continuation
// optional per line: "target_delimiter" (default " ": each choice is scored as delimiter + choice),
// "fewshot": true (the item is in the few-shot pool, not scored), "fewshot_exclude": [int, …] (a
// scored item drawn for as the harness draws for a task whose few-shot split is, by its rules, the
// split it scores: K + 1 examples, the listed pool items removed), and pre-tokenized ids for models
// whose tokenizer normlab cannot run: "context_ids" with "choice_ids" ([[int], …]) or
// "continuation_ids" (zero-shot only).
//
// The model sees at most max_length tokens per choice, as the harness's HF model: the context is
// cut from the left, (context + continuation)[-(max_length + 1):][:-1].
#pragma once

#include <cstdint>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

#include "normlab/data/dataset.h"
#include "normlab/model/transformer_model.h"

namespace normlab::eval {

struct TaskItem {
  int64_t line = 0;  // in its file, from 1
  std::string context, target_delimiter = " ";
  std::vector<std::string> choices;   // a last-word or partial item: its one continuation
  std::vector<std::string> contexts;  // partial scoring: one context per choice (the harness's
                                      // multiple_input; `context` unused)
  int64_t gold = 0;
  bool last_word = false;  // "continuation": scored by greedy match
  bool fewshot = false;
  // "fewshot_exclude": the pool items (0-based, among the "fewshot" lines in file order) equal to
  // this item's dataset row. Given (even empty), its examples are drawn as the harness's
  // ContextSampler.sample with the item as eval_doc; absent: rnd.sample(pool, K).
  std::optional<std::vector<int64_t>> fewshot_exclude;
  // Pre-tokenized: context and each choice's continuation ids (empty: tokenize the text).
  std::vector<int32_t> context_ids;
  std::vector<std::vector<int32_t>> choice_ids;
};

struct TaskFile {
  std::string name;  // the file's stem: hellaswag.jsonl → hellaswag (results are keyed by it)
  std::filesystem::path path;
  std::string sha256;
  std::vector<TaskItem> items;  // scored, in file order
  std::vector<TaskItem> pool;   // "fewshot": true
  // The metrics lm-evaluation-harness reports for the task (its YAML's metric_list, in its
  // order), and where that was read (docs/downstream.md, *Which metrics are the harness's*).
  std::vector<std::string> harness_metrics;
  std::string metrics_from;
};

// Reads and checks a task file: one line `FILE:LINE: field: expected …` for a missing or mistyped
// field, a gold index out of range, an empty choice list, invalid UTF-8 or JSON (or JSON nested
// deeper than kMaxTaskJsonDepth), ids not below `vocab`. Throws RunInputError.
constexpr int kMaxTaskJsonDepth = 64;
TaskFile read_task_file(const std::filesystem::path& path, int64_t vocab);

// Results are keyed by task name (tasks.*.json, train.jsonl, the report's columns): two files of
// one name (test.jsonl in two folders, or one file given twice) are refused, naming both. `key`
// names the option in the message (--tasks, [eval] tasks).
void check_task_names(const std::vector<TaskFile>& files, const std::string& key);

// The most tokens a run's language model is scored on at once: what `normlab export --format hf`
// writes as max_position_embeddings, max(data.lm_block, 2048), which lm-evaluation-harness's HF
// model takes as its max_length.
int64_t harness_max_length(int64_t lm_block);

// What the harness's _encode_pair gives for context + continuation: the context's trailing
// whitespace moved to the continuation; the continuation's ids are those of the whole text after
// the context's ids. An empty context is `eot` alone.
struct EncodedPair {
  std::vector<int32_t> context, continuation;
};
EncodedPair encode_pair(const data::Tokenizer& tok, std::string context, std::string continuation,
                        int32_t eot);

// What a run's tasks are tokenized with: the run's SentencePiece model (a text run's, or the one
// normlab token shards record) and its EOS (the harness's prefix token for an empty context);
// other token shards: no tokenizer (pre-tokenized items only) and the shards' eos_id.
struct TaskTokens {
  const data::Tokenizer* tok = nullptr;
  int32_t eot = 0;
};
TaskTokens task_tokens(const data::Dataset& ds);

struct TaskOptions {
  int shots = 0;                      // few-shot examples drawn from the file's pool
  std::string shots_key = "--shots";  // what messages call it (eval.tasks_shots in a manifest)
  uint64_t seed = 1234;  // their draw: Python's random.Random(seed).sample(pool, shots) per item in
                         // order (K + 1 for an item with fewshot_exclude), as the harness's
                         // default sampler (its fewshot_random_seed)
  int64_t limit = 0;     // > 0: only the first `limit` items
  int64_t batch_tokens = 2048;  // tokens per forward pass (padded; the logits are B·T·V floats)
  // The harness's max_length (harness_max_length): a longer context is cut from the left, a
  // continuation longer than it refused; no row of a forward pass is longer.
  int64_t max_length = 2048;
  // Each context once, its choices packed after it (the same scores to rounding; false: every
  // choice a sequence of its own, as the harness runs them).
  bool share_contexts = true;
  // Items split across the ranks of a job (`normlab eval --nproc`): this rank scores items
  // rank, rank + world, …; `sum_over_ranks` adds every rank's vector (each the same length), so
  // that every rank ends with all the scores. The few-shot draw is every item's on every rank.
  int rank = 0, world = 1;
  // Resamples of the bootstrap of a last-word task's perplexity stderr (the harness's default).
  int64_t bootstrap_iters = 100000;
  std::function<std::vector<double>(const std::vector<double>&)> sum_over_ranks;
};

struct ItemScore {
  int64_t line = 0;
  std::vector<double>
      loglikelihood;  // per choice (partial: per context): the sum of its continuation's log-probs
  std::vector<bool> greedy;      // per choice: every continuation token is the argmax
  std::vector<int64_t> tokens;   // per choice: continuation tokens
  std::vector<int64_t> fewshot;  // the pool items' lines, in prompt order
  int64_t truncated = 0;  // context tokens cut from the left to fit max_length (most of any choice)
  bool correct = false, correct_norm = false;
};

struct TaskResult {
  std::string name, file, sha256, kind;  // kind: multiple_choice | last_word
  int64_t items = 0;
  double acc = 0, acc_stderr = 0, acc_norm = 0, acc_norm_stderr = 0;
  double bits_per_byte = 0;  // of the gold continuations: −Σ ll / (ln 2 · Σ UTF-8 bytes)
  double ppl = 0;            // last word: exp(−mean ll), as the harness's lambada
  double ppl_stderr = 0;     // ... and its bootstrap standard error, as the harness's
  // OLMo's downstream bpb: the mean over items of each gold continuation's −ll / (ln 2 · bytes).
  double bits_per_byte_item_mean = 0;
  double chance = 0;  // multiple choice: the mean over items of 1 / choices (0 for last word)
  std::vector<std::string> harness_metrics;
  std::string metrics_from;
  double seconds = 0;
  int64_t max_length = 0, truncated_items = 0;  // items whose context was cut to fit max_length
  int64_t longest_row = 0;  // tokens in the longest row of a forward pass (at most max_length)
  std::vector<ItemScore> scores;
};

// lm-evaluation-harness's standard error of a perplexity (lm_eval/api/metrics.py bootstrap_stderr
// on the `perplexity` aggregation, as 0.4.13 runs it): iters / 1000 chunks of 1000 resamples, chunk
// i drawn by Python's random.Random(i).choices(lls, k=n); the sample standard deviation of the
// resamples' exp(−mean). The same draws as the harness's, so the same number up to rounding.
double harness_perplexity_stderr(const std::vector<double>& lls, int64_t iters = 100000);

// A result's metrics as JSON (file, sha256, kind, items, acc, acc_stderr, acc_norm,
// acc_norm_stderr, bits_per_byte, seconds, max_length, truncated_items; ppl for a last-word task),
// harness_metrics / metrics_from / normlab_metrics (which of them are the harness's), without the
// item scores.
nlohmann::json task_metrics(const TaskResult& t);

// Refuses, as evaluate_task would, what scoring `task` with `opt` cannot do (RunInputError naming
// the file and line): more shots than the pool (for an item with fewshot_exclude, than the pool
// less one, or less the items it lists), pre-tokenized items with shots, text items without a
// tokenizer, a context or choice that encodes to nothing, a continuation longer than max_length.
// Cheap (tokenizes the items scored, no model): run it before training or scoring starts.
// Returns each scored item's tokens: its longest choice's context + continuation as scored (after
// the cut to max_length).
std::vector<int64_t> check_task(const data::Tokenizer* tok, int32_t eot, const TaskFile& task,
                                const TaskOptions& opt);

// A warning ("" when none) naming `task`'s file and how many of `item_tokens` (check_task's) are
// longer than kLongItemBlocks × `lm_block`, the model's training block: attention's cost grows with
// the square of a row's length (issue 68.4: 4 items of 5 K tokens took 3× a validation).
constexpr int64_t kLongItemBlocks = 2;
std::string long_items_warning(const TaskFile& task, const std::vector<int64_t>& item_tokens,
                               int64_t lm_block);

// Scores every item of `task` with `model` (eval mode, no gradients) on `device`. `tok` may be
// null when every item is pre-tokenized.
TaskResult evaluate_task(TransformerModelImpl& model, const data::Tokenizer* tok, int32_t eot,
                         const TaskFile& task, const TaskOptions& opt, const at::Device& device);

}  // namespace normlab::eval
