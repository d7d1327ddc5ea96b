// N ranks as threads of one process: the in-process communicator (same
// interface as NCCL) and the runner that drives one function per rank
// concurrently. Ranks meet at a barrier in each collective; every rank
// reads all ranks' buffers directly (host memory), so a collective is a
// barrier, a copy or a fixed-order sum, and a barrier.
#pragma once

#include <condition_variable>
#include <memory>
#include <mutex>
#include <thread>
#include <vector>

#include "muse/parallel/communicator.h"

namespace muse {

// Marks the error a collective returns once another rank aborted the group.
inline constexpr const char* kAbortedMark = "parallel group aborted";

// The communicators of one group of `ranks` (rank i at index i).
std::vector<std::unique_ptr<Communicator>> make_in_process_group(int ranks);

// Runs fn(rank) for ranks 0..n-1 at once: rank 0 on the calling thread, the
// others on threads kept for the group's life (a step starts no thread and
// allocates nothing). Returns the first error by rank order.
class RankRunner {
 public:
  explicit RankRunner(int ranks);
  ~RankRunner();
  RankRunner(const RankRunner&) = delete;
  RankRunner& operator=(const RankRunner&) = delete;
  int size() const { return n_; }

  template <class F>
  Status run(F& fn) {
    return run_erased([](void* f, int rank) -> Status { return (*static_cast<F*>(f))(rank); }, &fn);
  }

 private:
  Status run_erased(Status (*call)(void*, int), void* fn);
  void worker(int rank);

  int n_;
  std::mutex mu_;
  std::condition_variable cv_;
  uint64_t job_ = 0;        // incremented per run
  int pending_ = 0;         // worker ranks still running the current job
  bool stop_ = false;
  Status (*call_)(void*, int) = nullptr;
  void* fn_ = nullptr;
  std::vector<Status> results_;
  std::vector<std::thread> threads_;
};

}  // namespace muse
