// The fork-join pool: every task runs exactly once, jobs back to back,
// pools created and destroyed at once (a worker starting after the
// destructor began must still exit), more threads than cores.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "muse/backends/cpu/thread_pool.h"

namespace muse::cpu {
namespace {

TEST(ThreadPool, EveryTaskRunsExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {1, 2, 3, 7, 64, 1000, 5000}) {
    for (int rep = 0; rep < 20; ++rep) {
      std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
      std::atomic<int> bad_thread{0};
      pool.run(n, [&](int64_t t, int thread) {
        hits[size_t(t)].fetch_add(1);
        if (thread < 0 || thread >= pool.size()) bad_thread = 1;
      });
      for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " task " << i;
      EXPECT_EQ(bad_thread.load(), 0);
    }
  }
}

TEST(ThreadPool, CreateAndDestroyImmediately) {
  for (int i = 0; i < 200; ++i) {
    ThreadPool pool(3);
    if (i % 2) pool.run(5, [](int64_t, int) {});
  }
  SUCCEED();
}

TEST(ThreadPool, IdleWorkersSleepAndWake) {
  ThreadPool pool(3);
  std::atomic<int64_t> sum{0};
  for (int i = 0; i < 3; ++i) {
    pool.run(100, [&](int64_t t, int) { sum += t; });
    std::this_thread::sleep_for(std::chrono::milliseconds(2));  // past the spin window: workers sleep
  }
  EXPECT_EQ(sum.load(), 3 * 4950);
}

}  // namespace
}  // namespace muse::cpu
