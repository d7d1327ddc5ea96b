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
  wake_.fetch_add(1, std::memory_order_seq_cst);
  {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  for (auto& t : workers_) t.join();
}

// Claims and runs tasks until the job in the claim word is exhausted.
void ThreadPool::work(int thread) {
  for (;;) {
    const uint64_t c = claim_.fetch_add(1, std::memory_order_acq_rel);
    const uint64_t task = c & kMask, n = (c >> kBits) & kMask;
    if (task >= n) return;
    call_(ctx_, int64_t(task), thread);
    done_.fetch_add(1, std::memory_order_release);
  }
}

void ThreadPool::run_impl(int64_t n, Call call, void* ctx) {
  if (n <= 0) return;
  if (workers_.empty() || n == 1) {
    for (int64_t i = 0; i < n; ++i) call(ctx, i, 0);
    return;
  }
  if (n > kMaxTasks) {  // never in practice; keep the claim word's fields apart
    struct Shifted {
      Call call;
      void* ctx;
      int64_t base;
    };
    for (int64_t b = 0; b < n; b += kMaxTasks) {
      Shifted sh{call, ctx, b};
      run_impl(std::min<int64_t>(kMaxTasks, n - b),
               [](void* c, int64_t t, int th) {
                 auto* s = static_cast<Shifted*>(c);
                 s->call(s->ctx, s->base + t, th);
               },
               &sh);
    }
    return;
  }
  call_ = call;
  ctx_ = ctx;
  job_ = (job_ + 1) & ((uint64_t(1) << (64 - 2 * kBits)) - 1);
  done_.store(0, std::memory_order_relaxed);
  claim_.store((job_ << (2 * kBits)) | (uint64_t(n) << kBits), std::memory_order_release);
  wake_.fetch_add(1, std::memory_order_seq_cst);
  if (sleepers_.load(std::memory_order_seq_cst) > 0) {
    std::lock_guard<std::mutex> lock(mu_);
    cv_.notify_all();
  }
  work(0);
  // Wait for tasks other threads still run. Spin first (they finish within
  // microseconds); yield after a while so an oversubscribed machine can run them.
  for (int spins = 0; done_.load(std::memory_order_acquire) < n; ++spins) {
    if (spins < 4096) MUSE_CPU_RELAX();
    else std::this_thread::yield();
  }
}

void ThreadPool::worker_loop(int thread) {
  // wake_ was 0 when this thread was created; a worker that starts late
  // must still notice every bump since (the destructor's included).
  uint32_t seen = 0;
  for (;;) {
    uint32_t w = wake_.load(std::memory_order_acquire);
    if (w == seen) {
      auto start = std::chrono::steady_clock::now();
      int spins = 0;
      while ((w = wake_.load(std::memory_order_acquire)) == seen) {
        MUSE_CPU_RELAX();
        if (++spins % 64 == 0 && std::chrono::steady_clock::now() - start > kSpin) {
          std::unique_lock<std::mutex> lock(mu_);
          sleepers_.fetch_add(1, std::memory_order_seq_cst);
          // The predicate reads wake_ after announcing ourselves; the caller
          // reads sleepers_ after bumping wake_: one of us sees the other.
          cv_.wait(lock, [&] { return wake_.load(std::memory_order_seq_cst) != seen; });
          sleepers_.fetch_sub(1, std::memory_order_relaxed);
          start = std::chrono::steady_clock::now();
        }
      }
    }
    seen = w;
    if (stop_.load(std::memory_order_relaxed)) return;
    work(thread);
  }
}

}  // namespace muse::cpu
