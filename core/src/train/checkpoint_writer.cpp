#include "checkpoint_writer.h"

#include <chrono>

#include "run/checkpoint.h"

namespace normlab {
namespace {

struct LoopTimer {
  double& total;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~LoopTimer() {
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

}  // namespace

CheckpointWriter::CheckpointWriter() : snapshot_(std::make_unique<CheckpointContents>()) {}

CheckpointWriter::~CheckpointWriter() {
  if (thread_.joinable()) thread_.join();
}

void CheckpointWriter::wait() {
  LoopTimer timer{loop_seconds_};
  if (thread_.joinable()) thread_.join();
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void CheckpointWriter::submit(const std::function<void(CheckpointContents&)>& take,
                              std::function<void(const CheckpointContents&)> write) {
  wait();
  LoopTimer timer{loop_seconds_};
  if (take) take(*snapshot_);
  thread_ = std::thread([this, write = std::move(write)] {
    try {
      write(*snapshot_);
    } catch (...) {
      error_ = std::current_exception();
    }
  });
}

}  // namespace normlab
