// Speculative decoding end to end on muse-tiny and its DSpark drafter
// (models/muse-tiny/, skipped when absent): greedy output with the drafter
// is bitwise the output without it, for k = 1..4, batch 1 and 4, through a
// preemption, with penalties and logprobs, and past the 128-token sliding
// window (rejections roll back sliding rings). At T > 0 with greedy drafts
// and `standard` acceptance the output equals the non-speculative one for
// the same seed (the sampler's own stream decides each row).
#include <gtest/gtest.h>

#include <chrono>
#include <functional>

#include "muse/core/mapped_file.h"
#include "muse/engine/scheduler.h"
#include "muse/engine/token_collector.h"
#include "muse/engine/speculation.h"
#include "muse/tokenizer/tokenizer.h"

namespace muse {
namespace {

using namespace std::chrono_literals;
const char* kModel = "models/muse-tiny";
const char* kDrafter = "models/muse-tiny/drafter";


std::vector<std::vector<int32_t>> prompts() {
  auto tok = Tokenizer::from_file(std::string(kModel) + "/tokenizer.json");
  EXPECT_TRUE(tok.ok());
  std::vector<std::vector<int32_t>> out;
  for (const char* q : {"What is the capital of France?", "Tell me about owls and where they live.",
                        "What's the weather in Paris?", "Write a long story about a dragon and a knight."}) {
    auto ids = tok->encode(std::string("<|start|>user<|message|>") + q + "<|eom|><|start|>assistant", false);
    out.push_back(ids);
  }
  return out;
}

struct Outputs {
  std::vector<std::vector<int32_t>> tokens;
  std::vector<std::vector<float>> logprobs;
  SchedulerStats stats;
  int64_t preemptions = 0;
};

// Every prompt at once (the scheduler batches up to max_sequences of them).
// `count` prompts; `serial`: one request at a time (batch 1).
Outputs generate(Engine& e, SchedulerOptions so, const SamplingConfig& sc, int max_tokens, int logprobs = -1,
                 bool ignore_eos = false, size_t count = 4, bool serial = false,
                 std::function<std::unique_ptr<TokenConstraint>()> constraint = {}) {
  auto ps = prompts();
  ps.resize(std::min(ps.size(), count));
  Outputs out;
  std::vector<std::shared_ptr<TokenCollector>> cs;
  {
    Scheduler sched(e, so);
    for (size_t i = 0; i < ps.size(); ++i) {
      GenerationRequest r;
      r.id = "r" + std::to_string(i);
      r.prompt = ps[i];
      r.sampling = sc;
      r.sampling.seed = sc.seed.value_or(0) + i;
      r.max_tokens = max_tokens;
      r.logprobs = logprobs;
      r.ignore_eos = ignore_eos;
      r.make_constraint = constraint;
      auto c = std::make_shared<TokenCollector>();
      const auto sr = sched.submit(std::move(r), c);
      EXPECT_EQ(sr.status, Scheduler::SubmitStatus::Ok) << sr.message;
      if (sr.status != Scheduler::SubmitStatus::Ok) c->finish_without_running();
      cs.push_back(c);
      if (serial) c->wait();
    }
    for (auto& c : cs) c->wait();
    out.stats = sched.stats();
  }
  for (auto& c : cs) {
    out.tokens.push_back(c->tokens);
    out.logprobs.push_back(c->logprobs);
    out.preemptions += c->summary.preemptions;
  }
  return out;
}

class SpecDecode : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    if (!file_exists(std::string(kDrafter) + "/model.safetensors")) return;
    SpeculativeConfig sc;
    sc.enabled = true;
    sc.model = kDrafter;
    engine_ = open_engine(4, 0, &sc);
    auto d = load_drafter(sc, *engine_);
    ASSERT_TRUE(d.ok()) << d.message();
    drafter_ = *d;
  }
  static void TearDownTestSuite() {
    drafter_.reset();
    engine_.reset();
  }
  static std::unique_ptr<Engine> open_engine(int64_t seqs, int64_t pages, SpeculativeConfig* sc) {
    EngineOptions eo;
    eo.backend.cpu.threads = 2;
    eo.max_sequences = seqs;
    eo.max_model_len = 512;
    eo.kv_block_size = 16;
    eo.kv_pages = pages;
    EXPECT_TRUE(prepare_speculation(*sc, kModel, &eo).ok());
    auto e = Engine::open(kModel, eo);
    EXPECT_TRUE(e.ok()) << e.message();
    return std::move(e).value();
  }
  void SetUp() override {
    if (!engine_) GTEST_SKIP() << "models/muse-tiny/drafter is absent";
  }
  SchedulerOptions base() const {
    SchedulerOptions so;
    so.eos_token_ids = engine_->config().eos_token_ids.empty() ? std::vector<int32_t>{}
                                                               : std::vector<int32_t>(engine_->config().eos_token_ids.begin(),
                                                                                      engine_->config().eos_token_ids.end());
    so.sampled_vocab_size = 4096;
    return so;
  }
  SchedulerOptions spec(int k, bool adaptive = false) const {
    SchedulerOptions so = base();
    so.speculative.enabled = true;
    so.speculative.model = kDrafter;
    so.speculative.num_speculative_tokens = k;
    so.speculative.enable_adaptive_verification = adaptive;
    so.drafter = drafter_;
    return so;
  }
  static inline std::unique_ptr<Engine> engine_;
  static inline std::shared_ptr<const Drafter> drafter_;
};

double mean_accepted(const SchedulerStats& s) {
  return s.spec.drafts ? 1.0 + double(s.spec.accepted_tokens) / double(s.spec.drafts) : 0.0;
}

TEST_F(SpecDecode, GreedyIsBitwiseTheSameForEveryK) {
  SamplingConfig greedy;
  // Two sequences batched, past EOS (ignore_eos) so both run beyond the
  // 128-token sliding window (~20 prompt + 120 generated positions).
  const Outputs ref = generate(*engine_, base(), greedy, 120, 2, true, 2);
  for (int k = 1; k <= 4; ++k) {
    const Outputs got = generate(*engine_, spec(k), greedy, 120, 2, true, 2);
    EXPECT_EQ(got.tokens, ref.tokens) << "k=" << k;
    EXPECT_EQ(got.logprobs, ref.logprobs) << "k=" << k;
    EXPECT_GT(got.stats.spec.drafts, 0u);
    EXPECT_GT(got.stats.spec.accepted_tokens, 0u);
    // Some drafts are rejected too, so rollback is exercised.
    EXPECT_LT(got.stats.spec.accepted_tokens, got.stats.spec.draft_tokens);
    std::printf("k=%d: %llu verify steps, mean accepted length %.2f\n", k, (unsigned long long)got.stats.spec.drafts,
                mean_accepted(got.stats));
  }
}

TEST_F(SpecDecode, GreedyBatchOneIsBitwiseTheSame) {
  SamplingConfig greedy;
  const Outputs ref = generate(*engine_, base(), greedy, 48, -1, false, 4, true);
  for (int k : {1, 2, 3, 4}) EXPECT_EQ(generate(*engine_, spec(k), greedy, 48, -1, false, 4, true).tokens, ref.tokens) << k;
}

TEST_F(SpecDecode, GreedyAdaptiveIsBitwiseTheSame) {
  SamplingConfig greedy;
  const Outputs ref = generate(*engine_, base(), greedy, 64);
  const Outputs got = generate(*engine_, spec(4, true), greedy, 64);
  EXPECT_EQ(got.tokens, ref.tokens);
}

TEST_F(SpecDecode, PenaltiesApplyToDraftedTokens) {
  SamplingConfig sc;
  sc.repetition_penalty = 1.3;
  sc.frequency_penalty = 0.4;
  sc.presence_penalty = 0.2;
  const Outputs ref = generate(*engine_, base(), sc, 64);
  const Outputs got = generate(*engine_, spec(3), sc, 64);
  EXPECT_EQ(got.tokens, ref.tokens);
}

// A stateful constraint: after a token t, t and t + 1 are refused for the
// next 3 tokens (a stand-in for a grammar: drafts it forbids must be rejected
// and the constraint must see exactly the emitted tokens).
struct NoRecentRepeat : TokenConstraint {
  std::vector<int32_t> recent;
  bool allows(int32_t id) const override {
    for (int32_t r : recent)
      if (id == r || id == r + 1) return false;
    return true;
  }
  void accept(int32_t id) override {
    recent.push_back(id);
    if (recent.size() > 3) recent.erase(recent.begin());
  }
};

TEST_F(SpecDecode, ConstraintsApplyToDraftedTokens) {
  SamplingConfig greedy;
  auto make = [] { return std::make_unique<NoRecentRepeat>(); };
  const Outputs ref = generate(*engine_, base(), greedy, 64, 2, false, 2, false, make);
  const Outputs got = generate(*engine_, spec(4), greedy, 64, 2, false, 2, false, make);
  EXPECT_EQ(got.tokens, ref.tokens);
  EXPECT_EQ(got.logprobs, ref.logprobs);
  EXPECT_GT(got.stats.spec.accepted_tokens, 0u);
  for (const auto& t : got.tokens)
    for (size_t i = 1; i < t.size(); ++i) EXPECT_NE(t[i], t[i - 1]);
}

TEST_F(SpecDecode, SampledWithGreedyDraftsKeepsTheSeedsOutput) {
  SamplingConfig sc;
  sc.temperature = 0.8;
  sc.top_p = 0.95;
  sc.seed = 11;
  const Outputs ref = generate(*engine_, base(), sc, 64);
  const Outputs got = generate(*engine_, spec(4), sc, 64);
  EXPECT_EQ(got.tokens, ref.tokens);
}

TEST_F(SpecDecode, ProbabilisticModesRunAndAreDeterministic) {
  SamplingConfig sc;
  sc.temperature = 1.0;
  sc.seed = 3;
  for (auto mode : {RejectionSampleMethod::Standard, RejectionSampleMethod::Block}) {
    SchedulerOptions so = spec(4);
    so.speculative.draft_sample_method = DraftSampleMethod::Probabilistic;
    so.speculative.rejection_sample_method = mode;
    const Outputs a = generate(*engine_, so, sc, 32, -1, false, 2);
    const Outputs b = generate(*engine_, so, sc, 32, -1, false, 2);
    EXPECT_EQ(a.tokens, b.tokens);
    EXPECT_GT(a.stats.spec.accepted_tokens, 0u);
    for (const auto& t : a.tokens) EXPECT_FALSE(t.empty());
  }
}

TEST_F(SpecDecode, GreedyThroughPreemptionIsBitwiseTheSame) {
  SpeculativeConfig sc;
  sc.enabled = true;
  sc.model = kDrafter;
  // 4 sequences of ~20 + 120 positions in a pool that holds about one and a half.
  const int64_t one = engine_->kv_cache().pages_for_sequence(150);
  auto small = open_engine(4, one + one / 2, &sc);
  SamplingConfig greedy;
  const Outputs ref = generate(*engine_, base(), greedy, 120, -1, true, 4);
  SchedulerOptions so = spec(3);
  const Outputs got = generate(*small, so, greedy, 120, -1, true, 4);
  EXPECT_GT(got.preemptions, 0);
  EXPECT_GT(got.stats.spec.accepted_tokens, 0u);
  EXPECT_EQ(got.tokens, ref.tokens);
}

TEST(SpecConfig, ParsesVllmKeysAndNamesBadOnes) {
  auto ok = parse_speculative_config(R"({"method":"dspark","model":"d","num_speculative_tokens":3,)"
                                     R"("draft_sample_method":"probabilistic","rejection_sample_method":"block",)"
                                     R"("enable_adaptive_verification":true})");
  ASSERT_TRUE(ok.ok()) << ok.message();
  EXPECT_TRUE(ok->enabled);
  EXPECT_EQ(ok->num_speculative_tokens, 3);
  EXPECT_EQ(ok->draft_sample_method, DraftSampleMethod::Probabilistic);
  EXPECT_EQ(ok->rejection_sample_method, RejectionSampleMethod::Block);
  EXPECT_TRUE(ok->enable_adaptive_verification);
  EXPECT_FALSE(parse_speculative_config("").value().enabled);
  auto unknown = parse_speculative_config(R"({"method":"dspark","model":"d","num_spec_tokens":3})");
  ASSERT_FALSE(unknown.ok());
  EXPECT_NE(unknown.message().find("num_spec_tokens"), std::string::npos);
  auto value = parse_speculative_config(R"({"method":"eagle3","model":"d"})");
  ASSERT_FALSE(value.ok());
  EXPECT_NE(value.message().find("eagle3"), std::string::npos);
  auto mode = parse_speculative_config(R"({"method":"dspark","model":"d","rejection_sample_method":"typical"})");
  ASSERT_FALSE(mode.ok());
  EXPECT_NE(mode.message().find("typical"), std::string::npos);
  EXPECT_FALSE(parse_speculative_config(R"({"method":"dspark"})").ok());  // no model
  EXPECT_FALSE(parse_speculative_config(R"({"method":"dspark","model":"d","num_speculative_tokens":0})").ok());
  EXPECT_FALSE(parse_speculative_config(R"([1])").ok());
}

}  // namespace
}  // namespace muse
