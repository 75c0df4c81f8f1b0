// Token-budget batches: sort by length, cut greedily under max_tokens, shuffle the batch order per
// epoch with our own Fisher–Yates (std::shuffle's algorithm is implementation-defined).
#include <fmt/format.h>

#include <algorithm>
#include <mutex>
#include <numeric>

#include "internal.h"
#include "token_shards.h"

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

BatchPlan::BatchPlan(const Split& split, int64_t max_tokens, uint64_t seed, bool shuffle,
                     bool sequential)
    : split_(&split),
      max_tokens_(max_tokens),
      seed_(seed),
      shuffle_(shuffle),
      sequential_(sequential) {
  if (max_tokens <= 0)
    throw DataError(fmt::format("batching: max_tokens must be positive, got {}", max_tokens));
  if (split.blocks) {  // fixed-length blocks: no buckets, batches computed when asked for
    lm_ = true;
    per_batch_ =
        std::max<int64_t>(1, max_tokens / std::max<int64_t>(split.blocks->block_tokens() - 1, 1));
    return;
  }
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

std::vector<size_t> BatchPlan::bucket_order(int64_t epoch) const {
  std::vector<size_t> order(buckets_.size());
  std::iota(order.begin(), order.end(), size_t(0));
  if (shuffle_) {
    std::mt19937_64 rng(detail::mix_seed(seed_, uint64_t(epoch)));
    for (size_t i = order.size(); i > 1; --i)
      std::swap(order[i - 1], order[detail::uniform_below(rng, i)]);
  }
  return order;
}

std::vector<std::vector<int32_t>> BatchPlan::epoch(int64_t epoch) const {
  if (split_->blocks)
    throw std::logic_error("BatchPlan::epoch: a split of blocks is batched with batch()");
  const std::vector<size_t> order = bucket_order(epoch);
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
  const int64_t pad = split_->pad_id;
  b.src.assign(size_t(b.size * b.src_len), pad);
  b.tgt_in.assign(size_t(b.size * b.tgt_len), pad);
  b.tgt_out.assign(size_t(b.size * b.tgt_len), pad);
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
      std::count_if(b.tgt_out.begin(), b.tgt_out.end(), [&](int64_t t) { return t != pad; });
  return b;
}

std::string BatchPlan::fingerprint() const {
  if (split_->blocks) return fmt::format("blocks {} a batch", per_batch_);
  uint64_t h = 1469598103934665603ull;  // FNV-1a over the buckets' sizes and example indices
  const auto mix = [&h](uint64_t v) {
    for (int i = 0; i < 8; ++i, v >>= 8) h = (h ^ (v & 0xff)) * 1099511628211ull;
  };
  for (const auto& bucket : buckets_) {
    mix(bucket.size());
    for (int32_t i : bucket) mix(uint64_t(uint32_t(i)));
  }
  return fmt::format("buckets {:016x}", h);
}

int64_t BatchPlan::batches_per_epoch() const {
  if (!split_->blocks) return int64_t(buckets_.size());
  return (split_->blocks->count() + per_batch_ - 1) / per_batch_;
}

std::vector<int64_t> BatchPlan::batch(int64_t epoch, int64_t i) const {
  std::vector<int64_t> out;
  if (!split_->blocks) {
    // The epoch's order of the buckets, computed once per epoch (not per batch: the training step
    // asks for every batch).
    std::lock_guard<std::mutex> lock(order_mutex_);
    if (order_epoch_ != epoch) {
      order_ = bucket_order(epoch);
      order_epoch_ = epoch;
    }
    const auto& bucket = buckets_.at(order_.at(size_t(i)));
    return {bucket.begin(), bucket.end()};
  }
  const int64_t n = split_->blocks->count();
  const int64_t first = i * per_batch_, last = std::min(n, first + per_batch_);
  if (first >= n || i < 0)
    throw DataError(
        fmt::format("batching: batch {} of an epoch of {} batches", i, batches_per_epoch()));
  const bool shuffled = shuffle_ && !sequential_;
  // One key per (seed, epoch): the order, and a mixture's draws (fresh each epoch, issue 66.1).
  const uint64_t epoch_key = detail::mix_seed(seed_, uint64_t(epoch));
  const SeededPermutation order(uint64_t(n), epoch_key);
  const BlockSource& src = *split_->blocks;
  for (int64_t k = first; k < last; ++k)
    out.push_back(src.block_at(shuffled ? int64_t(order.at(uint64_t(k))) : k, epoch_key));
  return out;
}

Batch BatchPlan::make_batch(const std::vector<int64_t>& indices) const {
  if (!split_->blocks) {
    std::vector<int32_t> small(indices.begin(), indices.end());
    return make(small);
  }
  const BlockSource& src = *split_->blocks;
  const int64_t T = src.block_tokens() - 1;
  Batch b;
  b.size = int64_t(indices.size());
  b.tgt_len = T;
  b.tgt_in.resize(size_t(b.size * T));
  b.tgt_out.resize(size_t(b.size * T));
  std::vector<int32_t> block(size_t(T + 1));
  for (int64_t r = 0; r < b.size; ++r) {
    if (indices[r] < 0 || indices[r] >= src.count())
      throw DataError(
          fmt::format("batching: block {} out of range (split has {})", indices[r], src.count()));
    src.read(indices[r], block.data());
    std::copy(block.begin(), block.end() - 1, b.tgt_in.begin() + r * T);
    std::copy(block.begin() + 1, block.end(), b.tgt_out.begin() + r * T);
  }
  b.target_tokens = b.size * T;  // full blocks: no padding
  return b;
}

}  // namespace normlab::data
