// The next batches of a split of token shards, made on a thread of their own while the current
// update runs (issue 44.6: the loader keeps batches ready, so a fast step never waits for the
// mapped pages). Positions are a pure function of (epoch, index), so prefetching never changes
// which batch comes: a request for another position is made on the spot. No LibTorch here.
#pragma once

#include <condition_variable>
#include <cstdint>
#include <deque>
#include <exception>
#include <mutex>
#include <thread>

#include "normlab/data/dataset.h"

namespace normlab {

class BatchPrefetcher {
 public:
  // Keeps up to `depth` batches ahead of the last one taken: the batches of rank `rank` of `world`,
  // which takes the k-th batch of every update where k % world == rank (updates have a multiple
  // of `world` batches).
  BatchPrefetcher(const data::BatchPlan& plan, int64_t depth, int world = 1, int rank = 0);
  ~BatchPrefetcher();
  BatchPrefetcher(const BatchPrefetcher&) = delete;
  BatchPrefetcher& operator=(const BatchPrefetcher&) = delete;

  // Batch `index` of `epoch`, the `k`-th of its update; `waited_s` gets the time it took (0 when it
  // was ready).
  data::Batch take(int64_t epoch, int64_t index, int64_t k, double* waited_s);

 private:
  struct Position {
    int64_t epoch = 0, index = 0;
    int64_t phase = 0;  // its place in the update, modulo world: this rank's when it is `rank`
    bool operator==(const Position& o) const { return epoch == o.epoch && index == o.index; }
    bool operator!=(const Position& o) const { return !(*this == o); }
  };
  struct Ready {
    Position at;
    data::Batch batch;
    std::exception_ptr error;  // made on the thread, rethrown when it is taken
  };
  Position after(Position p) const;
  void run();

  const data::BatchPlan& plan_;
  const int64_t depth_, per_epoch_;
  const int world_, rank_;
  std::mutex mutex_;
  std::condition_variable wake_;
  std::deque<Ready> ready_;
  Position next_;         // the thread's next position to make
  bool started_ = false;  // a position was asked for: the thread knows where to go
  bool stop_ = false;
  uint64_t generation_ = 0;  // bumped when the queue is reset: a batch in making is dropped
  std::thread thread_;
};

}  // namespace normlab
