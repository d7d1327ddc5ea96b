// Lossless acceptance: a toy Markov target and a different toy drafter over
// a vocabulary of 4; 10^6 generations of 3 tokens each, drafting blocks of 3;
// the joint distribution of the 3 output tokens must match the target's
// (χ² over 64 cells) for each acceptance mode at T ∈ {0.7, 1}.
#include <gtest/gtest.h>

#include <array>
#include <cmath>

#include "muse/speculative/acceptance.h"
#include "muse/speculative/keyed_random.h"

namespace muse {
namespace {

constexpr int V = 4, kDrafts = 3, kLen = 3;

using Table = std::array<std::array<double, V>, V>;

Table softmax_table(const double (&logits)[V][V], double T) {
  Table t{};
  for (int a = 0; a < V; ++a) {
    double s = 0;
    for (int b = 0; b < V; ++b) s += t[a][b] = std::exp(logits[a][b] / T);
    for (int b = 0; b < V; ++b) t[a][b] /= s;
  }
  return t;
}

enum class Mode { StandardProbabilistic, StandardGreedyDraft, BlockProbabilistic, BlockGreedyDraft };

double chi2(Mode mode, double T, int draws) {
  const double target_logits[V][V] = {{1.0, 0.2, -0.5, 0.3}, {0.1, 1.2, 0.4, -1.0}, {-0.3, 0.0, 0.9, 0.5}, {0.6, -0.2, 0.1, 0.0}};
  const double draft_logits[V][V] = {{0.8, 0.6, -0.2, 0.0}, {0.5, 0.7, 0.2, -0.5}, {0.0, -0.4, 1.3, 0.2}, {0.2, 0.3, 0.0, 0.4}};
  const Table P = softmax_table(target_logits, T), Qt = softmax_table(draft_logits, T);
  const bool greedy_draft = mode == Mode::StandardGreedyDraft || mode == Mode::BlockGreedyDraft;
  const bool block = mode == Mode::BlockProbabilistic || mode == Mode::BlockGreedyDraft;
  std::vector<double> counts(V * V * V, 0.0);
  uint64_t serial = 0;
  // Buffers kept across draws (the loop runs 10^6 times).
  std::vector<int32_t> out, x(kDrafts), emitted;
  std::vector<std::vector<float>> qrows(kDrafts);
  std::vector<std::vector<double>> prow(kDrafts + 1);
  std::vector<std::span<const float>> qs;
  std::vector<double> u(kDrafts);
  for (int d = 0; d < draws; ++d) {
    out.clear();
    int32_t anchor = 0;
    while (int(out.size()) < kLen) {
      const uint64_t key = ++serial;
      // Draft a block from Q (or its argmax), the Markov chain from the anchor.
      int32_t prev = anchor;
      for (int i = 0; i < kDrafts; ++i) {
        std::vector<float>& q = qrows[size_t(i)];
        q.assign(Qt[size_t(prev)].begin(), Qt[size_t(prev)].end());
        if (greedy_draft) {
          x[size_t(i)] = int32_t(std::max_element(q.begin(), q.end()) - q.begin());
          q.clear();  // one-hot
        } else {
          x[size_t(i)] = draw_from(std::span<const float>(q), keyed_uniform(key, i, kDraftStream));
        }
        prev = x[size_t(i)];
      }
      for (int i = 0; i <= kDrafts; ++i) {
        const int32_t ctx = i == 0 ? anchor : x[size_t(i - 1)];
        prow[size_t(i)].assign(P[size_t(ctx)].begin(), P[size_t(ctx)].end());
      }
      emitted.clear();
      if (block) {
        qs.clear();
        for (auto& q : qrows) qs.emplace_back(q);
        for (int i = 0; i < kDrafts; ++i) u[size_t(i)] = keyed_uniform(key, i, kAcceptStream);
        const BlockVerdict v = verify_block(prow, qs, x, u, keyed_uniform(key, 0, kResidualStream));
        for (int i = 0; i < v.accepted; ++i) emitted.push_back(x[size_t(i)]);
        emitted.push_back(v.bonus);
      } else {
        int i = 0;
        for (; i < kDrafts; ++i) {
          const TokenVerdict t = verify_token(prow[size_t(i)], qrows[size_t(i)], x[size_t(i)],
                                              keyed_uniform(key, i, kAcceptStream), keyed_uniform(key, i, kResidualStream));
          emitted.push_back(t.token);
          if (!t.accepted) break;
        }
        if (i == kDrafts)
          emitted.push_back(draw_from(std::span<const double>(prow[kDrafts]), keyed_uniform(key, kDrafts, kResidualStream)));
      }
      for (int32_t t : emitted) out.push_back(t);
      anchor = emitted.back();
    }
    counts[size_t(out[0] * V * V + out[1] * V + out[2])] += 1;
  }
  double c2 = 0;
  for (int a = 0; a < V; ++a)
    for (int b = 0; b < V; ++b)
      for (int c = 0; c < V; ++c) {
        const double e = draws * P[0][size_t(a)] * P[size_t(a)][size_t(b)] * P[size_t(b)][size_t(c)];
        const double o = counts[size_t(a * V * V + b * V + c)];
        c2 += (o - e) * (o - e) / e;
      }
  return c2;
}

// 63 degrees of freedom: the 0.999 quantile of χ²(63) is 103.4.
constexpr double kChi2Limit = 103.4;
constexpr int kDraws = 1000000;

TEST(Acceptance, StandardProbabilisticIsLossless) {
  for (double T : {0.7, 1.0}) EXPECT_LT(chi2(Mode::StandardProbabilistic, T, kDraws), kChi2Limit) << "T=" << T;
}
TEST(Acceptance, StandardGreedyDraftIsLossless) {
  for (double T : {0.7, 1.0}) EXPECT_LT(chi2(Mode::StandardGreedyDraft, T, kDraws), kChi2Limit) << "T=" << T;
}
TEST(Acceptance, BlockProbabilisticIsLossless) {
  for (double T : {0.7, 1.0}) EXPECT_LT(chi2(Mode::BlockProbabilistic, T, kDraws), kChi2Limit) << "T=" << T;
}
TEST(Acceptance, BlockGreedyDraftIsLossless) {
  for (double T : {0.7, 1.0}) EXPECT_LT(chi2(Mode::BlockGreedyDraft, T, kDraws), kChi2Limit) << "T=" << T;
}

// The test has power: a biased rule (accepting every draft) fails it.
TEST(Acceptance, ChiSquareDetectsALossyRule) {
  // Drafts from Q accepted unconditionally would give Q's joint: check that
  // Q's joint is far from P's under the same statistic.
  const double target_logits[V][V] = {{1.0, 0.2, -0.5, 0.3}, {0.1, 1.2, 0.4, -1.0}, {-0.3, 0.0, 0.9, 0.5}, {0.6, -0.2, 0.1, 0.0}};
  const double draft_logits[V][V] = {{0.8, 0.6, -0.2, 0.0}, {0.5, 0.7, 0.2, -0.5}, {0.0, -0.4, 1.3, 0.2}, {0.2, 0.3, 0.0, 0.4}};
  const Table P = softmax_table(target_logits, 1.0), Q = softmax_table(draft_logits, 1.0);
  double c2 = 0;
  for (int a = 0; a < V; ++a)
    for (int b = 0; b < V; ++b)
      for (int c = 0; c < V; ++c) {
        const double e = kDraws * P[0][size_t(a)] * P[size_t(a)][size_t(b)] * P[size_t(b)][size_t(c)];
        const double o = kDraws * Q[0][size_t(a)] * Q[size_t(a)][size_t(b)] * Q[size_t(b)][size_t(c)];
        c2 += (o - e) * (o - e) / e;
      }
  EXPECT_GT(c2, 100 * kChi2Limit);
}

}  // namespace
}  // namespace muse
