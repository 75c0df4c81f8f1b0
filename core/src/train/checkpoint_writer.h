// Checkpoints off the training loop's critical path (issue 43.2): the loop copies the checkpoint
// into host memory (a snapshot; pinned memory when the model is on a GPU) and goes on training
// while a thread of this writer writes, hashes and publishes the file. Jobs run in order, one at
// a time. Only one snapshot is held: a new snapshot waits until the writes before it are done
// (its buffers are reused), while a job without one (a hard link) is queued at once. The end of
// a run waits for the last job before its final status. A failed job drops the jobs queued
// behind it (a link to a file that was not written) and is reported once.
#pragma once

#include <condition_variable>
#include <deque>
#include <exception>
#include <functional>
#include <memory>
#include <mutex>
#include <thread>

namespace normlab {

struct CheckpointContents;

class CheckpointWriter {
 public:
  CheckpointWriter();
  // Finishes the queued jobs; their errors are dropped (the run is ending by another error).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Queues `write` to run on the writer's thread. With `take`, first waits for every queued job
  // (rethrowing an error) and runs `take` on this thread to fill the snapshot `write` receives.
  void submit(const std::function<void(CheckpointContents&)>& take,
              std::function<void(const CheckpointContents&)> write);
  // Queues `fill` to run on the writer's thread on the snapshot, before any checkpoint (the
  // first one's buffers, made while training starts). An error there is dropped: the snapshot
  // then allocates its buffers itself, and fails there if it must.
  void prepare(std::function<void(CheckpointContents&)> fill);
  // Waits for every queued job (the end of a run: not counted as the loop's wait); rethrows the
  // first error (util::FileError …) once.
  void finish() { drain(); }
  // What checkpoints cost the training loop: seconds taking snapshots, and seconds waiting for
  // earlier writes (a checkpoint interval shorter than a write).
  double snapshot_seconds() const { return snapshot_seconds_; }
  double wait_seconds() const { return wait_seconds_; }

 private:
  void drain();  // waits until the queue is empty and no job runs; rethrows an error
  void wait();   // drain(), timed as the loop's wait
  void work();   // the writer thread

  std::unique_ptr<CheckpointContents> snapshot_;
  std::mutex mutex_;
  std::condition_variable changed_;
  std::deque<std::function<void()>> jobs_;
  bool busy_ = false, stopping_ = false;
  std::exception_ptr error_;
  std::thread thread_;
  double snapshot_seconds_ = 0, wait_seconds_ = 0;
};

}  // namespace normlab
