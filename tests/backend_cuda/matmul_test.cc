// project on the GPU: the own fixed-order kernel (T <= 64; vector and
// scalar paths; mixed dtypes at any T) and cuBLASLt (T > 64), against a
// double reference; and batch invariance of a decode row.
#include "cuda_test_util.h"

namespace muse::cuda_testing {
namespace {

class Project : public CudaTest, public ::testing::WithParamInterface<DType> {
 public:
  DType act() const { return GetParam(); }
};

std::string param_name(const ::testing::TestParamInfo<DType>& i) { return dtype_label(i.param); }

// want[t, n] = Σ_k x[t, k] w[n, k]; scale = Σ_k |x w|.
void matmul_ref(const std::vector<float>& x, const std::vector<float>& w, int64_t T, int64_t N, int64_t K,
                std::vector<double>& want, std::vector<double>& scale) {
  want.assign(static_cast<size_t>(T * N), 0.0);
  scale.assign(static_cast<size_t>(T * N), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(x[size_t(t * K + k)]) * w[size_t(n * K + k)];
        s += p, a += std::fabs(p);
      }
      want[size_t(t * N + n)] = s, scale[size_t(t * N + n)] = a;
    }
}

TEST_P(Project, OddShapesBothWeightDtypesTwoOutputs) {
  uint32_t seed = 1000;
  for (int64_t T : {1, 3, 17, 64, 65, 203}) {
    for (int64_t K : {67, 256, 1000}) {
      for (DType wdt : {DType::BF16, DType::F32}) {
        const int64_t N1 = 45, N2 = 301;
        auto x = random_floats(static_cast<size_t>(T * K), ++seed);
        auto w1 = random_floats(static_cast<size_t>(N1 * K), ++seed, 0.05f), w2 = random_floats(static_cast<size_t>(N2 * K), ++seed, 0.05f);
        Tensor tx = up(act(), {T, K}, x), tw1 = up(wdt, {N1, K}, w1), tw2 = up(wdt, {N2, K}, w2);
        // The first output in the activation dtype, the second in F32 (as logits are).
        Tensor o1 = poisoned(act(), {T, N1}), o2 = poisoned(DType::F32, {T, N2});
        Projection ps[2] = {{tw1, o1}, {tw2, o2}};
        b().project(tx, std::span<const Projection>(ps, 2));
        run();
        std::vector<double> want, scale;
        // Own kernels: the warp dot, K/32 sequential fmas per lane + 5
        // butterfly levels; mma_gemv (BF16 x and W, K % 8 == 0), K/64 mma
        // steps per K-slice + 3 additions of the slices (within that bound);
        // cuBLASLt (T > 64, same dtypes): an unknown order, so K.
        const bool lt = T > 64 && wdt == act();
        const double n = lt ? double(K) + 2 : double(K) / 32 + 8;
        const std::string what = "T " + std::to_string(T) + " K " + std::to_string(K) + " w " + dtype_label(wdt);
        matmul_ref(x, w1, T, N1, K, want, scale);
        expect_close(lt ? "project (cublasLt)" : "project (own)", get(o1), want, fp32_tol(scale, n),
                     act() == DType::BF16, what + " out1");
        matmul_ref(x, w2, T, N2, K, want, scale);
        expect_close(lt ? "project (cublasLt)" : "project (own)", get(o2), want, fp32_tol(scale, n), false,
                     what + " out2");
      }
    }
  }
}

TEST_P(Project, DecodeRowIsBatchInvariantAndDeterministic) {
  const int64_t K = 1000, N = 300, B = 64, at = 37;
  // mma_gemv (K 1000, 4168: a K tail, BF16 activations), the warp dot's
  // vector path (F32 activations or F32 weights; one row alone takes its
  // deep-prefetch form, warp_dot_row) and its scalar path (K 67).
  for (DType wdt : {DType::BF16, DType::F32})
  for (int64_t kk : {K, int64_t(67), int64_t(4168)}) {
    auto xb = random_floats(static_cast<size_t>(B * kk), 2000);
    auto w = random_floats(static_cast<size_t>(N * kk), 2001, 0.05f);
    Tensor tw = up(wdt, {N, kk}, w);
    Tensor txb = up(act(), {B, kk}, xb);
    std::vector<float> x1(xb.begin() + at * kk, xb.begin() + (at + 1) * kk);
    Tensor tx1 = up(act(), {1, kk}, x1);
    Tensor ob = poisoned(act(), {B, N}), ob2 = poisoned(act(), {B, N}), o1 = poisoned(act(), {1, N});
    b().matmul(ob, txb, tw);
    b().matmul(o1, tx1, tw);
    b().matmul(ob2, txb, tw);
    run();
    auto bytes_b = get_bytes(ob), bytes_b2 = get_bytes(ob2), bytes_1 = get_bytes(o1);
    const size_t row = size_t(N) * ob.element_bytes();
    EXPECT_EQ(0, std::memcmp(bytes_b.data() + size_t(at) * row, bytes_1.data(), row))
        << "row " << at << " of a batch of 64 differs from the same row alone (K " << kk << ")";
    EXPECT_EQ(bytes_b, bytes_b2) << "the same product twice differs";
    // Batches of 4, 13 and 20 rows (other tiles of mma_gemv) holding the row.
    for (int64_t Bs : {4, 13, 20}) {
      const int64_t first = at - Bs / 2;
      std::vector<float> xs(xb.begin() + first * kk, xb.begin() + (first + Bs) * kk);
      Tensor txs = up(act(), {Bs, kk}, xs);
      Tensor os = poisoned(act(), {Bs, N});
      b().matmul(os, txs, tw);
      run();
      auto bytes_s = get_bytes(os);
      EXPECT_EQ(0, std::memcmp(bytes_b.data() + size_t(first) * row, bytes_s.data(), size_t(Bs) * row))
          << "rows " << first << ".." << first + Bs - 1 << " of a batch of 64 differ from a batch of " << Bs
          << " (K " << kk << ")";
    }
  }
}

#if defined(MUSE_HAVE_CUDA) && MUSE_HAVE_CUDA
// The F32 output bytes of x (T x K) · w (N x K)ᵀ through product kernel
// `variant` (the streamed ring at `stream_stages`, 0: the rule's depth).
std::vector<char> product_bytes(int variant, int64_t T, int64_t N, int64_t K, uint32_t seed, int stream_stages = 0) {
  CudaBackendOptions o;
  o.gemv_variant = variant;
  o.stream_stages = stream_stages;
  auto bp = backend_with(o);
  if (!bp) return {};
  Backend& be = *bp;
  auto bf = [](const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
    return h;
  };
  const auto x = bf(random_floats(static_cast<size_t>(T * K), seed)),
             w = bf(random_floats(static_cast<size_t>(N * K), seed + 1, 0.05f));
  auto tx = be.import_weight(DType::BF16, {T, K}, x.data(), false);
  auto tw = be.import_weight(DType::BF16, {N, K}, w.data(), false);
  auto to = be.alloc(DType::F32, {T, N});
  EXPECT_TRUE(tx.ok() && tw.ok() && to.ok());
  be.matmul(*to, *tx, *tw);
  EXPECT_TRUE(be.execute().ok());
  std::vector<char> out(static_cast<size_t>(to->bytes()));
  EXPECT_TRUE(be.download(*to, out.data()).ok());
  return out;
}

struct ProductCase {
  int64_t T, N, K;
};

// Each case through the register kernel (variant 1) and through each of
// `variants`: the same bytes. Seeds from `seed` + 2, + 4, ...
void expect_variants_give_the_same_bits(const std::vector<ProductCase>& cases, std::initializer_list<int> variants,
                                        uint32_t seed, int stream_stages = 0) {
  for (const ProductCase& c : cases) {
    seed += 2;
    const auto want = product_bytes(1, c.T, c.N, c.K, seed);
    for (int v : variants) {
      const auto got = product_bytes(v, c.T, c.N, c.K, seed, stream_stages);
      EXPECT_TRUE(want == got) << "variant " << v << " (stream stages " << stream_stages << ") T " << c.T << " N "
                               << c.N << " K " << c.K << ": " << describe_f32_difference(want, got);
    }
  }
}
#endif

// The decode-product kernel variants (CudaBackendOptions::gemv_variant:
// register loads, the cp.async ring with 3, 4 or 6 stages, the wide kernel,
// the prefill GEMM, the cluster kernel) compute the same
// fragments in the same order: the same bits, on odd shapes and K tails.
TEST(ProjectVariants, EveryGemvVariantGivesTheSameBits) {
#if !(defined(MUSE_HAVE_CUDA) && MUSE_HAVE_CUDA)
  GTEST_SKIP() << "this build has no CUDA backend (configure with -DMUSE_CUDA=ON: scripts/test-cuda.sh)";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine: the CUDA backend is not tested here";
  // Variant 7 is the prefill GEMM (the rule's choice above 64 rows) and 8, 9
  // the cluster kernel: 128-row tiles, so also N and T across tile edges, K
  // from one granule (slices without one) to whole slices.
  std::vector<ProductCase> cases;
  for (int64_t T : {1, 5, 16, 29, 64, 130, 300})
    for (int64_t K : {8, 136, 1000, 4168}) cases.push_back({T, T == 300 ? 333 : 77, K});
  for (const ProductCase c : {ProductCase{257, 129, 4096}, ProductCase{65, 260, 384}, ProductCase{200, 128, 640},
                              ProductCase{129, 255, 520}, ProductCase{2100, 513, 1032}})
    cases.push_back(c);
  expect_variants_give_the_same_bits(cases, {0, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16}, 7000);
#endif
}

// The wgmma kernels alone (variants 11 and 12, against the register kernel,
// which uses no clusters): a small case list that compute-sanitizer's
// racecheck can instrument in full (it fails on the mma.sync cluster kernel
// when that kernel is left uninstrumented: bench/NOTES.md).
TEST(ProjectVariants, WgmmaKernelsGiveTheSameBits) {
#if !(defined(MUSE_HAVE_CUDA) && MUSE_HAVE_CUDA)
  GTEST_SKIP() << "this build has no CUDA backend (configure with -DMUSE_CUDA=ON: scripts/test-cuda.sh)";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine: the CUDA backend is not tested here";
  // 20 x 9000 (71 weight tiles, 284 blocks): on an H200 (132 SMs) variant
  // 13 at 17..32 rows takes its three-blocks-an-SM form, which the other
  // shapes (two an SM) do not reach; 40 x 9000 the same launch at 33..64.
  expect_variants_give_the_same_bits({{1, 77, 1000}, {9, 130, 136}, {33, 255, 520}, {64, 129, 4168},
                                      {65, 260, 384}, {300, 333, 1032}, {20, 9000, 264}, {40, 9000, 264}},
                                     {11, 12, 13, 14}, 7700);
#endif
}

#if defined(MUSE_HAVE_CUDA) && MUSE_HAVE_CUDA
// project() with five, four or two outputs of odd sizes (tiles across the
// products' edges) and both output dtypes, on a backend forcing each of
// `variants`, at each of `rows`: every output's bytes equal its own
// product's (matmul alone).
void expect_grouped_outputs_give_separate_bits(std::initializer_list<int> variants, std::initializer_list<int64_t> rows,
                                               uint32_t seed, std::initializer_list<int64_t> ks = {136, 1000},
                                               std::vector<int64_t> Ns = {77, 16, 300, 9, 130}, int stream_stages = 0) {
  Ns.resize(5, 16);
  auto bf = [](const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
    return h;
  };
  for (int variant : variants)
    for (int64_t T : rows)
      for (int64_t K : ks)
        for (size_t n_out : {size_t(5), size_t(4), size_t(2)}) {
          CudaBackendOptions o;
          o.gemv_variant = variant;
          o.stream_stages = stream_stages;
          auto bp = backend_with(o);
          ASSERT_TRUE(bp);
          Backend& be = *bp;
          seed += 7;
          const auto x = bf(random_floats(static_cast<size_t>(T * K), seed));
          auto tx = be.import_weight(DType::BF16, {T, K}, x.data(), false);
          ASSERT_TRUE(tx.ok());
          std::vector<Tensor> ws, grouped, alone;
          std::vector<Projection> ps;
          for (size_t i = 0; i < n_out; ++i) {
            const auto w = bf(random_floats(static_cast<size_t>(Ns[i] * K), seed + 1 + uint32_t(i), 0.05f));
            auto tw = be.import_weight(DType::BF16, {Ns[i], K}, w.data(), false);
            const DType odt = i % 2 ? DType::BF16 : DType::F32;
            auto og = be.alloc(odt, {T, Ns[i]}), oa = be.alloc(odt, {T, Ns[i]});
            ASSERT_TRUE(tw.ok() && og.ok() && oa.ok());
            ws.push_back(*tw), grouped.push_back(*og), alone.push_back(*oa);
            ps.push_back({*tw, *og});
          }
          be.project(*tx, ps);
          for (size_t i = 0; i < ws.size(); ++i) be.matmul(alone[i], *tx, ws[i]);
          ASSERT_TRUE(be.execute().ok());
          for (size_t i = 0; i < ws.size(); ++i) {
            std::vector<char> a(static_cast<size_t>(grouped[i].bytes())), c(a.size());
            ASSERT_TRUE(be.download(grouped[i], a.data()).ok() && be.download(alone[i], c.data()).ok());
            EXPECT_EQ(a, c) << "output " << i << " of " << n_out << " (" << Ns[i] << " rows) variant " << variant
                            << " (stream stages " << stream_stages << ") T " << T << " K " << K;
          }
        }
}
#endif

// The outputs of one project() call launch as a chain of overlapping
// products (kChainNext / kChainXReady), or (two to four of them, at 9..64
// rows or variant 10) as one grouped cluster launch: each output's bits must
// be those of its own product, for every decode variant, with outputs of odd
// sizes (tiles across the products' edges), both output dtypes, and five,
// four or two outputs.
TEST(ProjectVariants, GroupedOutputsGiveTheBitsOfSeparateProducts) {
#if !(defined(MUSE_HAVE_CUDA) && MUSE_HAVE_CUDA)
  GTEST_SKIP() << "this build has no CUDA backend (configure with -DMUSE_CUDA=ON: scripts/test-cuda.sh)";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine: the CUDA backend is not tested here";
  expect_grouped_outputs_give_separate_bits({0, 1, 2, 3, 5, 6, 8, 9, 10, 11, 12, 13, 14}, {1, 5, 16, 29, 64, 200},
                                            9100);
#endif
}

// The streamed ring (variant 15, and the rule's grouped calls where it takes
// the ring, with more 16-row tiles than the stream's blocks): products of
// 6,000 to 12,000 rows, so tiles are cut between blocks and their
// accumulators handed on, K of one round (8, 136: never cut), of whole
// rounds (1000, Glimmer's 6,656) and of rounds whose last has granules for
// some warps only (520, 4168); the register kernel's bits. Then
// grouped calls of Q/K/V/gate-like sizes (the rule streams them): each
// output's bits are its own product's (the ring's, alone).
TEST(ProjectVariants, StreamedRingGivesTheSameBits) {
#if !(defined(MUSE_HAVE_CUDA) && MUSE_HAVE_CUDA)
  GTEST_SKIP() << "this build has no CUDA backend (configure with -DMUSE_CUDA=ON: scripts/test-cuda.sh)";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine: the CUDA backend is not tested here";
  // At the rule's depth and at each depth an A/B may launch (more or fewer
  // blocks, so the tiles are cut at other places).
  for (int stages : {0, 2, 3, 5}) {
    expect_variants_give_the_same_bits({{1, 9000, 1000}, {3, 7001, 4168}, {8, 6656, 6656}, {5, 12000, 136},
                                        {2, 9000, 520}, {7, 6100, 8}},
                                       {15}, 7900, stages);
    expect_grouped_outputs_give_separate_bits({0, 15}, {1, 4, 8}, 9400, {1000, 6656}, {4099, 256, 257, 4096, 300},
                                              stages);
  }
#endif
}

// The prefill GEMM through project() (x permuted, staged by the copy
// engine) over several activation tiles and K-slices long enough that
// every stage is refilled by thread 0 between its own units: each output's
// bits are its own matmul's.
TEST(ProjectVariants, PrefillRefillsGiveTheBitsOfSeparateProducts) {
#if !(defined(MUSE_HAVE_CUDA) && MUSE_HAVE_CUDA)
  GTEST_SKIP() << "this build has no CUDA backend (configure with -DMUSE_CUDA=ON: scripts/test-cuda.sh)";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine: the CUDA backend is not tested here";
  expect_grouped_outputs_give_separate_bits({11}, {600}, 9900, {4168});
#endif
}

// project_swiglu: on the ring (1..8 rows, variants 2, 3, 4, 6 and the
// rule's 1..4) one kernel forms silu(γ) · υ where the gate and up sums land;
// elsewhere it runs project then swiglu. Either way the bits are those of
// the two ops, for odd widths (tiles past I), both stored dtypes of γ and υ,
// and act aliasing gate's out (as the model calls it) or not.
TEST(ProjectVariants, ProjectSwigluGivesTheBitsOfProjectThenSwiglu) {
#if !(defined(MUSE_HAVE_CUDA) && MUSE_HAVE_CUDA)
  GTEST_SKIP() << "this build has no CUDA backend (configure with -DMUSE_CUDA=ON: scripts/test-cuda.sh)";
#else
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine: the CUDA backend is not tested here";
  auto bf = [](const std::vector<float>& v) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
    return h;
  };
  uint32_t seed = 9700;
  for (int variant : {0, 2, 3, 4, 6, 1, 14})
    for (int64_t T : {1, 2, 4, 5, 8})
      for (int64_t K : {136, 1000})
        for (int64_t I : {77, 300})
          for (int form = 0; form < 3; ++form) {  // 0: BF16, act aliases gate; 1: BF16; 2: F32 γ and υ, F32 act
            auto bp = backend_with_product_kernel(variant);
            ASSERT_TRUE(bp);
            Backend& be = *bp;
            seed += 3;
            const DType pdt = form == 2 ? DType::F32 : DType::BF16;
            const auto x = bf(random_floats(static_cast<size_t>(T * K), seed));
            const auto wg = bf(random_floats(static_cast<size_t>(I * K), seed + 1, 0.05f)),
                       wu = bf(random_floats(static_cast<size_t>(I * K), seed + 2, 0.05f));
            auto tx = be.import_weight(DType::BF16, {T, K}, x.data(), false);
            auto tg = be.import_weight(DType::BF16, {I, K}, wg.data(), false);
            auto tu = be.import_weight(DType::BF16, {I, K}, wu.data(), false);
            auto og = be.alloc(pdt, {T, I}), ou = be.alloc(pdt, {T, I}), act = be.alloc(pdt, {T, I});
            auto rg = be.alloc(pdt, {T, I}), ru = be.alloc(pdt, {T, I});
            ASSERT_TRUE(tx.ok() && tg.ok() && tu.ok() && og.ok() && ou.ok() && act.ok() && rg.ok() && ru.ok());
            const Tensor& got = form == 0 ? *og : *act;
            be.project_swiglu(*tx, {*tg, *og}, {*tu, *ou}, got);
            const Projection gu[] = {{*tg, *rg}, {*tu, *ru}};
            be.project(*tx, gu);
            be.swiglu(*rg, *rg, *ru);
            ASSERT_TRUE(be.execute().ok());
            std::vector<char> a(static_cast<size_t>(got.bytes())), c(a.size());
            ASSERT_TRUE(be.download(got, a.data()).ok() && be.download(*rg, c.data()).ok());
            EXPECT_EQ(a, c) << "variant " << variant << " T " << T << " K " << K << " I " << I << " form " << form;
          }
#endif
}

INSTANTIATE_TEST_SUITE_P(Act, Project, ::testing::Values(DType::F32, DType::BF16), param_name);

}  // namespace
}  // namespace muse::cuda_testing
