// The sigmoid router and the latent experts on the GPU, against double
// references of the CPU backend's semantics; batch invariance of a token.
#include <set>

#include "cuda_test_util.h"
#include "muse/model/weights.h"

namespace muse::cuda_testing {
namespace {

class Moe : public CudaTest, public ::testing::WithParamInterface<DType> {
 public:
  DType act() const { return GetParam(); }
};
std::string param_name(const ::testing::TestParamInfo<DType>& i) { return dtype_label(i.param); }

TEST_P(Moe, RouteTopKWithBiasTiesToTheLowerIndex) {
  const int64_t T = 9, E = 37, K = 5;
  const float mult = 1.3f, scaling = 2.5f;
  auto z = random_floats(static_cast<size_t>(T * E), 50);
  auto bias = random_floats(static_cast<size_t>(E), 51, 0.05f);
  // Row 3: three experts tie at the top (same logit, same bias).
  for (int e : {30, 5, 20}) z[size_t(3 * E + e)] = 4.0f, bias[size_t(e)] = 0.5f;  // out of reach of any other p + bias
  Tensor tz = up(DType::F32, {T, E}, z), tb = up(DType::F32, {E}, bias);
  Tensor ids = poisoned(DType::I32, {T, K}), w = poisoned(DType::F32, {T, K});
  b().moe_route(ids, w, tz, tb, mult, scaling);
  // The same without a bias, on constant logits.
  std::vector<float> zc(static_cast<size_t>(2 * E), 0.75f);
  Tensor tzc = up(DType::F32, {2, E}, zc);
  Tensor ids2 = poisoned(DType::I32, {2, K}), w2 = poisoned(DType::F32, {2, K});
  b().moe_route(ids2, w2, tzc, Tensor{}, 1.0f, 1.0f);
  run();
  auto gi = get_as<int32_t>(ids);
  auto gw = get(w);
  std::vector<double> want_w, tol;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> p(static_cast<size_t>(E)), sel(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      p[size_t(e)] = 1.0 / (1.0 + std::exp(-double(z[size_t(t * E + e)] * mult)));
      sel[size_t(e)] = p[size_t(e)] + bias[size_t(e)];
    }
    // Identical inputs give identical fp32 values on the GPU: keep exact ties exact here.
    std::vector<int> order(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return sel[size_t(a)] > sel[size_t(c)]; });
    double sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += p[size_t(order[size_t(k)])];
    for (int64_t k = 0; k < K; ++k) {
      EXPECT_EQ(gi[size_t(t * K + k)], order[size_t(k)]) << "row " << t << " slot " << k;
      want_w.push_back(p[size_t(order[size_t(k)])] / (sum + 1e-15) * scaling);
      tol.push_back(kU * std::fabs(want_w.back()) * double(K + 12));  // σ (exp 2 ulp, add, divide), K-term sum, divide, scale
    }
  }
  EXPECT_EQ(gi[size_t(3 * K)], 5);
  EXPECT_EQ(gi[size_t(3 * K + 1)], 20);
  EXPECT_EQ(gi[size_t(3 * K + 2)], 30);
  expect_close("moe_route", gw, want_w, tol, false, "router weights");
  auto gi2 = get_as<int32_t>(ids2);
  for (int64_t t = 0; t < 2; ++t)
    for (int64_t k = 0; k < K; ++k) EXPECT_EQ(gi2[size_t(t * K + k)], k) << "constant logits: ties go to lower ids";
}

TEST_P(Moe, RouteRealShape256Top8) {
  const int64_t T = 64, E = 256, K = 8;
  auto z = random_floats(static_cast<size_t>(T * E), 60);
  auto bias = random_floats(static_cast<size_t>(E), 61, 0.02f);
  Tensor tz = up(DType::F32, {T, E}, z), tb = up(DType::F32, {E}, bias);
  Tensor ids = poisoned(DType::I32, {T, K}), w = poisoned(DType::F32, {T, K});
  b().moe_route(ids, w, tz, tb, 1.0f, 2.5f);
  run();
  auto gi = get_as<int32_t>(ids);
  auto gw = get(w);
  std::vector<double> want_w, tol;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<double> p(static_cast<size_t>(E)), sel(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) {
      p[size_t(e)] = 1.0 / (1.0 + std::exp(-double(z[size_t(t * E + e)])));
      sel[size_t(e)] = p[size_t(e)] + bias[size_t(e)];
    }
    std::vector<int> order(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(), [&](int a, int c) { return sel[size_t(a)] > sel[size_t(c)]; });
    // This seed has no near-tie at the k-th place (margin checked below).
    EXPECT_GT(sel[size_t(order[size_t(K - 1)])] - sel[size_t(order[size_t(K)])], 1e-6) << "near-tie in row " << t;
    double sum = 0;
    for (int64_t k = 0; k < K; ++k) sum += p[size_t(order[size_t(k)])];
    for (int64_t k = 0; k < K; ++k) {
      EXPECT_EQ(gi[size_t(t * K + k)], order[size_t(k)]) << "row " << t << " slot " << k;
      want_w.push_back(p[size_t(order[size_t(k)])] / (sum + 1e-15) * 2.5);
      tol.push_back(kU * std::fabs(want_w.back()) * double(K + 12));
    }
  }
  expect_close("moe_route", gw, want_w, tol, false, "router weights 256/8");
}

// Past the one-warp router's 1024 experts, and rows with a NaN logit, the
// block rounds pick: the same order on a clean row; valid ids on a NaN row.
TEST_P(Moe, RouteWideAndNaNRowsTakeTheBlockRounds) {
  const int64_t T = 3, E = 1500, K = 6;
  // Logits a permutation of an even grid from -4 to 4: no two sigmoids tie.
  std::vector<float> z(static_cast<size_t>(T * E));
  for (int64_t t = 0; t < T; ++t)
    for (int64_t e = 0; e < E; ++e) z[size_t(t * E + e)] = float((e * 7919 + t * 31) % E) / float(E) * 8.0f - 4.0f;
  z[size_t(2 * E + 17)] = std::nanf("");
  Tensor tz = up(DType::F32, {T, E}, z);
  Tensor ids = poisoned(DType::I32, {T, K}), w = poisoned(DType::F32, {T, K});
  b().moe_route(ids, w, tz, Tensor{}, 1.0f, 1.0f);
  auto z2 = std::vector<float>(z.begin(), z.begin() + 2 * 256);
  Tensor tz2 = up(DType::F32, {2, 256}, z2);
  z2[size_t(256 + 9)] = std::nanf("");
  Tensor tz3 = up(DType::F32, {2, 256}, z2);
  Tensor ids2 = poisoned(DType::I32, {2, K}), w2 = poisoned(DType::F32, {2, K});
  Tensor ids3 = poisoned(DType::I32, {2, K}), w3 = poisoned(DType::F32, {2, K});
  b().moe_route(ids2, w2, tz2, Tensor{}, 1.0f, 1.0f);
  b().moe_route(ids3, w3, tz3, Tensor{}, 1.0f, 1.0f);
  run();
  auto gi = get_as<int32_t>(ids);
  for (int64_t t = 0; t < 2; ++t) {
    std::vector<int> order(static_cast<size_t>(E));
    for (int e = 0; e < E; ++e) order[size_t(e)] = e;
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int c) { return z[size_t(t * E + a)] > z[size_t(t * E + c)]; });
    for (int64_t k = 0; k < K; ++k) EXPECT_EQ(gi[size_t(t * K + k)], order[size_t(k)]) << "row " << t << " slot " << k;
  }
  for (int64_t k = 0; k < K; ++k) EXPECT_TRUE(gi[size_t(2 * K + k)] >= 0 && gi[size_t(2 * K + k)] < E) << "NaN row";
  // Row 0 of the 256-wide pair is the same with and without a NaN in row 1
  // (the NaN row takes the block rounds, the clean one the warp's).
  auto a2 = get_as<int32_t>(ids2), a3 = get_as<int32_t>(ids3);
  for (int64_t k = 0; k < K; ++k) {
    EXPECT_EQ(a2[size_t(k)], a3[size_t(k)]) << "slot " << k;
    EXPECT_TRUE(a3[size_t(K + k)] >= 0 && a3[size_t(K + k)] < 256) << "NaN row";
  }
}

TEST_P(Moe, ExpertsOddShapesBothWeightDtypes) {
  const ExpertCase cases[] = {
      {1, 6, 3, 72, 40, DType::BF16}, {5, 6, 3, 72, 40, DType::F32},  {40, 6, 3, 67, 33, DType::BF16},
      {40, 9, 4, 128, 64, DType::F32}, {70, 16, 8, 64, 24, DType::BF16}, {64, 256, 8, 256, 128, DType::BF16},
  };
  uint32_t seed = 3000;
  for (const auto& c : cases) {
    auto u = random_floats(static_cast<size_t>(c.T * c.Hm), ++seed);
    auto gu = random_floats(static_cast<size_t>(c.E * 2 * c.I * c.Hm), ++seed, 0.1f);
    auto dn = random_floats(static_cast<size_t>(c.E * c.Hm * c.I), ++seed, 0.1f);
    auto gain = random_floats(static_cast<size_t>(c.Hm), ++seed, 0.3f, 1.0f);
    auto ids = random_ids(c.T, c.E, c.K, ++seed);
    auto w = random_floats(static_cast<size_t>(c.T * c.K), ++seed, 0.2f, 0.5f);
    Tensor tu = up(act(), {c.T, c.Hm}, u), tgu = up(c.wdt, {c.E, 2 * c.I, c.Hm}, gu),
           tdn = up(c.wdt, {c.E, c.Hm, c.I}, dn), tg = up(DType::F32, {c.Hm}, gain), tw = up(DType::F32, {c.T, c.K}, w);
    Tensor tids = up_i32({c.T, c.K}, ids);
    Tensor out = poisoned(act(), {c.T, c.Hm});
    b().moe_experts(out, tu, tgu, tdn, tg, tids, tw, 1e-6f);
    run();
    std::vector<double> want, tol;
    const bool a_bf16 = act() == DType::BF16 && c.wdt == DType::BF16 && c.Hm % 8 == 0 && c.I % 8 == 0;
    experts_ref(c, u, gu, dn, gain, ids, w, 1e-6, want, tol, a_bf16);
    expect_close("moe_experts", get(out), want, tol, act() == DType::BF16,
                 "moe_experts T " + std::to_string(c.T) + " Hm " + std::to_string(c.Hm) + " I " + std::to_string(c.I) +
                     " w " + dtype_label(c.wdt));
  }
}

TEST_P(Moe, TokenIsBatchInvariant) {
  const ExpertCase c{64, 8, 4, 128, 64, DType::BF16};
  const int64_t at = 11;
  auto u = random_floats(static_cast<size_t>(c.T * c.Hm), 4000);
  auto gu = random_floats(static_cast<size_t>(c.E * 2 * c.I * c.Hm), 4001, 0.1f);
  auto dn = random_floats(static_cast<size_t>(c.E * c.Hm * c.I), 4002, 0.1f);
  auto gain = random_floats(static_cast<size_t>(c.Hm), 4003, 0.3f, 1.0f);
  auto ids = random_ids(c.T, c.E, c.K, 4004);
  auto w = random_floats(static_cast<size_t>(c.T * c.K), 4005, 0.2f, 0.5f);
  Tensor tu = up(act(), {c.T, c.Hm}, u), tgu = up(c.wdt, {c.E, 2 * c.I, c.Hm}, gu),
         tdn = up(c.wdt, {c.E, c.Hm, c.I}, dn), tg = up(DType::F32, {c.Hm}, gain), tw = up(DType::F32, {c.T, c.K}, w);
  Tensor tids = up_i32({c.T, c.K}, ids);
  Tensor ob = poisoned(act(), {c.T, c.Hm}), o1 = poisoned(act(), {1, c.Hm}), ob2 = poisoned(act(), {c.T, c.Hm});
  b().moe_experts(ob, tu, tgu, tdn, tg, tids, tw, 1e-6f);
  b().moe_experts(o1, tu.rows(at, 1), tgu, tdn, tg, tids.rows(at, 1), tw.rows(at, 1), 1e-6f);
  b().moe_experts(ob2, tu, tgu, tdn, tg, tids, tw, 1e-6f);
  run();
  auto rb = get_bytes(ob), r1 = get_bytes(o1), rb2 = get_bytes(ob2);
  const size_t row = size_t(c.Hm) * ob.element_bytes();
  EXPECT_EQ(0, std::memcmp(rb.data() + size_t(at) * row, r1.data(), row)) << "token alone vs in a batch of 64";
  EXPECT_EQ(rb, rb2) << "the same experts twice differ";
}

// Expert parallelism: two ranks each holding half the experts (expert_base
// 0 and E/2). Every token here routes all its slots into one half, so the
// rank holding it returns exactly the whole result and the other exactly 0.
TEST_P(Moe, ExpertParallelHalvesSkipTheOtherRanksSlots) {
  const ExpertCase c{24, 8, 3, 64, 32, DType::BF16};
  const int64_t half = c.E / 2;
  auto u = random_floats(static_cast<size_t>(c.T * c.Hm), 5000);
  auto gu = random_floats(static_cast<size_t>(c.E * 2 * c.I * c.Hm), 5001, 0.1f);
  auto dn = random_floats(static_cast<size_t>(c.E * c.Hm * c.I), 5002, 0.1f);
  auto gain = random_floats(static_cast<size_t>(c.Hm), 5003, 0.3f, 1.0f);
  auto w = random_floats(static_cast<size_t>(c.T * c.K), 5005, 0.2f, 0.5f);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < c.T; ++t)
    for (int64_t k = 0; k < c.K; ++k) ids.push_back(int32_t((t % 2 ? half : 0) + (t + k) % half));
  Tensor tu = up(act(), {c.T, c.Hm}, u), tgu = up(c.wdt, {c.E, 2 * c.I, c.Hm}, gu),
         tdn = up(c.wdt, {c.E, c.Hm, c.I}, dn), tg = up(DType::F32, {c.Hm}, gain), tw = up(DType::F32, {c.T, c.K}, w);
  Tensor tids = up_i32({c.T, c.K}, ids);
  Tensor whole = poisoned(act(), {c.T, c.Hm}), lo = poisoned(act(), {c.T, c.Hm}), hi = poisoned(act(), {c.T, c.Hm});
  b().moe_experts(whole, tu, tgu, tdn, tg, tids, tw, 1e-6f);
  b().moe_experts(lo, tu, tgu.rows(0, half), tdn.rows(0, half), tg, tids, tw, 1e-6f, 0);
  b().moe_experts(hi, tu, tgu.rows(half, half), tdn.rows(half, half), tg, tids, tw, 1e-6f, half);
  run();
  auto rw = get_bytes(whole), rl = get_bytes(lo), rh = get_bytes(hi);
  const size_t row = size_t(c.Hm) * whole.element_bytes();
  const std::vector<char> zero(row, 0);
  for (int64_t t = 0; t < c.T; ++t) {
    const auto& mine = t % 2 ? rh : rl;
    const auto& other = t % 2 ? rl : rh;
    EXPECT_EQ(0, std::memcmp(mine.data() + size_t(t) * row, rw.data() + size_t(t) * row, row)) << "token " << t;
    EXPECT_EQ(0, std::memcmp(other.data() + size_t(t) * row, zero.data(), row)) << "token " << t << ": not skipped";
  }
}

// Random inputs of one moe_experts call: T tokens of width Hm routed to
// top-k of E experts, the Eh held (gate/up and down of inner width I), and
// BF16 copies; `seed` advances as the tests' own draws did.
struct ExpertsInputs {
  std::vector<float> u, gu, dn, gain, w;
  std::vector<int32_t> ids;
  std::vector<uint16_t> ub, gub, dnb;
  ExpertsInputs(int64_t T, int64_t E, int64_t Eh, int64_t K, int64_t Hm, int64_t I, uint32_t& seed)
      : u(random_floats(size_t(T * Hm), ++seed)),
        gu(random_floats(size_t(Eh * 2 * I * Hm), ++seed, 0.1f)),
        dn(random_floats(size_t(Eh * Hm * I), ++seed, 0.1f)),
        gain(random_floats(size_t(Hm), ++seed, 0.3f, 1.0f)) {
    ids = random_ids(T, E, K, ++seed);
    w = random_floats(size_t(T * K), ++seed, 0.2f, 0.5f);
    ub = muse::testing::to_bf16(u), gub = muse::testing::to_bf16(gu), dnb = muse::testing::to_bf16(dn);
  }
};

// One moe_experts call on backend b with its own copies of the inputs
// (released after): the output's bytes. E experts held (from base, or all
// when base < 0); u, gu and dn in act / wdt's storage (BF16 as uint16).
struct ExpertsCall {
  int64_t T, E, K, Hm, I, base;
  DType act, wdt, out;  // u's, the experts' and the output's dtypes
  const void *u, *gu, *dn;
  const float *gain, *w;
  const int32_t* ids;
};
void run_experts(Backend& b, const ExpertsCall& c, std::vector<char>& got) {
  ModelWeights own;
  struct Release {
    Backend& be;
    ModelWeights& w;
    ~Release() { release_weights(be, w); }
  } release{b, own};
  auto tu = b.import_weight(c.act, {c.T, c.Hm}, c.u, false);
  auto tgu = b.import_weight(c.wdt, {c.E, 2 * c.I, c.Hm}, c.gu, false);
  auto tdn = b.import_weight(c.wdt, {c.E, c.Hm, c.I}, c.dn, false);
  auto tg = b.import_weight(DType::F32, {c.Hm}, c.gain, false);
  auto tw = b.import_weight(DType::F32, {c.T, c.K}, c.w, false);
  auto ti = b.import_weight(DType::I32, {c.T, c.K}, c.ids, false);
  auto out = b.alloc(c.out, {c.T, c.Hm});
  ASSERT_TRUE(tu.ok() && tgu.ok() && tdn.ok() && tg.ok() && tw.ok() && ti.ok() && out.ok());
  for (const Tensor& t : {*tu, *tgu, *tdn, *tg, *tw, *ti, *out}) own.owned.push_back(t);
  b.moe_experts(*out, *tu, *tgu, *tdn, *tg, *ti, *tw, 1e-6f, c.base);
  Status s = b.execute();
  ASSERT_TRUE(s.ok()) << s.message();
  got.resize(out->bytes());
  ASSERT_TRUE(b.download(*out, got.data()).ok());
}

// The grouped wgmma GEMM (CudaBackendOptions::expert_gemm 2 and 3: tiles of
// 256 and 128 pairs) gives the per-tile kernels' bits (1): widths that are
// not whole 64-k units or 64-row weight tiles, experts with more pairs than
// a tile, top-k up to 8, and one rank of two under expert parallelism (the
// other rank's pairs left out of the grouping).
TEST_P(Moe, GroupedGemmGivesThePerTileBits) {
  if (act() != DType::BF16) GTEST_SKIP() << "the grouped GEMM takes BF16 activations";
  struct Case {
    int64_t T, E, K, Hm, I, base;  // base >= 0: this rank holds experts [base, base + E / 2)
  };
  const Case cases[] = {{1, 2, 1, 64, 64, -1}, {1, 2, 1, 128, 64, -1}, {1, 2, 1, 64, 128, -1}, {1, 2, 1, 64, 32, -1},
                        {1, 2, 1, 32, 64, -1}, {8, 2, 1, 64, 64, -1}, {3, 4, 2, 64, 64, -1}, {300, 16, 4, 160, 96, -1}, {520, 8, 3, 256, 224, -1}, {1000, 64, 8, 128, 64, -1},
                        {700, 4, 2, 96, 320, -1},  {400, 16, 4, 128, 96, 8}};
  std::unique_ptr<Backend> be[3];
  for (int k = 0; k < 3; ++k) {
    be[k] = backend_with_expert_gemm(k + 1);
    ASSERT_TRUE(be[k]);
  }
  uint32_t seed = 6000;
  for (const Case& c : cases) {
    const int64_t E = c.base >= 0 ? c.E / 2 : c.E;  // experts this rank holds
    const ExpertsInputs in(c.T, c.E, E, c.K, c.Hm, c.I, seed);
    const auto &u = in.u, &gu = in.gu, &dn = in.dn, &gain = in.gain, &w = in.w;
    const auto &ids = in.ids;
    const auto &ub = in.ub, &gub = in.gub, &dnb = in.dnb;
    std::vector<char> got[3];
    const ExpertsCall call{c.T, E, c.K, c.Hm, c.I, c.base >= 0 ? c.base : -1, DType::BF16, DType::BF16, DType::F32,
                           ub.data(), gub.data(), dnb.data(), gain.data(), w.data(), ids.data()};
    for (int k = 0; k < 3; ++k) {
      ASSERT_NO_FATAL_FAILURE(run_experts(*be[k], call, got[k]));
    }
    for (int k = 1; k < 3; ++k)
      EXPECT_EQ(0, std::memcmp(got[0].data(), got[k].data(), got[0].size()))
          << "T " << c.T << " E " << c.E << " top " << c.K << " Hm " << c.Hm << " I " << c.I << " base " << c.base
          << ": the grouped GEMM in tiles of " << (k == 1 ? 256 : 128) << " pairs differs from the per-tile kernels: "
          << describe_f32_difference(got[0], got[k]) << [&] {
               // Which tokens differ, and their experts (a failure's pattern).
               std::string w;
               const size_t row = size_t(c.Hm) * sizeof(float);
               int shown = 0, tokens = 0;
               for (int64_t t = 0; t < c.T; ++t) {
                 if (std::memcmp(got[0].data() + t * row, got[k].data() + t * row, row) == 0) continue;
                 ++tokens;
                 if (shown++ < 6) {
                   w += "; token " + std::to_string(t) + " experts";
                   for (int64_t j = 0; j < c.K; ++j) w += " " + std::to_string(ids[size_t(t * c.K + j)]);
                 }
               }
               return "; " + std::to_string(tokens) + " tokens differ" + w;
             }();
    if (c.base < 0) {  // and both against the double reference (bf16 inputs, a stored in bf16)
      const ExpertCase ec{c.T, c.E, c.K, c.Hm, c.I, DType::BF16};
      std::vector<double> want, tol;
      experts_ref(ec, as_stored(u, DType::BF16), as_stored(gu, DType::BF16), as_stored(dn, DType::BF16), gain, ids, w,
                  1e-6, want, tol, true);
      for (int k = 0; k < 3; ++k) {
        std::vector<float> f(got[k].size() / sizeof(float));
        std::memcpy(f.data(), got[k].data(), got[k].size());
        expect_close("moe_experts grouped", f, want, tol, false,
                     "expert_gemm " + std::to_string(k + 1) + " T " + std::to_string(c.T) + " Hm " +
                         std::to_string(c.Hm) + " I " + std::to_string(c.I));
      }
    }
  }
}

// The combine's two kernels (CudaBackendOptions::moe_combine 1: a block a
// token; 2: a cluster of eight blocks a token, the rule at decode) give the
// same bits: widths below, at and past the block's 256 threads, not whole
// 16-byte pieces, Spark's 4096; top-k of 1 to 16 (two batches of eight at
// 9); one rank of two under expert parallelism (absent slots); 1 to 70
// tokens; both weight dtypes and output dtypes.
TEST_P(Moe, ClusterCombineGivesTheBlockCombineBits) {
  struct Case {
    int64_t T, E, K, Hm, I, base;  // base >= 0: this rank holds experts [base, base + E / 2)
    DType wdt;
  };
  const Case cases[] = {{1, 16, 8, 4096, 64, -1, DType::BF16}, {1, 6, 3, 72, 40, -1, DType::F32},
                        {5, 6, 3, 100, 40, -1, DType::BF16},   {3, 20, 9, 260, 32, -1, DType::BF16},
                        {64, 64, 16, 256, 64, -1, DType::BF16}, {70, 16, 8, 64, 24, -1, DType::BF16},
                        {24, 8, 3, 64, 32, 4, DType::BF16},    {2, 8, 2, 8, 16, -1, DType::F32}};
  std::unique_ptr<Backend> be[2];
  for (int k = 0; k < 2; ++k) {
    CudaBackendOptions o;
    o.moe_combine = k + 1;
    be[k] = backend_with(o);
    ASSERT_TRUE(be[k]);
  }
  uint32_t seed = 7000;
  for (const Case& c : cases) {
    const int64_t E = c.base >= 0 ? c.E / 2 : c.E;  // experts this rank holds
    const ExpertsInputs in(c.T, c.E, E, c.K, c.Hm, c.I, seed);
    const bool ab = act() == DType::BF16, wb = c.wdt == DType::BF16;
    std::vector<char> got[2];
    const ExpertsCall call{c.T, E, c.K, c.Hm, c.I, c.base >= 0 ? c.base : -1, act(), c.wdt, act(),
                           ab ? static_cast<const void*>(in.ub.data()) : in.u.data(),
                           wb ? static_cast<const void*>(in.gub.data()) : in.gu.data(),
                           wb ? static_cast<const void*>(in.dnb.data()) : in.dn.data(), in.gain.data(), in.w.data(),
                           in.ids.data()};
    for (int k = 0; k < 2; ++k) {
      ASSERT_NO_FATAL_FAILURE(run_experts(*be[k], call, got[k]));
    }
    EXPECT_EQ(0, std::memcmp(got[0].data(), got[1].data(), got[0].size()))
        << "T " << c.T << " E " << c.E << " top " << c.K << " Hm " << c.Hm << " I " << c.I << " base " << c.base
        << " w " << dtype_label(c.wdt) << ": the cluster combine differs from the block combine"
        << (ab ? std::string() : ": " + describe_f32_difference(got[0], got[1]));
  }
}

// moe_route groups its ids for moe_experts (the per-tile rule: decode), so
// that on a side branch the grouping runs beside the pre-expert product.
// Experts of those ids give the bits of experts that group the same ids
// themselves (a second route's ids: the grouping is the last route's only),
// from 1 to 64 rows, on a side branch and not, BF16 and F32 weights, with
// the experts' tile rows spanning more than one 8-pair tile.
TEST_P(Moe, RoutesGroupingGivesTheBitsOfTheExpertsOwn) {
  const ExpertCase cases[] = {{1, 256, 8, 128, 64, DType::BF16}, {5, 16, 4, 72, 40, DType::F32},
                              {64, 128, 8, 64, 32, DType::BF16}, {17, 256, 8, 64, 32, DType::BF16}};
  uint32_t seed = 7000;
  for (const auto& c : cases)
    for (bool side : {false, true}) {
      const std::string what = "T " + std::to_string(c.T) + " E " + std::to_string(c.E) + (side ? " side" : "");
      auto z = random_floats(static_cast<size_t>(c.T * c.E), ++seed, 2.0f);
      auto u = random_floats(static_cast<size_t>(c.T * c.Hm), ++seed);
      auto gu = random_floats(static_cast<size_t>(c.E * 2 * c.I * c.Hm), ++seed, 0.1f);
      auto dn = random_floats(static_cast<size_t>(c.E * c.Hm * c.I), ++seed, 0.1f);
      auto gain = random_floats(static_cast<size_t>(c.Hm), ++seed, 0.3f, 1.0f);
      Tensor tz = up(DType::F32, {c.T, c.E}, z), tu = up(act(), {c.T, c.Hm}, u);
      Tensor tgu = up(c.wdt, {c.E, 2 * c.I, c.Hm}, gu), tdn = up(c.wdt, {c.E, c.Hm, c.I}, dn);
      Tensor tg = up(DType::F32, {c.Hm}, gain);
      Tensor own_ids = poisoned(DType::I32, {c.T, c.K}), own_w = poisoned(DType::F32, {c.T, c.K});
      Tensor ids = poisoned(DType::I32, {c.T, c.K}), w = poisoned(DType::F32, {c.T, c.K});
      Tensor own = poisoned(act(), {c.T, c.Hm}), planned = poisoned(act(), {c.T, c.Hm});
      b().moe_route(own_ids, own_w, tz, Tensor{}, 1.0f, 1.0f);
      if (side) b().begin_side();
      b().moe_route(ids, w, tz, Tensor{}, 1.0f, 1.0f);
      if (side) b().end_side(), b().join_side();
      b().moe_experts(own, tu, tgu, tdn, tg, own_ids, own_w, 1e-6f);  // not the last route's ids: groups them itself
      b().moe_experts(planned, tu, tgu, tdn, tg, ids, w, 1e-6f);
      run();
      EXPECT_EQ(get_bytes(own_ids), get_bytes(ids)) << what;
      EXPECT_EQ(get_bytes(own), get_bytes(planned)) << what << ": the route's grouping changed the experts' bits";
    }
}

TEST_P(Moe, BadExpertIdIsAnError) {
  const ExpertCase c{2, 4, 2, 16, 8, DType::BF16};
  auto u = random_floats(32, 1), gu = random_floats(static_cast<size_t>(4 * 16 * 16), 2), dn = random_floats(static_cast<size_t>(4 * 16 * 8), 3);
  auto gain = random_floats(16, 4, 0.1f, 1.0f), w = random_floats(4, 5);
  Tensor tu = up(act(), {2, 16}, u), tgu = up(c.wdt, {4, 16, 16}, gu), tdn = up(c.wdt, {4, 16, 8}, dn),
         tg = up(DType::F32, {16}, gain), tw = up(DType::F32, {2, 2}, w);
  Tensor tids = up_i32({2, 2}, {0, 1, 2, 4});
  Tensor out = poisoned(act(), {2, 16});
  b().moe_experts(out, tu, tgu, tdn, tg, tids, tw, 1e-6f);
  Status s = b().execute();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("moe_experts"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("expert id 4"), std::string::npos) << s.message();
}

INSTANTIATE_TEST_SUITE_P(Act, Moe, ::testing::Values(DType::F32, DType::BF16), param_name);

// Prints the per-op error table (max |got - want| and max error / tolerance).
class ErrorReport : public ::testing::Environment {
 public:
  void TearDown() override {
    if (ErrorTable::get().rows.empty()) return;
    std::printf("\n%-30s %12s %14s %12s\n", "op", "checked", "max |err|", "max err/tol");
    for (const auto& [op, r] : ErrorTable::get().rows)
      std::printf("%-30s %12ld %14.3e %12.3f\n", op.c_str(), r.checked, r.max_abs, r.max_ratio);
  }
};
const auto* const kReport = ::testing::AddGlobalTestEnvironment(new ErrorReport);

}  // namespace
}  // namespace muse::cuda_testing
