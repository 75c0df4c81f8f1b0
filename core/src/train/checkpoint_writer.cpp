#include "checkpoint_writer.h"

#include <chrono>
#include <utility>

#include "run/checkpoint.h"

namespace normlab {
namespace {

struct Stopwatch {
  double& total;
  std::chrono::steady_clock::time_point start = std::chrono::steady_clock::now();
  ~Stopwatch() {
    total += std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  }
};

}  // namespace

CheckpointWriter::CheckpointWriter()
    : snapshot_(std::make_unique<CheckpointContents>()), thread_([this] { work(); }) {}

CheckpointWriter::~CheckpointWriter() {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    stopping_ = true;
  }
  changed_.notify_all();
  thread_.join();
}

void CheckpointWriter::work() {
  std::unique_lock<std::mutex> lock(mutex_);
  for (;;) {
    changed_.wait(lock, [&] { return stopping_ || !jobs_.empty(); });
    if (jobs_.empty()) return;  // stopping, and every job done
    std::function<void()> job = std::move(jobs_.front());
    jobs_.pop_front();
    busy_ = true;
    lock.unlock();
    std::exception_ptr failed;
    try {
      job();
    } catch (...) {
      failed = std::current_exception();
    }
    lock.lock();
    busy_ = false;
    if (failed) {
      if (!error_) error_ = failed;
      jobs_.clear();  // a link queued behind a failed write would publish the wrong file
    }
    changed_.notify_all();
  }
}

void CheckpointWriter::drain() {
  std::unique_lock<std::mutex> lock(mutex_);
  changed_.wait(lock, [&] { return jobs_.empty() && !busy_; });
  if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
}

void CheckpointWriter::wait() {
  Stopwatch watch{wait_seconds_};
  drain();
}

void CheckpointWriter::prepare(std::function<void(CheckpointContents&)> fill) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    CheckpointContents* snapshot = snapshot_.get();
    jobs_.push_back([fill = std::move(fill), snapshot] {
      try {
        fill(*snapshot);
      } catch (const std::exception&) {
        snapshot->tensors.clear();
      }
    });
  }
  changed_.notify_all();
}

void CheckpointWriter::submit(const std::function<void(CheckpointContents&)>& take,
                              std::function<void(const CheckpointContents&)> write) {
  if (take) {
    wait();  // the snapshot's buffers are free once every earlier write is done
    Stopwatch watch{snapshot_seconds_};
    take(*snapshot_);
  } else {
    std::lock_guard<std::mutex> lock(mutex_);
    if (error_) std::rethrow_exception(std::exchange(error_, nullptr));
  }
  {
    std::lock_guard<std::mutex> lock(mutex_);
    const CheckpointContents* snapshot = snapshot_.get();
    jobs_.push_back([write = std::move(write), snapshot] { write(*snapshot); });
  }
  changed_.notify_all();
}

}  // namespace normlab
