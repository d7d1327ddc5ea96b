// moe_experts with expert_base on the CPU backend: two ranks each holding
// half the experts. A token whose slots all route into one half gets, from
// the rank holding that half, exactly the single-rank result, and exactly 0
// from the other; a token split between the halves gets the two parts of
// its sum (equal to the whole up to the order of one addition).
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "muse/backends/cpu/cpu_backend.h"

namespace muse {
namespace {

std::vector<float> randoms(size_t n, uint32_t seed, float scale) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<float> d(-scale, scale);
  std::vector<float> v(n);
  for (float& x : v) x = d(g);
  return v;
}

TEST(MoeExpertParallel, HalvesSkipTheOtherRanksSlots) {
  const int64_t T = 12, E = 8, K = 3, Hm = 32, I = 16, half = E / 2;
  CpuBackendOptions o;
  o.threads = 2;
  auto made = create_cpu_backend(o);
  ASSERT_TRUE(made.ok());
  Backend& b = **made;
  const auto u = randoms(size_t(T * Hm), 1, 1.0f), gu = randoms(size_t(E * 2 * I * Hm), 2, 0.2f),
             dn = randoms(size_t(E * Hm * I), 3, 0.2f), w = randoms(size_t(T * K), 5, 0.5f);
  std::vector<float> gain(size_t(Hm), 1.1f);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t k = 0; k < K; ++k) {
      if (t < 8) ids.push_back(int32_t((t % 2 ? half : 0) + (t + k) % half));  // all slots in one half
      else ids.push_back(int32_t((t + 3 * k) % E));                              // split between the halves
    }
  auto imp = [&](const std::vector<float>& v, std::initializer_list<int64_t> shape) {
    return b.import_weight(DType::F32, shape, v.data(), true).value();
  };
  Tensor tu = imp(u, {T, Hm}), tgu = imp(gu, {E, 2 * I, Hm}), tdn = imp(dn, {E, Hm, I}), tg = imp(gain, {Hm}),
         tw = imp(w, {T, K});
  Tensor tids = b.import_weight(DType::I32, {T, K}, ids.data(), true).value();
  Tensor whole = b.alloc(DType::F32, {T, Hm}).value(), lo = b.alloc(DType::F32, {T, Hm}).value(),
         hi = b.alloc(DType::F32, {T, Hm}).value();
  b.moe_experts(whole, tu, tgu, tdn, tg, tids, tw, 1e-6f);
  b.moe_experts(lo, tu, tgu.rows(0, half), tdn.rows(0, half), tg, tids, tw, 1e-6f, 0);
  b.moe_experts(hi, tu, tgu.rows(half, half), tdn.rows(half, half), tg, tids, tw, 1e-6f, half);
  ASSERT_TRUE(b.execute().ok());
  std::vector<float> rw(size_t(T * Hm)), rl(rw.size()), rh(rw.size());
  ASSERT_TRUE(b.download(whole, rw.data()).ok());
  ASSERT_TRUE(b.download(lo, rl.data()).ok());
  ASSERT_TRUE(b.download(hi, rh.data()).ok());
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < Hm; ++i) {
      const size_t at = size_t(t * Hm + i);
      if (t < 8) {
        EXPECT_EQ((t % 2 ? rh : rl)[at], rw[at]) << "token " << t;
        EXPECT_EQ((t % 2 ? rl : rh)[at], 0.0f) << "token " << t << ": another rank's slots not skipped";
      } else {
        EXPECT_NEAR(rl[at] + rh[at], rw[at], 1e-6f * (1.0f + std::fabs(rw[at]))) << "token " << t;
      }
    }
}

}  // namespace
}  // namespace muse
