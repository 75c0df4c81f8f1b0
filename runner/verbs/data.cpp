// `normlab data list | fetch | path`: the named datasets.
#include <iostream>
#include <string>

#include "normlab/interop_commands.h"
#include "verb.h"

namespace normlab::verbs {

Verb add_data(CLI::App& app, const Globals&) {
  auto o = state<normlab::DataOptions>();
  auto* data = app.add_subcommand(
      "data", "named datasets: list, fetch (resumable, SHA-256 checked), path; tokenize to shards");
  data->require_subcommand(1);
  data->add_subcommand("list", "the datasets, whether fetched, whether their SHA-256 is pinned");
  for (const char* action : {"fetch", "path"}) {
    auto* sub = data->add_subcommand(
        action, std::string(action) == "fetch"
                    ? "download, verify and unpack NAME (from $NORMLAB_DATA_MIRROR when set)"
                    : "print NAME's folder (exit 1 when not fetched)");
    sub->add_option("NAME", o->name, "dataset name (normlab data list)")->required();
  }
  auto* tok = data->add_subcommand(
      "tokenize",
      "text files (plain, .gz, .zst; JSONL) -> normlab token shards, in parallel, resumable");
  tok->add_option("INPUT", o->inputs, "text files; .jsonl records give their text field")
      ->required()
      ->check(CLI::ExistingFile);
  tok->add_option("--out", o->out, "folder of the shards (new, empty or made by this command)")
      ->required();
  tok->add_option("--model", o->model,
                  "an existing SentencePiece .model (e.g. a LLaMA tokenizer); default: train one");
  tok->add_option("--vocab-size", o->vocab_size, "vocabulary of a trained tokenizer")
      ->capture_default_str()
      ->check(CLI::Range(5, 1 << 20));
  tok->add_option("--model-type", o->model_type, "bpe | unigram | char | word (a trained one)")
      ->capture_default_str();
  tok->add_option("--sample-lines", o->sample_lines,
                  "a trained tokenizer learns from this many non-empty lines (JSONL records), a "
                  "uniform random sample over all inputs")
      ->capture_default_str()
      ->check(kPositive);
  tok->add_option("--sample-seed", o->sample_seed, "which lines that sample takes")
      ->capture_default_str();
  tok->add_option("--jsonl-field", o->jsonl_field,
                  "the text field of JSONL records (default text)");
  tok->add_option("--jobs", o->jobs, "parallel workers")->check(CLI::Range(1, 1024));
  tok->add_option("--documents", o->documents,
                  "what a document (ending with EOS) of a plain input is: lines, paragraphs (lines "
                  "up to a blank line, newlines kept) or files; a JSONL record is one")
      ->capture_default_str()
      ->check(CLI::IsMember({"lines", "paragraphs", "files"}));
  tok->add_flag("--keep-newlines", o->keep_newlines,
                "a trained tokenizer keeps newlines and runs of spaces (indentation): NFKC "
                "without NMT's whitespace rules, byte fallback; else they become single spaces");
  tok->add_option("--piece-mb", o->piece_mb,
                  "every input, compressed or not, is cut at line starts into pieces of about this "
                  "many MiB of text, tokenized in parallel, one shard each")
      ->capture_default_str()
      ->check(CLI::Range(1, 1 << 20));
  tok->add_option("--max-line-bytes", o->max_line_bytes,
                  "refuse a longer line or JSONL record (tokenizing takes ~100 bytes of memory per "
                  "byte of a line)")
      ->capture_default_str()
      ->check(kPositive);
  tok->add_flag("!--no-word-cache", o->word_cache,
                "encode every line whole (the same tokens, slower; for comparison)");
  tok->add_option("--cache-dir", o->cache_dir,
                  "trained tokenizers (default ~/.cache/normlab/data)");
  return {data,
          [o, data] {
            o->action = data->get_subcommands().front()->get_name();
            return normlab::data_command(*o, std::cout, std::cerr);
          },
          /*trains=*/false, /*uses_blas=*/false};
}

}  // namespace normlab::verbs
