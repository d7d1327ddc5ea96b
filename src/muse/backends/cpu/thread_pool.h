// A fork-join thread pool tuned for decode, where a token is a few hundred
// small operations of tens of microseconds each: the caller runs tasks too,
// idle workers spin briefly before sleeping (so the next operation starts in
// well under a microsecond), and tasks are claimed from one atomic word that
// also carries the job's generation and size. The caller waits for its tasks
// to *complete*, not for every worker to check in, so a worker the OS has
// descheduled never stalls a step (it joins whatever job is current when it
// runs again). Which thread runs a task never changes a result: every kernel
// gives each output element to exactly one task.
#pragma once

#include <atomic>
#include <condition_variable>
#include <mutex>
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

  // Claim word: [generation:20][tasks:22][next task:22]. Workers fetch_add
  // it; the returned value says which job and task they got.
  static constexpr int kBits = 22;
  static constexpr uint64_t kMask = (uint64_t(1) << kBits) - 1;
  static constexpr int64_t kMaxTasks = int64_t(kMask) - 4096;  // headroom for overshoot

  std::vector<std::thread> workers_;
  // The current job; written before the claim word is published, and never
  // rewritten while one of its tasks is unfinished.
  Call call_ = nullptr;
  void* ctx_ = nullptr;
  uint64_t job_ = 0;  // generation of the current job
  alignas(64) std::atomic<uint64_t> claim_{0};
  alignas(64) std::atomic<int64_t> done_{0};     // tasks of the current job completed
  alignas(64) std::atomic<uint32_t> wake_{0};    // bumped per job; idle workers wait on it
  alignas(64) std::atomic<int> sleepers_{0};     // workers asleep on cv_
  std::atomic<bool> stop_{false};
  // The sleep path (a condition variable, not atomic::wait: libstdc++ 12's
  // atomic wait/notify can lose wakeups).
  std::mutex mu_;
  std::condition_variable cv_;
};

// Number of hardware threads available to this process (affinity aware).
int available_cpus();

}  // namespace muse::cpu
