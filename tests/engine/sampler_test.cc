// The sampler: greedy ties, the sampled-vocabulary mask, seeds, top-k/top-p,
// and the empirical distribution against softmax(logits / T).
#include <gtest/gtest.h>

#include <cmath>
#include <map>

#include "muse/sampling/sampler.h"

namespace muse {
namespace {

TEST(Sampler, GreedyTiesGoToTheLowerIdAndMaskedIdsNeverWin) {
  std::vector<float> l = {0.5f, 2.0f, 2.0f, -1.0f, 9.0f};
  EXPECT_EQ(argmax(l, 5), 4);
  EXPECT_EQ(argmax(l, 4), 1);  // id 4 is beyond the sampled vocabulary
  Sampler s({0.0, 0, 1.0, 0});
  EXPECT_EQ(s.sample(l, 4), 1);
  Sampler hot({5.0, 0, 1.0, 3});
  for (int i = 0; i < 500; ++i) EXPECT_LT(hot.sample(l, 4), 4);
}

TEST(Sampler, SameSeedSameTokensDifferentSeedDifferent) {
  std::vector<float> l;
  for (int i = 0; i < 50; ++i) l.push_back(float(std::sin(i * 1.7)));
  auto draw = [&](uint64_t seed) {
    Sampler s({1.0, 0, 1.0, seed});
    std::vector<int32_t> v;
    for (int i = 0; i < 64; ++i) v.push_back(s.sample(l, 50));
    return v;
  };
  EXPECT_EQ(draw(7), draw(7));
  EXPECT_NE(draw(7), draw(8));
}

TEST(Sampler, TopKOneAndTinyTopPAreGreedy) {
  std::vector<float> l = {0.1f, 0.3f, 3.0f, 0.2f};
  Sampler k1({1.0, 1, 1.0, 1}), p0({1.0, 0, 1e-6, 1});
  for (int i = 0; i < 100; ++i) {
    EXPECT_EQ(k1.sample(l, 4), 2);
    EXPECT_EQ(p0.sample(l, 4), 2);
  }
  Sampler k2({1.0, 2, 1.0, 9});
  for (int i = 0; i < 300; ++i) {
    int32_t t = k2.sample(l, 4);
    EXPECT_TRUE(t == 2 || t == 1) << t;
  }
}

TEST(Sampler, FrequenciesFollowSoftmaxOverTemperature) {
  std::vector<float> l = {1.0f, 0.0f, -0.5f, 2.0f};
  const double T = 0.7;
  Sampler s({T, 0, 1.0, 1234});
  std::map<int32_t, int> count;
  const int n = 40000;
  for (int i = 0; i < n; ++i) ++count[s.sample(l, 4)];
  double z = 0;
  for (float x : l) z += std::exp(x / T);
  for (int i = 0; i < 4; ++i) {
    double p = std::exp(l[size_t(i)] / T) / z;
    EXPECT_NEAR(double(count[i]) / n, p, 4 * std::sqrt(p * (1 - p) / n) + 1e-3) << i;
  }
}

TEST(Sampler, ParameterValidation) {
  EXPECT_FALSE(validate({-1.0, 0, 1.0, 0}).ok());
  EXPECT_FALSE(validate({NAN, 0, 1.0, 0}).ok());
  EXPECT_FALSE(validate({1.0, -2, 1.0, 0}).ok());
  EXPECT_FALSE(validate({1.0, 0, 0.0, 0}).ok());
  EXPECT_FALSE(validate({1.0, 0, 1.5, 0}).ok());
  EXPECT_TRUE(validate({0.0, 0, 1.0, 0}).ok());
}

}  // namespace
}  // namespace muse
