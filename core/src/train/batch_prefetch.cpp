#include "batch_prefetch.h"

#include <algorithm>
#include <chrono>

namespace normlab {

BatchPrefetcher::BatchPrefetcher(const data::BatchPlan& plan, int64_t depth, int world, int rank)
    : plan_(plan),
      depth_(std::max<int64_t>(depth, 1)),
      per_epoch_(plan.batches_per_epoch()),
      world_(world),
      rank_(rank),
      thread_([this] { run(); }) {}

BatchPrefetcher::~BatchPrefetcher() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stop_ = true;
  }
  wake_.notify_all();
  thread_.join();
}

// The next position this rank takes: the following ones, skipping the other ranks' phases.
BatchPrefetcher::Position BatchPrefetcher::after(Position p) const {
  do {
    p = ++p.index < per_epoch_ ? p : Position{p.epoch + 1, 0, p.phase};
    p.phase = (p.phase + 1) % world_;
  } while (p.phase != rank_);
  return p;
}

data::Batch BatchPrefetcher::take(int64_t epoch, int64_t index, int64_t k, double* waited_s) {
  const auto t0 = std::chrono::steady_clock::now();
  const Position want{epoch, index, k % world_};
  std::unique_lock<std::mutex> lock(mutex_);
  while (!ready_.empty() && !(ready_.front().at == want)) ready_.pop_front();
  if (ready_.empty() && started_ && next_ == want) {
    // In the making: wait for it rather than make it twice.
    wake_.wait(lock, [&] { return !ready_.empty() || stop_; });
  }
  if (!ready_.empty() && ready_.front().at == want) {
    Ready r = std::move(ready_.front());
    ready_.pop_front();
    lock.unlock();
    wake_.notify_all();
    if (waited_s)
      *waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r.error) std::rethrow_exception(r.error);
    return std::move(r.batch);
  }
  // Another position (the first, or after a jump): made here, the thread restarts after it.
  ready_.clear();
  ++generation_;
  next_ = after(want);
  started_ = true;
  lock.unlock();
  wake_.notify_all();
  data::Batch b = plan_.make_batch(plan_.batch(epoch, index));
  if (waited_s)
    *waited_s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  return b;
}

void BatchPrefetcher::run() {
  std::unique_lock<std::mutex> lock(mutex_);
  while (true) {
    wake_.wait(lock, [&] { return stop_ || (started_ && int64_t(ready_.size()) < depth_); });
    if (stop_) return;
    const Position at = next_;
    const uint64_t generation = generation_;
    lock.unlock();
    Ready r;
    r.at = at;
    try {
      r.batch = plan_.make_batch(plan_.batch(at.epoch, at.index));
    } catch (...) {
      r.error = std::current_exception();
    }
    lock.lock();
    if (generation != generation_) continue;  // reset meanwhile: not the batch wanted next
    ready_.push_back(std::move(r));
    next_ = after(at);
    wake_.notify_all();
  }
}

}  // namespace normlab
