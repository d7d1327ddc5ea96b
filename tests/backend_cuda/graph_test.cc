// Recorded regions (Backend::begin_graph) on the CUDA backend: a key's
// second step is captured into a CUDA graph and later steps replay it. The
// replayed steps must give the bits of the same ops launched one by one, a
// step that breaks the key's promise must fail rather than return the
// recording's results, and a region a graph cannot hold runs eagerly.
// The whole-model form is in tests/model_cuda (CudaModel.GraphsGiveTheEagerBits).
#include "cuda_test_util.h"

namespace muse {
namespace {

using cuda_testing::backend_with;
using cuda_testing::CudaTest;
using cuda_testing::random_floats;

class Graphs : public CudaTest {
 protected:
  static constexpr int64_t kRows = 5, kCols = 96;
  // A step: new input rows uploaded, then (inside the region) a norm and a
  // softcap of them; `full` = false leaves the softcap out.
  Status step(Backend& be, const Tensor& in, const Tensor& out, const Tensor& gain, int salt, uint64_t key,
              bool full = true, bool upload_inside = false) {
    std::vector<float> x = muse::testing::random_floats(size_t(kRows * kCols), uint32_t(100 + salt), 1.5f);
    if (!upload_inside) be.set_input(in, x.data(), x.size() * sizeof(float));
    be.begin_graph(key);
    if (upload_inside) be.set_input(in, x.data(), x.size() * sizeof(float));
    be.rms_norm(out, in, gain, NormGain::After, 1e-6f);
    if (full) be.softcap(out, 1.3f, 2.0f);
    be.end_graph();
    return be.execute();
  }
  struct Buffers {
    Tensor in, out, gain;
  };
  Buffers buffers(Backend& be) {
    Buffers t;
    t.in = *be.alloc(DType::F32, {kRows, kCols});
    t.out = *be.alloc(DType::BF16, {kRows, kCols});
    std::vector<float> g = muse::testing::random_floats(size_t(kCols), 7u, 1.0f);
    t.gain = *be.import_weight(DType::F32, {kCols}, g.data(), false);
    return t;
  }
  // Step `salt` on this backend (graphs on, `upload_inside` as given) and
  // on `ref` (graphs off): the same output bits.
  void expect_same_step(Backend& ref, const Buffers& g, const Buffers& e, int salt, uint64_t key,
                        bool upload_inside = false) {
    ASSERT_TRUE(step(b(), g.in, g.out, g.gain, salt, key, true, upload_inside).ok());
    ASSERT_TRUE(step(ref, e.in, e.out, e.gain, salt, key).ok());
    std::vector<uint16_t> got(size_t(kRows * kCols)), want(got.size());
    ASSERT_TRUE(b().download(g.out, got.data()).ok());
    ASSERT_TRUE(ref.download(e.out, want.data()).ok());
    EXPECT_EQ(got, want) << "step " << salt;
  }
  std::unique_ptr<Backend> eager() {
    CudaBackendOptions o;
    o.graphs = false;
    auto r = create_cuda_backend(o);
    EXPECT_TRUE(r.ok()) << r.message();
    return r.ok() ? std::move(r).value() : nullptr;
  }
};

TEST_F(Graphs, ReplayedStepsGiveTheEagerBits) {
  auto ref = eager();
  ASSERT_TRUE(ref);
  const Buffers g = buffers(b()), e = buffers(*ref);
  for (int s = 0; s < 6; ++s) {
    expect_same_step(*ref, g, e, s, 42);
  }
  const Backend::GraphStats st = b().graph_stats();
  EXPECT_EQ(st.captured, 1) << "the key's second step is recorded";
  EXPECT_EQ(st.replayed, 4) << "and the four after it replay it";
  EXPECT_EQ(st.live, 1);
  EXPECT_EQ(ref->graph_stats().captured, 0) << "graphs off: nothing recorded";
}

TEST_F(Graphs, AStepThatBreaksTheKeysPromiseFails) {
  const Buffers g = buffers(b());
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(step(b(), g.in, g.out, g.gain, s, 7).ok());
  ASSERT_EQ(b().graph_stats().replayed, 1);
  // The same key, one op fewer: the replay has already run the softcap.
  Status bad = step(b(), g.in, g.out, g.gain, 3, 7, /*full=*/false);
  ASSERT_FALSE(bad.ok()) << "a replay of other ops than the recording must fail the step";
  EXPECT_NE(bad.message().find("graph replay"), std::string::npos) << bad.message();
  EXPECT_EQ(b().graph_stats().live, 0) << "the recording is dropped";
  // The backend goes on: the key starts again (eager, then recorded).
  auto ref = eager();
  ASSERT_TRUE(ref);
  const Buffers e = buffers(*ref);
  for (int s = 4; s < 8; ++s) {
    expect_same_step(*ref, g, e, s, 7);
  }
  EXPECT_EQ(b().graph_stats().captured, 2);
}

TEST_F(Graphs, ARegionWithAnUploadRunsEagerly) {
  auto ref = eager();
  ASSERT_TRUE(ref);
  const Buffers g = buffers(b()), e = buffers(*ref);
  for (int s = 0; s < 4; ++s) {
    expect_same_step(*ref, g, e, s, 9, /*upload_inside=*/true);
  }
  EXPECT_EQ(b().graph_stats().captured, 0) << "set_input cannot be inside a recording";
}

// Steps of one key whose uploads before the region differ in number (the
// model's padding-token upload) get separate recordings: a recording bakes
// in its ops' indices, which device errors are reported by.
TEST_F(Graphs, OpsBeforeTheRegionAreInTheKey) {
  auto ref = eager();
  ASSERT_TRUE(ref);
  const Buffers g = buffers(b()), e = buffers(*ref);
  Tensor extra = *b().alloc(DType::I32, {4});
  const int32_t four[4] = {1, 2, 3, 4};
  for (int s = 0; s < 8; ++s) {
    if (s % 2) b().set_input(extra, four, sizeof(four));  // one more op before the region
    expect_same_step(*ref, g, e, s, 5);
  }
  const Backend::GraphStats st = b().graph_stats();
  EXPECT_EQ(st.captured, 2) << "one recording for each number of ops before the region";
  EXPECT_EQ(st.replayed, 4);
}

TEST_F(Graphs, ProfilingRunsEagerly) {
  const Buffers g = buffers(b());
  b().set_profiling(true);
  for (int s = 0; s < 3; ++s) ASSERT_TRUE(step(b(), g.in, g.out, g.gain, s, 11).ok());
  b().set_profiling(false);
  EXPECT_EQ(b().graph_stats().captured, 0) << "a profiled step times each op: no graph";
  EXPECT_NE(b().profile_report().find("softcap"), std::string::npos);
}

// A timing probe (CudaBackendOptions::skip_ops) records its steps without
// the skipped ops: the replays give the bits of the eager steps that skip
// them too (here: the norm alone, no softcap).
TEST_F(Graphs, SkipProbesAreRecordedWithoutTheSkippedOps) {
  CudaBackendOptions probe;
  probe.skip_ops = {"softcap"};
  auto pb = backend_with(probe);
  ASSERT_TRUE(pb);
  auto ref = eager();
  ASSERT_TRUE(ref);
  const Buffers g = buffers(*pb), e = buffers(*ref);
  for (int s = 0; s < 5; ++s) {
    ASSERT_TRUE(step(*pb, g.in, g.out, g.gain, s, 13).ok());
    ASSERT_TRUE(step(*ref, e.in, e.out, e.gain, s, 13, /*full=*/false).ok());
    std::vector<uint16_t> got(size_t(kRows * kCols)), want(got.size());
    ASSERT_TRUE(pb->download(g.out, got.data()).ok());
    ASSERT_TRUE(ref->download(e.out, want.data()).ok());
    EXPECT_EQ(got, want) << "step " << s << ": the probe ran the softcap it skips";
  }
  EXPECT_EQ(pb->graph_stats().captured, 1) << "the probe's steps are recorded";
  EXPECT_EQ(pb->graph_stats().replayed, 3);
}

// Side branches (Backend::begin_side) on a second stream give the bits of
// the same ops in order on one stream (side_stream off, graphs off), eager
// and recorded: a branch forked from the main ops so far, one whose op needs
// the scratch (it runs in order, after a join), a branch that reads what a
// main op wrote after an earlier branch that was never joined, an op after
// join_side() that reads a branch's output, and a branch left open at
// execute(). F32 x: the fp32 weights' warp dot takes no scratch, BF16
// weights the split products, which do.
class SideBranches : public CudaTest {
 protected:
  static constexpr int64_t kRows = 5, kK = 96, kA = 24, kD = 40;
  struct Step {
    Tensor x, gain, wf, wb, wf2, h, a, c, d, e, f, g;
  };
  Step make(Backend& be) {
    Step t;
    t.x = *be.alloc(DType::F32, {kRows, kK});
    auto w = [&](DType dt, int64_t n, int64_t k, uint32_t seed) {
      std::vector<float> v = random_floats(size_t(n * k), seed, 0.2f);
      if (dt == DType::F32) return *be.import_weight(dt, {n, k}, v.data(), false);
      const std::vector<uint16_t> b = muse::testing::to_bf16(v);
      return *be.import_weight(dt, {n, k}, b.data(), false);
    };
    std::vector<float> g = random_floats(size_t(kK), 3u, 1.0f);
    t.gain = *be.import_weight(DType::F32, {kK}, g.data(), false);
    t.wf = w(DType::F32, kA, kK, 11u), t.wb = w(DType::BF16, kD, kK, 12u), t.wf2 = w(DType::F32, kA, kD, 13u);
    t.h = *be.alloc(DType::F32, {kRows, kK});
    for (Tensor* o : {&t.a, &t.e, &t.g}) *o = *be.alloc(DType::F32, {kRows, kA});
    for (Tensor* o : {&t.c, &t.d}) *o = *be.alloc(DType::F32, {kRows, kD});
    t.f = *be.alloc(DType::F32, {kRows, kK});
    return t;
  }
  static Status run(Backend& be, const Step& t, int salt, uint64_t key) {
    std::vector<float> x = random_floats(size_t(kRows * kK), uint32_t(200 + salt), 1.5f);
    be.set_input(t.x, x.data(), x.size() * sizeof(float));
    be.begin_graph(key);
    be.rms_norm(t.h, t.x, t.gain, NormGain::After, 1e-6f);
    be.begin_side();
    be.matmul(t.a, t.h, t.wf);
    be.softcap(t.a, 1.0f, 3.0f);
    be.matmul(t.c, t.h, t.wb);  // scratch: in order from here
    be.end_side();
    be.matmul(t.d, t.h, t.wb);
    be.begin_side();
    be.matmul(t.g, t.h, t.wf);
    be.end_side();
    be.rms_norm(t.f, t.h, t.gain, NormGain::After, 1e-5f);
    be.begin_side();  // the branch before is still open: this one also waits for d
    be.matmul(t.e, t.d, t.wf2);
    be.end_side();
    be.join_side();
    be.softcap(t.e, 0.7f, 2.0f);  // after the join: reads the branch's e
    be.end_graph();
    be.begin_side();  // open at execute()
    be.softcap(t.g, 1.1f, 4.0f);
    be.end_side();
    return be.execute();
  }
  static std::vector<float> down(Backend& be, const Tensor& t) {
    std::vector<float> v(size_t(t.numel()));
    EXPECT_TRUE(be.download(t, v.data()).ok());
    return v;
  }
};

TEST_F(SideBranches, GiveTheBitsOfOneStream) {
  CudaBackendOptions one;
  one.side_stream = false;
  one.graphs = false;
  auto ref = backend_with(one);
  ASSERT_TRUE(ref);
  const Step s = make(b()), r = make(*ref);
  for (int k = 0; k < 5; ++k) {
    ASSERT_TRUE(run(b(), s, k, 77).ok()) << "step " << k;
    ASSERT_TRUE(run(*ref, r, k, 77).ok()) << "step " << k;
    const char* names = "acdefg";
    int i = 0;
    for (auto [got, want] : {std::pair{s.a, r.a}, {s.c, r.c}, {s.d, r.d}, {s.e, r.e}, {s.f, r.f}, {s.g, r.g}}) {
      const std::vector<float> g = down(b(), got), w = down(*ref, want);
      EXPECT_EQ(0, std::memcmp(g.data(), w.data(), g.size() * sizeof(float)))
          << "step " << k << ", output " << names[i] << ": the side stream's bits differ from one stream's";
      ++i;
    }
  }
  EXPECT_GE(b().graph_stats().replayed, 3) << "the region with its branches was recorded and replayed";
}

}  // namespace
}  // namespace muse
