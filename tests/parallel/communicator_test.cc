// The in-process communicator and rank runner (parallel/in_process.h), and
// the CPU backend's collective ops over them: N ranks as threads.
#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "muse/backends/cpu/cpu_backend.h"
#include "muse/parallel/in_process.h"

namespace muse {
namespace {

TEST(InProcess, AllReduceIsTheRankOrderSumOnEveryRank) {
  for (int n : {1, 2, 3, 4}) {
    auto comms = make_in_process_group(n);
    RankRunner runner(n);
    std::vector<std::vector<float>> data(static_cast<size_t>(n));
    for (int r = 0; r < n; ++r)
      for (int i = 0; i < 1000; ++i) data[size_t(r)].push_back(1.0f / float(1 + r + i) * (i % 2 ? 1e4f : 1e-4f));
    std::vector<float> want(1000);
    for (int i = 0; i < 1000; ++i) {
      float acc = data[0][size_t(i)];
      for (int r = 1; r < n; ++r) acc += data[size_t(r)][size_t(i)];
      want[size_t(i)] = acc;
    }
    auto fn = [&](int r) { return comms[size_t(r)]->all_reduce_sum(data[size_t(r)].data(), 1000, DType::F32, nullptr); };
    ASSERT_TRUE(runner.run(fn).ok());
    for (int r = 0; r < n; ++r) EXPECT_EQ(data[size_t(r)], want) << "rank " << r << " of " << n;  // bitwise
    if (n > 1) EXPECT_EQ(comms[0]->traffic().all_reduce, uint64_t(2 * 4000 * (n - 1) / n));
  }
}

TEST(InProcess, AllGatherAndAllToAll) {
  const int n = 3, count = 5;
  auto comms = make_in_process_group(n);
  RankRunner runner(n);
  std::vector<std::vector<int32_t>> send(n), gathered(n, std::vector<int32_t>(n * count)),
      exchanged(n, std::vector<int32_t>(n * count));
  for (int r = 0; r < n; ++r)
    for (int i = 0; i < n * count; ++i) send[size_t(r)].push_back(100 * r + i);
  auto fn = [&](int r) -> Status {
    MUSE_RETURN_IF_ERROR(comms[size_t(r)]->all_gather(send[size_t(r)].data(), gathered[size_t(r)].data(), count,
                                                      DType::I32, nullptr));
    return comms[size_t(r)]->all_to_all(send[size_t(r)].data(), exchanged[size_t(r)].data(), count, DType::I32,
                                        nullptr);
  };
  ASSERT_TRUE(runner.run(fn).ok());
  for (int r = 0; r < n; ++r)
    for (int s = 0; s < n; ++s)
      for (int i = 0; i < count; ++i) {
        // all_gather: block s = rank s's first `count` values.
        EXPECT_EQ(gathered[size_t(r)][size_t(s * count + i)], 100 * s + i);
        // all_to_all: block s of rank r = block r of rank s's send.
        EXPECT_EQ(exchanged[size_t(r)][size_t(s * count + i)], 100 * s + r * count + i);
      }
  EXPECT_EQ(comms[1]->traffic().all_to_all, uint64_t(count * 4 * (n - 1)));
}

TEST(InProcess, AbortWakesTheOthersAndTheRunnerReportsTheFirstError) {
  auto comms = make_in_process_group(3);
  RankRunner runner(3);
  std::vector<float> x(4, 1.0f);
  auto fn = [&](int r) -> Status {
    if (r == 1) {
      comms[1]->abort();
      return make_error("rank 1 failed");
    }
    return comms[size_t(r)]->all_reduce_sum(x.data(), 0, DType::F32, nullptr);
  };
  Status s = runner.run(fn);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("aborted"), std::string::npos) << s.message();  // rank 0's error comes first
}

TEST(InProcess, CpuBackendCollectiveOpsRunInStepOrder) {
  const int n = 2;
  auto comms = make_in_process_group(n);
  RankRunner runner(n);
  std::vector<std::unique_ptr<Backend>> b;
  for (int r = 0; r < n; ++r) {
    CpuBackendOptions o;
    o.threads = 1;
    auto made = create_cpu_backend(o);
    ASSERT_TRUE(made.ok());
    b.push_back(std::move(made).value());
  }
  std::vector<std::vector<float>> out(n, std::vector<float>(2 * 3));
  auto fn = [&](int r) -> Status {
    Backend& be = *b[size_t(r)];
    MUSE_ASSIGN_OR_RETURN(Tensor x, be.alloc(DType::F32, {3}));
    MUSE_ASSIGN_OR_RETURN(Tensor g, be.alloc(DType::F32, {2 * 3}));
    const float v[3] = {float(r + 1), 2.0f * float(r + 1), 0.5f};
    be.set_input(x, v, sizeof v);
    be.all_reduce_sum(x, *comms[size_t(r)]);  // {3, 6, 1} on both
    be.softcap(x, 2.0f, 0.0f);                // runs after the sum: {6, 12, 2}
    be.all_gather(g, x, *comms[size_t(r)]);
    MUSE_RETURN_IF_ERROR(be.execute());
    return be.download(g, out[size_t(r)].data());
  };
  ASSERT_TRUE(runner.run(fn).ok());
  const std::vector<float> want = {6, 12, 2, 6, 12, 2};
  for (int r = 0; r < n; ++r) EXPECT_EQ(out[size_t(r)], want);
}

}  // namespace
}  // namespace muse
