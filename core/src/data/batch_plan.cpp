// Token-budget batches: sort by length, cut greedily under max_tokens, shuffle the batch order per
// epoch with our own Fisher–Yates (std::shuffle's algorithm is implementation-defined).
#include <fmt/format.h>

#include <algorithm>
#include <numeric>

#include "internal.h"

namespace normlab::data {

namespace {

bool is_lm(const Split& split) {
  return !split.examples.empty() && std::all_of(split.examples.begin(), split.examples.end(),
                                                [](const Example& e) { return e.src.empty(); });
}

// Padded length of one row: translation max(src, tgt) (tgt_in = BOS + tgt[:-1] is as long as tgt),
// LM the block minus the shift.
int64_t row_len(const Example& e, bool lm) {
  if (lm) return std::max<int64_t>(int64_t(e.tgt.size()) - 1, 0);
  return std::max<int64_t>(e.src.size(), e.tgt.size());
}

}  // namespace

BatchPlan::BatchPlan(const Split& split, int64_t max_tokens, uint64_t seed, bool shuffle)
    : split_(&split), max_tokens_(max_tokens), seed_(seed), shuffle_(shuffle) {
  if (max_tokens <= 0)
    throw DataError(fmt::format("batching: max_tokens must be positive, got {}", max_tokens));
  lm_ = is_lm(split);
  const bool lm = lm_;
  const auto& ex = split.examples;
  std::vector<int32_t> order(ex.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) {
    const auto ka = std::make_pair(ex[a].src.size(), ex[a].tgt.size());
    const auto kb = std::make_pair(ex[b].src.size(), ex[b].tgt.size());
    return ka < kb;
  });
  std::vector<int32_t> current;
  int64_t longest = 0;
  for (int32_t i : order) {
    const int64_t len = row_len(ex[i], lm);
    const int64_t grown = std::max(longest, len);
    if (!current.empty() && int64_t(current.size() + 1) * grown > max_tokens) {
      buckets_.push_back(std::move(current));
      current.clear();
      longest = 0;
    }
    current.push_back(i);  // an example over the budget on its own still forms a batch
    longest = std::max(longest, len);
  }
  if (!current.empty()) buckets_.push_back(std::move(current));
}

std::vector<std::vector<int32_t>> BatchPlan::epoch(int64_t epoch) const {
  std::vector<size_t> order(buckets_.size());
  std::iota(order.begin(), order.end(), size_t(0));
  if (shuffle_) {
    std::mt19937_64 rng(detail::mix_seed(seed_, uint64_t(epoch)));
    for (size_t i = order.size(); i > 1; --i)
      std::swap(order[i - 1], order[detail::uniform_below(rng, i)]);
  }
  std::vector<std::vector<int32_t>> out;
  out.reserve(order.size());
  for (size_t b : order) out.push_back(buckets_[b]);
  return out;
}

Batch BatchPlan::make(const std::vector<int32_t>& indices) const {
  const auto& ex = split_->examples;
  for (int32_t i : indices)
    if (i < 0 || size_t(i) >= ex.size())
      throw DataError(
          fmt::format("batching: example index {} out of range (split has {})", i, ex.size()));
  const bool lm = lm_;
  Batch b;
  b.size = int64_t(indices.size());
  for (int32_t i : indices) {
    b.src_len = std::max<int64_t>(b.src_len, ex[i].src.size());
    b.tgt_len =
        std::max<int64_t>(b.tgt_len, lm ? std::max<int64_t>(int64_t(ex[i].tgt.size()) - 1, 0)
                                        : int64_t(ex[i].tgt.size()));
  }
  b.src.assign(size_t(b.size * b.src_len), kPad);
  b.tgt_in.assign(size_t(b.size * b.tgt_len), kPad);
  b.tgt_out.assign(size_t(b.size * b.tgt_len), kPad);
  for (int64_t r = 0; r < b.size; ++r) {
    const Example& e = ex[indices[r]];
    std::copy(e.src.begin(), e.src.end(), b.src.begin() + r * b.src_len);
    auto in = b.tgt_in.begin() + r * b.tgt_len;
    auto out = b.tgt_out.begin() + r * b.tgt_len;
    if (lm) {
      if (e.tgt.size() >= 2) {
        std::copy(e.tgt.begin(), e.tgt.end() - 1, in);
        std::copy(e.tgt.begin() + 1, e.tgt.end(), out);
      }
    } else if (!e.tgt.empty()) {
      *in = kBos;
      std::copy(e.tgt.begin(), e.tgt.end() - 1, in + 1);
      std::copy(e.tgt.begin(), e.tgt.end(), out);
    }
  }
  b.target_tokens =
      std::count_if(b.tgt_out.begin(), b.tgt_out.end(), [](int64_t t) { return t != kPad; });
  return b;
}

}  // namespace normlab::data
