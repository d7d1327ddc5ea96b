#include "muse/backends/cpu/thread_pool.h"

#include <sched.h>

#include <chrono>

#if defined(__x86_64__)
#include <immintrin.h>
#define MUSE_CPU_RELAX() _mm_pause()
#else
#define MUSE_CPU_RELAX() ((void)0)
#endif

namespace muse::cpu {
namespace {
// How long an idle worker spins before sleeping. Long enough to bridge the
// gap between two operations of one step, short enough not to burn a core
// between requests.
constexpr auto kSpin = std::chrono::microseconds(200);
}  // namespace

int available_cpus() {
  cpu_set_t set;
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  unsigned n = std::thread::hardware_concurrency();
  return n ? int(n) : 1;
}

ThreadPool::ThreadPool(int threads) {
  if (threads < 1) threads = 1;
  workers_.reserve(size_t(threads - 1));
  for (int i = 1; i < threads; ++i) workers_.emplace_back([this, i] { worker_loop(i); });
}

ThreadPool::~ThreadPool() {
  stop_.store(true, std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  generation_.notify_all();
  for (auto& t : workers_) t.join();
}

void ThreadPool::work(int thread) {
  const int64_t n = num_tasks_;
  for (;;) {
    int64_t task = next_task_.fetch_add(1, std::memory_order_relaxed);
    if (task >= n) break;
    call_(ctx_, task, thread);
  }
}

void ThreadPool::run_impl(int64_t n, Call call, void* ctx) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) call(ctx, i, 0);
    return;
  }
  call_ = call;
  ctx_ = ctx;
  num_tasks_ = n;
  next_task_.store(0, std::memory_order_relaxed);
  pending_.store(int(workers_.size()), std::memory_order_relaxed);
  generation_.fetch_add(1, std::memory_order_release);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) generation_.notify_all();
  work(0);
  // Wait for the stragglers. Spin first (they are usually microseconds
  // behind); yield after a while so an oversubscribed machine can run them.
  for (int spins = 0; pending_.load(std::memory_order_acquire) != 0; ++spins) {
    if (spins < 4096) MUSE_CPU_RELAX();
    else std::this_thread::yield();
  }
}

void ThreadPool::worker_loop(int thread) {
  uint32_t seen = 0;
  for (;;) {
    uint32_t g = generation_.load(std::memory_order_acquire);
    if (g == seen) {
      auto start = std::chrono::steady_clock::now();
      int spins = 0;
      while ((g = generation_.load(std::memory_order_acquire)) == seen) {
        MUSE_CPU_RELAX();
        if (++spins % 256 == 0) std::this_thread::yield();  // let a preempted caller run
        if (spins % 64 == 0 && std::chrono::steady_clock::now() - start > kSpin) {
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          // Re-check after announcing ourselves: the caller reads sleepers_
          // after bumping generation_, so one of us sees the other.
          if (generation_.load(std::memory_order_seq_cst) == seen) generation_.wait(seen, std::memory_order_acquire);
          sleepers_.fetch_sub(1, std::memory_order_relaxed);
          start = std::chrono::steady_clock::now();
        }
      }
    }
    seen = g;
    if (stop_.load(std::memory_order_relaxed)) return;
    work(thread);
    pending_.fetch_sub(1, std::memory_order_acq_rel);
  }
}

}  // namespace muse::cpu
