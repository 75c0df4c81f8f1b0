// Checkpoints off the training loop's critical path (issue 43.2): the loop copies the checkpoint
// into host memory (a snapshot; pinned memory when the model is on a GPU) and goes on training
// while a thread of this writer writes, hashes and publishes the file. One write at a time: the
// next checkpoint waits for the previous one, so at most one snapshot is held, and its buffers
// are reused. The end of a run waits for the last write before its final status.
#pragma once

#include <exception>
#include <functional>
#include <memory>
#include <thread>

namespace normlab {

struct CheckpointContents;

class CheckpointWriter {
 public:
  CheckpointWriter();
  // Waits for a write in flight; its error is dropped (the run is ending by another error).
  ~CheckpointWriter();
  CheckpointWriter(const CheckpointWriter&) = delete;
  CheckpointWriter& operator=(const CheckpointWriter&) = delete;

  // Waits for the previous write (rethrowing its error), runs `take` on this thread to fill the
  // snapshot, then `write` on the writer's thread. A null `take` writes no snapshot (a link).
  void submit(const std::function<void(CheckpointContents&)>& take,
              std::function<void(const CheckpointContents&)> write);
  // Waits for the write in flight; rethrows its error (util::FileError …).
  void wait();
  // Seconds the training loop spent in submit() and wait(): taking snapshots and waiting for
  // writes (what the checkpoints cost it).
  double loop_seconds() const { return loop_seconds_; }

 private:
  std::unique_ptr<CheckpointContents> snapshot_;
  std::thread thread_;
  std::exception_ptr error_;
  double loop_seconds_ = 0;
};

}  // namespace normlab
