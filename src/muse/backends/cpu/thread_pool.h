// A fork-join thread pool tuned for decode, where a token is a few hundred
// small operations of tens of microseconds each: the caller runs tasks too,
// idle workers spin briefly on a generation counter before sleeping (so the
// next operation starts in well under a microsecond), and tasks are claimed
// from an atomic counter. Which thread runs a task never changes a result:
// every kernel gives each output element to exactly one task.
#pragma once

#include <atomic>
#include <cstdint>
#include <thread>
#include <vector>

namespace muse::cpu {

class ThreadPool {
 public:
  // `threads` in total, the calling thread included (>= 1).
  explicit ThreadPool(int threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int size() const { return int(workers_.size()) + 1; }

  // Runs fn(task, thread) for every task in [0, n) and returns when all are
  // done. `thread` is in [0, size()), for per-thread scratch.
  template <class F>
  void run(int64_t n, F&& fn) {
    run_impl(n, [](void* ctx, int64_t task, int thread) { (*static_cast<F*>(ctx))(task, thread); }, &fn);
  }

 private:
  using Call = void (*)(void*, int64_t, int);
  void run_impl(int64_t n, Call call, void* ctx);
  void worker_loop(int thread);
  void work(int thread);

  std::vector<std::thread> workers_;
  // The current job. Written by the caller before bumping generation_.
  Call call_ = nullptr;
  void* ctx_ = nullptr;
  int64_t num_tasks_ = 0;
  alignas(64) std::atomic<int64_t> next_task_{0};
  alignas(64) std::atomic<uint32_t> generation_{0};
  alignas(64) std::atomic<int> pending_{0};   // workers still in the current job
  alignas(64) std::atomic<int> sleepers_{0};  // workers blocked in generation_.wait
  std::atomic<bool> stop_{false};
};

// Number of hardware threads available to this process (affinity aware).
int available_cpus();

}  // namespace muse::cpu
