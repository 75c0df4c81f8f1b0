// load_dataset: dispatch on the task, plus the summary pieces the file-based loaders share.
#include <fmt/format.h>

#include "internal.h"
#include "normlab/data/named_datasets.h"

namespace fs = std::filesystem;

namespace normlab::data {

namespace detail {

std::string dataset_name(const std::string& path) {
  fs::path p = fs::path(path).lexically_normal();
  std::string dir = p.parent_path().filename().string();
  if (!dir.empty() && dir != "." && dir != "..") return dir;
  return p.stem().string();
}

std::string tokenizer_status(const TokenizerOutcome& src, const TokenizerOutcome* tgt) {
  auto one = [](const TokenizerOutcome& o) -> std::string {
    switch (o.source) {
      case TokenizerOutcome::Given:
        return "from tokenizer.model";
      case TokenizerOutcome::CacheHit:
        return "cache hit";
      case TokenizerOutcome::Trained:
        return fmt::format("trained ({:.1f} s)", o.seconds);
    }
    return "";
  };
  if (!tgt || tgt->tokenizer == src.tokenizer) return "tokenizer " + one(src);
  if (src.source == tgt->source && src.source != TokenizerOutcome::Trained)
    return "tokenizers " + one(src);
  return fmt::format("tokenizer src {}, tgt {}", one(src), one(*tgt));
}

std::string corpus_status(const std::vector<SplitLoad>& loads) {
  size_t hits = 0;
  double seconds = 0;
  for (const auto& l : loads) {
    hits += l.hit;
    seconds += l.seconds;
  }
  if (hits == loads.size()) return "corpus cache hit";
  if (hits == 0) return fmt::format("corpus cache miss (tokenized in {:.1f} s)", seconds);
  std::string hit, miss;
  for (const auto& l : loads) {
    std::string& list = l.hit ? hit : miss;
    if (!list.empty()) list += '+';
    list += l.name;
  }
  return fmt::format("corpus cache hit {}, miss {} (tokenized in {:.1f} s)", hit, miss, seconds);
}

fs::path cache_file(const fs::path& cache_dir, const char* kind, const Digest& key,
                    const char* ext) {
  return cache_dir / kind / (key.hex() + ext);
}

}  // namespace detail

Dataset load_dataset(const DataConfig& given, std::ostream& log) {
  DataConfig cfg = given;
  resolve_named_dataset(cfg, log);  // data.dataset: fetched on first use, sets task and paths
  if (cfg.task == "translation") return detail::load_translation(cfg, log);
  if (cfg.task == "lm") return detail::load_lm(cfg, log);
  if (cfg.task == "copy" || cfg.task == "reverse" || cfg.task == "synthetic-lm")
    return detail::make_synthetic(cfg, log);
  throw DataError(fmt::format(
      "data.task: unknown '{}' (expected translation, lm, copy, reverse or synthetic-lm)",
      cfg.task));
}

}  // namespace normlab::data
