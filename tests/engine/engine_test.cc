// Engine/Session behaviour on tiny random models of both families:
// determinism (run to run, thread count, batch composition), KV rings over
// more than three windows, block bookkeeping, and clear errors.
#include <algorithm>
#include <cstring>

#include "engine_test_util.h"
#include "muse/sampling/sequence_sampler.h"

namespace muse::testing {
namespace {

class BothFamilies : public ::testing::TestWithParam<bool> {};

// Greedy and seeded sampling: two independent runs give the same ids.
std::vector<int32_t> generate(Engine& e, const std::vector<int32_t>& prompt, int n, const SamplingConfig& sc,
                              std::vector<float>* all_logits = nullptr) {
  auto s = e.new_session();
  EXPECT_TRUE(s.ok());
  auto logits = (*s)->feed(prompt);
  EXPECT_TRUE(logits.ok());
  SequenceSampler sampler(sc, e.config().sampled_vocab_size);
  std::vector<int32_t> out;
  for (int i = 0; i < n; ++i) {
    if (all_logits) all_logits->insert(all_logits->end(), logits->begin(), logits->end());
    out.push_back(sampler.sample(*logits).id);
    sampler.accept(out.back());
    logits = (*s)->feed(std::span<const int32_t>(&out.back(), 1));
    EXPECT_TRUE(logits.ok()) << (logits.ok() ? "" : logits.message());
  }
  return out;
}

TEST_P(BothFamilies, RunToRunAndThreadCountIdentical) {
  const bool spark = GetParam();
  auto prompt = some_tokens(19);
  for (double temperature : {0.0, 0.8}) {
    SamplingConfig sp;
    sp.temperature = temperature, sp.seed = 42;
    std::vector<float> l1, l2, l3;
    auto e1 = tiny_engine(spark, 2), e2 = tiny_engine(spark, 2), e3 = tiny_engine(spark, 1);
    auto a = generate(*e1, prompt, 24, sp, &l1);
    auto b = generate(*e2, prompt, 24, sp, &l2);
    auto c = generate(*e3, prompt, 24, sp, &l3);
    EXPECT_EQ(a, b);
    EXPECT_EQ(a, c);
    EXPECT_TRUE(bits_equal(l1, l2)) << "run to run";
    EXPECT_TRUE(bits_equal(l1, l3)) << "1 vs 2 threads";
  }
}

// The ring keeps exactly the window (4): decoding token by token for 21
// positions (more than five windows) gives the same bits as one prefill of
// all positions, where every key comes straight from the step.
TEST_P(BothFamilies, RingDecodeLongerThanThreeWindowsEqualsFullPrefill) {
  const bool spark = GetParam();
  auto e = tiny_engine(spark, 2);
  auto tokens = some_tokens(21, 3);
  auto full = e->new_session();
  auto all = (*full)->feed(tokens, LogitsWanted::All);
  ASSERT_TRUE(all.ok());
  full->reset();
  auto inc = e->new_session();
  std::vector<float> rows;
  for (int32_t t : tokens) {
    auto r = (*inc)->feed(std::span<const int32_t>(&t, 1));
    ASSERT_TRUE(r.ok()) << r.message();
    rows.insert(rows.end(), r->begin(), r->end());
  }
  EXPECT_TRUE(bits_equal(*all, rows));
  EXPECT_EQ((*inc)->length(), 21);
}

// Two sequences in one step (a prefill chunk and a decode token) give the
// same bits as running each alone.
TEST_P(BothFamilies, BatchCompositionChangesNothing) {
  const bool spark = GetParam();
  EngineOptions o;
  o.max_sequences = 3;
  auto e = tiny_engine(spark, 2, o);
  auto pa = some_tokens(9, 1), pb = some_tokens(6, 2), more = some_tokens(7, 4);
  // Alone.
  std::vector<float> alone_a, alone_b;
  {
    auto a = e->new_session();
    ASSERT_TRUE((*a)->feed(pa).ok());
    alone_a = *(*a)->feed(more, LogitsWanted::All);
    auto b = e->new_session();
    ASSERT_TRUE((*b)->feed(pb).ok());
    alone_b = *(*b)->feed(std::span<const int32_t>(more.data(), 1));
  }
  // Together: a's chunk of 7 and b's one decode token in the same step.
  auto a = e->new_session();
  auto b = e->new_session();
  ASSERT_TRUE((*a)->feed(pa).ok());
  ASSERT_TRUE((*b)->feed(pb).ok());
  StepItem items[] = {{a->get(), more, LogitsWanted::All}, {b->get(), std::span<const int32_t>(more.data(), 1)}};
  ASSERT_TRUE(e->step(items).ok());
  auto la = e->logits(0), lb = e->logits(1);
  EXPECT_TRUE(bits_equal(std::vector<float>(la.begin(), la.end()), alone_a));
  EXPECT_TRUE(bits_equal(std::vector<float>(lb.begin(), lb.end()), alone_b));
  EXPECT_EQ((*a)->length(), 16);
  EXPECT_EQ((*b)->length(), 7);
}

INSTANTIATE_TEST_SUITE_P(Engine, BothFamilies, ::testing::Values(false, true),
                         [](const ::testing::TestParamInfo<bool>& i) { return i.param ? "spark" : "glimmer"; });

// With record_experts, every step counts the distinct experts its rows
// route to in each sparse layer (all sparse layers' ids come down in one
// copy): one row routes to exactly top-k experts a layer, T rows to
// between top-k and min(E, T·top-k); the count does not depend on the
// engine's row capacity, and a step without recording counts nothing.
TEST(EngineExperts, DistinctExpertsAreEachSparseLayersOwn) {
  EngineOptions small, large;
  small.record_experts = large.record_experts = true;
  small.max_batch_tokens = 16, large.max_batch_tokens = 64;
  auto a = tiny_engine(true, 2, small), b = tiny_engine(true, 2, large), none = tiny_engine(true, 2);
  ASSERT_TRUE(a && b && none);
  const ModelConfig& c = a->config();
  ASSERT_GT(c.num_experts, c.num_experts_per_tok);
  const double k = double(c.num_experts_per_tok), E = double(c.num_experts);
  for (size_t rows : {size_t(1), size_t(5), size_t(12)}) {
    const auto tokens = some_tokens(rows, int32_t(rows));
    double counts[2];
    Engine* engines[2] = {a.get(), b.get()};
    for (int i = 0; i < 2; ++i) {
      auto s = engines[i]->new_session();
      ASSERT_TRUE(s.ok() && (*s)->feed(tokens).ok());
      counts[i] = engines[i]->distinct_experts();
    }
    EXPECT_EQ(counts[0], counts[1]) << rows << " rows";
    if (rows == 1) EXPECT_EQ(counts[0], k);
    EXPECT_GE(counts[0], k) << rows << " rows";
    EXPECT_LE(counts[0], std::min(E, double(rows) * k)) << rows << " rows";
  }
  auto s = none->new_session();
  ASSERT_TRUE(s.ok() && (*s)->feed(some_tokens(5)).ok());
  EXPECT_EQ(none->distinct_experts(), 0.0);
}

TEST(EngineErrors, BadInputIsAClearError) {
  EngineOptions o;
  o.max_model_len = 10;
  o.max_batch_tokens = 8;
  auto e = tiny_engine(true, 1, o);
  auto s = e->new_session();
  ASSERT_TRUE(s.ok());
  std::vector<int32_t> bad = {5, 97};
  auto r = (*s)->feed(bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("97"), std::string::npos) << r.message();
  EXPECT_EQ((*s)->length(), 0) << "a failed step advances nothing";
  auto r2 = (*s)->feed(some_tokens(11));
  ASSERT_FALSE(r2.ok());
  EXPECT_NE(r2.message().find("max_model_len"), std::string::npos) << r2.message();
  // max_sequences = 1 by default.
  auto s2 = e->new_session();
  ASSERT_FALSE(s2.ok());
  EXPECT_NE(s2.message().find("slots"), std::string::npos) << s2.message();
  // A session twice in one step; more than max_batch_tokens.
  auto t = some_tokens(3);
  StepItem twice[] = {{s->get(), t}, {s->get(), t}};
  EXPECT_FALSE(e->step(twice).ok());
  auto nine = some_tokens(9);
  StepItem big[] = {{s->get(), nine}};
  Status st = e->step(big);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("max_batch_tokens"), std::string::npos) << st.message();
}

TEST(EngineKv, PagesAreReturnedAndFullPoolIsAnError) {
  // Tiny: 2 full + 4 sliding layers, so a page is 2 layers' block: a full
  // block is 1 page, a sliding block 2. Window 4, blocks of 4, no rollback
  // margin: a sequence keeps the sliding blocks covering its last 3 positions.
  EngineOptions o;
  o.max_sequences = 2;
  o.kv_pages = 10;
  o.kv_max_rollback = 0;
  o.max_model_len = 64;
  auto e = tiny_engine(false, 1, o);
  const KvCache& kv = e->kv_cache();
  EXPECT_EQ(kv.geometry().full_pages_per_block, 1);
  EXPECT_EQ(kv.geometry().sliding_pages_per_block, 2);
  EXPECT_EQ(kv.available_pages(), 10);
  {
    auto a = e->new_session();
    ASSERT_TRUE((*a)->feed(some_tokens(13)).ok());  // 4 full blocks + sliding blocks 2, 3
    EXPECT_EQ(kv.available_pages(), 2);
    EXPECT_EQ(kv.geometry().pages_for(13), 8);
    auto b = e->new_session();
    auto r = (*b)->feed(some_tokens(5));  // needs 2 full + 2 sliding blocks: 6 pages
    ASSERT_FALSE(r.ok());
    EXPECT_NE(r.message().find("KV cache full"), std::string::npos) << r.message();
  }
  EXPECT_EQ(kv.available_pages(), 10);
  EXPECT_EQ(kv.free_sequences(), 2);
  // A step that does not fit grows no table (all or nothing).
  auto a = e->new_session();
  auto b = e->new_session();
  ASSERT_TRUE((*a)->feed(some_tokens(15)).ok());  // 4 full + 1 sliding block: 6 pages
  EXPECT_EQ(kv.available_pages(), 4);
  auto one = some_tokens(2), five = some_tokens(5);
  StepItem items[] = {{a->get(), one}, {b->get(), five}};  // a needs 1 + 2 more, b 6
  Status st = e->step(items);
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.message().find("KV cache full"), std::string::npos) << st.message();
  EXPECT_EQ(kv.available_pages(), 4);
  EXPECT_EQ((*a)->length(), 15);
}

}  // namespace
}  // namespace muse::testing
