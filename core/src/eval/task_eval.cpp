#include "task_eval.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <set>

#include "data/internal.h"
#include "python_random.h"
#include "run_model.h"
#include "torch_api.h"
#include "util/atomic_file.h"
#include "util/utf8.h"

namespace fs = std::filesystem;
using json = nlohmann::json;

namespace normlab::eval {
namespace {

// Code points of UTF-8 text: Python's len(), which the harness's acc_norm divides by.
int64_t code_point_count(const std::string& s) {
  int64_t n = 0;
  for (unsigned char c : s) n += (c & 0xC0) != 0x80;
  return n;
}

// Python's str.isspace() for one code point: what str.rstrip() strips (the harness moves a
// context's trailing whitespace to its continuation, U+0085 and U+3000 included).
bool python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 ||
         c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F ||
         c == 0x205F || c == 0x3000;
}

// The bytes of `s`'s trailing whitespace as Python's str.rstrip() finds it (valid UTF-8).
size_t trailing_space(const std::string& s) {
  size_t end = s.size();
  while (end > 0) {
    size_t start = end - 1;
    while (start > 0 && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    uint32_t c = static_cast<unsigned char>(s[start]);
    const size_t len = end - start;
    if (len > 1) {
      c &= 0xFFu >> (len + 1);
      for (size_t i = start + 1; i < end; ++i)
        c = (c << 6) | (static_cast<unsigned char>(s[i]) & 0x3F);
    }
    if (!python_space(c)) break;
    end = start;
  }
  return s.size() - end;
}

class LineReader {
 public:
  LineReader(const fs::path& file, int64_t line, int64_t vocab)
      : file_(file), line_(line), vocab_(vocab) {}
  RunInputError bad(const std::string& field, const std::string& what) const {
    return RunInputError(fmt::format("{}:{}: {}: {}", file_.string(), line_, field, what));
  }
  std::string text(const json& j, const char* field) const {
    if (!j[field].is_string()) throw bad(field, "expected a string, got " + type(j[field]));
    return j[field].get<std::string>();
  }
  std::vector<int32_t> ids(const json& v, const std::string& field) const {
    if (!v.is_array()) throw bad(field, "expected a list of token ids, got " + type(v));
    std::vector<int32_t> out;
    for (const json& e : v) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0 || e.get<int64_t>() >= vocab_)
        throw bad(field, fmt::format("expected token ids from 0 to {} (the model's vocabulary), "
                                     "got {}",
                                     vocab_ - 1, brief(e)));
      out.push_back(int32_t(e.get<int64_t>()));
    }
    return out;
  }
  static std::string type(const json& v) { return std::string("a JSON ") + v.type_name(); }
  // A value as a message shows it: ASCII JSON, cut after 60 characters (a line may hold megabytes).
  static std::string brief(const json& v) {
    std::string s = v.dump(-1, ' ', /*ensure_ascii=*/true, json::error_handler_t::replace);
    return s.size() <= 60 ? s : s.substr(0, 57) + "...";
  }

 private:
  const fs::path& file_;
  int64_t line_, vocab_;
};

// {"contexts": [str, …], "continuation": str, "gold": int}: the harness's partial scoring
// (Winogrande: the sentence up to the blank, filled with each option, then the shared rest).
TaskItem parse_partial(const LineReader& r, const json& j, TaskItem it, bool has_ids) {
  if (has_ids) throw r.bad("context_ids", "not supported with \"contexts\" (partial scoring)");
  if (j.contains("choices")) throw r.bad("choices", "expected either \"contexts\" or \"choices\"");
  if (j.contains("context")) throw r.bad("context", "expected either \"contexts\" or \"context\"");
  const json& c = j["contexts"];
  if (!c.is_array() || c.empty())
    throw r.bad("contexts", "expected a non-empty list of strings, got " +
                                (c.is_array() ? std::string("an empty list") : r.type(c)));
  for (const json& e : c) {
    if (!e.is_string()) throw r.bad("contexts", "expected strings, got " + r.type(e));
    it.contexts.push_back(e.get<std::string>());
  }
  if (!j.contains("continuation"))
    throw r.bad("continuation", "missing (the text scored after each context)");
  it.choices.push_back(r.text(j, "continuation"));
  if (!j.contains("gold") || !j["gold"].is_number_integer() || j["gold"].get<int64_t>() < 0 ||
      j["gold"].get<int64_t>() >= int64_t(it.contexts.size()))
    throw r.bad("gold", fmt::format("expected an index from 0 to {} into contexts, got {}",
                                    it.contexts.size() - 1,
                                    j.contains("gold") ? r.brief(j["gold"]) : "nothing"));
  it.gold = j["gold"].get<int64_t>();
  return it;
}

TaskItem parse_item(const fs::path& file, int64_t line, const std::string& text, int64_t vocab) {
  const LineReader r(file, line, vocab);
  if (const size_t bad = util::find_invalid_utf8(text); bad != std::string::npos)
    throw r.bad("(line)", fmt::format("invalid UTF-8 at byte {}", bad));
  // Nesting is bounded as it is read: a value nested 200,000 deep would overflow the stack of
  // the recursive code that later prints or copies it.
  // A key given twice in one object is refused: which one counts ("gold": 0, "gold": 1) would be a
  // guess (JSON leaves it open; Python's json and this parser keep the last).
  struct TooDeep {};
  struct TwiceGiven {
    std::string key;
  };
  std::vector<std::set<std::string>> keys;  // of each object being read
  const json::parser_callback_t checks = [&keys](int depth, json::parse_event_t event,
                                                 json& parsed) {
    if (depth > kMaxTaskJsonDepth) throw TooDeep{};
    if (event == json::parse_event_t::object_start) keys.emplace_back();
    if (event == json::parse_event_t::object_end && !keys.empty()) keys.pop_back();
    if (event == json::parse_event_t::key && !keys.empty() &&
        !keys.back().insert(parsed.get<std::string>()).second)
      throw TwiceGiven{parsed.get<std::string>()};
    return true;
  };
  json j;
  try {
    j = json::parse(text, checks);
  } catch (const json::parse_error& e) {
    if (std::string(e.what()).find("surrogate") != std::string::npos)
      throw r.bad("(line)", fmt::format("a \\u escape of a lone UTF-16 surrogate near byte {} "
                                        "(half of a character, not text)",
                                        e.byte));
    throw r.bad("(line)", fmt::format("not JSON (syntax error at byte {})", e.byte));
  } catch (const TooDeep&) {
    throw r.bad("(line)", fmt::format("JSON nested deeper than {} levels", kMaxTaskJsonDepth));
  } catch (const TwiceGiven& t) {
    std::string key = t.key.size() > 60 ? t.key.substr(0, 57) + "..." : t.key;
    for (char& c : key)
      if (static_cast<unsigned char>(c) < 0x20) c = '?';  // the message stays one line
    throw r.bad(key.empty() ? "\"\" (an empty key)" : key,
                "given twice in one object (which one counts would be a guess)");
  }
  if (!j.is_object()) throw r.bad("(line)", "expected a JSON object, got " + r.type(j));
  TaskItem it;
  it.line = line;
  const bool has_ids = j.contains("context_ids");
  if (j.contains("target_delimiter")) it.target_delimiter = r.text(j, "target_delimiter");
  if (j.contains("fewshot")) {
    if (!j["fewshot"].is_boolean()) throw r.bad("fewshot", "expected true or false");
    it.fewshot = j["fewshot"].get<bool>();
  }
  if (j.contains("fewshot_exclude")) {
    if (it.fewshot)
      throw r.bad("fewshot_exclude", "only for scored items (this line is in the few-shot pool)");
    const json& x = j["fewshot_exclude"];
    if (!x.is_array())
      throw r.bad("fewshot_exclude",
                  "expected a list of pool indices (0-based, among the \"fewshot\" lines), got " +
                      r.type(x));
    it.fewshot_exclude.emplace();
    for (const json& e : x) {
      if (!e.is_number_integer() || e.get<int64_t>() < 0)
        throw r.bad(
            "fewshot_exclude",
            "expected pool indices from 0 (among the \"fewshot\" lines), got " + r.brief(e));
      it.fewshot_exclude->push_back(e.get<int64_t>());
    }
  }
  if (j.contains("contexts")) return parse_partial(r, j, std::move(it), has_ids);
  if (j.contains("context"))
    it.context = r.text(j, "context");
  else if (!has_ids)
    throw r.bad("context", "missing (the prompt, used verbatim)");
  const bool mc = j.contains("choices"), lw = j.contains("continuation");
  if (mc == lw)
    throw r.bad(mc ? "continuation" : "choices",
                "expected either \"choices\" with \"gold\" or one \"continuation\"");
  if (lw) {
    it.last_word = true;
    it.choices.push_back(r.text(j, "continuation"));
    if (j.contains("continuation_ids"))
      it.choice_ids.push_back(r.ids(j["continuation_ids"], "continuation_ids"));
  } else {
    const json& c = j["choices"];
    if (!c.is_array() || c.empty())
      throw r.bad("choices", "expected a non-empty list of strings, got " +
                                 (c.is_array() ? std::string("an empty list") : r.type(c)));
    for (const json& e : c) {
      if (!e.is_string()) throw r.bad("choices", "expected strings, got " + r.type(e));
      it.choices.push_back(e.get<std::string>());
    }
    if (!j.contains("gold") || !j["gold"].is_number_integer() || j["gold"].get<int64_t>() < 0 ||
        j["gold"].get<int64_t>() >= int64_t(it.choices.size()))
      throw r.bad("gold", fmt::format("expected an index from 0 to {} into choices, got {}",
                                      it.choices.size() - 1,
                                      j.contains("gold") ? r.brief(j["gold"]) : "nothing"));
    it.gold = j["gold"].get<int64_t>();
    if (j.contains("choice_ids")) {
      const json& ci = j["choice_ids"];
      if (!ci.is_array() || ci.size() != it.choices.size())
        throw r.bad("choice_ids",
                    fmt::format("expected {} lists of ids, one per choice", it.choices.size()));
      for (const json& e : ci) it.choice_ids.push_back(r.ids(e, "choice_ids"));
    }
  }
  if (has_ids) {
    it.context_ids = r.ids(j["context_ids"], "context_ids");
    if (it.context_ids.empty()) throw r.bad("context_ids", "expected at least one id");
    if (it.choice_ids.empty())
      throw r.bad(lw ? "continuation_ids" : "choice_ids", "missing (context_ids is given)");
  } else if (!it.choice_ids.empty()) {
    throw r.bad("context_ids", "missing (continuation or choice ids are given)");
  }
  for (const auto& ids : it.choice_ids)
    if (ids.empty()) throw r.bad(lw ? "continuation_ids" : "choice_ids", "an empty list");
  return it;
}

double mean_of(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / double(v.size());
}

// The harness's mean_stderr: the sample standard deviation over √n.
double stderr_of(const std::vector<double>& v) {
  if (v.size() < 2) return 0;
  const double m = mean_of(v);
  double ss = 0;
  for (double x : v) ss += (x - m) * (x - m);
  return std::sqrt(ss / double(v.size() - 1) / double(v.size()));
}

struct Request {
  size_t item, choice;
  std::vector<int32_t> context, continuation;
};

// The metric_list of the harness YAMLs python/normlab_tasks.py converts (lm_eval 0.4.13), for
// TASK.source.json files written before it recorded "metrics".
const std::vector<std::pair<std::string, std::vector<std::string>>>& known_yaml_metrics() {
  static const std::vector<std::pair<std::string, std::vector<std::string>>> known = {
      {"lm_eval/tasks/hellaswag/hellaswag.yaml", {"acc", "acc_norm"}},
      {"lm_eval/tasks/piqa/piqa.yaml", {"acc", "acc_norm"}},
      {"lm_eval/tasks/arc/arc_easy.yaml", {"acc", "acc_norm"}},
      {"lm_eval/tasks/arc/arc_challenge.yaml", {"acc", "acc_norm"}},
      {"lm_eval/tasks/winogrande/default.yaml", {"acc"}},
      {"lm_eval/tasks/super_glue/boolq/default.yaml", {"acc"}},
      {"lm_eval/tasks/openbookqa/openbookqa.yaml", {"acc", "acc_norm"}},
      {"lm_eval/tasks/sciq/sciq.yaml", {"acc", "acc_norm"}},
      {"lm_eval/tasks/lambada/lambada_openai.yaml", {"perplexity", "acc"}}};
  return known;
}

// Which metrics the harness reports for the task: TASK.source.json beside the file (written by
// python/normlab_tasks.py) names them ("format": "metrics"), or its task YAML; without one, the
// harness's defaults for the task's output type (lm_eval/api/registry.py DEFAULT_METRIC_REGISTRY:
// loglikelihood → perplexity, acc; multiple_choice → acc, acc_norm).
void set_harness_metrics(TaskFile& t) {
  const bool last_word = t.items.front().last_word;
  const fs::path source = t.path.parent_path() / (t.name + ".source.json");
  std::error_code ec;
  if (fs::is_regular_file(source, ec)) {
    std::ifstream in(source, std::ios::binary);
    const json j = json::parse(in, nullptr, false);
    if (j.is_discarded() || !j.is_object())
      throw RunInputError(
          fmt::format("{}: not a JSON object (the task's source record, read for "
                      "which metrics lm-evaluation-harness reports)",
                      source.string()));
    const json fmt_ = j.value("format", json::object());
    if (fmt_.is_object() && fmt_.contains("metrics")) {
      const json& m = fmt_["metrics"];
      const std::vector<std::string> allowed = last_word
                                                   ? std::vector<std::string>{"perplexity", "acc"}
                                                   : std::vector<std::string>{"acc", "acc_norm"};
      bool ok = m.is_array() && !m.empty();
      if (ok)
        for (const json& x : m)
          ok = ok && x.is_string() &&
               std::find(allowed.begin(), allowed.end(), x.get<std::string>()) != allowed.end();
      if (!ok)
        throw RunInputError(fmt::format(
            "{}: format.metrics: expected a non-empty list of metrics among {} (what normlab "
            "computes for a {} task), got {}",
            source.string(), fmt::join(allowed, ", "), last_word ? "last-word" : "multiple-choice",
            m.dump().substr(0, 60)));
      for (const json& x : m) t.harness_metrics.push_back(x.get<std::string>());
      t.metrics_from = source.filename().string() + " format.metrics";
      return;
    }
    const std::string yaml =
        fmt_.is_object() && fmt_.value("task_yaml", json()).is_string() ? fmt_["task_yaml"] : "";
    for (const auto& [name, metrics] : known_yaml_metrics())
      if (name == yaml) {
        t.harness_metrics = metrics;
        t.metrics_from = source.filename().string() + " format.task_yaml " + yaml;
        return;
      }
  }
  t.harness_metrics = last_word ? std::vector<std::string>{"perplexity", "acc"}
                                : std::vector<std::string>{"acc", "acc_norm"};
  t.metrics_from = last_word ? "the harness's defaults for a loglikelihood task"
                             : "the harness's defaults for a multiple_choice task";
}

}  // namespace

TaskFile read_task_file(const fs::path& path, int64_t vocab) {
  std::error_code ec;
  if (!fs::is_regular_file(path, ec))
    throw RunInputError(fmt::format("--tasks {}: not a readable file", path.string()));
  std::ifstream in(path, std::ios::binary);
  if (!in) throw RunInputError(fmt::format("--tasks {}: cannot be read", path.string()));
  TaskFile t;
  t.path = path;
  t.name = path.stem().string();
  t.sha256 = util::sha256_file(path);
  int64_t line = 0;
  for (std::string text; std::getline(in, text);) {
    ++line;
    if (!text.empty() && text.back() == '\r') text.pop_back();
    if (text.find_first_not_of(" \t") == std::string::npos) continue;  // blank lines
    TaskItem it = parse_item(path, line, text, vocab);
    (it.fewshot ? t.pool : t.items).push_back(std::move(it));
  }
  if (t.items.empty())
    throw RunInputError(
        fmt::format("{}: no item to score (every line is empty or \"fewshot\")", path.string()));
  for (const TaskItem& it : t.items)
    if (it.fewshot_exclude)
      for (const int64_t k : *it.fewshot_exclude)
        if (k >= int64_t(t.pool.size()))
          throw RunInputError(
              fmt::format("{}:{}: fewshot_exclude: {} is not a pool index (0-based; the file has "
                          "{} \"fewshot\" lines)",
                          path.string(), it.line, k, t.pool.size()));
  set_harness_metrics(t);
  return t;
}

void check_task_names(const std::vector<TaskFile>& files, const std::string& key) {
  for (size_t i = 0; i < files.size(); ++i)
    for (size_t k = 0; k < i; ++k) {
      if (files[k].name != files[i].name) continue;
      std::error_code ec;
      if (fs::equivalent(files[k].path, files[i].path, ec))
        throw RunInputError(fmt::format("{}: {} is given twice", key, files[i].path.string()));
      throw RunInputError(fmt::format(
          "{}: {} and {} are both task '{}' (results are keyed by the file's name without its "
          "extension): rename one",
          key, files[k].path.string(), files[i].path.string(), files[i].name));
    }
}

int64_t harness_max_length(int64_t lm_block) { return std::max<int64_t>(lm_block, 2048); }

TaskTokens task_tokens(const data::Dataset& ds) {
  // Token shards whose shards.json names their SentencePiece model carry it (issue 59.3).
  const bool encodes =
      dynamic_cast<const data::detail::SentencePieceTokenizer*>(ds.tgt_tokenizer.get()) != nullptr;
  return {encodes ? ds.tgt_tokenizer.get() : nullptr, int32_t(std::max<int64_t>(0, ds.eos_id))};
}

EncodedPair encode_pair(const data::Tokenizer& tok, std::string context, std::string continuation,
                        int32_t eot) {
  if (context.empty()) return {{eot}, tok.encode(continuation)};
  if (const size_t n = trailing_space(context); n > 0) {
    continuation = context.substr(context.size() - n) + continuation;
    context.resize(context.size() - n);
  }
  const std::vector<int32_t> whole = tok.encode(context + continuation);
  std::vector<int32_t> ctx = tok.encode(context);
  const size_t at = std::min(ctx.size(), whole.size());
  return {std::move(ctx), std::vector<int32_t>(whole.begin() + int64_t(at), whole.end())};
}

namespace {

// Each choice of each of the first `n` items as a request: its context (with the item's few-shot
// prefix) and continuation, tokenized as the harness does; `scores` sized for them.
// The text scored for choice c and the context it follows (partial scoring: the c-th context and
// the one continuation).
size_t choice_count(const TaskItem& it) {
  return it.contexts.empty() ? it.choices.size() : it.contexts.size();
}
const std::string& context_of(const TaskItem& it, size_t c) {
  return it.contexts.empty() ? it.context : it.contexts[c];
}
const std::string& choice_of(const TaskItem& it, size_t c) {
  return it.contexts.empty() ? it.choices[c] : it.choices[0];
}
// What acc_norm divides by: the harness's len() of doc_to_choice's entries (partial: the contexts).
int64_t norm_length(const TaskItem& it, size_t c) {
  return std::max<int64_t>(1,
                           code_point_count(it.contexts.empty() ? it.choices[c] : it.contexts[c]));
}

// What precedes choice c's text when it is scored: the target delimiter, except for a last-word
// item, whose continuation is scored as given (the harness's loglikelihood output type passes
// doc_to_target alone; the delimiter joins only its few-shot examples).
std::string scored_delimiter(const TaskItem& it) { return it.last_word ? "" : it.target_delimiter; }

// A few-shot example as the harness writes it: question, delimiter, gold answer.
std::string example_text(const TaskItem& ex) {
  const size_t g = size_t(ex.gold);
  return context_of(ex, g) + ex.target_delimiter + choice_of(ex, g) + "\n\n";
}

// The pool items drawn as `it`'s examples, as the harness's default sampler draws them
// (lm_eval/api/samplers.py ContextSampler.sample, one `rng` per task, items in order). An item
// with fewshot_exclude is drawn for as the harness draws for a task whose few-shot split is, by its
// rules, the split it scores (api/task.py fewshot_context passes the document as eval_doc when
// the few-shot split equals test_split, both unset for HellaSwag, PIQA, Winogrande, BoolQ):
// rnd.sample(pool, K + 1), the pool items equal to the document removed, the first K kept; fewer
// than K left (copies of it drawn): rnd.sample(the pool without them, K).
std::vector<size_t> draw_examples(PythonRandom& rng, const TaskFile& task, const TaskItem& it,
                                  const TaskOptions& opt) {
  const size_t n = task.pool.size(), k = size_t(opt.shots);
  if (!it.fewshot_exclude) return rng.sample(n, k);
  if (n < k + 1)
    throw RunInputError(fmt::format(
        "{} {}: {}:{} has fewshot_exclude, for which the harness draws {} + 1 examples (then "
        "drops the item itself), but the file has {} few-shot items (\"fewshot\": true)",
        opt.shots_key, opt.shots, task.path.string(), it.line, k, n));
  std::vector<bool> excluded(n, false);
  for (const int64_t e : *it.fewshot_exclude) excluded[size_t(e)] = true;
  std::vector<size_t> picks;
  for (const size_t j : rng.sample(n, k + 1))
    if (!excluded[j] && picks.size() < k) picks.push_back(j);
  if (picks.size() == k) return picks;
  std::vector<size_t> rest;
  for (size_t j = 0; j < n; ++j)
    if (!excluded[j]) rest.push_back(j);
  if (rest.size() < k)
    throw RunInputError(
        fmt::format("{} {}: {}:{}: {} few-shot items are left once fewshot_exclude's are removed",
                    opt.shots_key, opt.shots, task.path.string(), it.line, rest.size()));
  picks.clear();
  for (const size_t j : rng.sample(rest.size(), k)) picks.push_back(rest[j]);
  return picks;
}

// Each choice of each of the first `n` items as a request: its context (with the item's few-shot
// prefix) and continuation, tokenized as the harness does; `scores` sized for them.
std::vector<Request> make_requests(const data::Tokenizer* tok, int32_t eot, const TaskFile& task,
                                   const TaskOptions& opt, size_t n,
                                   std::vector<ItemScore>& scores) {
  std::vector<Request> requests;
  scores.resize(n);
  // The harness's default sampler: one Random(seed) per task, drawn per item in order.
  PythonRandom rng(opt.seed);
  for (size_t i = 0; i < n; ++i) {
    const TaskItem& it = task.items[i];
    ItemScore& sc = scores[i];
    sc.line = it.line;
    std::string prefix;
    if (opt.shots > 0) {
      // The examples are joined as text before the item's context: ids cannot take them.
      if (!it.context_ids.empty())
        throw RunInputError(fmt::format(
            "{} {}: {}:{} is pre-tokenized (context_ids): such items are scored zero-shot only",
            opt.shots_key, opt.shots, task.path.string(), it.line));
      for (size_t k : draw_examples(rng, task, it, opt)) {
        if (!task.pool[k].context_ids.empty())
          throw RunInputError(fmt::format(
              "{} {}: {}:{} is pre-tokenized (context_ids): few-shot examples are joined as text",
              opt.shots_key, opt.shots, task.path.string(), task.pool[k].line));
        prefix += example_text(task.pool[k]);
        sc.fewshot.push_back(task.pool[k].line);
      }
    }
    const size_t choices = choice_count(it);
    for (size_t c = 0; c < choices; ++c) {
      Request r{i, c, {}, {}};
      if (!it.context_ids.empty()) {
        r.context = it.context_ids;
        r.continuation = it.choice_ids[c];
      } else {
        if (!tok)
          throw RunInputError(fmt::format(
              "{}:{}: this run has no tokenizer (token shards): give context_ids and choice_ids",
              task.path.string(), it.line));
        EncodedPair p = encode_pair(*tok, prefix + context_of(it, c),
                                    scored_delimiter(it) + choice_of(it, c), eot);
        r.context = std::move(p.context);
        r.continuation = std::move(p.continuation);
      }
      // A context of whitespace alone encodes to nothing: no state would predict the continuation
      // (the harness asserts on it).
      if (r.context.empty())
        throw RunInputError(
            fmt::format("{}:{}: the context of choice {} encodes to no token (whitespace only?)",
                        task.path.string(), it.line, c));
      if (r.continuation.empty())
        throw RunInputError(
            it.last_word ? fmt::format("{}:{}: the continuation encodes to no token (empty?)",
                                       task.path.string(), it.line)
                         : fmt::format("{}:{}: choice {} encodes to no token", task.path.string(),
                                       it.line, c));
      // The harness's window (huggingface.py _loglikelihood_tokens): (context + continuation)
      // [-(max_length + 1):][:-1], the continuation scored whole after what is left of the context.
      if (int64_t(r.continuation.size()) > opt.max_length)
        throw RunInputError(
            fmt::format("{}:{}: choice {} is {} tokens, more than the model's max_length {} "
                        "(max(data.lm_block, 2048), as lm-evaluation-harness)",
                        task.path.string(), it.line, c, r.continuation.size(), opt.max_length));
      const int64_t over = int64_t(r.context.size() + r.continuation.size()) - (opt.max_length + 1);
      if (over > 0) {
        r.context.erase(r.context.begin(), r.context.begin() + over);
        sc.truncated = std::max(sc.truncated, over);
      }
      requests.push_back(std::move(r));
    }
    sc.loglikelihood.assign(choices, 0);
    sc.greedy.assign(choices, false);
    sc.tokens.assign(choices, 0);
  }
  return requests;
}

// A row of a batch: one context and the continuations scored after it. Shared (every choice of an
// item whose context tokens are the same): the context once, then each continuation's inputs, each
// seeing the context and its own earlier tokens at the positions it would have alone. Else one
// request, teacher-forced causally.
struct Unit {
  std::vector<size_t> requests;
  int64_t length = 0;  // tokens in the row
};

// A row holds at most `max_length` tokens (a request alone fits: make_requests truncates it), so
// that memory is bounded by batch_tokens · max_length whatever the items.
std::vector<Unit> make_units(const std::vector<Request>& rq, bool share, int64_t max_length) {
  std::vector<Unit> units;
  for (size_t k = 0; k < rq.size();) {
    Unit u;
    u.length = int64_t(rq[k].context.size());
    size_t e = k;
    do {
      u.requests.push_back(e);
      u.length += int64_t(rq[e].continuation.size()) - 1;
      ++e;
    } while (share && e < rq.size() && rq[e].item == rq[k].item && rq[e].context == rq[k].context &&
             u.length + int64_t(rq[e].continuation.size()) - 1 <= max_length);
    units.push_back(std::move(u));
    k = e;
  }
  // Longest first, as the harness orders its requests: batches of like lengths pad little. Each
  // request carries its item and choice, so the order changes no score.
  std::stable_sort(units.begin(), units.end(),
                   [](const Unit& a, const Unit& b) { return a.length > b.length; });
  return units;
}

// One batch's inputs: tokens [B,T]; for shared rows their positions and additive mask [B,1,T,T];
// and, per continuation token, the (row, position) whose state predicts it, and the token.
struct BatchInputs {
  torch::Tensor tokens, positions, mask;
  std::vector<int64_t> rows, at, targets;
};

BatchInputs batch_inputs(const std::vector<Request>& rq, const std::vector<Unit>& units, size_t b,
                         size_t e, int64_t T, int32_t eot, bool shared) {
  const int64_t B = int64_t(e - b);
  BatchInputs in;
  in.tokens = torch::full({B, T}, int64_t(eot), torch::kLong);
  auto tok = in.tokens.accessor<int64_t, 2>();
  if (shared) {
    in.positions = torch::zeros({B, T}, torch::kLong);
    in.mask = torch::full({B, 1, T, T}, -std::numeric_limits<float>::infinity(), torch::kFloat);
  }
  for (int64_t row = 0; row < B; ++row) {
    const Unit& u = units[b + size_t(row)];
    const std::vector<int32_t>& ctx = rq[u.requests.front()].context;
    const int64_t L = int64_t(ctx.size());
    for (int64_t t = 0; t < L; ++t) tok[row][t] = ctx[size_t(t)];
    int64_t next = L;  // where the next continuation's inputs begin
    for (size_t k : u.requests) {
      const std::vector<int32_t>& cont = rq[k].continuation;
      const int64_t first = next;
      for (size_t j = 0; j < cont.size(); ++j) {
        in.rows.push_back(row);
        // Token j is predicted by the context's last state (j = 0) or by token j − 1's.
        in.at.push_back(j == 0 ? L - 1 : first + int64_t(j) - 1);
        in.targets.push_back(cont[j]);
        if (j + 1 < cont.size()) tok[row][next++] = cont[j];
      }
      if (!shared) continue;
      auto pos = in.positions.accessor<int64_t, 2>();
      auto m = in.mask.accessor<float, 4>();
      for (int64_t t = first; t < next; ++t) {
        pos[row][t] = L + (t - first);
        for (int64_t s = 0; s < L; ++s) m[row][0][t][s] = 0;
        for (int64_t s = first; s <= t; ++s) m[row][0][t][s] = 0;
      }
    }
    if (!shared) continue;
    auto pos = in.positions.accessor<int64_t, 2>();
    auto m = in.mask.accessor<float, 4>();
    for (int64_t t = 0; t < L; ++t) {
      pos[row][t] = t;
      for (int64_t s = 0; s <= t; ++s) m[row][0][t][s] = 0;
    }
    for (int64_t t = next; t < T; ++t) m[row][0][t][t] = 0;  // padding sees itself: no NaN
  }
  return in;
}

// Every request's log-likelihood and greedy match into `scores`: rows of units (make_units)
// batched up to batch_tokens, padded on the right.
// Returns the longest row's tokens.
int64_t score_requests(TransformerModelImpl& model, int32_t eot,
                       const std::vector<Request>& requests, const TaskOptions& opt,
                       const at::Device& device, std::vector<ItemScore>& scores) {
  const std::vector<Unit> units = make_units(requests, opt.share_contexts, opt.max_length);
  auto on_device = [&](const std::vector<int64_t>& v) {
    return torch::tensor(v, torch::kLong).to(device);
  };
  for (size_t b = 0; b < units.size();) {
    size_t e = b + 1;
    const int64_t T = units[b].length;  // the longest: units are longest first
    while (e < units.size() && T * int64_t(e - b + 1) <= opt.batch_tokens) ++e;
    const BatchInputs in = batch_inputs(requests, units, b, e, T, eot, opt.share_contexts);
    const torch::Tensor hidden =
        opt.share_contexts
            ? model.packed_hidden(in.tokens.to(device), in.positions.to(device), in.mask.to(device))
            : model.final_hidden(torch::Tensor(), in.tokens.to(device), /*unpadded=*/true);
    // The output projection of the predicting states alone: the same logits as forward_lm's there,
    // without B·T·V of them; log-softmax in fp32 as the harness (F.log_softmax), summed in double.
    const torch::Tensor logits = model.cap_logits(torch::linear(
        hidden.index({on_device(in.rows), on_device(in.at)}), model.output_projection()));
    const torch::Tensor lp = torch::log_softmax(logits.to(torch::kFloat), -1);
    const torch::Tensor target = on_device(in.targets);
    const torch::Tensor picked =
        lp.gather(1, target.unsqueeze(1)).squeeze(1).to(torch::kDouble).cpu();
    const torch::Tensor hits = (lp.argmax(-1) == target).cpu();
    const auto pick = picked.accessor<double, 1>();
    const auto hit = hits.accessor<bool, 1>();
    int64_t at = 0;
    for (size_t u = b; u < e; ++u) {
      for (size_t k : units[u].requests) {
        const Request& r = requests[k];
        double ll = 0;
        bool greedy = true;
        for (size_t j = 0; j < r.continuation.size(); ++j, ++at) {
          ll += pick[at];
          greedy = greedy && hit[at];
        }
        ItemScore& sc = scores[r.item];
        sc.loglikelihood[r.choice] = ll;
        sc.greedy[r.choice] = greedy;
        sc.tokens[r.choice] = int64_t(r.continuation.size());
      }
    }
    b = e;
  }
  return units.empty() ? 0 : units.front().length;
}

// A choice of an item identical to an earlier one (the same context and continuation ids, after
// the cut to max_length): scored once, its score copied (issue 68.1).
struct DuplicateChoice {
  size_t item, choice, same_as;
};

// Removes from `rq` each request identical to an earlier one of its item. Identical choices scored
// at two places of a packed row or a padded batch differed by ~1e-6, so "the first of equal
// maxima" (np.argmax) never applied; copied, they are bitwise equal.
std::vector<DuplicateChoice> drop_duplicate_choices(std::vector<Request>& rq) {
  std::vector<DuplicateChoice> dups;
  std::vector<Request> kept;
  size_t item_start = 0;  // where the item's kept requests begin (an item's first is kept)
  for (Request& r : rq) {
    if (kept.empty() || kept.back().item != r.item) item_start = kept.size();
    const auto same =
        std::find_if(kept.begin() + int64_t(item_start), kept.end(), [&](const Request& k) {
          return k.context == r.context && k.continuation == r.continuation;
        });
    if (same != kept.end())
      dups.push_back({r.item, r.choice, same->choice});
    else
      kept.push_back(std::move(r));
  }
  rq = std::move(kept);
  return dups;
}

// Every rank's item scores on every rank: each adds its own (zeros elsewhere) to a sum.
void gather_scores(const TaskOptions& opt, std::vector<ItemScore>& scores) {
  std::vector<double> v;
  for (const ItemScore& sc : scores)
    for (size_t c = 0; c < sc.loglikelihood.size(); ++c)
      v.insert(v.end(), {sc.loglikelihood[c], double(sc.greedy[c]), double(sc.tokens[c])});
  const std::vector<double> all = opt.sum_over_ranks(v);
  size_t at = 0;
  for (ItemScore& sc : scores)
    for (size_t c = 0; c < sc.loglikelihood.size(); ++c, at += 3) {
      sc.loglikelihood[c] = all[at];
      sc.greedy[c] = all[at + 1] > 0.5;
      sc.tokens[c] = int64_t(all[at + 2]);
    }
}

// The items scored (the first `limit`) as requests, after every check evaluate_task makes.
std::vector<Request> task_requests(const data::Tokenizer* tok, int32_t eot, const TaskFile& task,
                                   const TaskOptions& opt, std::vector<ItemScore>& scores) {
  if (opt.max_length < 1)
    throw RunInputError(fmt::format("max_length {}: expected at least 1", opt.max_length));
  if (opt.shots > 0 && int64_t(task.pool.size()) < opt.shots)
    throw RunInputError(fmt::format("{} {}: {} has {} few-shot items (\"fewshot\": true)",
                                    opt.shots_key, opt.shots, task.path.string(),
                                    task.pool.size()));
  const size_t n =
      opt.limit > 0 ? std::min<size_t>(size_t(opt.limit), task.items.size()) : task.items.size();
  return make_requests(tok, eot, task, opt, n, scores);
}

}  // namespace

std::vector<int64_t> check_task(const data::Tokenizer* tok, int32_t eot, const TaskFile& task,
                                const TaskOptions& opt) {
  std::vector<ItemScore> scores;
  const std::vector<Request> requests = task_requests(tok, eot, task, opt, scores);
  std::vector<int64_t> tokens(scores.size(), 0);
  for (const Request& r : requests)
    tokens[r.item] = std::max(tokens[r.item], int64_t(r.context.size() + r.continuation.size()));
  return tokens;
}

std::string long_items_warning(const TaskFile& task, const std::vector<int64_t>& item_tokens,
                               int64_t lm_block) {
  const int64_t limit = kLongItemBlocks * lm_block;
  int64_t long_items = 0, longest = 0;
  for (const int64_t t : item_tokens) {
    long_items += t > limit;
    longest = std::max(longest, t);
  }
  if (long_items == 0) return "";
  return fmt::format(
      "warning: {}: {} of its {} items are longer than {} × the model's training block "
      "(data.lm_block = {}: {} tokens; the longest {} tokens): attention's cost grows with the "
      "square of the length, so they take most of the evaluation's time (docs/downstream.md, In "
      "the training loop), and the model was trained on no position beyond {}",
      task.path.string(), long_items, item_tokens.size(), kLongItemBlocks, lm_block, limit, longest,
      lm_block - 1);
}

json task_metrics(const TaskResult& t) {
  json j = {{"file", t.file},
            {"sha256", t.sha256},
            {"kind", t.kind},
            {"items", t.items},
            {"acc", t.acc},
            {"acc_stderr", t.acc_stderr},
            {"acc_norm", t.acc_norm},
            {"acc_norm_stderr", t.acc_norm_stderr},
            {"bits_per_byte", t.bits_per_byte},
            {"seconds", t.seconds},
            {"max_length", t.max_length},
            {"truncated_items", t.truncated_items}};
  if (t.kind == "last_word") {
    j["ppl"] = t.ppl;
    j["ppl_stderr"] = t.ppl_stderr;
  } else {
    j["chance"] = t.chance;
  }
  j["bits_per_byte_item_mean"] = t.bits_per_byte_item_mean;
  // Which of these lm-evaluation-harness reports for the task; the rest are normlab's own.
  json normlab = json::array();
  const auto harness = [&](const std::string& m) {
    return std::find(t.harness_metrics.begin(), t.harness_metrics.end(), m) !=
           t.harness_metrics.end();
  };
  for (const char* m : {"acc", "acc_norm", "perplexity"})
    if (!harness(m) && (std::string(m) != "perplexity" || t.kind == "last_word") &&
        (std::string(m) != "acc_norm" || t.kind != "last_word"))
      normlab.push_back(m);
  normlab.push_back("bits_per_byte");
  normlab.push_back("bits_per_byte_item_mean");
  j["harness_metrics"] = t.harness_metrics;
  j["metrics_from"] = t.metrics_from;
  j["normlab_metrics"] = std::move(normlab);
  return j;
}

double harness_perplexity_stderr(const std::vector<double>& lls, int64_t iters) {
  const size_t n = lls.size();
  const int64_t chunk = std::min<int64_t>(1000, iters);
  if (n == 0 || chunk <= 0) return 0;
  std::vector<double> reps;
  reps.reserve(size_t(iters / chunk * chunk));
  const double n_float = double(n);
  for (int64_t i = 0; i < iters / chunk; ++i) {
    PythonRandom rnd{uint64_t(i)};
    for (int64_t k = 0; k < chunk; ++k) {
      double sum = 0;  // Python 3.11's sum(): left to right
      for (size_t d = 0; d < n; ++d) sum += lls[size_t(std::floor(rnd.random() * n_float))];
      reps.push_back(std::exp(-(sum / n_float)));
    }
  }
  if (reps.size() < 2) return 0;
  double mu = 0;
  for (double x : reps) mu += x;
  mu /= double(reps.size());
  double ss = 0;
  for (double x : reps) ss += (x - mu) * (x - mu);
  return std::sqrt(ss / double(reps.size() - 1));
}

TaskResult evaluate_task(TransformerModelImpl& model, const data::Tokenizer* tok, int32_t eot,
                         const TaskFile& task, const TaskOptions& opt, const at::Device& device) {
  const auto start = std::chrono::steady_clock::now();
  torch::NoGradGuard no_grad;
  model.eval();
  TaskResult res;
  res.name = task.name;
  res.file = task.path.string();
  res.sha256 = task.sha256;
  const size_t n =
      opt.limit > 0 ? std::min<size_t>(size_t(opt.limit), task.items.size()) : task.items.size();
  res.kind = task.items.front().last_word ? "last_word" : "multiple_choice";
  res.max_length = opt.max_length;
  std::vector<Request> requests = task_requests(tok, eot, task, opt, res.scores);
  for (const ItemScore& sc : res.scores) res.truncated_items += sc.truncated > 0;
  const std::vector<DuplicateChoice> duplicates = drop_duplicate_choices(requests);
  if (opt.world > 1) {  // this rank's items (drawn and tokenized above with every other's)
    std::vector<Request> mine;
    for (Request& r : requests)
      if (int64_t(r.item % size_t(opt.world)) == opt.rank) mine.push_back(std::move(r));
    requests = std::move(mine);
  }
  res.longest_row = score_requests(model, eot, requests, opt, device, res.scores);
  if (opt.world > 1) gather_scores(opt, res.scores);
  for (const DuplicateChoice& d : duplicates) {
    ItemScore& sc = res.scores[d.item];
    sc.loglikelihood[d.choice] = sc.loglikelihood[d.same_as];
    sc.greedy[d.choice] = sc.greedy[d.same_as];
    sc.tokens[d.choice] = sc.tokens[d.same_as];
  }
  // The metrics, as the harness's process_results and aggregations.
  std::vector<double> acc, acc_norm, lls;
  double nats = 0, bytes = 0, item_bpb = 0, chance = 0;
  for (size_t i = 0; i < n; ++i) {
    const TaskItem& it = task.items[i];
    ItemScore& sc = res.scores[i];
    const std::string gold_text = scored_delimiter(it) + choice_of(it, size_t(it.gold));
    nats -= sc.loglikelihood[size_t(it.gold)];
    bytes += double(gold_text.size());
    if (!gold_text.empty())
      item_bpb -= sc.loglikelihood[size_t(it.gold)] / (std::log(2.0) * double(gold_text.size()));
    if (!it.last_word)
      chance += 1.0 / double(it.contexts.empty() ? it.choices.size() : it.contexts.size());
    if (it.last_word) {
      sc.correct = sc.correct_norm = sc.greedy[0];
      lls.push_back(sc.loglikelihood[0]);
    } else {
      // np.argmax: the first of equal maxima.
      size_t best = 0, best_norm = 0;
      auto norm = [&](size_t c) { return sc.loglikelihood[c] / double(norm_length(it, c)); };
      for (size_t c = 1; c < sc.loglikelihood.size(); ++c) {
        if (sc.loglikelihood[c] > sc.loglikelihood[best]) best = c;
        if (norm(c) > norm(best_norm)) best_norm = c;
      }
      sc.correct = int64_t(best) == it.gold;
      sc.correct_norm = int64_t(best_norm) == it.gold;
    }
    acc.push_back(sc.correct);
    acc_norm.push_back(sc.correct_norm);
  }
  res.items = int64_t(n);
  res.acc = mean_of(acc);
  res.acc_stderr = stderr_of(acc);
  res.acc_norm = mean_of(acc_norm);
  res.acc_norm_stderr = stderr_of(acc_norm);
  res.bits_per_byte = bytes > 0 ? nats / (std::log(2.0) * bytes) : 0;
  if (!lls.empty()) {
    res.ppl = std::exp(-mean_of(lls));
    res.ppl_stderr = harness_perplexity_stderr(lls, opt.bootstrap_iters);
  }
  res.bits_per_byte_item_mean = n > 0 ? item_bpb / double(n) : 0;
  res.chance = n > 0 ? chance / double(n) : 0;
  res.harness_metrics = task.harness_metrics;
  res.metrics_from = task.metrics_from;
  res.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  return res;
}

}  // namespace normlab::eval
