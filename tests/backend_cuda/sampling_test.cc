// sample_rows on the GPU against the row definition, sample_row_host
// (sampling/row_sampling.h), on the same logits: the same token for every
// spec (greedy, temperature, top-k, top-p, min-p, edits, both logprob
// modes), the same top-logprob ids, logprobs within a few ulps (the device
// sums probabilities in tree order, the host in id order). Rows 1..64,
// vocabularies from tiny to Spark's 202,048, and a sampled vocabulary below
// the logits' width.
#include <chrono>
#include <cstdio>

#include "../support/row_sampling_cases.h"
#include "cuda_test_util.h"

namespace muse::cuda_testing {
namespace {

class Sampling : public CudaTest {};

// Runs `c` on the GPU; returns the results.
std::vector<RowSampleResult> run_on(CudaTest& t, const testing::RowSampleCase& c, double* seconds = nullptr) {
  Backend& b = t.b();
  const int64_t rows = int64_t(c.specs.size()), V = c.vocab;
  std::vector<float> logits = c.logits;
  Tensor tl = t.up(DType::F32, {rows, V}, logits);
  const std::vector<char> buf = c.buffer();
  auto specs = b.alloc(DType::U8, {int64_t(buf.size() + c.edits.size() * sizeof(float))});
  auto out = b.alloc(DType::U8, {rows * int64_t(sizeof(RowSampleResult))});
  EXPECT_TRUE(specs.ok() && out.ok());
  b.set_input(*specs, buf.data(), buf.size());
  const auto t0 = std::chrono::steady_clock::now();
  b.sample_rows(*out, tl, *specs, rows, int64_t(c.edits.size()));
  t.run();
  if (seconds) *seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<RowSampleResult> r(static_cast<size_t>(rows));
  EXPECT_TRUE(b.download(*out, r.data()).ok());
  return r;
}

void expect_same(const testing::RowSampleCase& c, const std::vector<RowSampleResult>& got, const std::string& what) {
  int mismatched = 0;
  for (size_t r = 0; r < c.specs.size(); ++r) {
    std::vector<float> row(c.logits.begin() + ptrdiff_t(r * size_t(c.vocab)),
                           c.logits.begin() + ptrdiff_t((r + 1) * size_t(c.vocab)));
    const RowSampleSpec& s = c.specs[r];
    const RowSampleResult want =
        sample_row_host(s, std::span<const RowEdit>(c.edits).subspan(size_t(s.edit_begin), size_t(s.edit_count)), row);
    const RowSampleResult& g = got[r];
    const std::string where = what + " row " + std::to_string(r) + " (flags " + std::to_string(s.flags) + ", top_k " +
                              std::to_string(s.top_k) + ", top_p " + std::to_string(s.top_p) + ", min_p " +
                              std::to_string(s.min_p) + ", logprobs " + std::to_string(s.top_logprobs) + ", u " +
                              std::to_string(s.uniform) + ")";
    if (g.id != want.id && ++mismatched <= 5) ADD_FAILURE() << where << ": token " << g.id << ", host " << want.id;
    if (s.top_logprobs < 0) continue;
    EXPECT_NEAR(g.logprob, want.logprob, 4e-6 * std::max(1.0f, std::fabs(want.logprob))) << where;
    ASSERT_EQ(g.top_count, want.top_count) << where;
    for (int j = 0; j < want.top_count; ++j) {
      EXPECT_EQ(g.top_id[j], want.top_id[j]) << where << " top " << j;
      EXPECT_NEAR(g.top_logprob[j], want.top_logprob[j], 4e-6 * std::max(1.0f, std::fabs(want.top_logprob[j])))
          << where << " top " << j;
    }
  }
  EXPECT_EQ(mismatched, 0) << what;
}

TEST_F(Sampling, MatchesTheHostDefinitionOnEverySpec) {
  for (int64_t V : {int64_t(37), int64_t(1000), int64_t(4099)})
    for (int rows : {1, 7, 64}) {
      const auto c = testing::make_row_sample_case(rows, V, uint32_t(V * 131 + rows));
      expect_same(c, run_on(*this, c), "V " + std::to_string(V) + " rows " + std::to_string(rows));
    }
}

TEST_F(Sampling, SparkVocabularyBatch64) {
  const auto c = testing::make_row_sample_case(64, 202048, 7);
  double s = 0;
  const auto got = run_on(*this, c, &s);
  std::printf("sample_rows: 64 rows of 202048 in %.3f ms (mixed specs)\n", s * 1e3);
  expect_same(c, got, "V 202048 rows 64");
}

// Plain argmax rows (greedy, no edits, no logprobs) in steps of up to 16
// rows take the multi-block pre-pass (argmax_slices_kernel): the host's id,
// ties to the lower id, across slice edges, with a sampled vocabulary
// below the width and a row of -inf; mixed in with a row that has logprobs
// (the full pass).
TEST_F(Sampling, PlainArgmaxOfFewRows) {
  for (int64_t V : {int64_t(37), int64_t(4099), int64_t(202048)})
    for (int rows : {1, 5, 16}) {
      testing::RowSampleCase c = testing::make_row_sample_case(rows, V, uint32_t(V + 17 * rows));
      c.edits.clear();
      for (int r = 0; r < rows; ++r) {
        RowSampleSpec& sp = c.specs[size_t(r)];
        sp.flags = kRowGreedy;
        sp.edit_begin = sp.edit_count = 0;
        sp.top_logprobs = r == 2 ? 3 : -1;
        sp.limit = int32_t(r % 2 ? V - 3 : V);
        float* x = c.logits.data() + int64_t(r) * V;
        const int64_t n = sp.limit;
        int64_t best = 0;
        for (int64_t i = 1; i < n; ++i)
          if (x[i] > x[best]) best = i;
        // Ties with the max on both sides of it and in another slice.
        if (r % 3 == 0) x[n - 1] = x[best], x[n / 2] = x[best];
        if (r % 3 == 1 && best > 0) x[0] = x[best];
        if (r == 3) std::fill(x, x + V, -INFINITY);
      }
      expect_same(c, run_on(*this, c), "plain argmax, V " + std::to_string(V) + " rows " + std::to_string(rows));
    }
}

// Many draws of one distribution: the device's draws are the host's draws
// (same variates), so their frequencies agree exactly, not just in law.
TEST_F(Sampling, SeededDrawsAgreeOverManyVariates) {
  testing::RowSampleCase c = testing::make_row_sample_case(64, 3001, 99);
  for (size_t r = 0; r < c.specs.size(); ++r) {
    RowSampleSpec& s = c.specs[r];
    s.flags &= ~uint32_t(kRowGreedy);
    s.inv_temperature = 1.0f;
    s.uniform = (double(r) + 0.5) / double(c.specs.size());
    std::copy(c.logits.begin(), c.logits.begin() + 3001, c.logits.begin() + ptrdiff_t(r * 3001));  // one distribution
  }
  expect_same(c, run_on(*this, c), "one row, 64 variates");
}

TEST_F(Sampling, BadRowIsAnErrorNamingTheOp) {
  testing::RowSampleCase c = testing::make_row_sample_case(2, 100, 3);
  c.specs[1].logit_row = 5;  // beyond the 2 rows
  std::vector<float> logits = c.logits;
  Tensor tl = up(DType::F32, {2, 100}, logits);
  const std::vector<char> buf = c.buffer();
  auto specs = b().alloc(DType::U8, {int64_t(buf.size() + c.edits.size() * 4)});
  auto out = b().alloc(DType::U8, {2 * int64_t(sizeof(RowSampleResult))});
  b().set_input(*specs, buf.data(), buf.size());
  b().sample_rows(*out, tl, *specs, 2, int64_t(c.edits.size()));
  Status st = b().execute();
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("sample_rows"), std::string::npos) << st.message();
}

}  // namespace
}  // namespace muse::cuda_testing
