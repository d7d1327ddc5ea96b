// The sampling primitives: the greedy choice (ties, the sampled-vocabulary
// limit) and the seeded generator. Sampling itself: sequence_sampler_test.cc.
#include <gtest/gtest.h>

#include <vector>

#include "muse/sampling/sequence_sampler.h"

namespace muse {
namespace {

TEST(Argmax, TiesGoToTheLowerIdAndIdsBeyondTheLimitNeverWin) {
  std::vector<float> l = {0.5f, 2.0f, 2.0f, -1.0f, 9.0f};
  EXPECT_EQ(argmax(l, 5), 4);
  EXPECT_EQ(argmax(l, 4), 1);  // id 4 is beyond the sampled vocabulary
  EXPECT_EQ(argmax(l, 100), 4);
}

TEST(Rng, SameSeedSameStreamDifferentSeedDifferentUniformInUnitInterval) {
  Rng a(7), b(7), c(8);
  bool differs = false;
  for (int i = 0; i < 1000; ++i) {
    const double x = a.uniform();
    EXPECT_EQ(x, b.uniform());
    differs |= x != c.uniform();
    EXPECT_GE(x, 0.0);
    EXPECT_LT(x, 1.0);
  }
  EXPECT_TRUE(differs);
}

TEST(SequenceSampler, TopKOneAndTinyTopPAreGreedy) {
  SamplingConfig k1, p0, k2;
  k1.temperature = p0.temperature = k2.temperature = 1.0;
  k1.top_k = 1, k1.seed = 1;
  p0.top_p = 1e-6, p0.seed = 1;
  k2.top_k = 2, k2.seed = 9;
  SequenceSampler sk1(k1, 4), sp0(p0, 4), sk2(k2, 4);
  const std::vector<float> l = {0.1f, 0.3f, 3.0f, 0.2f};
  for (int i = 0; i < 100; ++i) {
    std::vector<float> a = l, b = l;
    EXPECT_EQ(sk1.sample(a).id, 2);
    EXPECT_EQ(sp0.sample(b).id, 2);
  }
  for (int i = 0; i < 300; ++i) {
    std::vector<float> x = l;
    const int32_t t = sk2.sample(x).id;
    EXPECT_TRUE(t == 2 || t == 1) << t;
  }
}

}  // namespace
}  // namespace muse
