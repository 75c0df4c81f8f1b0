// The manifest schema (one table of every key) and the loader that validates against it.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <toml++/toml.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <limits>
#include <set>
#include <sstream>

#include "normlab/data/named_datasets.h"
#include "normlab/manifest/experiment.h"
#include "normlab/plugins/registry.h"
#include "toml_describe.h"
#include "util/utf8.h"

namespace fs = std::filesystem;

namespace normlab {
namespace {

ProbeNameSource& probe_name_source() {
  static ProbeNameSource source = nullptr;
  return source;
}

constexpr double kInf = std::numeric_limits<double>::infinity();

enum class Kind { Bool, Int, Float, String, StringList, IntList };

const char* kind_name(Kind k) {
  switch (k) {
    case Kind::Bool:
      return "bool";
    case Kind::Int:
      return "integer";
    case Kind::Float:
      return "float";
    case Kind::String:
      return "string";
    case Kind::StringList:
      return "list of strings";
    case Kind::IntList:
      return "list of integers";
  }
  return "?";
}

struct Field {
  std::string section, key;
  Kind kind = Kind::String;
  double min = -kInf, max = kInf;
  bool min_exclusive = false;
  std::vector<std::string> choices;
  // Choices known only at run time (the registered analysis probes); `choices_doc` stands for
  // them in the reference table, which must not depend on what a binary happens to register.
  std::function<std::vector<std::string>()> dynamic_choices;
  std::string choices_doc;
  bool is_path = false;  // relative to the manifest's folder (to the CWD for a command-line --set)
  bool must_exist = true;  // a path that must exist when set (not a directory made on demand)
  std::string doc;
  std::function<void(ExperimentSpec&, const toml::node&)> set;  // node already checked
  std::function<void(const ExperimentSpec&, toml::table&)> get;
};

template <class T>
Field make_field(const char* section, const char* key, T& (*acc)(ExperimentSpec&),
                 const char* doc) {
  Field f;
  f.section = section;
  f.key = key;
  f.doc = doc;
  if constexpr (std::is_same_v<T, bool>) {
    f.kind = Kind::Bool;
    f.set = [acc](ExperimentSpec& s, const toml::node& n) { acc(s) = *n.value<bool>(); };
    f.get = [acc, key](const ExperimentSpec& s, toml::table& t) {
      t.insert_or_assign(key, acc(const_cast<ExperimentSpec&>(s)));
    };
  } else if constexpr (std::is_integral_v<T>) {
    f.kind = Kind::Int;
    f.set = [acc](ExperimentSpec& s, const toml::node& n) { acc(s) = T(*n.value<int64_t>()); };
    f.get = [acc, key](const ExperimentSpec& s, toml::table& t) {
      t.insert_or_assign(key, int64_t(acc(const_cast<ExperimentSpec&>(s))));
    };
  } else if constexpr (std::is_same_v<T, double>) {
    f.kind = Kind::Float;
    f.set = [acc](ExperimentSpec& s, const toml::node& n) { acc(s) = *n.value<double>(); };
    f.get = [acc, key](const ExperimentSpec& s, toml::table& t) {
      t.insert_or_assign(key, acc(const_cast<ExperimentSpec&>(s)));
    };
  } else if constexpr (std::is_same_v<T, std::string>) {
    f.kind = Kind::String;
    f.set = [acc](ExperimentSpec& s, const toml::node& n) { acc(s) = *n.value<std::string>(); };
    f.get = [acc, key](const ExperimentSpec& s, toml::table& t) {
      t.insert_or_assign(key, acc(const_cast<ExperimentSpec&>(s)));
    };
  } else if constexpr (std::is_same_v<T, std::vector<int64_t>>) {
    f.kind = Kind::IntList;
    f.set = [acc](ExperimentSpec& s, const toml::node& n) {
      acc(s).clear();
      for (const auto& e : *n.as_array()) acc(s).push_back(*e.value<int64_t>());
    };
    f.get = [acc, key](const ExperimentSpec& s, toml::table& t) {
      toml::array a;
      for (const auto& v : acc(const_cast<ExperimentSpec&>(s))) a.push_back(v);
      t.insert_or_assign(key, a);
    };
  } else {
    f.kind = Kind::StringList;
    f.set = [acc](ExperimentSpec& s, const toml::node& n) {
      acc(s).clear();
      if (n.is_string())
        acc(s).push_back(*n.value<std::string>());
      else
        for (const auto& e : *n.as_array()) acc(s).push_back(*e.value<std::string>());
    };
    f.get = [acc, key](const ExperimentSpec& s, toml::table& t) {
      toml::array a;
      for (const auto& v : acc(const_cast<ExperimentSpec&>(s))) a.push_back(v);
      t.insert_or_assign(key, a);
    };
  }
  return f;
}

#define NL_FIELD(section, key, member, doc) \
  make_field(                               \
      section, key, +[](ExperimentSpec & s) -> auto& { return s.member; }, doc)

Field& range(Field& f, double lo, double hi, bool lo_exclusive = false) {
  f.min = lo;
  f.max = hi;
  f.min_exclusive = lo_exclusive;
  return f;
}

// The schema: every manifest key, its type, range and meaning. The table in docs/manifests.md is
// generated from it (`normlab manifest reference`).
const std::vector<Field>& schema() {
  static const std::vector<Field> fields = [] {
    std::vector<Field> v;
    auto add = [&](Field f) -> Field& {
      v.push_back(std::move(f));
      return v.back();
    };
    auto choices = [](Field& f, std::vector<std::string> c) { f.choices = std::move(c); };
    // [model]
    choices(add(NL_FIELD("model", "arch", model.arch,
                         "encdec: encoder-decoder (translation); lm: decoder-only language model")),
            {"encdec", "lm"});
    range(add(NL_FIELD("model", "d_model", model.d_model, "model width d")), 1, 65536);
    range(add(NL_FIELD("model", "ffn_dim", model.ffn_dim,
                       "FFN inner width (llama: default int(8d/3) rounded up to ffn_multiple_of)")),
          1, 1 << 20);
    range(add(NL_FIELD("model", "heads", model.heads, "attention heads (must divide d_model)")), 1,
          4096);
    range(add(NL_FIELD("model", "enc_layers", model.enc_layers, "encoder layers N (encdec)")), 1,
          100000);
    range(add(NL_FIELD("model", "dec_layers", model.dec_layers,
                       "decoder layers M (the LM's layers for lm)")),
          1, 100000);
    range(add(NL_FIELD("model", "dropout", model.dropout,
                       "residual dropout on each branch output and on embeddings")),
          0, 0.999);
    range(add(NL_FIELD("model", "attention_dropout", model.attention_dropout,
                       "dropout on attention probabilities")),
          0, 0.999);
    range(add(NL_FIELD("model", "activation_dropout", model.activation_dropout,
                       "dropout after the FFN's ReLU")),
          0, 0.999);
    choices(add(NL_FIELD("model", "share_embeddings", model.share_embeddings,
                         "none; decoder: target embedding = output projection; all: one matrix "
                         "(joint vocabulary)")),
            {"none", "decoder", "all"});
    choices(add(NL_FIELD("model", "family", model.family,
                         "transformer: fairseq's (ReLU FFN, sinusoidal positions, biases); llama: "
                         "decoder-only LLaMA-style "
                         "(SwiGLU FFN, rotary positions, no biases; defaults scheme.norm = "
                         "rmsnorm, norm_eps = 1e-6, "
                         "lr_schedule = cosine)")),
            {"transformer", "llama"});
    range(add(NL_FIELD(
              "model", "kv_heads", model.kv_heads,
              "llama: key/value heads, a divisor of heads (grouped-query attention); 0 = heads")),
          0, 4096);
    range(add(NL_FIELD("model", "ffn_multiple_of", model.ffn_multiple_of,
                       "llama: the default ffn_dim's rounding (LLaMA: 256)")),
          1, 1 << 16);
    range(add(NL_FIELD("model", "rope_theta", model.rope_theta,
                       "llama: rotary positions' base theta")),
          1, 1e9);
    range(add(NL_FIELD("model", "init_std", model.init_std,
                       "llama: std of the normal init of projections and embeddings")),
          1e-6, 10);
    add(NL_FIELD("model", "scaled_init", model.scaled_init,
                 "llama: out_proj and fc2 init std divided by sqrt(2L) (GPT-2/Megatron/OLMo); "
                 "LNS's authors advise against it"));
    choices(
        add(NL_FIELD("model", "qk_norm", model.qk_norm,
                     "either family: a norm on q and k after their projections, before RoPE "
                     "(QK-norm, Dehghani et al. 2023, Wortsman et al. 2023): none | rms | layer "
                     "(a gain, no bias; exempt from weight decay)")),
        {"none", "rms", "layer"});
    choices(add(NL_FIELD("model", "qk_norm_scope", model.qk_norm_scope,
                         "with qk_norm: head (each head's d/heads values, Qwen3/Gemma 3) or all "
                         "(the whole q and k projections, OLMo 2)")),
            {"head", "all"});
    range(add(NL_FIELD("model", "attn_logit_softcap", model.attn_logit_softcap,
                       "either family: s·tanh(x/s) on the attention logits q·kᵀ/√d_h before the "
                       "mask and softmax (Gemma 2: 50); 0 = off")),
          0, 1e6);
    range(add(NL_FIELD("model", "final_logit_softcap", model.final_logit_softcap,
                       "either family: s·tanh(x/s) on the output logits, in training, evaluation "
                       "and generation (Gemma 2: 30); 0 = off")),
          0, 1e6);
    // [scheme] (its other keys are the scheme's parameters: `normlab plugins show NAME`)
    add(NL_FIELD(
        "scheme", "name", scheme.name,
        "residual/normalization scheme (`normlab plugins list`); other keys are its parameters"));
    choices(add(NL_FIELD("scheme", "norm", scheme.norm,
                         "kind of the norms the scheme places: layernorm | rmsnorm | scalenorm | "
                         "dyt | l2 | none")),
            {"layernorm", "rmsnorm", "scalenorm", "dyt", "l2", "none"});
    range(add(NL_FIELD("scheme", "norm_eps", scheme.norm_eps, "epsilon of those norms")), 0, 1);
    // [data]
    choices(add(NL_FIELD(
                "data", "task", data.task,
                "translation | lm (files) | copy | reverse | synthetic-lm (built-in, no files)")),
            {"translation", "lm", "copy", "reverse", "synthetic-lm"});
    add(NL_FIELD("data", "dataset", data.dataset,
                 "a named dataset (`normlab data list`), fetched on first use; sets task and the "
                 "file paths"));
    add(NL_FIELD("data", "pair", data.pair,
                 "with dataset (translation): direction, e.g. \"en-de\" (default: the dataset's "
                 "first); ignored without"));
    for (auto [key, doc] : std::vector<std::pair<const char*, const char*>>{
             {"train_src", "translation: training source, one sentence per line"},
             {"train_tgt", "translation: training target, line i translates line i of train_src"},
             {"valid_src", "translation: validation source"},
             {"valid_tgt", "translation: validation target"},
             {"test_src", "translation: test source (optional)"},
             {"test_tgt", "translation: test target (optional)"},
             {"train", "lm: training text, or token shards (a file or a glob)"},
             {"valid", "lm: validation text or shards (optional: else the end of train)"},
             {"test", "lm: test text or shards (optional)"}}) {
      Field f = make_field(
          "data", key, +[](ExperimentSpec& s) -> std::string& { return s.data.train; }, doc);
      // Re-bind the accessor by key (a member pointer per key keeps the table readable).
      static const std::map<std::string, std::string data::DataConfig::*> members = {
          {"train_src", &data::DataConfig::train_src},
          {"train_tgt", &data::DataConfig::train_tgt},
          {"valid_src", &data::DataConfig::valid_src},
          {"valid_tgt", &data::DataConfig::valid_tgt},
          {"test_src", &data::DataConfig::test_src},
          {"test_tgt", &data::DataConfig::test_tgt},
          {"train", &data::DataConfig::train},
          {"valid", &data::DataConfig::valid},
          {"test", &data::DataConfig::test}};
      auto m = members.at(key);
      std::string k = key;
      f.set = [m](ExperimentSpec& s, const toml::node& n) { s.data.*m = *n.value<std::string>(); };
      f.get = [m, k](const ExperimentSpec& s, toml::table& t) { t.insert_or_assign(k, s.data.*m); };
      f.is_path = true;
      add(std::move(f));
    }
    add(NL_FIELD("data", "mixture", data.mixture,
                 "token shards: a weighted mixture of shard sets (files or globs) instead of "
                 "train; needs valid"));
    add(NL_FIELD(
        "data", "mixture_weights", data.mixture_weights,
        "token shards: each mixture set's relative weight, whole numbers (e.g. [70, 30])"));
    range(add(NL_FIELD("data", "lm_valid_fraction", data.lm_valid_fraction,
                       "lm without `valid`: share of train's last lines used for validation")),
          0, 0.9, true);
    range(add(NL_FIELD("data", "lm_block", data.lm_block, "lm: tokens per example")), 2, 1 << 20);
    choices(add(NL_FIELD("data", "format", data.format,
                         "lm: text (files tokenized here) or token shards, memory-mapped: nanogpt "
                         "| npy | megatron | normlab (docs/data.md)")),
            {"text", "nanogpt", "npy", "megatron", "normlab"});
    range(add(NL_FIELD("data", "vocab_size", data.vocab_size,
                       "token shards: the tokenizer's vocabulary size (0: from normlab's "
                       "shards.json)")),
          0, double(int64_t(1) << 31));
    range(add(NL_FIELD("data", "eos_id", data.eos_id,
                       "token shards: the end-of-document id (-1: from shards.json, or none)")),
          -1, double(int64_t(1) << 31));
    range(add(NL_FIELD("data", "text_max_mb", data.text_max_mb,
                       "lm text: files above this many MB are refused with how to make token "
                       "shards (text is held in memory whole; 0: no limit)")),
          0, double(int64_t(1) << 40));
    choices(add(NL_FIELD("data", "sampling", data.sampling,
                         "token shards: blocks in a seeded order per epoch (random) or in order "
                         "(sequential)")),
            {"random", "sequential"});
    {
      Field& f = add(NL_FIELD("data", "cache_dir", data.cache_dir,
                              "tokenizers and tokenized corpora, relative to the manifest (default "
                              "~/.cache/normlab/data)"));
      f.is_path = true;
      f.must_exist = false;  // made on first use
    }
    range(add(NL_FIELD("data", "max_len", data.max_len,
                       "training pairs with a side longer than this (tokens) are dropped")),
          1, 1 << 20);
    range(add(NL_FIELD("data", "synthetic_vocab", data.synthetic_vocab,
                       "synthetic tasks: number of symbols")),
          2, 1 << 20);
    range(add(NL_FIELD("data", "synthetic_min_len", data.synthetic_min_len,
                       "synthetic tasks: shortest sequence")),
          1, 4096);
    range(add(NL_FIELD("data", "synthetic_max_len", data.synthetic_max_len,
                       "synthetic tasks: longest sequence")),
          1, 4096);
    range(add(NL_FIELD("data", "synthetic_train", data.synthetic_train,
                       "synthetic tasks: training examples")),
          1, 1 << 30);
    range(add(NL_FIELD("data", "synthetic_valid", data.synthetic_valid,
                       "synthetic tasks: validation examples")),
          1, 1 << 30);
    range(add(NL_FIELD("data", "synthetic_noise", data.synthetic_noise,
                       "copy/reverse: share of source tokens replaced at random")),
          0, 1);
    // [data.tokenizer]
    add(NL_FIELD("data.tokenizer", "model", data.tokenizer.model,
                 "an existing SentencePiece .model (else one is trained)"))
        .is_path = true;
    range(add(NL_FIELD("data.tokenizer", "vocab_size", data.tokenizer.vocab_size,
                       "SentencePiece vocabulary to train")),
          8, 1 << 20);
    choices(add(NL_FIELD("data.tokenizer", "model_type", data.tokenizer.model_type,
                         "SentencePiece model type")),
            {"unigram", "bpe", "char", "word"});
    add(NL_FIELD("data.tokenizer", "joint", data.tokenizer.joint,
                 "translation: one tokenizer for source and target"));
    range(add(NL_FIELD("data.tokenizer", "character_coverage", data.tokenizer.character_coverage,
                       "SentencePiece character coverage")),
          0.5, 1.0);
    // [optim]
    range(add(NL_FIELD("optim", "lr", optim.lr, "peak learning rate")), 0, 10, true);
    range(add(NL_FIELD("optim", "beta1", optim.beta1, "Adam beta1")), 0, 0.999999);
    range(add(NL_FIELD("optim", "beta2", optim.beta2, "Adam beta2")), 0, 0.999999);
    range(add(NL_FIELD("optim", "eps", optim.eps, "Adam epsilon")), 0, 1, true);
    range(add(NL_FIELD("optim", "warmup_updates", optim.warmup_updates,
                       "linear warm-up updates (0: none; inverse_sqrt then decays as lr/√u from "
                       "the first update)")),
          0, kInf);
    choices(add(NL_FIELD("optim", "lr_schedule", optim.lr_schedule,
                         "after linear warm-up: inverse_sqrt (fairseq), constant, cosine decay to "
                         "min_lr_ratio·lr at max_updates, or wsd (warmup-stable-decay: lr until "
                         "the last decay_updates, then decay to min_lr_ratio·lr; a run extends "
                         "before its decay); wsd_hagele2024: Hägele et al. 2024's own scheduler "
                         "(warm-up from lr/100, cooldown to 0 by default)")),
            {"inverse_sqrt", "constant", "cosine", "wsd", "wsd_hagele2024"});
    range(add(NL_FIELD("optim", "min_lr_ratio", optim.min_lr_ratio,
                       "cosine and wsd schedules: final lr / lr (wsd_hagele2024: 0 unless given)")),
          0, 1);
    range(add(NL_FIELD("optim", "decay_updates", optim.decay_updates,
                       "wsd, wsd_hagele2024: the decay's updates, ending at max_updates (0: a "
                       "fifth of max_updates)")),
          0, kInf);
    choices(add(NL_FIELD("optim", "decay_shape", optim.decay_shape,
                         "wsd, wsd_hagele2024: the decay's shape, 1-sqrt (Hägele et al. 2024) or "
                         "linear")),
            {"1-sqrt", "linear"});
    range(add(NL_FIELD("optim", "weight_decay", optim.weight_decay,
                       "decoupled weight decay (AdamW, as fairseq's adam)")),
          0, 1);
    choices(add(NL_FIELD("optim", "no_decay", optim.no_decay,
                         "parameters weight decay skips: nothing (fairseq: all decay), vectors "
                         "(biases, every norm's gain and bias whatever its shape, and every other "
                         "tensor of < 2 dims; HF Trainer), "
                         "vectors+scheme (and every scheme parameter: nanoGPT, OLMo), or auto "
                         "(transformer family: nothing; llama family: vectors+scheme); a run "
                         "started before this key decayed everything: resume it with nothing")),
            {"auto", "nothing", "vectors", "vectors+scheme"});
    range(add(NL_FIELD("optim", "clip_norm", optim.clip_norm,
                       "clip the gradient norm to this (0: no clipping, norm still logged)")),
          0, kInf);
    range(
        add(NL_FIELD("optim", "label_smoothing", optim.label_smoothing, "label smoothing epsilon")),
        0, 0.999);
    range(add(NL_FIELD("optim", "z_loss", optim.z_loss,
                       "auxiliary c·log²Z per target token, Z the softmax normalizer of the "
                       "output logits (PaLM, Chowdhery et al. 2022 §5: 1e-4); in the training "
                       "loss, logged as z_loss, never in nll/ppl; 0 = off")),
          0, 1);
    range(add(NL_FIELD("optim", "max_tokens", optim.max_tokens,
                       "tokens per batch, padding included")),
          1, kInf);
    range(add(NL_FIELD("optim", "max_updates", optim.max_updates, "stop after this many updates")),
          1, kInf);
    range(add(NL_FIELD("optim", "update_freq", optim.update_freq,
                       "accumulate gradients over N batches per update (fairseq's --update-freq): "
                       "N×max_tokens per update")),
          1, 65536);
    range(add(NL_FIELD("optim", "max_epochs", optim.max_epochs,
                       "stop after this many epochs (0: no limit)")),
          0, kInf);
    // [eval]
    range(add(NL_FIELD("eval", "interval", eval.interval,
                       "validate every N updates (0: only at the end)")),
          0, kInf);
    add(NL_FIELD(
        "eval", "bleu", eval.bleu,
        "translation: greedy decoding and corpus BLEU (sacreBLEU 13a) at each validation"));
    range(add(NL_FIELD("eval", "bleu_max_sentences", eval.bleu_max_sentences,
                       "decode only the first N validation sentences (0: all)")),
          0, kInf);
    range(add(NL_FIELD("eval", "bleu_after_updates", eval.bleu_after_updates,
                       "no BLEU (no decoding) at validations before this update")),
          0, kInf);
    range(add(NL_FIELD("eval", "bleu_every", eval.bleu_every,
                       "BLEU on every k-th validation and the final one (the loss on all)")),
          1, kInf);
    range(add(NL_FIELD("eval", "patience", eval.patience,
                       "early stopping: stop (status stopped_early) after N validations without a "
                       "better valid nll (0: never)")),
          0, kInf);
    range(add(NL_FIELD("eval", "max_len_a", eval.max_len_a, "decoding length limit a*src_len + b")),
          0, 100);
    range(add(NL_FIELD("eval", "max_len_b", eval.max_len_b, "decoding length limit a*src_len + b")),
          0, 100000);
    range(add(NL_FIELD("eval", "valid_tokens", eval.valid_tokens,
                       "lm: tokens of validation/test evaluated, the same blocks each time (0: "
                       "all of a text file, 2^20 of token shards)")),
          0, double(int64_t(1) << 40));
    range(add(NL_FIELD("eval", "test_beam", eval.test_beam,
                       "end of training: test-set BLEU/chrF with this beam (perplexity for lm) "
                       "when the data has a test set (0: none)")),
          0, 1000);
    add(NL_FIELD("eval", "tasks", eval.tasks,
                 "language models: downstream task files (JSONL, docs/downstream.md) scored in the "
                 "loop, relative to the manifest; a record per task in train.jsonl"));
    range(add(NL_FIELD("eval", "tasks_interval", eval.tasks_interval,
                       "score eval.tasks every N updates (0: at each validation) and at the end")),
          0, kInf);
    range(add(NL_FIELD("eval", "tasks_limit", eval.tasks_limit,
                       "the in-loop budget: score the first N items of each task (0: all)")),
          0, kInf);
    range(add(NL_FIELD("eval", "tasks_shots", eval.tasks_shots,
                       "few-shot examples per item, drawn from each file's pool as the harness "
                       "draws them")),
          0, 64);
    // [run]
    add(NL_FIELD("run", "out_dir", run.out_dir,
                 "run directory (default runs/<manifest name>): new, empty or made by normlab "
                 "(.normlab-dir); an existing run is resumed"));
    range(add(NL_FIELD("run", "seed", run.seed, "seed of initialization, dropout and batch order")),
          0, kInf);
    add(NL_FIELD("run", "device", run.device, "cpu, cuda or cuda:N"));
    range(add(NL_FIELD("run", "threads", run.threads,
                       "LibTorch intra-op threads (0: what the machine gives the run)")),
          0, 4096);
    range(add(NL_FIELD("run", "log_interval", run.log_interval, "one log line every N updates")), 1,
          kInf);
    range(add(NL_FIELD("run", "checkpoint_interval", run.checkpoint_interval,
                       "write step_N and last checkpoints every N updates")),
          1, kInf);
    range(add(NL_FIELD(
              "run", "checkpoint_keep_last", run.checkpoint_keep_last,
              "keep the newest K step_N.safetensors (last.safetensors is always kept; 0: none)")),
          0, kInf);
    add(NL_FIELD("run", "save_initial", run.save_initial,
                 "write checkpoints/step_0.safetensors, the initialization after the scheme's init "
                 "and setup pass (never pruned)"));
    choices(add(NL_FIELD("run", "checkpoint_save_best", run.checkpoint_save_best,
                         "keep best.safetensors, the checkpoint with the best validation nll or "
                         "BLEU (none: no best.safetensors)")),
            {"valid_nll", "bleu", "none"});
    add(NL_FIELD(
        "run", "allow_oversize", run.allow_oversize,
        "train even when the memory estimate exceeds the machine's (or GPU's) available memory"));
    add(NL_FIELD("run", "init_on_cpu", run.init_on_cpu,
                 "draw the initial weights on the CPU and move them to the device: the weights a "
                 "CPU run gets for the seed (false: drawn on the device by its generator, a "
                 "faster setup)"));
    range(add(NL_FIELD("run", "divergence_loss", run.divergence_loss,
                       "training nll above this is divergence (0: 3*ln(vocab))")),
          0, kInf);
    choices(add(NL_FIELD("run", "dtype", run.dtype,
                         "precision of the training forward (autocast): fp32; bf16 (CPU or CUDA); "
                         "fp16 (CUDA only, dynamic loss scaling). "
                         "Weights, optimizer state, validation and probes stay fp32")),
            {"fp32", "bf16", "fp16"});
    add(NL_FIELD("run", "tf32", run.tf32,
                 "on a GPU, fp32 matrix products (cuBLAS) on tensor cores with TF32 inputs (10-bit "
                 "mantissa), as torch.backends.cuda.matmul.allow_tf32 = True: faster fp32, "
                 "results within ~1e-3; no effect on the CPU"));
    add(NL_FIELD("run", "cuda_graph", run.cuda_graph,
                 "on a GPU, record each batch shape's update (forward, backward, clipping, AdamW) "
                 "as a CUDA graph and replay it: one launch instead of thousands for small and "
                 "deep models. Updates the analysis probes watch stay eager; not with fp16, "
                 "data-parallel jobs, run.shard_optimizer or run.activation_checkpointing; no "
                 "effect on the CPU"));
    add(NL_FIELD("run", "activation_checkpointing", run.activation_checkpointing,
                 "keep only each layer's input in the forward and recompute the layer in backward "
                 "(same results, less memory, ~1/3 more compute)"));
    add(NL_FIELD("run", "plugin_path", run.plugin_path,
                 "extra scheme plugin directories or files"));
    choices(add(NL_FIELD("run", "dist_backend", run.dist_backend,
                         "data-parallel jobs (torchrun, srun, --nproc): the c10d backend; auto = "
                         "nccl on CUDA, gloo on CPU")),
            {"auto", "gloo", "nccl"});
    range(add(NL_FIELD("run", "dist_timeout_s", run.dist_timeout_s,
                       "data-parallel jobs: the longest wait for another rank, to join or in any "
                       "collective, before the job stops")),
          1, 86400);
    add(NL_FIELD("run", "shard_optimizer", run.shard_optimizer,
                 "data-parallel jobs: each rank keeps AdamW's moments for 1/world of the "
                 "parameters and updates those (ZeRO stage 1); checkpoints stay one file"));
    // [analysis]
    {
      Field& probes = add(NL_FIELD(
          "analysis", "probes", analysis.probes,
          "probes to record (README \"Analysis\"); all = every probe; empty: analysis off"));
      probes.dynamic_choices = [] {
        std::vector<std::string> c = {"all"};
        for (const std::string& name :
             probe_name_source() ? probe_name_source()() : std::vector<std::string>{})
          c.push_back(name);
        return c;
      };
      probes.choices_doc =
          "all \\| any registered probe: act_grad_norm, activation_kurtosis, attn_entropy, "
          "attn_logit_max, grad_norm, hidden_state_norm, layer_angular_distance, layer_cosine, "
          "ln_input_norm, massive_activations, output_logits, param_update, scheme_state, "
          "sparsity, update_norm, and yours";
    }
    range(add(NL_FIELD("analysis", "interval", analysis.interval, "probe every N updates")), 1,
          kInf);
    range(add(NL_FIELD("analysis", "dense_until", analysis.dense_until,
                       "also probe every update up to this one (the papers' early window)")),
          0, kInf);
    add(NL_FIELD("analysis", "layers", analysis.layers,
                 "layers of the activation probes: auto (all up to 24 per stack, else "
                 "0,1,N/4,N/2,3N/4,N-2,N-1), all, or a list like \"0,1,-2,-1\""));
    add(NL_FIELD(
        "analysis", "cosine_at", analysis.cosine_at,
        "updates at which the layer-similarity matrix is recorded (default: 0 and the last)"));
    range(add(NL_FIELD("analysis", "probe_sentences", analysis.probe_sentences,
                       "size of the fixed probe batch (first N validation examples)")),
          1, 4096);
    choices(add(NL_FIELD("analysis", "formats", analysis.formats,
                         "record files: csv (analysis.csv, the canonical table), jsonl "
                         "(analysis.jsonl, the same rows), "
                         "tensorboard (<run>/tensorboard events, training curves included)")),
            {"csv", "jsonl", "tensorboard"});
    add(NL_FIELD("analysis", "tensorboard", analysis.tensorboard,
                 "old spelling: true adds \"tensorboard\" to formats"));
    return v;
  }();
  return fields;
}

const std::vector<std::string>& sections() {
  static const std::vector<std::string> s = {"model", "scheme", "data", "data.tokenizer",
                                             "optim", "eval",   "run",  "analysis"};
  return s;
}

// fairseq's spelling: [checkpoint] keep_last / save_best / interval are [run] checkpoint_keep_last
// / checkpoint_save_best / checkpoint_interval (folded into [run] before validation; the resolved
// manifest writes the [run] keys).
constexpr const char* kCheckpointAlias = "checkpoint";
const std::vector<std::pair<std::string, std::string>>& checkpoint_aliases() {
  static const std::vector<std::pair<std::string, std::string>> a = {
      {"keep_last", "checkpoint_keep_last"},
      {"save_best", "checkpoint_save_best"},
      {"interval", "checkpoint_interval"}};
  return a;
}
bool is_section(const std::string& name) {
  return name == kCheckpointAlias ||
         std::find(sections().begin(), sections().end(), name) != sections().end();
}
std::string checkpoint_alias_keys() {
  std::vector<std::string> k;
  for (const auto& [alias, key] : checkpoint_aliases()) k.push_back(alias);
  return fmt::format("{}", fmt::join(k, ", "));
}
// The [run] key of [checkpoint] KEY, or "" when there is none.
std::string checkpoint_alias_target(const std::string& key) {
  for (const auto& [alias, target] : checkpoint_aliases())
    if (alias == key) return target;
  return "";
}

std::string where(const std::string& file, const toml::source_region& r) {
  return fmt::format("{}:{}:{}", file, r.begin.line, r.begin.column);
}

// 1048576 rather than 1.04858e+06, 0.1 rather than 0.10000000000000001.
std::string number_text(double x) {
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  if (x == std::floor(x) && std::abs(x) < 1e15) return fmt::format("{}", int64_t(x));
  return fmt::format("{:g}", x);
}

std::vector<std::string> choices_of(const Field& f) {
  return f.dynamic_choices ? f.dynamic_choices() : f.choices;
}

std::string expectation(const Field& f) {
  std::string e = kind_name(f.kind);
  if (!choices_of(f).empty()) return fmt::format("one of {}", fmt::join(choices_of(f), " | "));
  if (f.kind == Kind::Int || f.kind == Kind::Float) {
    if (std::isinf(f.min) && std::isinf(f.max)) return e;
    return fmt::format("{} in {}{}, {}]", e, f.min_exclusive ? "(" : "[", number_text(f.min),
                       number_text(f.max));
  }
  return e;
}

// Checks one value against its field; returns an error text or "".
std::string check_value(const Field& f, const toml::node& n) {
  bool ok = false;
  double x = 0;
  switch (f.kind) {
    case Kind::Bool:
      ok = n.is_boolean();
      break;
    case Kind::Int:
      ok = n.is_integer();
      if (ok) x = double(*n.value<int64_t>());
      break;
    case Kind::Float:
      ok = n.is_number();
      if (ok) x = *n.value<double>();
      break;
    case Kind::String:
      ok = n.is_string();
      break;
    case Kind::StringList:
      ok = n.is_string() ||
           (n.is_array() && n.as_array()->is_homogeneous(toml::node_type::string)) ||
           (n.is_array() && n.as_array()->empty());
      if (const std::vector<std::string> choices = choices_of(f); ok && !choices.empty()) {
        std::vector<std::string> items;
        if (n.is_string())
          items.push_back(*n.value<std::string>());
        else
          for (const auto& e : *n.as_array()) items.push_back(*e.value<std::string>());
        for (const auto& item : items)
          if (std::find(choices.begin(), choices.end(), item) == choices.end())
            return fmt::format("[{}] {}: expected a list of {}, got \"{}\"", f.section, f.key,
                               fmt::join(choices, " | "), item);
      }
      break;
    case Kind::IntList:
      ok = n.is_array() &&
           (n.as_array()->empty() || n.as_array()->is_homogeneous(toml::node_type::integer));
      if (ok)
        for (const auto& e : *n.as_array())
          if (*e.value<int64_t>() < 0)
            return fmt::format("[{}] {}: expected non-negative integers, got {}", f.section, f.key,
                               *e.value<int64_t>());
      break;
  }
  if (ok && (f.kind == Kind::Int || f.kind == Kind::Float))
    ok = (f.min_exclusive ? x > f.min : x >= f.min) && x <= f.max;
  if (ok && f.kind == Kind::String && !f.choices.empty())
    ok = std::find(f.choices.begin(), f.choices.end(), *n.value<std::string>()) != f.choices.end();
  if (ok) return "";
  return fmt::format("[{}] {}: expected {}, got {}", f.section, f.key, expectation(f),
                     describe_toml_value(n));
}

const Field* find_field(const std::string& section, const std::string& key) {
  for (const auto& f : schema())
    if (f.section == section && f.key == key) return &f;
  return nullptr;
}

std::vector<std::string> keys_of(const std::string& section) {
  std::vector<std::string> k;
  for (const auto& f : schema())
    if (f.section == section) k.push_back(f.key);
  return k;
}

ParamValue to_param(const toml::node& n, bool* ok) {
  *ok = true;
  if (n.is_boolean()) return ParamValue::of_bool(*n.value<bool>());
  if (n.is_integer()) return ParamValue::of_int(*n.value<int64_t>());
  if (n.is_floating_point()) return ParamValue::of_float(*n.value<double>());
  if (n.is_string()) return ParamValue::of_string(*n.value<std::string>());
  *ok = false;
  return {};
}

// A value given on the command line: TOML syntax, or a bare word taken as a string.
toml::table parse_override_value(const std::string& value) {
  try {
    return toml::parse("v = " + value);
  } catch (const toml::parse_error&) {
    toml::table t;
    t.insert("v", value);
    return t;
  }
}

// "auto", "all" or a comma-separated list of layer indices (negative count from the top).
std::string analysis_layers_error(const std::string& layers) {
  if (layers == "auto" || layers == "all") return "";
  std::stringstream ss(layers);
  std::string item;
  int n = 0;
  while (std::getline(ss, item, ',')) {
    size_t used = 0;
    try {
      std::stoll(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    while (used < item.size() && item[used] == ' ') ++used;
    if (used == 0 || used != item.size())
      return fmt::format(
          "expected auto, all or a list of layer indices like \"0,1,-1\", got \"{}\"", layers);
    ++n;
  }
  if (n == 0)
    return "expected auto, all or a list of layer indices like \"0,1,-1\", got an empty string";
  return "";
}

// An index outside every stack would record no rows for it, silently (issue 42.16).
std::string analysis_layers_range_error(const ExperimentSpec& spec) {
  const std::string& layers = spec.analysis.layers;
  if (layers == "auto" || layers == "all") return "";
  const int64_t deepest = spec.model.arch == "lm"
                              ? spec.model.dec_layers
                              : std::max(spec.model.enc_layers, spec.model.dec_layers);
  std::stringstream ss(layers);
  for (std::string item; std::getline(ss, item, ',');) {
    const int64_t i = std::stoll(item);
    if (i >= deepest || i < -deepest)
      return fmt::format(
          "layer {} is in no stack of this model (the deepest has {} layers: indices {} to {})", i,
          deepest, -deepest, deepest - 1);
  }
  return "";
}

}  // namespace

ExperimentSpec load_manifest(const std::string& path, const std::vector<std::string>& overrides,
                             const PluginRegistry* registry) {
  return load_manifest(path, overrides, registry, ManifestLoadOptions{});
}

const std::vector<std::string>& manifest_sections() { return sections(); }

void set_probe_name_source(ProbeNameSource names) { probe_name_source() = names; }

std::string check_manifest_key(const std::string& dotted) {
  const auto dot = dotted.rfind('.');
  if (dot == std::string::npos || dot == 0 || dot + 1 == dotted.size())
    return fmt::format("expected section.key (sections: {})", fmt::join(sections(), ", "));
  const std::string section = dotted.substr(0, dot), key = dotted.substr(dot + 1);
  if (!is_section(section))
    return fmt::format("unknown section [{}] (known: {})", section, fmt::join(sections(), ", "));
  if (section == kCheckpointAlias)
    return checkpoint_alias_target(key).empty()
               ? fmt::format("[checkpoint] has no key '{}' (known: {})", key,
                             checkpoint_alias_keys())
               : "";
  if (section == "scheme" || find_field(section, key)) return "";
  if (section == "data" && key == "tokenizer") return "[data.tokenizer] is a table, not a key";
  return fmt::format("[{}] has no key '{}' (known: {})", section, key,
                     fmt::join(keys_of(section), ", "));
}

namespace {

// A manifest being loaded: its TOML tree with the --set overrides merged in, and where each value
// came from (for error messages, and for which relative paths are manifest-relative).
struct ManifestTree {
  std::string path;
  fs::path base;
  toml::table root;
  std::map<const toml::node*, std::string> origin;
  std::set<const toml::node*> from_file;  // overrides whose relative paths are manifest-relative
  std::string at(const toml::node& n) const {
    auto it = origin.find(&n);
    return it != origin.end() ? it->second : where(path, n.source());
  }
};
using GivenFields = std::vector<std::pair<const Field*, const toml::node*>>;

// Overrides become part of the tree, remembered with their origin for error messages.
void apply_overrides(ManifestTree& m, const std::vector<std::string>& overrides,
                     const ManifestLoadOptions& options) {
  toml::table& root = m.root;
  auto& origin = m.origin;
  auto& from_file = m.from_file;
  const std::string& path = m.path;
  for (size_t i = 0; i < overrides.size(); ++i) {
    const std::string& o = overrides[i];
    const std::string given_at =
        i < options.override_origins.size() ? options.override_origins[i] : "";
    // TOML text is UTF-8; a key or bare word that is not would be dumped with escapes that read
    // back as other characters (manifest_fuzz found it).
    if (const size_t bad = util::find_invalid_utf8(o); bad != std::string::npos)
      throw ManifestError(
          fmt::format("{}: expected UTF-8 text, got byte 0x{:02X} at offset {} of \"{}…\"",
                      given_at.empty() ? "--set" : given_at,
                      unsigned(static_cast<unsigned char>(o[bad])), bad, o.substr(0, bad)));
    const auto eq = o.find('=');
    // "section={k = v, …}" replaces a whole table (a sweep's scheme variant with its parameters).
    if (eq != std::string::npos && o.rfind('.', eq) == std::string::npos &&
        std::find(sections().begin(), sections().end(), o.substr(0, eq)) != sections().end()) {
      const std::string section = o.substr(0, eq);
      toml::table parsed = parse_override_value(o.substr(eq + 1));
      const toml::table* value = parsed.get("v")->as_table();
      if (!value)
        throw ManifestError(
            fmt::format("{}: [{}]: expected an inline table {{key = value, …}}, got {}",
                        given_at.empty() ? "--set " + o : given_at, section,
                        describe_toml_value(*parsed.get("v"))));
      toml::table* parent = &root;
      std::string leaf = section;
      if (section == "data.tokenizer") {
        if (!root.contains("data")) root.insert("data", toml::table{});
        parent = root["data"].as_table();
        leaf = "tokenizer";
      }
      if (const toml::table* old = parent->get_as<toml::table>(leaf))
        for (const auto& [k, node] : *old) origin.erase(&node), from_file.erase(&node);
      parent->insert_or_assign(leaf, *value);
      toml::table* t = (*parent)[leaf].as_table();
      for (auto& [k, node] : *t) {
        origin[&node] =
            given_at.empty() ? "--set " + section + "." + std::string(k.str()) : given_at;
        if (!given_at.empty()) from_file.insert(&node);
      }
      continue;
    }
    const auto dot = o.rfind('.', eq);
    if (eq == std::string::npos || dot == std::string::npos || dot == 0)
      throw ManifestError(fmt::format("--set {}: expected section.key=value", o));
    const std::string section = o.substr(0, dot), key = o.substr(dot + 1, eq - dot - 1);
    if (!is_section(section))
      throw ManifestError(fmt::format("{}: unknown section [{}] (known: {})",
                                      given_at.empty() ? "--set " + o : given_at, section,
                                      fmt::join(sections(), ", ")));
    toml::table* t = root.at_path(section).as_table();
    if (!t) {
      // "data.tokenizer" is nested; create tables along the way.
      toml::table* cur = &root;
      std::stringstream ss(section);
      std::string part;
      while (std::getline(ss, part, '.')) {
        if (!cur->contains(part)) cur->insert(part, toml::table{});
        cur = (*cur)[part].as_table();
        if (!cur)
          throw ManifestError(fmt::format("--set {}: [{}] is not a table in {}", o, section, path));
      }
      t = cur;
    }
    toml::table parsed = parse_override_value(o.substr(eq + 1));
    t->insert_or_assign(key, *parsed.get("v"));
    origin[t->get(key)] = given_at.empty() ? "--set " + o.substr(0, eq) : given_at;
    if (!given_at.empty()) from_file.insert(t->get(key));
  }
}

void merge_checkpoint_alias(ManifestTree& m) {
  toml::table& root = m.root;
  auto& origin = m.origin;
  auto& from_file = m.from_file;
  auto at = [&](const toml::node& n) { return m.at(n); };
  // [checkpoint] aliases move into [run]; a --set of either spelling wins over the file's other
  // one.
  if (toml::node* cp = root.get(kCheckpointAlias)) {
    if (!cp->is_table())
      throw ManifestError(fmt::format("{}: [checkpoint]: expected a table (keys {}), got {}",
                                      at(*cp), checkpoint_alias_keys(), describe_toml_value(*cp)));
    if (!root.contains("run")) root.insert("run", toml::table{});
    toml::table* run = root["run"].as_table();
    if (!run) throw ManifestError(fmt::format("{}: [run]: expected a table", at(*root.get("run"))));
    for (const auto& [k, node] : *cp->as_table()) {
      const std::string key(k.str()), target = checkpoint_alias_target(key);
      if (target.empty())
        throw ManifestError(
            fmt::format("{}: [checkpoint] unknown key '{}' (known: {}; fairseq's names for [run] "
                        "checkpoint_keep_last, checkpoint_save_best, checkpoint_interval)",
                        at(node), key, checkpoint_alias_keys()));
      if (const toml::node* existing = run->get(target)) {
        const bool alias_set = origin.count(&node) > 0, run_set = origin.count(existing) > 0;
        if (alias_set == run_set)
          throw ManifestError(fmt::format(
              "{}: [checkpoint] {} and {} [run] {} give the same setting twice: keep one", at(node),
              key, at(*existing), target));
        if (run_set) continue;  // the --set of the [run] spelling wins
      }
      const std::string given_at = at(node);
      run->insert_or_assign(target, node);
      origin[run->get(target)] = given_at;
    }
    for (const auto& [k, node] : *cp->as_table()) origin.erase(&node), from_file.erase(&node);
    root.erase(kCheckpointAlias);
  }
}

// Only the known tables at the top; [sweep] belongs to `normlab sweep`.
void check_top_level(const ManifestTree& m, const ManifestLoadOptions& options) {
  const std::string& path = m.path;
  const toml::table& root = m.root;
  auto at = [&](const toml::node& n) { return m.at(n); };
  for (const auto& [k, node] : root) {
    const std::string name(k.str());
    if (std::find(options.ignore_tables.begin(), options.ignore_tables.end(), name) !=
        options.ignore_tables.end())
      continue;
    if (name == "sweep" && node.is_table())
      throw ManifestError(
          fmt::format("{}: [sweep] makes this a sweep manifest: run it with `normlab sweep {}` "
                      "(one run: `normlab run-one {} --index I`)",
                      at(node), path, path));
    if (std::find(sections().begin(), sections().end(), name) == sections().end() ||
        !node.is_table())
      throw ManifestError(fmt::format("{}: unknown top-level key '{}' (expected the tables {})",
                                      at(node), name,
                                      "[model] [scheme] [data] [optim] [eval] [run] [analysis]"));
  }
}

// Every key checked against the schema and set; [scheme] keys that are not the schema's are the
// scheme's parameters.
GivenFields read_fields(const ManifestTree& m, ExperimentSpec& spec) {
  const toml::table& root = m.root;
  auto at = [&](const toml::node& n) { return m.at(n); };
  GivenFields given;
  for (const auto& section : sections()) {
    const toml::table* t = root.at_path(section).as_table();
    if (!t) continue;
    for (const auto& [k, node] : *t) {
      const std::string key(k.str());
      if (section == "data" && key == "tokenizer" && node.is_table()) continue;
      const Field* f = find_field(section, key);
      if (!f) {
        if (section == "scheme") {
          // Parameter names are TOML bare keys; toml++'s writer prints some quoted keys (tabs and
          // quotes) unquoted, so the resolved dump would not load (manifest_fuzz found it).
          const bool bare = !key.empty() && std::all_of(key.begin(), key.end(), [](char c) {
            return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
                   c == '_' || c == '-';
          });
          if (!bare)
            throw ManifestError(fmt::format(
                "{}: [scheme] parameter {:?}: expected a name of letters, digits, '_' or '-'",
                at(node), key));
          bool ok;
          ParamValue v = to_param(node, &ok);
          if (!ok)
            throw ManifestError(
                fmt::format("{}: [scheme] {}: expected a bool, number or string, got {}", at(node),
                            key, describe_toml_value(node)));
          spec.scheme.params[key] = v;
          spec.scheme.params_at[key] = at(node);
          continue;
        }
        throw ManifestError(fmt::format("{}: [{}] unknown key '{}' (known: {})", at(node), section,
                                        key, fmt::join(keys_of(section), ", ")));
      }
      const std::string err = check_value(*f, node);
      if (!err.empty()) throw ManifestError(fmt::format("{}: {}", at(node), err));
      given.emplace_back(f, &node);
    }
  }
  return given;
}

void set_fields_and_paths(const ManifestTree& m, const GivenFields& given, ExperimentSpec& spec) {
  const auto& origin = m.origin;
  const auto& from_file = m.from_file;
  const fs::path& base = m.base;
  auto at = [&](const toml::node& n) { return m.at(n); };
  for (const auto& [f, node] : given) f->set(spec, *node);
  // Paths: relative ones are taken from the manifest's folder (from the working directory for
  // --set values), and every given file must exist.
  for (const auto& [f, node] : given) {
    if (!f->is_path) continue;
    std::string p = *node->value<std::string>();
    if (p.empty()) continue;
    fs::path resolved = fs::path(p);
    if (resolved.is_relative() && (!origin.count(node) || from_file.count(node)))
      resolved = base / resolved;
    // A glob of shards is expanded when the data is loaded; a Megatron prefix names PREFIX.bin.
    const bool pattern = p.find_first_of("*?[") != std::string::npos;
    if (f->must_exist && !pattern && !fs::exists(resolved) &&
        !fs::exists(fs::path(resolved.string() + ".bin")))
      throw ManifestError(fmt::format("{}: [{}] {}: file not found: {}", at(*node), f->section,
                                      f->key, resolved.string()));
    toml::table out;
    out.insert("v", resolved.lexically_normal().string());
    f->set(spec, *out.get("v"));
  }
  // Lists of files, the same rules for each: data.mixture's shard sets (a glob, a file or a
  // Megatron prefix) and eval.tasks (files).
  auto resolve_each = [&](const std::string& section, const std::string& key,
                          std::vector<std::string>& list, bool shards) {
    for (const auto& [f, node] : given) {
      if (f->section != section || f->key != key) continue;
      for (std::string& p : list) {
        fs::path resolved(p);
        if (resolved.is_relative() && (!origin.count(node) || from_file.count(node)))
          resolved = base / resolved;
        const bool found = shards ? p.find_first_of("*?[") != std::string::npos ||
                                        fs::exists(resolved) ||
                                        fs::exists(fs::path(resolved.string() + ".bin"))
                                  : fs::is_regular_file(resolved);
        if (!found)
          throw ManifestError(fmt::format("{}: [{}] {}: file not found: {}", at(*node), section,
                                          key, resolved.string()));
        p = resolved.lexically_normal().string();
      }
    }
  };
  resolve_each("data", "mixture", spec.data.mixture, true);
  resolve_each("eval", "tasks", spec.eval.tasks, false);
}

// data.mixture: token shards instead of data.train, with data.valid, one whole weight (1 to
// kMaxMixtureWeight) per set.
template <class Pos>
void check_mixture(const data::DataConfig& d, const Pos& pos) {
  if (d.mixture.empty() && d.mixture_weights.empty()) return;
  const auto fail = [&](const char* key, const std::string& what) {
    return ManifestError(fmt::format("{}: [data] {}: {}", pos("data", key), key, what));
  };
  if (d.format == "text")
    throw fail("mixture",
               "a mixture is of token shards: set data.format (nanogpt, npy, megatron, "
               "normlab)");
  if (!d.train.empty()) throw fail("mixture", "give data.train or data.mixture, not both");
  if (d.valid.empty())
    throw fail("mixture",
               "a mixture needs data.valid (no single train stream to hold out the end of)");
  if (d.mixture_weights.size() != d.mixture.size())
    throw fail("mixture_weights", fmt::format("{} weights for {} mixture sets: one per set",
                                              d.mixture_weights.size(), d.mixture.size()));
  for (size_t i = 0; i < d.mixture.size(); ++i) {
    if (d.mixture[i].empty()) throw fail("mixture", fmt::format("set {} is empty", i + 1));
    if (d.mixture_weights[i] < 1 || d.mixture_weights[i] > data::kMaxMixtureWeight)
      throw fail("mixture_weights",
                 fmt::format("weight {} is {}: expected a whole number from 1 to {}", i + 1,
                             d.mixture_weights[i], data::kMaxMixtureWeight));
  }
}

// The llama family's rules and its defaults for keys the manifest leaves out.
template <class NodeOf, class Pos>
void check_family(ExperimentSpec& spec, const NodeOf& node_of, const Pos& pos) {
  ModelSection& m = spec.model;
  if (m.family != "llama") {
    // A resolved manifest lists every key: only a value other than the default is an error.
    const ModelSection d;
    const std::map<std::string, bool> changed = {
        {"kv_heads", m.kv_heads != d.kv_heads},
        {"ffn_multiple_of", m.ffn_multiple_of != d.ffn_multiple_of},
        {"rope_theta", m.rope_theta != d.rope_theta},
        {"init_std", m.init_std != d.init_std},
        {"scaled_init", m.scaled_init != d.scaled_init}};
    for (const auto& [key, differs] : changed)
      if (differs && node_of("model", key))
        throw ManifestError(
            fmt::format("{}: [model] {}: a key of family = \"llama\", got family = \"{}\"",
                        pos("model", key), key, m.family));
    return;
  }
  if (m.arch != "lm")
    throw ManifestError(
        fmt::format("{}: [model] family: \"llama\" is a decoder-only language model here; expected "
                    "arch = \"lm\", got \"{}\"",
                    pos("model", "family"), m.arch));
  const int64_t dh = m.d_model / m.heads;
  if (dh % 2 != 0)
    throw ManifestError(fmt::format(
        "{}: [model] heads: rotary positions need an even head width d_model/heads, got {}",
        pos("model", "heads"), dh));
  if (m.kv_heads != 0 && m.heads % m.kv_heads != 0)
    throw ManifestError(
        fmt::format("{}: [model] kv_heads: expected a divisor of heads = {}, got {}",
                    pos("model", "kv_heads"), m.heads, m.kv_heads));
  if (!node_of("model",
               "ffn_dim")) {  // LLaMA's model.py: multiple_of · ⌈int(2·4d/3) / multiple_of⌉
    const int64_t hidden = 8 * m.d_model / 3;
    m.ffn_dim = m.ffn_multiple_of * ((hidden + m.ffn_multiple_of - 1) / m.ffn_multiple_of);
  }
  if (!node_of("scheme", "norm")) spec.scheme.norm = "rmsnorm";
  if (!node_of("scheme", "norm_eps")) spec.scheme.norm_eps = 1e-6;
  if (!node_of("optim", "lr_schedule")) spec.optim.lr_schedule = "cosine";
}

// wsd_hagele2024's default floor; a wsd decay must fit after the warm-up: otherwise wsd silently
// shortens the decay it was given and wsd_hagele2024 (as the authors' scheduler) jumps from the
// warm-up into the middle of it.
template <typename NodeOf, typename Pos>
void check_wsd(OptimSection& o, const NodeOf& node_of, const Pos& pos) {
  // Hägele et al.'s recipe cools down to 0 (their final_lr_factor) unless min_lr_ratio says.
  if (o.lr_schedule == "wsd_hagele2024" && !node_of("optim", "min_lr_ratio")) o.min_lr_ratio = 0;
  if (o.lr_schedule != "wsd" && o.lr_schedule != "wsd_hagele2024") return;
  const int64_t decay = o.decay_updates > 0 ? o.decay_updates : o.max_updates / 5;
  const std::string decay_text =
      o.decay_updates > 0 ? fmt::format("decay_updates = {}", decay)
                          : fmt::format("the default decay of a fifth of max_updates ({})", decay);
  if (decay > o.max_updates)
    throw ManifestError(fmt::format(
        "{}: [optim] decay_updates: expected at most max_updates = {} (the {} decay ends at "
        "max_updates), got {}",
        pos("optim", "decay_updates"), o.max_updates, o.lr_schedule, decay));
  if (o.warmup_updates + decay > o.max_updates)
    throw ManifestError(fmt::format(
        "{}: [optim] warmup_updates: the warm-up ({} updates) and the {} decay ({}) overlap: "
        "expected warmup_updates + decay ≤ max_updates = {}; shorten one or raise max_updates",
        pos("optim", node_of("optim", "warmup_updates") ? "warmup_updates" : "lr_schedule"),
        o.warmup_updates, o.lr_schedule, decay_text, o.max_updates));
}

// Rules between fields; `pos(section, key)` says where a key was given (or its table, or the file).
void check_cross_fields(const ManifestTree& m, const GivenFields& given, ExperimentSpec& spec) {
  const std::string& path = m.path;
  auto node_of = [&](const std::string& section, const std::string& key) -> const toml::node* {
    for (const auto& [f, node] : given)
      if (f->section == section && f->key == key) return node;
    return nullptr;
  };
  auto pos = [&](const std::string& section, const std::string& key) {
    if (const toml::node* n = node_of(section, key)) return m.at(*n);
    if (const toml::node* t = m.root.at_path(section).node()) return where(path, t->source());
    return path;
  };
  check_wsd(spec.optim, node_of, pos);
  if (spec.model.d_model % spec.model.heads != 0)
    throw ManifestError(fmt::format("{}: [model] heads: expected a divisor of d_model = {}, got {}",
                                    pos("model", "heads"), spec.model.d_model, spec.model.heads));
  check_family(spec, node_of, pos);
  if (spec.model.qk_norm == "none" && spec.model.qk_norm_scope != "head" &&
      node_of("model", "qk_norm_scope"))
    throw ManifestError(fmt::format(
        "{}: [model] qk_norm_scope: a scope of model.qk_norm, which is \"none\"; expected "
        "qk_norm = \"rms\" or \"layer\" with it, or no qk_norm_scope",
        pos("model", "qk_norm_scope")));
  if (!spec.data.dataset.empty()) {  // the catalog only: fetching waits for training
    std::string named_task;
    std::vector<std::string> pairs;
    try {
      named_task = data::named_dataset(spec.data.dataset).task;
      pairs = data::named_dataset(spec.data.dataset).pairs;
    } catch (const data::DataError& e) {
      throw ManifestError(fmt::format("{}: [data] dataset: {}", pos("data", "dataset"), e.what()));
    }
    if (!spec.data.pair.empty() &&
        std::find(pairs.begin(), pairs.end(), spec.data.pair) == pairs.end())
      throw ManifestError(
          fmt::format("{}: [data] pair: dataset \"{}\" has {}, got \"{}\"", pos("data", "pair"),
                      spec.data.dataset,
                      pairs.empty() ? "no pairs" : fmt::format("{}", fmt::join(pairs, " or ")),
                      spec.data.pair));
    if (node_of("data", "task") && spec.data.task != named_task)
      throw ManifestError(
          fmt::format("{}: [data] task: dataset \"{}\" is a {} dataset, got task = \"{}\"",
                      pos("data", "task"), spec.data.dataset, named_task, spec.data.task));
    const data::DataConfig& d = spec.data;
    for (const auto& [key, value] :
         std::vector<std::pair<const char*, const std::string*>>{{"train_src", &d.train_src},
                                                                 {"train_tgt", &d.train_tgt},
                                                                 {"valid_src", &d.valid_src},
                                                                 {"valid_tgt", &d.valid_tgt},
                                                                 {"test_src", &d.test_src},
                                                                 {"test_tgt", &d.test_tgt},
                                                                 {"train", &d.train},
                                                                 {"valid", &d.valid},
                                                                 {"test", &d.test}})
      if (!value->empty())
        throw ManifestError(
            fmt::format("{}: [data] {}: not with dataset = \"{}\" (it names the files)",
                        pos("data", key), key, spec.data.dataset));
    spec.data.task = named_task;
  }  // without data.dataset, data.pair is ignored (clearing the dataset by --set keeps the manifest
     // usable)
  const std::string& task = spec.data.task;
  const bool seq2seq = task == "translation" || task == "copy" || task == "reverse";
  if (seq2seq && spec.model.arch != "encdec")
    throw ManifestError(
        fmt::format("{}: [model] arch: task \"{}\" needs arch = \"encdec\", got \"{}\"",
                    pos("model", "arch"), task, spec.model.arch));
  if (!seq2seq && spec.model.arch != "lm")
    throw ManifestError(fmt::format("{}: [model] arch: task \"{}\" needs arch = \"lm\", got \"{}\"",
                                    pos("model", "arch"), task, spec.model.arch));
  std::vector<std::string> required;
  if (task == "translation" && spec.data.dataset.empty())
    required = {"train_src", "train_tgt", "valid_src", "valid_tgt"};
  if (task == "lm" && spec.data.dataset.empty() && spec.data.mixture.empty()) required = {"train"};
  for (const auto& key : required)
    if (!node_of("data", key))
      throw ManifestError(
          fmt::format("{}: [data] {}: required for task = \"{}\"", pos("data", "task"), key, task));
  if (spec.data.synthetic_min_len > spec.data.synthetic_max_len)
    throw ManifestError(
        fmt::format("{}: [data] synthetic_min_len: expected at most synthetic_max_len = {}, got {}",
                    pos("data", "synthetic_min_len"), spec.data.synthetic_max_len,
                    spec.data.synthetic_min_len));
  const std::string& dev = spec.run.device;
  const bool cuda_index = dev.rfind("cuda:", 0) == 0 && dev.size() > 5 && dev.size() <= 8 &&
                          dev.find_first_not_of("0123456789", 5) == std::string::npos;
  if (!(dev == "cpu" || dev == "cuda" || cuda_index))
    throw ManifestError(fmt::format("{}: [run] device: expected cpu, cuda or cuda:N, got \"{}\"",
                                    pos("run", "device"), dev));
  if (spec.run.dtype == "fp16" && dev == "cpu")
    throw ManifestError(
        fmt::format("{}: [run] dtype: fp16 (with dynamic loss scaling) is for device = \"cuda\"; "
                    "expected fp32 or bf16 with device = \"cpu\"",
                    pos("run", "dtype")));
  if ((spec.data.test_src.empty()) != (spec.data.test_tgt.empty()))
    throw ManifestError(
        fmt::format("{}: [data] test_src/test_tgt: expected both or neither",
                    pos("data", spec.data.test_src.empty() ? "test_tgt" : "test_src")));
  if (spec.analysis.formats.empty() && !spec.analysis.tensorboard)
    throw ManifestError(fmt::format(
        "{}: [analysis] formats: expected at least one of \"csv\", \"jsonl\", \"tensorboard\", "
        "got an empty list",
        pos("analysis", "formats")));
  if (const std::string err = analysis_layers_error(spec.analysis.layers); !err.empty())
    throw ManifestError(fmt::format("{}: [analysis] layers: {}", pos("analysis", "layers"), err));
  if (const std::string err = analysis_layers_range_error(spec); !err.empty())
    throw ManifestError(fmt::format("{}: [analysis] layers: {}", pos("analysis", "layers"), err));
  if (spec.run.out_dir.empty())
    spec.run.out_dir = (fs::path("runs") / fs::path(path).stem()).string();
  spec.data.seed = uint64_t(spec.run.seed);
  spec.data.valid_tokens = spec.eval.valid_tokens;
  if (spec.data.format != "text" && spec.data.task != "lm")
    throw ManifestError(
        fmt::format("{}: [data] format = \"{}\": token shards are for task = "
                    "\"lm\", got \"{}\"",
                    pos("data", "format"), spec.data.format, spec.data.task));
  check_mixture(spec.data, pos);
}

// The scheme and its parameters, through the registry's declarations.
void resolve_scheme(const ManifestTree& m, const PluginRegistry& registry, ExperimentSpec& spec) {
  const toml::node* table = m.root.at_path("scheme").node();
  const toml::node* name_node =
      table && table->is_table() ? table->as_table()->get("name") : nullptr;
  const std::string name_at = name_node ? m.at(*name_node)
                              : table   ? where(m.path, table->source())
                                        : m.path;
  try {
    registry.info(spec.scheme.name);
  } catch (const PluginError& e) {
    throw ManifestError(fmt::format("{}: [scheme] name: {}", name_at, e.what()));
  }
  for (const auto& [key, value] : spec.scheme.params) {
    try {
      registry.resolve_params(spec.scheme.name, {{key, value}});
    } catch (const PluginError& e) {
      throw ManifestError(fmt::format("{}: [scheme] {}", spec.scheme.params_at[key], e.what()));
    }
  }
  spec.scheme.params = registry.resolve_params(spec.scheme.name, spec.scheme.params).values();
}

}  // namespace

ExperimentSpec load_manifest(const std::string& path, const std::vector<std::string>& overrides,
                             const PluginRegistry* registry, const ManifestLoadOptions& options) {
  ManifestTree m;
  m.path = path;
  m.base = fs::path(path).parent_path();
  m.root = parse_manifest_file(path);
  apply_overrides(m, overrides, options);
  merge_checkpoint_alias(m);
  check_top_level(m, options);
  ExperimentSpec spec;
  spec.source = path;
  const GivenFields given = read_fields(m, spec);
  set_fields_and_paths(m, given, spec);
  check_cross_fields(m, given, spec);
  if (registry) resolve_scheme(m, *registry, spec);
  return spec;
}

namespace {

// The spec with every relative path made absolute, so that its dump is a recipe that runs from any
// directory: files and out_dir as the process sees them (relative to its working directory),
// plugin_path entries from the manifest's folder (as `normlab train` takes them).
ExperimentSpec with_absolute_paths(const ExperimentSpec& spec) {
  ExperimentSpec abs = spec;
  auto absolute = [](const fs::path& p) {
    return p.empty() ? p : fs::absolute(p).lexically_normal();
  };
  for (const auto& f : schema()) {
    if (!f.is_path) continue;
    toml::table t;
    f.get(abs, t);
    toml::table out;
    out.insert("v", absolute(*t.get(f.key)->value<std::string>()).string());
    f.set(abs, *out.get("v"));
  }
  abs.run.out_dir = absolute(abs.run.out_dir).string();
  for (auto& p : abs.eval.tasks) p = absolute(p).string();
  for (auto& p : abs.data.mixture) p = absolute(p).string();
  for (auto& p : abs.run.plugin_path)
    if (fs::path(p).is_relative()) p = absolute(fs::path(spec.source).parent_path() / p).string();
  return abs;
}

// A value as TOML: floats in their shortest form that reads back exactly (0.9, not
// 0.90000000000000002 as Debian's toml++ prints them), everything else as toml++ prints it.
void print_value(std::ostream& os, const toml::node& v) {
  if (const auto* d = v.as_floating_point()) {
    const double x = d->get();
    if (!std::isfinite(x)) {
      os << (std::isnan(x) ? "nan" : x > 0 ? "inf" : "-inf");
      return;
    }
    std::string text = fmt::format("{}", x);
    if (text.find_first_of(".eEn") == std::string::npos) text += ".0";
    os << text;
  } else if (const auto* a = v.as_array()) {
    os << "[";
    for (size_t i = 0; i < a->size(); ++i) {
      if (i) os << ", ";
      print_value(os, *a->get(i));
    }
    os << "]";
  } else {
    v.visit([&](const auto& node) { os << node; });
  }
}

// The tables of `root` in order, each key = value (subtables as [parent.child]).
void print_tables(std::ostream& os, const toml::table& root, const std::string& prefix) {
  for (const auto& [key, node] : root) {
    const auto* t = node.as_table();
    if (!t) continue;
    const std::string name = prefix + std::string(key.str());
    os << "[" << name << "]\n";
    for (const auto& [k, v] : *t) {
      if (v.is_table()) continue;
      os << k.str() << " = ";
      print_value(os, v);
      os << "\n";
    }
    os << "\n";
    print_tables(os, *t, name + ".");
  }
}

}  // namespace

std::string dump_manifest(const ExperimentSpec& given) {
  const ExperimentSpec spec = with_absolute_paths(given);
  toml::table root;
  for (const auto& section : sections()) {
    toml::table t;
    for (const auto& f : schema())
      if (f.section == section) f.get(spec, t);
    if (section == "scheme")
      for (const auto& [k, v] : spec.scheme.params) {
        switch (v.type) {
          case ParamType::Bool:
            t.insert_or_assign(k, v.b);
            break;
          case ParamType::Int:
            t.insert_or_assign(k, v.i);
            break;
          case ParamType::Float:
            t.insert_or_assign(k, v.f);
            break;
          case ParamType::String:
            t.insert_or_assign(k, v.s);
            break;
        }
      }
    if (section == "data.tokenizer")
      root["data"].as_table()->insert_or_assign("tokenizer", std::move(t));
    else
      root.insert_or_assign(section, std::move(t));
  }
  std::ostringstream os;
  os << "# Fully resolved manifest written by normlab (defaults filled, --set applied, paths "
        "absolute).\n"
     << "# source: " << spec.source << "\n\n";
  print_tables(os, root, "");
  return os.str();
}

std::string manifest_reference_markdown() {
  ExperimentSpec defaults;
  defaults.run.out_dir = "runs/<manifest name>";
  std::ostringstream os;
  os << "| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n";
  for (const auto& f : schema()) {
    toml::table t;
    f.get(defaults, t);
    const toml::node& n = *t.get(f.key);
    std::string d;
    if (n.is_floating_point())
      d = number_text(*n.value<double>());
    else if (n.is_string())
      d = n.value<std::string>()->empty() ? "" : "\"" + *n.value<std::string>() + "\"";
    else {
      std::ostringstream val;
      val << t;  // "key = value": the value as TOML writes it
      d = val.str().substr(val.str().find(" = ") + 3);
    }
    d = d.empty() || d == "[]" ? "—" : "`" + d + "`";
    std::string allowed;
    if (!f.choices_doc.empty())
      allowed = f.choices_doc;
    else if (!f.choices.empty())
      allowed = fmt::format("{}", fmt::join(f.choices, " \\| "));
    else if (f.kind == Kind::Int || f.kind == Kind::Float) {
      const std::string e = expectation(f);
      allowed = e.substr(e.find(' ') == std::string::npos ? 0 : e.find(" in ") + 4);
      if (e.find(" in ") == std::string::npos) allowed = "";
    }
    std::string doc = f.doc;
    for (size_t i = doc.find('|'); i != std::string::npos; i = doc.find('|', i + 2))
      doc.replace(i, 1, "\\|");
    os << fmt::format("| `{}.{}` | {} | {} | {} | {} |\n", f.section, f.key, kind_name(f.kind), d,
                      allowed, doc);
  }
  os << "| `scheme.<param>` | per scheme | the scheme's | per scheme | the scheme's parameters "
        "(`normlab plugins show NAME`) |\n";
  return os.str();
}

}  // namespace normlab
