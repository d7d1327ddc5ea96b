// Adaptive verify width on synthetic step-cost tables: for a fixed
// per-position acceptance profile the width pick_widths chooses gives
// tokens/s within 5% of the fastest width; on a MoE target whose verify
// rows each bring their own experts, expensive experts push it down to 2–3
// (seed 000's lesson) and cheap ones let it rise to the block.
#include <gtest/gtest.h>

#include <cmath>

#include "muse/speculative/verify_width.h"

namespace muse {
namespace {

// Distinct experts B rows route to when each picks k of E at random.
double distinct(int64_t rows, double E = 128, double k = 8) { return E * (1 - std::pow(1 - k / E, double(rows))); }

StepCostModel moe_model(double dense_seconds_per_row, double expert_seconds) {
  StepCostModel m;
  for (int64_t b = 1; b <= 16; ++b) {
    m.seconds.push_back(0.010 + dense_seconds_per_row * double(b));
    m.distinct_experts.push_back(distinct(b));
  }
  m.expert_seconds = expert_seconds;
  m.finish();
  return m;
}

// Expected tokens per second of one request verifying n drafts.
double throughput(const std::vector<float>& c, int n, const StepCostModel& m) {
  double tokens = 1, a = 1;
  for (int j = 0; j < n; ++j) tokens += (a *= c[size_t(j)]);
  return tokens / m.cost(1 + n);
}

void expect_near_best(const std::vector<float>& c, const StepCostModel& m, int* picked, int* best_out) {
  const std::vector<std::vector<float>> conf{c};
  const std::vector<int> caps{int(c.size())};
  const int w = pick_widths(conf, caps, 0, m)[0];
  int best = 0;
  for (int n = 1; n <= int(c.size()); ++n)
    if (throughput(c, n, m) > throughput(c, best, m)) best = n;
  EXPECT_GE(throughput(c, w, m), 0.95 * throughput(c, best, m)) << "picked " << w << ", fastest " << best;
  *picked = w;
  *best_out = best;
}

TEST(VerifyWidth, WithinFivePercentOfTheFastestWidth) {
  // Seed 000's profile: 0.7 per position gives 3.14 tokens per step at k = 7.
  const std::vector<float> seed000(7, 0.7f);
  const std::vector<float> decaying{0.93f, 0.85f, 0.8f, 0.72f, 0.6f, 0.5f, 0.4f};
  for (const auto& c : {seed000, decaying})
    for (double es : {0.0, 0.0005, 0.002, 0.01}) {
      int w = 0, best = 0;
      expect_near_best(c, moe_model(0.001, es), &w, &best);
    }
}

TEST(VerifyWidth, ExpensiveExpertsPullTheWidthDown) {
  const std::vector<float> c(7, 0.7f);
  int cheap = 0, costly = 0, best = 0;
  expect_near_best(c, moe_model(0.0002, 0.0), &cheap, &best);  // resident experts: rows are nearly free
  EXPECT_EQ(cheap, 7);
  // Experts streamed from host memory: an 8-row check costs ≈ 3.7 one-row steps (seed 000).
  StepCostModel host = moe_model(0.0002, 0.0012);
  EXPECT_NEAR(host.cost(8) / host.cost(1), 3.7, 0.4);
  expect_near_best(c, host, &costly, &best);
  EXPECT_GE(costly, 1);
  EXPECT_LE(costly, 3);
}

TEST(VerifyWidth, BatchSharesTheBudgetByConfidence) {
  // Two requests, one confident and one not: the confident one gets the wider verify.
  const std::vector<std::vector<float>> conf{{0.95f, 0.95f, 0.9f, 0.9f}, {0.3f, 0.2f, 0.2f, 0.1f}};
  const std::vector<int> caps{4, 4};
  const std::vector<int> w = pick_widths(conf, caps, 0, moe_model(0.001, 0.001));
  EXPECT_GT(w[0], w[1]);
  // Caps are respected.
  const std::vector<int> capped = pick_widths(conf, std::vector<int>{2, 0}, 0, moe_model(0.0, 0.0));
  EXPECT_LE(capped[0], 2);
  EXPECT_EQ(capped[1], 0);
}

TEST(VerifyWidth, ObservedExpertsFeedTheCost) {
  StepCostModel m;
  m.seconds = {1.0, 1.0, 1.0};
  m.expert_seconds = 0.1;
  m.observe_experts(1, 8);
  m.observe_experts(3, 20);
  EXPECT_DOUBLE_EQ(m.cost(1), 1.8);
  EXPECT_DOUBLE_EQ(m.cost(3), 3.0);
  m.observe_experts(3, 10, 0.5);
  EXPECT_DOUBLE_EQ(m.cost(3), 2.5);
}

}  // namespace
}  // namespace muse
