// The continuous-batching scheduler on tiny random models: outputs under load,
// with chunked prefill, queueing and preemption equal each request run alone
// (computed here without the scheduler); n > 1 seeds; stops; cancellation;
// admission errors; prompt logprobs.
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <mutex>
#include <random>

#include "engine_test_util.h"
#include "muse/backends/factory/backend_factory.h"
#include "muse/engine/scheduler.h"

namespace muse::testing {
namespace {

using namespace std::chrono_literals;

struct Collector : RequestObserver {
  explicit Collector(int n = 1) : tokens(size_t(n)), finish(size_t(n), SeqFinish::None), stop_token(size_t(n)) {}
  bool on_update(const SequenceUpdate& u) override {
    std::lock_guard lock(mu);
    if (u.token) tokens[size_t(u.index)].push_back(u.token->id);
    if (u.token && u.token->has_logprobs) logprobs.push_back(u.token->logprob);
    if (u.prompt_logprobs) prompt_logprobs = *u.prompt_logprobs;
    finish[size_t(u.index)] = u.finish;
    stop_token[size_t(u.index)] = u.stop_token;
    ++updates;
    cv.notify_all();
    if (stop_after > 0 && int(tokens[size_t(u.index)].size()) >= stop_after) {
      observer_stopped = true;
      return true;
    }
    return false;
  }
  void on_complete(const RequestSummary& s) override {
    std::lock_guard lock(mu);
    ++completions;
    summary = s;
    cv.notify_all();
  }
  bool wait(std::chrono::seconds limit = 60s) {
    std::unique_lock lock(mu);
    return cv.wait_for(lock, limit, [&] { return completions > 0; });
  }
  void wait_tokens(size_t n) {
    std::unique_lock lock(mu);
    cv.wait_for(lock, 60s, [&] { return tokens[0].size() >= n || completions > 0; });
  }

  std::mutex mu;
  std::condition_variable cv;
  std::vector<std::vector<int32_t>> tokens;
  std::vector<SeqFinish> finish;
  std::vector<std::optional<int32_t>> stop_token;
  std::vector<float> logprobs;
  std::vector<PromptTokenLogprob> prompt_logprobs;
  int updates = 0, completions = 0, stop_after = -1;
  bool observer_stopped = false;
  RequestSummary summary;
};

// The request alone, without the scheduler: Session::feed + the same sampler.
std::vector<int32_t> alone(Engine& e, const std::vector<int32_t>& prompt, SamplingConfig sc, int max_tokens,
                           const std::vector<int32_t>& stops = {}) {
  auto s = e.new_session();
  EXPECT_TRUE(s.ok());
  SequenceSampler sampler(sc, e.config().sampled_vocab_size);
  sampler.set_prompt(prompt);
  auto logits = (*s)->feed(prompt);
  std::vector<int32_t> out;
  for (;;) {
    int32_t t = sampler.sample(*logits).id;
    sampler.accept(t);
    out.push_back(t);
    if (int(out.size()) >= max_tokens || std::find(stops.begin(), stops.end(), t) != stops.end()) break;
    logits = (*s)->feed(std::span<const int32_t>(&t, 1));
    EXPECT_TRUE(logits.ok());
  }
  return out;
}

GenerationRequest request(const std::string& id, std::vector<int32_t> prompt, int max_tokens, SamplingConfig sc = {}) {
  GenerationRequest r;
  r.id = id;
  r.prompt = std::move(prompt);
  r.max_tokens = max_tokens;
  r.sampling = sc;
  return r;
}

SamplingConfig sampled(uint64_t seed) {
  SamplingConfig c;
  c.temperature = 0.9;
  c.top_p = 0.95;
  c.seed = seed;
  return c;
}

// Both families, on the CPU and (where this build has it and a GPU is
// present; otherwise those instances skip, saying so) on CUDA: the CUDA
// engine's rows are chunk- and batch-invariant too, so the same equalities
// hold there bitwise, with its tokens drawn on the device.
struct SchedulerCase {
  bool spark = false;
  Device device = Device::Cpu;
};
class SchedulerFamilies : public ::testing::TestWithParam<SchedulerCase> {
 protected:
  void SetUp() override {
    if (GetParam().device != Device::Cpu)
      if (Status st = check_device(GetParam().device); !st.ok()) GTEST_SKIP() << st.message();
  }
  std::unique_ptr<Engine> engine(EngineOptions o) {
    o.backend.device = GetParam().device;
    if (o.backend.device != Device::Cpu) o.gpu_memory_utilization = 0.3;
    return tiny_engine(GetParam().spark, 2, o);
  }
};

// 24 requests at once, 6 sequence slots, 16 tokens per step (prompts are
// chunked, decodes and prefills share steps, most requests queue): every
// greedy and seeded output equals the request alone.
TEST_P(SchedulerFamilies, UnderLoadEqualsAlone) {
  EngineOptions o;
  o.max_sequences = 6;
  o.max_batch_tokens = 16;
  auto e = engine(o);
  std::vector<std::vector<int32_t>> expect;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 24; ++i) {
    auto prompt = some_tokens(size_t(3 + (i * 7) % 37), i);
    SamplingConfig sc = i % 3 == 2 ? sampled(100 + uint64_t(i)) : SamplingConfig{};
    reqs.push_back(request("r" + std::to_string(i), prompt, 12 + i % 9, sc));
    expect.push_back(alone(*e, prompt, sc, reqs.back().max_tokens));
  }
  Scheduler sched(*e, {});
  std::vector<std::shared_ptr<Collector>> got;
  for (auto& r : reqs) {
    got.push_back(std::make_shared<Collector>());
    ASSERT_EQ(sched.submit(r, got.back()).status, Scheduler::SubmitStatus::Ok);
  }
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i]->wait());
    EXPECT_EQ(got[i]->tokens[0], expect[i]) << "request " << i;
    EXPECT_EQ(got[i]->finish[0], SeqFinish::Length);
    EXPECT_EQ(got[i]->summary.completion_tokens[0], int64_t(expect[i].size()));
  }
  auto st = sched.stats();
  EXPECT_GT(st.steps, 0u);
  EXPECT_LE(st.model_seconds, st.busy_seconds);
}

// A KV pool far smaller than the load needs: sequences are preempted (KV
// freed, recomputed later) and still produce exactly their solo tokens.
TEST_P(SchedulerFamilies, PreemptionRecomputesToTheSameTokens) {
  EngineOptions o;
  o.max_sequences = 6;
  o.max_batch_tokens = 32;
  o.kv_block_size = 4;
  o.kv_pages = 60;  // one sequence needs up to 44 pages (26 + one step's transient)
  auto e = engine(o);
  std::vector<std::vector<int32_t>> expect;
  std::vector<GenerationRequest> reqs;
  for (int i = 0; i < 10; ++i) {
    auto prompt = some_tokens(size_t(14 + i), 50 + i);
    SamplingConfig sc = i % 2 ? sampled(7 + uint64_t(i)) : SamplingConfig{};
    sc.repetition_penalty = i % 4 == 3 ? 1.3 : 1.0;
    reqs.push_back(request("p" + std::to_string(i), prompt, 30, sc));
    expect.push_back(alone(*e, prompt, sc, 30));
  }
  Scheduler sched(*e, {});
  std::vector<std::shared_ptr<Collector>> got;
  for (auto& r : reqs) {
    got.push_back(std::make_shared<Collector>());
    ASSERT_EQ(sched.submit(r, got.back()).status, Scheduler::SubmitStatus::Ok);
  }
  int64_t preempted = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i]->wait());
    EXPECT_EQ(got[i]->tokens[0], expect[i]) << "request " << i;
    preempted += got[i]->summary.preemptions;
  }
  EXPECT_GT(preempted, 0) << "the pool was meant to run out";
  EXPECT_EQ(int64_t(sched.stats().preemptions), preempted);
  EXPECT_EQ(e->kv_cache().available_pages(), 60);
}

// Prefix caching under the scheduler: requests sharing a system prompt
// (and some sharing more: multi-turn histories, n > 1), a pool small enough
// to preempt, greedy and seeded sampling: every output equals the request
// alone on an engine without the cache, and later requests report cached
// prompt tokens.
TEST_P(SchedulerFamilies, PrefixCachingWithPreemptionEqualsAlone) {
  EngineOptions o;
  o.max_sequences = 6;
  o.max_batch_tokens = 32;
  o.kv_block_size = 4;
  auto plain = engine(o);
  o.prefix_caching = true;
  o.kv_pages = 60;  // one sequence of 70 positions needs 48 at most; 6 want to run
  auto e = engine(o);
  const auto system = some_tokens(23, 500);
  std::vector<std::vector<int32_t>> expect;
  std::vector<GenerationRequest> reqs;
  std::vector<int32_t> history = system;
  for (int i = 0; i < 14; ++i) {
    std::vector<int32_t> prompt = i % 3 == 0 ? history : system;
    const auto user = some_tokens(size_t(3 + i % 5), 600 + i);
    prompt.insert(prompt.end(), user.begin(), user.end());
    if (i % 3 == 0) history = prompt;  // the next "turn" extends this one
    SamplingConfig sc = i % 2 ? sampled(40 + uint64_t(i)) : SamplingConfig{};
    reqs.push_back(request("c" + std::to_string(i), prompt, 20, sc));
    reqs.back().ignore_eos = true;
    expect.push_back(alone(*plain, prompt, sc, 20));
  }
  Scheduler sched(*e, {});
  std::vector<std::shared_ptr<Collector>> got;
  for (size_t i = 0; i < reqs.size(); ++i) {
    got.push_back(std::make_shared<Collector>());
    ASSERT_EQ(sched.submit(reqs[i], got.back()).status, Scheduler::SubmitStatus::Ok);
    if (i == 0) ASSERT_TRUE(got[0]->wait());  // the first fills the cache
  }
  int64_t preempted = 0, cached = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_TRUE(got[i]->wait());
    EXPECT_EQ(got[i]->tokens[0], expect[i]) << "request " << i;
    preempted += got[i]->summary.preemptions;
    cached += got[i]->summary.cached_tokens;
    EXPECT_LE(got[i]->summary.cached_tokens, int64_t(reqs[i].prompt.size()) - 1);
  }
  EXPECT_GT(preempted, 0) << "the pool was meant to run out";
  // Each later request shares 20+ system-prompt positions; under this much
  // pressure some find them evicted (about 220 of 260 here).
  EXPECT_GE(cached, 6 * 20);
  auto st = sched.stats();
  EXPECT_GT(st.prefix_cache_hits, 0u);
  EXPECT_GE(st.prefix_cache_queries, st.prefix_cache_hits);
  EXPECT_EQ(e->kv_cache().used_pages(), 0);
}

// Randomized: prompts cut from three stems at random lengths (prefixes end
// at every offset of a block and of the window), random tails and lengths,
// greedy and seeded, submitted in random bursts to a pool that preempts:
// every output equals the request alone on an engine without the cache.
TEST_P(SchedulerFamilies, PrefixCachingRandomizedWithPreemptionEqualsAlone) {
  EngineOptions o;
  o.max_sequences = 5;
  o.max_batch_tokens = 24;
  o.kv_block_size = 4;
  auto plain = engine(o);
  o.prefix_caching = true;
  o.kv_pages = 50;  // one sequence of up to 78 positions needs 46
  auto e = engine(o);
  std::mt19937 rng(4242);
  std::vector<std::vector<int32_t>> stems;
  for (int i = 0; i < 3; ++i) stems.push_back(some_tokens(60, 700 + i));
  Scheduler sched(*e, {});
  int64_t preempted = 0, cached = 0;
  for (int burst = 0; burst < 4; ++burst) {
    std::vector<std::vector<int32_t>> expect;
    std::vector<GenerationRequest> burst_reqs;
    std::vector<std::shared_ptr<Collector>> got;
    for (int k = 0; k < 6; ++k) {
      const auto& stem = stems[rng() % stems.size()];
      std::vector<int32_t> prompt(stem.begin(), stem.begin() + long(1 + rng() % 55));
      const auto tail = some_tokens(1 + rng() % 6, 900 + burst * 10 + k);
      prompt.insert(prompt.end(), tail.begin(), tail.end());
      const int max_tokens = 4 + int(rng() % 14);
      SamplingConfig sc = rng() % 2 ? sampled(rng()) : SamplingConfig{};
      GenerationRequest r = request("b" + std::to_string(burst) + "k" + std::to_string(k), prompt, max_tokens, sc);
      r.ignore_eos = true;
      expect.push_back(alone(*plain, prompt, sc, max_tokens));
      burst_reqs.push_back(std::move(r));
    }
    // The whole burst back to back (the references are computed first): were
    // each submitted after its reference run, the scheduler could finish one
    // before the next arrives and the pool would never run out.
    for (auto& r : burst_reqs) {
      got.push_back(std::make_shared<Collector>());
      ASSERT_EQ(sched.submit(r, got.back()).status, Scheduler::SubmitStatus::Ok);
    }
    for (size_t i = 0; i < got.size(); ++i) {
      ASSERT_TRUE(got[i]->wait());
      EXPECT_EQ(got[i]->tokens[0], expect[i]) << "burst " << burst << " request " << i;
      preempted += got[i]->summary.preemptions;
      cached += got[i]->summary.cached_tokens;
    }
  }
  EXPECT_GT(preempted, 0) << "the pool was meant to run out";
  EXPECT_GT(cached, 0);
  EXPECT_EQ(e->kv_cache().used_pages(), 0);
}


TEST_P(SchedulerFamilies, ChoicesSampleWithSeedPlusIndex) {
  EngineOptions o;
  o.max_sequences = 4;
  auto e = engine(o);
  auto prompt = some_tokens(11, 9);
  std::vector<std::vector<int32_t>> expect;
  for (int i = 0; i < 3; ++i) expect.push_back(alone(*e, prompt, sampled(40 + uint64_t(i)), 15));
  Scheduler sched(*e, {});
  auto c = std::make_shared<Collector>(3);
  GenerationRequest r = request("n3", prompt, 15, sampled(40));
  r.n = 3;
  ASSERT_EQ(sched.submit(r, c).status, Scheduler::SubmitStatus::Ok);
  ASSERT_TRUE(c->wait());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c->tokens[size_t(i)], expect[size_t(i)]) << i;
  EXPECT_NE(c->tokens[0], c->tokens[1]);
  EXPECT_EQ(c->summary.completion_tokens.size(), 3u);
}

// n > 1 with prefix caching: choices 1.. wait for choice 0's prompt and
// reuse it from the cache (not prefilled n times); tokens unchanged.
TEST(Scheduler, ChoicesShareThePromptThroughThePrefixCache) {
  EngineOptions o;
  o.max_sequences = 4;
  o.max_batch_tokens = 32;
  o.kv_block_size = 4;
  auto plain = tiny_engine(true, 2, o);
  o.prefix_caching = true;
  auto e = tiny_engine(true, 2, o);
  auto prompt = some_tokens(90, 19);
  std::vector<std::vector<int32_t>> expect;
  for (int i = 0; i < 3; ++i) expect.push_back(alone(*plain, prompt, sampled(60 + uint64_t(i)), 10));
  Scheduler sched(*e, {});
  auto c = std::make_shared<Collector>(3);
  GenerationRequest r = request("n3", prompt, 10, sampled(60));
  r.n = 3;
  ASSERT_EQ(sched.submit(r, c).status, Scheduler::SubmitStatus::Ok);
  ASSERT_TRUE(c->wait());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(c->tokens[size_t(i)], expect[size_t(i)]) << i;
  const auto st = sched.stats();
  // Choices 1 and 2 found the prompt's blocks up to max_rollback behind its end.
  EXPECT_GE(st.prefix_cache_hits, 2u * 68u);
  EXPECT_LT(st.prompt_tokens_computed, 2u * 90u);
}

TEST(Scheduler, StopIdsEosIgnoreEosAndMinTokens) {
  auto e = tiny_engine(false, 2);
  auto prompt = some_tokens(8, 3);
  auto free_run = alone(*e, prompt, {}, 20);
  const int32_t stop = free_run[4];
  const size_t first = size_t(std::find(free_run.begin(), free_run.end(), stop) - free_run.begin());

  SchedulerOptions so;
  so.eos_token_ids = {stop};
  Scheduler sched(*e, so);
  auto eos = std::make_shared<Collector>();
  ASSERT_EQ(sched.submit(request("eos", prompt, 20), eos).status, Scheduler::SubmitStatus::Ok);
  ASSERT_TRUE(eos->wait());
  EXPECT_EQ(eos->tokens[0].size(), first + 1);
  EXPECT_EQ(eos->finish[0], SeqFinish::Stop);
  EXPECT_FALSE(eos->stop_token[0].has_value());

  auto ignore = std::make_shared<Collector>();
  GenerationRequest ri = request("ignore", prompt, 20);
  ri.ignore_eos = true;
  ASSERT_EQ(sched.submit(ri, ignore).status, Scheduler::SubmitStatus::Ok);
  ASSERT_TRUE(ignore->wait());
  EXPECT_EQ(ignore->tokens[0], free_run);
  EXPECT_EQ(ignore->finish[0], SeqFinish::Length);

  auto by_id = std::make_shared<Collector>();
  GenerationRequest rs = request("stopid", prompt, 20);
  rs.ignore_eos = true;
  rs.stop_token_ids = {stop};
  ASSERT_EQ(sched.submit(rs, by_id).status, Scheduler::SubmitStatus::Ok);
  ASSERT_TRUE(by_id->wait());
  EXPECT_EQ(by_id->tokens[0].size(), first + 1);
  EXPECT_EQ(by_id->stop_token[0], std::optional<int32_t>(stop));

  // min_tokens: the stop id cannot be sampled before 6 tokens exist.
  auto min = std::make_shared<Collector>();
  GenerationRequest rm = request("min", prompt, 20);
  rm.sampling.min_tokens = 6;
  ASSERT_EQ(sched.submit(rm, min).status, Scheduler::SubmitStatus::Ok);
  ASSERT_TRUE(min->wait());
  ASSERT_GE(min->tokens[0].size(), 6u);
  for (size_t i = 0; i < 6; ++i) EXPECT_NE(min->tokens[0][i], stop);

  // The observer ends a sequence (what a stop string does).
  auto obs = std::make_shared<Collector>();
  obs->stop_after = 3;
  GenerationRequest ro = request("obs", prompt, 20);
  ro.ignore_eos = true;
  ASSERT_EQ(sched.submit(ro, obs).status, Scheduler::SubmitStatus::Ok);
  ASSERT_TRUE(obs->wait());
  EXPECT_EQ(obs->tokens[0].size(), 3u);
  EXPECT_EQ(obs->summary.completion_tokens[0], 3);
}

TEST_P(SchedulerFamilies, CancelTakesEffectWithinAStepAndFreesEverything) {
  EngineOptions o;
  o.max_sequences = 2;
  auto e = engine(o);
  Scheduler sched(*e, {});
  auto running = std::make_shared<Collector>(2), queued = std::make_shared<Collector>();
  GenerationRequest r = request("long", some_tokens(10), 200);
  r.ignore_eos = true;
  r.n = 2;
  ASSERT_EQ(sched.submit(r, running).status, Scheduler::SubmitStatus::Ok);
  ASSERT_EQ(sched.submit(request("queued", some_tokens(5), 200), queued).status, Scheduler::SubmitStatus::Ok);
  running->wait_tokens(5);
  sched.cancel("queued");  // never scheduled: both slots are taken
  sched.cancel("long");
  sched.cancel("no-such-request");
  ASSERT_TRUE(running->wait());
  ASSERT_TRUE(queued->wait());
  EXPECT_EQ(running->finish[0], SeqFinish::Abort);
  EXPECT_EQ(running->finish[1], SeqFinish::Abort);
  EXPECT_LT(running->tokens[0].size(), 200u);
  EXPECT_EQ(queued->finish[0], SeqFinish::Abort);
  EXPECT_TRUE(queued->tokens[0].empty());
  EXPECT_EQ(running->completions, 1);
  for (int i = 0; i < 100 && sched.stats().requests_running + sched.stats().requests_waiting > 0; ++i)
    std::this_thread::sleep_for(10ms);
  EXPECT_EQ(sched.stats().requests_running, 0);
  EXPECT_EQ(sched.stats().requests_waiting, 0);
  EXPECT_EQ(e->kv_cache().free_sequences(), 2);
}

TEST(Scheduler, AdmissionErrors) {
  EngineOptions o;
  o.max_sequences = 2;
  o.kv_block_size = 4;
  o.kv_pages = 16;  // 31 positions: 8 full + 1 sliding block (2 pages) + one step's transient (6 pages)
  o.kv_max_rollback = 0;
  o.max_batch_tokens = 8;
  o.max_model_len = 64;
  auto e = tiny_engine(false, 2, o);
  Scheduler sched(*e, {});
  auto c = std::make_shared<Collector>();
  using S = Scheduler::SubmitStatus;
  EXPECT_EQ(sched.submit(request("empty", {}, 4), c).status, S::Invalid);
  EXPECT_EQ(sched.submit(request("bad id", {1, 500}, 4), c).status, S::Invalid);
  EXPECT_EQ(sched.submit(request("zero", {1, 2}, 0), c).status, S::Invalid);
  auto ctx = sched.submit(request("context", some_tokens(40), 30), c);
  EXPECT_EQ(ctx.status, S::Invalid);
  EXPECT_NE(ctx.message.find("context"), std::string::npos) << ctx.message;
  auto kv = sched.submit(request("kv", some_tokens(30), 10), c);
  EXPECT_EQ(kv.status, S::Invalid);
  EXPECT_NE(kv.message.find("KV-cache pages"), std::string::npos) << kv.message;
  GenerationRequest many = request("n", some_tokens(3), 4);
  many.n = 3;
  EXPECT_EQ(sched.submit(many, c).status, S::Invalid);
  GenerationRequest bias = request("bias", some_tokens(3), 4);
  bias.sampling.logit_bias = {{1000, 1.0f}};
  EXPECT_EQ(sched.submit(bias, c).status, S::Invalid);
  EXPECT_EQ(c->updates, 0);
  // Fits exactly: 22 + 10 - 1 = 31 positions = 16 pages.
  EXPECT_EQ(e->kv_cache().pages_for_sequence(31), 16);
  EXPECT_EQ(e->kv_cache().pages_for_sequence(33), 19);
  EXPECT_EQ(sched.submit(request("fits", some_tokens(22), 10), c).status, S::Ok);
  ASSERT_TRUE(c->wait());
}

TEST(Scheduler, OverloadedWhenTheQueueIsFull) {
  EngineOptions o;
  o.max_sequences = 1;
  auto e = tiny_engine(false, 2, o);
  SchedulerOptions so;
  so.max_waiting_requests = 1;
  Scheduler sched(*e, so);
  auto a = std::make_shared<Collector>(), b = std::make_shared<Collector>(), c = std::make_shared<Collector>();
  GenerationRequest r = request("a", some_tokens(5), 100);
  r.ignore_eos = true;
  ASSERT_EQ(sched.submit(r, a).status, Scheduler::SubmitStatus::Ok);
  a->wait_tokens(2);
  ASSERT_EQ(sched.submit(request("b", some_tokens(5), 5), b).status, Scheduler::SubmitStatus::Ok);
  EXPECT_EQ(sched.submit(request("c", some_tokens(5), 5), c).status, Scheduler::SubmitStatus::Overloaded);
  sched.cancel("a");
  ASSERT_TRUE(a->wait());
  ASSERT_TRUE(b->wait());
}

TEST(Scheduler, PromptLogprobsAreTheModelsLogSoftmax) {
  EngineOptions o;
  o.max_batch_tokens = 8;  // the prompt arrives in chunks
  auto e = tiny_engine(true, 2, o);
  auto prompt = some_tokens(19, 4);
  auto s = e->new_session();
  auto rows = (*s)->feed(prompt, LogitsWanted::All);
  ASSERT_TRUE(rows.ok());
  s->reset();
  Scheduler sched(*e, {});
  auto c = std::make_shared<Collector>();
  GenerationRequest r = request("echo", prompt, 2);
  r.prompt_logprobs = 2;
  r.logprobs = 1;
  ASSERT_EQ(sched.submit(r, c).status, Scheduler::SubmitStatus::Ok);
  ASSERT_TRUE(c->wait());
  ASSERT_EQ(c->prompt_logprobs.size(), prompt.size());
  EXPECT_TRUE(std::isnan(c->prompt_logprobs[0].logprob));
  const int64_t V = e->config().vocab_size;
  for (size_t i = 1; i < prompt.size(); ++i) {
    std::span<const float> row(rows->data() + (i - 1) * size_t(V), size_t(V));
    double mx = *std::max_element(row.begin(), row.end()), z = 0;
    for (float x : row) z += std::exp(double(x) - mx);
    // Measured at most 2.4e-7 (was 1e-4, 420× above).
    EXPECT_NEAR(c->prompt_logprobs[i].logprob, double(row[size_t(prompt[i])]) - mx - std::log(z), 1e-6) << i;
    EXPECT_EQ(c->prompt_logprobs[i].top.size(), 2u);
  }
  EXPECT_EQ(c->logprobs.size(), 2u);
}

// The logits observer (muse run --dump-logits) sees each position's raw row
// exactly once and in order, through chunked prefill, shared steps and
// preemption (recomputed rows are not delivered again): the rows equal the
// sequence's tokens fed alone.
TEST(Scheduler, LogitsObserverSeesEveryPositionOnceInOrder) {
  EngineOptions o;
  o.max_sequences = 4;
  o.max_batch_tokens = 16;
  o.kv_block_size = 4;
  o.kv_pages = 50;  // one sequence needs up to ~40 pages: preemption
  auto e = tiny_engine(true, 2, o);
  const int64_t V = e->config().vocab_size;
  std::vector<std::vector<float>> rows(6);
  std::vector<std::shared_ptr<Collector>> got;
  std::vector<std::vector<int32_t>> prompts;
  SchedulerOptions so;
  so.max_logit_rows = 8;
  Scheduler sched(*e, so);
  for (int i = 0; i < 6; ++i) {
    prompts.push_back(some_tokens(size_t(11 + 3 * i), 70 + i));
    GenerationRequest r = request("o" + std::to_string(i), prompts.back(), 12, i % 2 ? sampled(3) : SamplingConfig{});
    r.logits_observer = [&rows, i](int index, std::span<const float> x) {
      EXPECT_EQ(index, 0);
      rows[size_t(i)].insert(rows[size_t(i)].end(), x.begin(), x.end());
    };
    got.push_back(std::make_shared<Collector>());
    ASSERT_EQ(sched.submit(r, got.back()).status, Scheduler::SubmitStatus::Ok);
  }
  int64_t preempted = 0;
  for (int i = 0; i < 6; ++i) {
    ASSERT_TRUE(got[size_t(i)]->wait());
    preempted += got[size_t(i)]->summary.preemptions;
  }
  for (int i = 0; i < 6; ++i) {
    // Every prompt position, then each generated token but the last (never fed).
    std::vector<int32_t> fed = prompts[size_t(i)];
    fed.insert(fed.end(), got[size_t(i)]->tokens[0].begin(), got[size_t(i)]->tokens[0].end() - 1);
    auto s = e->new_session();
    ASSERT_TRUE(s.ok());
    auto want = (*s)->feed(fed, LogitsWanted::All);
    ASSERT_TRUE(want.ok());
    ASSERT_EQ(rows[size_t(i)].size(), fed.size() * size_t(V)) << "request " << i;
    EXPECT_EQ(rows[size_t(i)], *want) << "request " << i;
  }
  EXPECT_GT(preempted, 0) << "the pool was meant to run out";
}

TEST(Scheduler, StoppingAbortsEverythingLeft) {
  EngineOptions o;
  o.max_sequences = 1;
  auto e = tiny_engine(false, 2, o);
  std::vector<std::shared_ptr<Collector>> cs;
  {
    Scheduler sched(*e, {});
    for (int i = 0; i < 4; ++i) {
      cs.push_back(std::make_shared<Collector>());
      GenerationRequest r = request("s" + std::to_string(i), some_tokens(6, i), 200);
      r.ignore_eos = true;
      ASSERT_EQ(sched.submit(r, cs.back()).status, Scheduler::SubmitStatus::Ok);
    }
    cs[0]->wait_tokens(1);
  }
  for (auto& c : cs) {
    EXPECT_EQ(c->completions, 1);
    EXPECT_EQ(c->finish[0], SeqFinish::Abort);
  }
  EXPECT_EQ(e->kv_cache().free_sequences(), 1);
}

INSTANTIATE_TEST_SUITE_P(Scheduler, SchedulerFamilies,
                         ::testing::Values(SchedulerCase{false, Device::Cpu}, SchedulerCase{true, Device::Cpu},
                                           SchedulerCase{false, Device::Cuda}, SchedulerCase{true, Device::Cuda}),
                         [](const ::testing::TestParamInfo<SchedulerCase>& i) {
                           return std::string(i.param.spark ? "spark" : "glimmer") +
                                  (i.param.device == Device::Cpu ? "_cpu" : "_cuda");
                         });

}  // namespace
}  // namespace muse::testing

namespace muse::testing {
namespace {

// Tokens drawn by the backend (EngineOptions::sample_on_device; on the CPU
// backend its sample_rows runs the row definition) equal tokens drawn on the
// host from downloaded logits, for every kind of sampling config, several
// requests sharing each step; the logprobs too.
TEST(Scheduler, SamplingOnTheBackendEqualsTheHost) {
  std::vector<SamplingConfig> configs;
  configs.push_back({});  // greedy
  SamplingConfig c = sampled(3);
  configs.push_back(c);
  c.top_k = 7, c.top_p = 1.0, c.min_p = 0.02, c.seed = 4;
  configs.push_back(c);
  c.repetition_penalty = 1.4, c.frequency_penalty = 0.5, c.presence_penalty = 0.3, c.seed = 5;
  configs.push_back(c);
  c = sampled(6);
  c.logit_bias = {{5, 4.0f}, {9, -100.0f}, {5, 1.0f}};
  c.min_tokens = 6, c.min_tokens_blocked = {1, 2};
  configs.push_back(c);
  SamplingConfig g;
  g.repetition_penalty = 1.2;
  configs.push_back(g);
  auto run = [&](bool device, int logprobs) {
    EngineOptions o;
    o.max_sequences = 3;
    o.max_batch_tokens = 16;
    o.sample_on_device = device;
    auto e = tiny_engine(true, 2, o);
    Scheduler sched(*e, {});
    std::vector<std::shared_ptr<Collector>> cs;
    for (size_t i = 0; i < configs.size(); ++i) {
      cs.push_back(std::make_shared<Collector>());
      GenerationRequest r = request("r" + std::to_string(i), some_tokens(9 + int(i), int(i) + 3), 14, configs[i]);
      r.logprobs = logprobs;
      EXPECT_EQ(sched.submit(r, cs.back()).status, Scheduler::SubmitStatus::Ok);
    }
    std::vector<std::pair<std::vector<int32_t>, std::vector<float>>> out;
    for (auto& col : cs) {
      EXPECT_TRUE(col->wait());
      out.push_back({col->tokens[0], col->logprobs});
    }
    return out;
  };
  for (int logprobs : {-1, 0, 5}) {
    const auto host = run(false, logprobs), device = run(true, logprobs);
    for (size_t i = 0; i < configs.size(); ++i) {
      EXPECT_EQ(device[i].first, host[i].first) << "config " << i << " logprobs " << logprobs;
      EXPECT_EQ(device[i].second, host[i].second) << "config " << i << " logprobs " << logprobs;
      EXPECT_EQ(host[i].first.size(), 14u) << i;
    }
  }
}

}  // namespace
}  // namespace muse::testing
