// Timings of the decode-shaped ops (DISABLED_: run them with
// --gtest_also_run_disabled_tests --gtest_filter='*Timing*'). Not a
// benchmark (issue 12 owns that): wall time of many ops in one execute(),
// and the weight/KV bytes they must read, against ~4.4 TB/s of HBM.
#include <algorithm>
#include <chrono>

#include "cuda_test_util.h"
#include "muse/backends/cuda/cuda_bench.h"
#include "muse/backends/step_plan.h"

namespace muse::cuda_testing {
namespace {

// A cheap non-zero pattern for large timing inputs (random draws of ~10^9
// values would take longer than the timings).
std::vector<float> pattern(size_t n, uint32_t seed, float scale = 1.0f, float offset = 0.0f) {
  std::vector<float> v(n);
  uint32_t x = seed * 2654435761u + 1;
  for (auto& f : v) {
    x = x * 1664525u + 1013904223u;
    f = offset + scale * (float(int32_t(x >> 8) % 2001 - 1000) + 0.5f) * 1e-3f;
  }
  return v;
}

class Timing : public CudaTest {
 public:
  // Seconds per op: `reps` enqueues of `op` in one step, after a warm-up step.
  template <class F>
  double time_op(F&& op, int reps = 20) {
    op();
    run();
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) op();
    run();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  }
  static void line(const std::string& what, double s, double bytes) {
    std::printf("%-48s %9.1f us  %7.1f GB/s\n", what.c_str(), s * 1e6, bytes / s * 1e-9);
  }
};

TEST_F(Timing, DISABLED_DecodeShapes) {
  for (int64_t T : {1, 8, 64, 512}) {
    const int64_t N = 4096, K = 4096;
    auto w = pattern(static_cast<size_t>(N * K), 1, 0.02f), x = pattern(static_cast<size_t>(T * K), 2);
    Tensor tw = up(DType::BF16, {N, K}, w), tx = up(DType::BF16, {T, K}, x);
    Tensor out = poisoned(DType::BF16, {T, N});
    const double s = time_op([&] { b().matmul(out, tx, tw); });
    line("project bf16 4096x4096, T " + std::to_string(T), s, double(N * K * 2));
    b().release(tw);
  }
  {
    const int64_t N = 32768, K = 4096;  // a head-sized product
    auto w = pattern(static_cast<size_t>(N * K), 3, 0.02f), x = pattern(static_cast<size_t>(K), 4);
    Tensor tw = up(DType::BF16, {N, K}, w), tx = up(DType::BF16, {1, K}, x);
    Tensor out = poisoned(DType::F32, {1, N});
    const double s = time_op([&] { b().matmul(out, tx, tw); });
    line("project bf16 32768x4096 -> f32, T 1", s, double(N * K * 2));
  }
  for (int64_t B : {1, 64}) {
    const int64_t d = 128, hq = 32, hk = 8, kvd = hk * d, ctx = 4096, bs = 64, nb = ctx / bs + 1;
    KvLayerStorage cache;
    cache.layout = KvLayout::Paged;
    auto kvals = pattern(static_cast<size_t>(B * nb * bs * kvd), 12);
    cache.k = up(DType::BF16, {B * nb, 1, bs, kvd}, kvals);
    cache.v = up(DType::BF16, {B * nb, 1, bs, kvd}, kvals);
    StepPlanBuilder pb(StepPlanCapacity{B, B, B, B * nb});
    for (int64_t s = 0; s < B; ++s) {
      std::vector<int32_t> blocks;
      for (int64_t i = 0; i < nb; ++i) blocks.push_back(int32_t(s * nb + i));
      std::vector<int32_t> tok = {1};
      pb.add(tok, ctx, blocks, {}, 0, false, true);
    }
    Tensor buf = *b().alloc(DType::I32, {pb.layout().total});
    b().set_input(buf, pb.data(), pb.upload_bytes());
    StepPlanView view;
    view.buffer = buf, view.layout = pb.layout(), view.block_size = bs;
    auto q = pattern(static_cast<size_t>(B * hq * d), 5), k = pattern(static_cast<size_t>(B * kvd), 6);
    Tensor tq = up(DType::BF16, {B, hq * d}, q), tk = up(DType::BF16, {B, kvd}, k);
    Tensor out = poisoned(DType::BF16, {B, hq * d});
    const double s = time_op([&] { b().attention(out, tq, tk, tk, cache, view, d, 0, 0.088f); });
    line("attention decode 32/8x128, ctx 4096, batch " + std::to_string(B), s, double(B * ctx * kvd * 2 * 2));
  }
  {
    const int64_t E = 64, Kk = 8, Hm = 2048, I = 1024;
    auto gu = pattern(static_cast<size_t>(E * 2 * I * Hm), 7, 0.02f), dn = pattern(static_cast<size_t>(E * Hm * I), 8, 0.02f);
    auto gain = pattern(static_cast<size_t>(Hm), 9, 0.1f, 1.0f), u = pattern(static_cast<size_t>(Hm), 10), w = pattern(8, 11);
    Tensor tgu = up(DType::BF16, {E, 2 * I, Hm}, gu), tdn = up(DType::BF16, {E, Hm, I}, dn);
    Tensor tg = up(DType::F32, {Hm}, gain), tu = up(DType::BF16, {1, Hm}, u), tw = up(DType::F32, {1, Kk}, w);
    Tensor ids = up_i32({1, Kk}, {3, 9, 17, 22, 40, 41, 57, 63});
    Tensor out = poisoned(DType::BF16, {1, Hm});
    const double s = time_op([&] { b().moe_experts(out, tu, tgu, tdn, tg, ids, tw, 1e-6f); });
    line("moe_experts decode 8 of 64 experts 3x2048x1024", s, double(Kk * 3 * Hm * I * 2));
  }
}

// The decode products of Muse Glimmer 30B (BF16 weights and activations,
// weights made on the GPU), T = 1, 4, 16, 64 rows, against a streaming HBM
// read measured in the same run. (The before/after figures in bench/NOTES.md
// came from a build that could switch kernels; that switch is gone: muse has
// no environment switches.)
TEST_F(Timing, DISABLED_DecodeProducts) {
  auto ceil = measure_gpu_ceilings(uint64_t(4) << 30, 2048, 5);
  ASSERT_TRUE(ceil.ok()) << ceil.message();
  const double hbm = ceil->hbm_read_gbps;
  std::printf("HBM streaming read: %.1f GB/s (%s)\n", hbm, ceil->device.c_str());
  struct Shape {
    const char* name;
    int64_t N, K;
  };
  // Glimmer's, then the Spark slice's short ones (the pooler in and out, o),
  // which run on 128-256 ring blocks at one row (pre-expert: 57% of HBM).
  const Shape shapes[] = {{"qkv+gate", 8704, 6656}, {"o", 6656, 4096},       {"gate+up", 39936, 6656},
                          {"down", 6656, 19968},    {"lm_head", 202048, 6656}, {"sp.pre_ex", 4096, 8192},
                          {"sp.post_ex", 8192, 4096}, {"sp.o", 8192, 8192}};
  // Each kernel variant on its own backend (CudaBackendOptions::gemv_variant).
  // (regs, 1, and wide, 5, lost everywhere in the 2026-12-01 runs: not timed.)
  const std::pair<int, const char*> variants[] = {{2, "ring2"},  {3, "ring3"},   {4, "ring4"},
                                                  {6, "ring6"},  {8, "clus3"},   {9, "clus4"},
                                                  {12, "wgmma"}, {13, "wgperm"}, {0, "rule"}};
  std::vector<std::unique_ptr<Backend>> backends;
  for (const auto& [v, name] : variants) {
    backends.push_back(backend_with_product_kernel(v));
    ASSERT_TRUE(backends.back());
  }
  uint64_t seed = 100;
  for (const Shape& sh : shapes) {
    for (size_t vi = 0; vi < backends.size(); ++vi) {
      Backend& be = *backends[vi];
      auto tw = be.alloc(DType::BF16, {sh.N, sh.K});
      ASSERT_TRUE(tw.ok());
      ASSERT_TRUE(be.fill_uniform(*tw, seed + 1, 0.02f, 0.0f).ok());
      for (int64_t T : {1, 4, 16, 32, 64}) {
        auto tx = be.alloc(DType::BF16, {T, sh.K});
        auto out = be.alloc(DType::BF16, {T, sh.N});
        ASSERT_TRUE(tx.ok() && out.ok());
        ASSERT_TRUE(be.fill_uniform(*tx, seed + 2 + uint64_t(T), 1.0f, 0.0f).ok());
        const double bytes = double(sh.N * sh.K * 2);
        const int reps = std::max(5, int(2e9 / bytes));
        be.matmul(*out, *tx, *tw);
        ASSERT_TRUE(be.execute().ok());
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) be.matmul(*out, *tx, *tw);
        ASSERT_TRUE(be.execute().ok());
        const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
        std::printf("project %-5s %-9s %6lldx%-6lld T %2lld %9.1f us %8.1f GB/s %5.1f%% of HBM read\n",
                    variants[vi].second, sh.name, (long long)sh.N, (long long)sh.K, (long long)T, s * 1e6,
                    bytes / s * 1e-9, 100.0 * bytes / s * 1e-9 / hbm);
        be.release(*tx);
        be.release(*out);
      }
      be.release(*tw);
    }
    seed += 100;
  }
}

// The multi-output products of a Glimmer layer as the model calls them (one
// project() with Q, K, V and the gate; one with gate and up), and the Spark
// slice's Q, K, V and gate: chained launches (ring3, clus3) against one
// grouped cluster launch (variant 10) and the rule, T = 1, 4, 16, 64, as a
// share of the HBM read of the same run. (A grouped ring launch, variants 15
// and 16 of 2026-12-04, lost to the rule here and in the whole model:
// bench/NOTES.md 2026-12-05.)
TEST_F(Timing, DISABLED_GroupedProducts) {
  auto ceil = measure_gpu_ceilings(uint64_t(4) << 30, 2048, 5);
  ASSERT_TRUE(ceil.ok()) << ceil.message();
  const double hbm = ceil->hbm_read_gbps;
  std::printf("HBM streaming read: %.1f GB/s (%s)\n", hbm, ceil->device.c_str());
  struct Group {
    const char* name;
    std::vector<int64_t> Ns;
    int64_t K;
  };
  const Group groups[] = {{"q,k,v,gate", {4096, 256, 256, 4096}, 6656},
                          {"gate,up", {19968, 19968}, 6656},
                          {"sp.q,k,v,gate", {8192, 1024, 1024, 8192}, 8192}};
  const std::pair<int, const char*> variants[] = {{3, "ring3"}, {8, "clus3"}, {10, "group"}, {0, "rule"}};
  uint64_t seed = 500;
  for (const auto& [v, vname] : variants) {
    auto bp = backend_with_product_kernel(v);
    ASSERT_TRUE(bp);
    Backend& be = *bp;
    for (const Group& g : groups) {
      std::vector<Tensor> ws;
      double bytes = 0;
      for (int64_t N : g.Ns) {
        auto tw = be.alloc(DType::BF16, {N, g.K});
        ASSERT_TRUE(tw.ok());
        ASSERT_TRUE(be.fill_uniform(*tw, ++seed, 0.02f, 0.0f).ok());
        ws.push_back(*tw);
        bytes += double(N * g.K * 2);
      }
      for (int64_t T : {1, 4, 16, 64}) {
        auto tx = be.alloc(DType::BF16, {T, g.K});
        ASSERT_TRUE(tx.ok());
        ASSERT_TRUE(be.fill_uniform(*tx, ++seed, 1.0f, 0.0f).ok());
        std::vector<Projection> ps;
        for (const Tensor& w : ws) {
          auto out = be.alloc(DType::BF16, {T, w.rows()});
          ASSERT_TRUE(out.ok());
          ps.push_back({w, *out});
        }
        const int reps = std::max(5, int(2e9 / bytes));
        be.project(*tx, ps);
        ASSERT_TRUE(be.execute().ok());
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) be.project(*tx, ps);
        ASSERT_TRUE(be.execute().ok());
        const double sec = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
        std::printf("project %-5s %-10s T %2lld %9.1f us %8.1f GB/s %5.1f%% of HBM read\n", vname, g.name,
                    (long long)T, sec * 1e6, bytes / sec * 1e-9, 100.0 * bytes / sec * 1e-9 / hbm);
        be.release(*tx);
        for (auto& p : ps) be.release(p.out);
      }
      for (auto& w : ws) be.release(w);
    }
  }
}

// The prefill GEMMs (variant 7, mma.sync; variant 11, wgmma: the rule's
// choice above 64 rows on sm_90a), T = 4096 rows of Glimmer's shapes, in
// TFLOP/s and as a fraction of the cuBLASLt bf16 rate measured in the same run.
TEST_F(Timing, DISABLED_PrefillProducts) {
  auto ceil = measure_gpu_ceilings(uint64_t(1) << 30, 8192, 5);
  ASSERT_TRUE(ceil.ok()) << ceil.message();
  std::printf("bf16 GEMM rate: %.1f TFLOP/s (%s)\n", ceil->bf16_tflops, ceil->device.c_str());
  struct Shape {
    const char* name;
    int64_t N, K;
  };
  const Shape shapes[] = {{"qkv+gate", 8704, 6656}, {"o", 6656, 4096}, {"gate", 19968, 6656}, {"down", 6656, 19968}};
  const std::pair<int, const char*> variants[] = {{7, "mma"}, {11, "wgmma"}};
  const int64_t T = 4096;
  for (const auto& [v, vname] : variants) {
    auto bp = backend_with_product_kernel(v);
    ASSERT_TRUE(bp);
    Backend& be = *bp;
    uint64_t seed = 300;
    for (const Shape& sh : shapes) {
      auto tw = be.alloc(DType::BF16, {sh.N, sh.K});
      auto tx = be.alloc(DType::BF16, {T, sh.K});
      auto out = be.alloc(DType::BF16, {T, sh.N});
      ASSERT_TRUE(tw.ok() && tx.ok() && out.ok());
      ASSERT_TRUE(be.fill_uniform(*tw, seed + 1, 0.02f, 0.0f).ok());
      ASSERT_TRUE(be.fill_uniform(*tx, seed + 2, 1.0f, 0.0f).ok());
      std::vector<double> runs;
      for (int round = 0; round < 4; ++round) {
        const int reps = round == 0 ? 1 : 5;  // round 0 warms up
        auto t0 = std::chrono::steady_clock::now();
        for (int i = 0; i < reps; ++i) be.matmul(*out, *tx, *tw);
        ASSERT_TRUE(be.execute().ok());
        if (round) runs.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps);
      }
      std::sort(runs.begin(), runs.end());
      const double s = runs[1], flops = 2.0 * double(T) * double(sh.N) * double(sh.K);
      std::printf("prefill %-5s %-9s %6lldx%-6lld T %lld %9.1f us %7.1f TFLOP/s %5.1f%% of the bf16 rate\n", vname,
                  sh.name, (long long)sh.N, (long long)sh.K, (long long)T, s * 1e6, flops / s * 1e-12,
                  100.0 * flops / s * 1e-12 / ceil->bf16_tflops);
      for (auto* t : {&*tw, &*tx, &*out}) be.release(*t);
      seed += 10;
    }
  }
}

// Attention at decode: batch 1..64 rows over 1K and 32K contexts, the
// Glimmer (32 q / 2 kv heads of 128) and Spark (128 / 16 of 64) shapes;
// KV bytes read per second.
TEST_F(Timing, DISABLED_DecodeAttention) {
  struct Shape {
    const char* name;
    int64_t hq, hk, d;
  };
  for (const Shape sh : {Shape{"glimmer", 32, 2, 128}, Shape{"spark", 128, 16, 64}})
    for (int64_t ctx : {1024, 32768})
      for (int64_t B : {1, 16, 64}) {
        const int64_t per = 16, kvd = sh.hk * sh.d, blocks_per_seq = (ctx + per) / per + 1;
        const int64_t pages = B * blocks_per_seq;
        auto k = b().alloc(DType::BF16, {pages, 1, per, kvd}), v = b().alloc(DType::BF16, {pages, 1, per, kvd});
        auto q = b().alloc(DType::BF16, {B, sh.hq * sh.d}), kn = b().alloc(DType::BF16, {B, kvd}),
             vn = b().alloc(DType::BF16, {B, kvd}), out = b().alloc(DType::BF16, {B, sh.hq * sh.d});
        ASSERT_TRUE(k.ok() && v.ok() && q.ok() && kn.ok() && vn.ok() && out.ok());
        for (auto* t : {&*k, &*v, &*q, &*kn, &*vn}) ASSERT_TRUE(b().fill_uniform(*t, 9, 1.0f, 0.0f).ok());
        StepPlanCapacity cap;
        cap.max_rows = B, cap.max_seqs = B, cap.max_logit_rows = B, cap.max_blocks = pages;
        StepPlanBuilder builder(cap);
        builder.reset();
        const std::vector<int32_t> none;
        for (int64_t s = 0; s < B; ++s) {
          std::vector<int32_t> tok(1, 1), table(static_cast<size_t>(blocks_per_seq));
          for (int64_t j = 0; j < blocks_per_seq; ++j) table[size_t(j)] = int32_t(s * blocks_per_seq + j);
          builder.add(tok, ctx, table, none, 0, false, true);
        }
        auto pb = b().alloc(DType::I32, {builder.layout().total});
        ASSERT_TRUE(pb.ok());
        b().set_input(*pb, builder.data(), builder.upload_bytes());
        StepPlanView view = StepPlanView::over(*pb, cap, 0, per);
        KvLayerStorage cache;
        cache.k = *k, cache.v = *v;
        const double s = time_op([&] {
          b().attention(*out, *q, *kn, *vn, cache, view, sh.d, 0, 0.088f);
        });
        const double bytes = double(B) * double(ctx) * double(kvd) * 2 * 2;
        line(std::string("attention ") + sh.name + " ctx " + std::to_string(ctx) + " B " + std::to_string(B), s,
             bytes);
        for (auto* t : {&*k, &*v, &*q, &*kn, &*vn, &*out, &*pb}) b().release(*t);
      }
}

TEST_F(Timing, ProfileReportNamesTheOps) {
#if defined(MUSE_HAVE_CUDA) && MUSE_HAVE_CUDA
  CudaBackendOptions o;
  o.profile = true;
  auto r = create_cuda_backend(o);
  ASSERT_TRUE(r.ok()) << r.message();
  Backend& pb = **r;
  std::vector<float> x = random_floats(64, 1);
  auto t = pb.import_weight(DType::F32, {2, 32}, x.data(), false);
  ASSERT_TRUE(t.ok());
  pb.softcap(*t, 0.5f, 10.0f);
  pb.swiglu(*t, *t, *t);
  ASSERT_TRUE(pb.execute().ok());
  const std::string rep = pb.profile_report();
  EXPECT_NE(rep.find("softcap"), std::string::npos) << rep;
  EXPECT_NE(rep.find("swiglu"), std::string::npos) << rep;
  EXPECT_TRUE(b().profile_report().empty());
#endif
}

}  // namespace
}  // namespace muse::cuda_testing
