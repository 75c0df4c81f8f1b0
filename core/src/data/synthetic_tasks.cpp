// Built-in synthetic tasks, generated from the seed (no files, no cache): copy and reverse
// (seq2seq, optionally denoising) and synthetic-lm (a stream from a fixed sparse Markov chain).
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <ostream>
#include <sstream>

#include "internal.h"

namespace normlab::data::detail {

std::vector<int32_t> SyntheticTokenizer::encode(const std::string& text) const {
  std::vector<int32_t> ids;
  std::istringstream in(text);
  std::string word;
  while (in >> word) {
    int32_t id = kUnk;
    if (word.size() >= 2 && word.size() <= 10 && word[0] == 'w' &&
        std::all_of(word.begin() + 1, word.end(), [](char c) { return c >= '0' && c <= '9'; }) &&
        (word.size() == 2 || word[1] != '0')) {
      long v = std::stol(word.substr(1));
      if (v < symbols_) id = static_cast<int32_t>(4 + v);
    }
    ids.push_back(id);
  }
  return ids;
}

std::string SyntheticTokenizer::decode(const std::vector<int32_t>& ids) const {
  std::string out;
  for (int32_t id : ids) {
    if (id < 4 || id >= 4 + symbols_) continue;
    if (!out.empty()) out += ' ';
    out += 'w';
    out += std::to_string(id - 4);
  }
  return out;
}

namespace {

enum Stream : uint64_t { kTrainStream = 1, kValidStream = 2, kTestStream = 3 };

void check_config(const DataConfig& cfg) {
  auto fail = [](const std::string& msg) { throw DataError("data config: " + msg); };
  if (cfg.synthetic_vocab < 2)
    fail(fmt::format("synthetic_vocab must be at least 2, got {}", cfg.synthetic_vocab));
  if (cfg.synthetic_min_len < 1 || cfg.synthetic_max_len < cfg.synthetic_min_len)
    fail(fmt::format("synthetic lengths need 1 <= synthetic_min_len ({}) <= synthetic_max_len ({})",
                     cfg.synthetic_min_len, cfg.synthetic_max_len));
  if (cfg.synthetic_train < 1 || cfg.synthetic_valid < 0)
    fail(fmt::format("synthetic_train ({}) must be >= 1 and synthetic_valid ({}) >= 0",
                     cfg.synthetic_train, cfg.synthetic_valid));
  if (!(cfg.synthetic_noise >= 0 && cfg.synthetic_noise <= 1))
    fail(fmt::format("synthetic_noise must be in [0, 1], got {}", cfg.synthetic_noise));
  if (cfg.task == "synthetic-lm" && cfg.lm_block < 1)
    fail(fmt::format("lm_block must be >= 1, got {}", cfg.lm_block));
}

// copy / reverse: tgt is the clean sequence (reversed for reverse), src the sequence with each
// token replaced, with probability `noise`, by a different random symbol; both end with EOS. The
// noise has its own generator, so the clean sequences do not depend on the noise level.
Split make_seq2seq(const DataConfig& cfg, Stream stream, int count, bool reverse,
                   const Tokenizer& tok) {
  std::mt19937_64 rng(mix_seed(cfg.seed, stream)), noise_rng(mix_seed(cfg.seed, stream + 0x100));
  const int V = cfg.synthetic_vocab;
  const uint64_t span = uint64_t(cfg.synthetic_max_len - cfg.synthetic_min_len) + 1;
  Split split;
  split.examples.reserve(count);
  for (int i = 0; i < count; ++i) {
    const int len = cfg.synthetic_min_len + static_cast<int>(uniform_below(rng, span));
    std::vector<int32_t> clean(len);
    for (auto& t : clean) t = 4 + static_cast<int32_t>(uniform_below(rng, V));
    Example ex;
    ex.src = clean;
    if (cfg.synthetic_noise > 0)
      for (auto& t : ex.src)
        if (uniform01(noise_rng) < cfg.synthetic_noise)
          t = 4 + static_cast<int32_t>((t - 4 + 1 + uniform_below(noise_rng, V - 1)) % V);
    ex.tgt = clean;
    if (reverse) std::reverse(ex.tgt.begin(), ex.tgt.end());
    split.sources.push_back(tok.decode(ex.src));
    split.references.push_back(tok.decode(ex.tgt));
    ex.src.push_back(kEos);
    ex.tgt.push_back(kEos);
    split.examples.push_back(std::move(ex));
  }
  return split;
}

// A fixed sparse Markov chain over V symbols: each symbol has min(V, 4) successors with unequal
// probabilities. It depends on V only (not the seed), so every seed samples the same task.
struct MarkovChain {
  std::vector<std::vector<int32_t>> next;  // successor symbols
  std::vector<std::vector<double>> prob;   // their probabilities
};

MarkovChain make_chain(int V) {
  std::mt19937_64 rng(mix_seed(0x6e6f726d6c6162ULL /* "normlab" */, uint64_t(V)));
  const int k = std::min(V, 4);
  MarkovChain c;
  c.next.resize(V);
  c.prob.resize(V);
  std::vector<int32_t> symbols(V);
  for (int s = 0; s < V; ++s) {
    for (int i = 0; i < V; ++i) symbols[i] = i;
    for (int i = 0; i < k; ++i)  // partial Fisher–Yates: k distinct successors
      std::swap(symbols[i], symbols[i + uniform_below(rng, uint64_t(V - i))]);
    double total = 0;
    for (int i = 0; i < k; ++i) {
      double w = std::pow(0.1 + uniform01(rng), 3.0);
      c.next[s].push_back(symbols[i]);
      c.prob[s].push_back(w);
      total += w;
    }
    for (auto& p : c.prob[s]) p /= total;
  }
  return c;
}

// Symbol stream (ids 4…) of `length` tokens; also the mean -log p of its transitions.
std::vector<int32_t> sample_chain(const MarkovChain& c, std::mt19937_64& rng, size_t length,
                                  double* nll) {
  std::vector<int32_t> out;
  out.reserve(length);
  int32_t s = static_cast<int32_t>(uniform_below(rng, c.next.size()));
  double total = 0;
  for (size_t t = 0; t < length; ++t) {
    if (t > 0) {
      double u = uniform01(rng), acc = 0;
      size_t j = 0;
      for (; j + 1 < c.next[s].size(); ++j) {
        acc += c.prob[s][j];
        if (u < acc) break;
      }
      total -= std::log(c.prob[s][j]);
      s = c.next[s][j];
    }
    out.push_back(4 + s);
  }
  if (nll) *nll = length > 1 ? total / double(length - 1) : 0;
  return out;
}

}  // namespace

Dataset make_synthetic(const DataConfig& cfg, std::ostream& log) {
  check_config(cfg);
  auto tok = std::make_shared<SyntheticTokenizer>(cfg.synthetic_vocab);
  Dataset d;
  d.src_tokenizer = d.tgt_tokenizer = tok;
  d.src_vocab = d.tgt_vocab = tok->vocab_size();
  const std::string vocab =
      fmt::format("vocab {} ({} symbols + 4 specials)", tok->vocab_size(), cfg.synthetic_vocab);
  if (cfg.task == "copy" || cfg.task == "reverse") {
    const bool rev = cfg.task == "reverse";
    d.train = make_seq2seq(cfg, kTrainStream, cfg.synthetic_train, rev, *tok);
    d.valid = make_seq2seq(cfg, kValidStream, cfg.synthetic_valid, rev, *tok);
    d.test = make_seq2seq(cfg, kTestStream, cfg.synthetic_valid, rev, *tok);
    d.summary = fmt::format(
        "{}: train {} pairs, valid {}, test {}, {}, lengths {}..{}, noise {}, seed {}, generated",
        cfg.task, d.train.examples.size(), d.valid.examples.size(), d.test.examples.size(), vocab,
        cfg.synthetic_min_len, cfg.synthetic_max_len, cfg.synthetic_noise, cfg.seed);
  } else {  // synthetic-lm
    const MarkovChain chain = make_chain(cfg.synthetic_vocab);
    double entropy = 0;
    auto blocks = [&](Stream stream, int count, double* nll) {
      std::mt19937_64 rng(mix_seed(cfg.seed, stream));
      Split s;
      if (count > 0)
        s.examples = cut_blocks(sample_chain(chain, rng, size_t(count) * cfg.lm_block + 1, nll),
                                cfg.lm_block);
      return s;
    };
    d.train = blocks(kTrainStream, cfg.synthetic_train, &entropy);
    d.valid = blocks(kValidStream, cfg.synthetic_valid, nullptr);
    d.test = blocks(kTestStream, cfg.synthetic_valid, nullptr);
    d.summary = fmt::format(
        "synthetic-lm: train {} blocks of {}, valid {}, test {}, {}, sparse Markov chain ({} "
        "successors per symbol, "
        "entropy rate ~{:.3f} nats/token, uniform {:.3f}), seed {}, generated",
        d.train.examples.size(), cfg.lm_block, d.valid.examples.size(), d.test.examples.size(),
        vocab, std::min(cfg.synthetic_vocab, 4), entropy, std::log(double(cfg.synthetic_vocab)),
        cfg.seed);
  }
  log << "data: generated " << cfg.task << " from seed " << cfg.seed << "\n";
  return d;
}

}  // namespace normlab::data::detail
