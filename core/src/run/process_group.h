// Data-parallel training's process group: the ranks of one training job, joined through PyTorch's
// c10d (a TCPStore rendezvous; Gloo on CPU, NCCL on CUDA where the LibTorch build has it). Every
// collective has the job's timeout; a collective that fails because a rank is gone says which one.
#pragma once

#include <torch/types.h>

#include <chrono>
#include <memory>
#include <stdexcept>
#include <string>
#include <vector>

namespace normlab {

// Where this process stands in a job, from its launcher's environment: torchrun (RANK, WORLD_SIZE,
// LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR, MASTER_PORT), srun (SLURM_PROCID,
// SLURM_STEP_NUM_TASKS, SLURM_LOCALID, SLURM_STEP_TASKS_PER_NODE; MASTER_ADDR/MASTER_PORT when set,
// else the launching node and a port from the job id) or `normlab train --nproc N` (which sets
// torchrun's variables).
struct DistEnv {
  int rank = 0, world = 1;
  int local_rank = 0, local_world = 1;
  std::string master_addr = "127.0.0.1";
  int master_port = 29500;
  std::string launcher = "none";  // none | env (torchrun, --nproc) | slurm
  bool distributed() const { return world > 1; }
};
// Throws std::invalid_argument naming the variable when one is malformed (RANK=x, RANK ≥ WORLD_SIZE
// …).
DistEnv dist_env_from_environment();

// A collective failed: a rank exited or stopped answering. The message names the rank when it can
// be told (a rank on this host whose process is gone), else the transport's cause.
class PeerLostError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

// The job could not start: a rank did not join in time, or the ranks disagree (their manifests).
class JoinError : public std::runtime_error {
 public:
  using std::runtime_error::runtime_error;
};

struct RankInfo {
  int rank = 0;
  int pid = 0;
  std::string host, device;
};

class ProcessGroup {
 public:
  // Forms the group of env.world ranks; `backend` is gloo or nccl (resolved, not auto); `device` is
  // this rank's ("cpu", "cuda:1"). `fingerprint` (the resolved manifest's hash) must be the same on
  // every rank. Throws JoinError on every rank, naming what went wrong, within `timeout`.
  static std::unique_ptr<ProcessGroup> join(const DistEnv& env, const std::string& backend,
                                            const std::string& device,
                                            const std::string& fingerprint,
                                            std::chrono::milliseconds timeout);
  ~ProcessGroup();

  int rank() const { return env_.rank; }
  int world() const { return env_.world; }
  bool leader() const { return env_.rank == 0; }
  const DistEnv& env() const { return env_; }
  const std::string& backend() const { return backend_; }
  const std::vector<RankInfo>& ranks() const { return ranks_; }
  std::chrono::milliseconds timeout() const { return timeout_; }

  // In place, over every rank (contiguous tensors on this rank's device).
  void sum(std::vector<torch::Tensor>& tensors);
  std::vector<double> sum(const std::vector<double>& values);
  int64_t max(int64_t value);
  // Rank 0's values into every rank's tensors.
  void broadcast(std::vector<torch::Tensor>& tensors);
  // `all` holds world slots of n elements, rank r's part in slot r: afterwards every rank has every
  // slot (in place, no world-sized temporary).
  void all_gather_in_place(torch::Tensor& all, int64_t n);
  // Every rank's `mine` (same size on each) into rank 0's `all` (world × that size, rank order);
  // the other ranks pass no `all` and allocate nothing.
  void gather_to_leader(const torch::Tensor& mine, torch::Tensor* all);

  // Rank 0 posts a message under `key`; the others wait for it (the job's timeout). With `last`
  // (rank 0 is about to exit: it hosts the store), rank 0 waits until every rank has read it.
  void post(const std::string& key, const std::string& message, bool last = false);
  std::string await(const std::string& key);

 private:
  ProcessGroup() = default;
  [[noreturn]] void lost(const std::exception& cause) const;
  // Every rank counts itself in under `key`; rank 0 returns once all have (or the timeout passed).
  void wait_for_all(const std::string& key);

  DistEnv env_;
  std::string backend_;
  std::chrono::milliseconds timeout_{0};
  std::vector<RankInfo> ranks_;
  struct C10d;  // the store and the c10d group (process_group.cpp)
  std::unique_ptr<C10d> c10d_;
};

// The per-update seed of rank `rank`'s dropout stream in a data-parallel job: every rank draws its
// own masks, and a resumed job draws the same ones again (no generator state to carry).
uint64_t rank_stream_seed(uint64_t seed, int rank, int64_t update);

}  // namespace normlab
