// The whole model on the GPU (issue 11's acceptance, as tests):
//  - every fixture, teacher-forced with its recorded ids: CUDA logits within
//    twice the gap that the reference's own bf16 run on the GPU shows against
//    its fp32 run (bf16_reference.json, recorded by
//    scripts/cuda/reference_bf16_gap.py on the GPU machine), and the greedy
//    pick equal to the fp32 reference's except at recorded near-ties;
//  - decode is batch-invariant: a sequence decoded alone and inside a batch
//    of 64 unrelated sequences gives bitwise identical logits;
//  - greedy decoding is identical run to run;
//  - tokens drawn on the GPU (sample_rows) equal tokens drawn on the host
//    from the same GPU logits, for greedy, seeded and penalised requests.
// Without a GPU (or without the CUDA backend built in) every test skips and
// says why.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "../forward/fixture_util.h"
#include "muse/backends/factory/backend_factory.h"
#include "muse/engine/engine.h"
#include "muse/engine/scheduler.h"
#include "muse/engine/token_collector.h"
#include "muse/model/config.h"
#include "muse/model/random_weights.h"
#include "muse/sampling/sampler.h"

namespace muse {
namespace {

using namespace fixtures;

#define SKIP_WITHOUT_GPU()                                                        \
  do {                                                                            \
    if (Status st = check_device(Device::Cuda); !st.ok()) GTEST_SKIP() << st.message(); \
  } while (0)

std::unique_ptr<Engine> cuda_engine(const std::string& model_dir, EngineOptions o) {
  o.backend.device = Device::Cuda;
  o.load.language_model_only = true;
  o.gpu_memory_utilization = 0.5;
  auto e = Engine::open(model_dir, o);
  EXPECT_TRUE(e.ok()) << model_dir << ": " << (e.ok() ? "" : e.message());
  return e.ok() ? std::move(e).value() : nullptr;
}

// Prompt (all rows), then each recorded generated id but the last, one
// decode step each: the reference's rows, teacher-forced.
std::vector<float> teacher_forced(Engine& e, const Fixture& f) {
  auto s = e.new_session();
  EXPECT_TRUE(s.ok());
  if (!s.ok()) return {};
  auto rows = (*s)->feed(f.prompt, LogitsWanted::All);
  EXPECT_TRUE(rows.ok()) << (rows.ok() ? "" : rows.message());
  if (!rows.ok()) return {};
  std::vector<float> out = *rows;
  for (size_t k = 0; k + 1 < f.generated.size(); ++k) {
    auto next = (*s)->feed(std::span<const int32_t>(&f.generated[k], 1));
    EXPECT_TRUE(next.ok()) << (next.ok() ? "" : next.message());
    if (!next.ok()) return {};
    out.insert(out.end(), next->begin(), next->end());
  }
  return out;
}

class CudaFixture : public ::testing::TestWithParam<std::string> {};

TEST_P(CudaFixture, WithinTwiceTheReferenceBf16Gap) {
  SKIP_WITHOUT_GPU();
  Fixture f = load_fixture(GetParam());
  auto text = read_file(f.dir + "/bf16_reference.json");
  if (!text.ok())
    GTEST_SKIP() << f.name << ": no bf16_reference.json (record it on the GPU machine with "
                 << "scripts/cuda/reference_bf16_gap.py)";
  auto j = Json::parse(*text);
  ASSERT_TRUE(j.ok());
  const double gap = j->get_double("bf16_vs_fp32_max_rel", 0);
  ASSERT_GT(gap, 0) << "bf16_reference.json without a gap";
  std::vector<int64_t> near_ties;
  if (const Json* n = j->find("greedy_differs_at"))
    for (const Json& x : n->as_array()) near_ties.push_back(x.as_int());

  EngineOptions o;
  o.max_model_len = int64_t(f.prompt.size() + f.generated.size());
  o.kv_block_size = 4;  // many block-table crossings
  o.max_batch_tokens = 256;
  auto e = cuda_engine(f.model_dir, o);
  ASSERT_TRUE(e);
  std::vector<float> got = teacher_forced(*e, f);
  ASSERT_EQ(got.size(), f.logits.size());
  float max_ref = 0;
  for (float x : f.logits) max_ref = std::max(max_ref, std::fabs(x));
  double worst = 0;
  int64_t worst_row = -1;
  for (int64_t r = 0; r < f.num_rows; ++r)
    for (int64_t i = 0; i < f.vocab; ++i) {
      const double d = std::fabs(double(got[size_t(r * f.vocab + i)]) - f.logits[size_t(r * f.vocab + i)]);
      if (d > worst) worst = d, worst_row = r;
    }
  const double rel = worst / max_ref;
  std::printf("[ cuda     ] %-10s max |cuda - fp32 reference| / max|logit| = %.3e (row %lld); "
              "reference bf16 gap %.3e; ratio %.2f\n",
              f.name.c_str(), rel, (long long)worst_row, gap, rel / gap);
  EXPECT_LE(rel, 2 * gap) << f.name << ": worst row " << worst_row;

  // Greedy picks along the recorded continuation. Where the engine picks
  // another id than the fp32 reference, that id must be a near-tie at bf16
  // precision: its fp32 reference logit within the bf16 reference's own gap
  // (2× gap × max|logit|) of the reference's best. (A chaotic random fixture
  // makes that gap large; scripts/cuda/random_large_check.py holds the
  // contractive models where it is small.)
  const int64_t P = int64_t(f.prompt.size());
  const int64_t sampled = e->config().sampled_vocab_size > 0 ? e->config().sampled_vocab_size : f.vocab;
  int differ = 0;
  for (size_t k = 0; k < f.generated.size(); ++k) {
    const size_t row = size_t((P - 1 + int64_t(k)) * f.vocab);
    std::span<const float> mine(got.data() + row, size_t(f.vocab));
    const int32_t id = argmax(mine, sampled);
    if (id == f.generated[k]) continue;
    ++differ;
    const double margin = double(f.logits[row + size_t(f.generated[k])]) - f.logits[row + size_t(id)];
    EXPECT_LE(margin, 2 * gap * max_ref) << f.name << ": greedy step " << k << " picks " << id << ", the reference "
                                         << f.generated[k] << " by a margin of " << margin << " (beyond bf16 noise)";
  }
  std::printf("[ cuda     ] %-10s greedy picks equal at %zu of %zu steps (the bf16 reference's own: %zu)\n",
              f.name.c_str(), f.generated.size() - size_t(differ), f.generated.size(),
              f.generated.size() - near_ties.size());
}

INSTANTIATE_TEST_SUITE_P(Fixtures, CudaFixture, ::testing::ValuesIn(fixture_names()),
                         [](const ::testing::TestParamInfo<std::string>& i) {
                           std::string n = i.param;
                           for (char& c : n)
                             if (c == '-') c = '_';
                           return n;
                         });
GTEST_ALLOW_UNINSTANTIATED_PARAMETERIZED_TEST(CudaFixture);

std::string tiny_model() { return std::string(MUSE_SOURCE_DIR) + "/models/muse-tiny"; }

std::vector<int32_t> tokens(size_t n, int32_t salt) {
  std::vector<int32_t> t;
  for (size_t i = 0; i < n; ++i) t.push_back(int32_t((i * 131 + 7 + size_t(salt) * 977) % 4000 + 10));
  return t;
}

// One sequence decoded alone, then the same sequence inside a batch of 64
// unrelated ones (different prompts and lengths): every decode step's logits
// bitwise equal.
TEST(CudaModel, DecodeIsBatchInvariant) {
  SKIP_WITHOUT_GPU();
  EngineOptions o;
  o.max_sequences = 64;
  o.max_model_len = 512;
  o.max_batch_tokens = 512;
  auto e = cuda_engine(tiny_model(), o);
  ASSERT_TRUE(e);
  const auto prompt = tokens(150, 1);  // longer than the 128-position window
  constexpr int kSteps = 8;
  auto decode_alone = [&]() {
    std::vector<std::vector<float>> rows;
    auto s = e->new_session();
    auto l = (*s)->feed(prompt);
    EXPECT_TRUE(l.ok());
    for (int k = 0; k < kSteps && l.ok(); ++k) {
      const int32_t id = argmax(*l, 4096);
      l = (*s)->feed(std::span<const int32_t>(&id, 1));
      rows.push_back(*l);
    }
    return rows;
  };
  const auto alone = decode_alone();
  ASSERT_EQ(alone.size(), size_t(kSteps));
  EXPECT_EQ(decode_alone(), alone) << "decode is not reproducible run to run";

  // The same sequence as item 0 of a batch of 64.
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<int32_t> next(64);
  for (int i = 0; i < 64; ++i) {
    auto s = e->new_session();
    ASSERT_TRUE(s.ok()) << s.message();
    auto p = i == 0 ? prompt : tokens(size_t(3 + (i * 37) % 200), i + 1);
    auto l = (*s)->feed(p);
    ASSERT_TRUE(l.ok()) << l.message();
    next[size_t(i)] = argmax(*l, 4096);
    sessions.push_back(std::move(s).value());
  }
  for (int k = 0; k < kSteps; ++k) {
    std::vector<StepItem> items;
    for (int i = 0; i < 64; ++i) items.push_back({sessions[size_t(i)].get(), std::span<const int32_t>(&next[size_t(i)], 1)});
    ASSERT_TRUE(e->step(items).ok());
    for (int i = 0; i < 64; ++i) {
      auto l = e->logits(size_t(i));
      if (i == 0) {
        ASSERT_EQ(l.size(), alone[size_t(k)].size());
        EXPECT_EQ(0, std::memcmp(l.data(), alone[size_t(k)].data(), l.size() * 4))
            << "step " << k << ": the batched row differs from the row decoded alone";
      }
      next[size_t(i)] = argmax(l, 4096);
    }
  }
}

// A small dense (Glimmer) model with random weights: its recorded steps run
// at padded row counts (a MoE model's, muse-tiny's, do not).
std::unique_ptr<Engine> dense_engine(EngineOptions o) {
  auto config = parse_model_config(R"({"model_type": "muse_glimmer", "text_config": {
    "vocab_size": 4096, "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 8,
    "num_key_value_heads": 2, "head_dim": 32, "intermediate_size": 512, "rms_norm_eps": 1e-5,
    "post_norm_eps": 1e-8, "rope_parameters": {"rope_type": "default", "rope_theta": 10000.0},
    "sliding_window": 128, "max_position_embeddings": 4096, "qk_scale_factor": 3.0,
    "output_multiplier": 0.2, "final_logit_softcapping": 20.0, "tie_word_embeddings": false,
    "bos_token_id": 1, "eos_token_id": 2}})");
  EXPECT_TRUE(config.ok()) << config.message();
  if (!config.ok()) return nullptr;
  o.backend.device = Device::Cuda;
  o.gpu_memory_utilization = 0.5;
  auto e = Engine::create(*config, std::make_unique<RandomWeightSource>(*config), o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.message());
  return e.ok() ? std::move(e).value() : nullptr;
}

// Decode steps replayed from CUDA graphs give the bits of the same steps
// launched op by op (an engine with graphs off): batches of 1, 3, 5, 13, 17
// and 21 rows in turn, four steps each (eager, recorded, replayed,
// replayed), over contexts that cross the 128-position sliding window and
// the coarse key-length hint's steps (a new recording each time). On the
// dense model 17 and 21 rows both run as 24 (one recording, padding rows
// skipped by attention); the engine without graphs runs them unpadded.
// `open(true)` and `open(false)`: the two engines compared; `graphs_vs_eager`:
// the second has graphs off (its recordings are counted too).
void expect_graphs_give_the_eager_bits(const std::function<std::unique_ptr<Engine>(bool graphs)>& open,
                                       bool graphs_vs_eager = true) {
  auto with = open(true), without = open(false);
  ASSERT_TRUE(with && without);
  struct Run {
    Engine& e;
    std::vector<std::unique_ptr<Session>> sessions;
    std::vector<int32_t> next;
  };
  Run runs[2] = {{*with, {}, {}}, {*without, {}, {}}};
  for (Run& r : runs) {
    for (int i = 0; i < 21; ++i) {
      auto s = r.e.new_session();
      ASSERT_TRUE(s.ok()) << s.message();
      auto l = (*s)->feed(tokens(size_t(100 + 7 * i), i + 3));
      ASSERT_TRUE(l.ok()) << l.message();
      r.next.push_back(argmax(*l, 4096));
      r.sessions.push_back(std::move(s).value());
    }
  }
  const int widths[] = {1, 3, 5, 13, 17, 21};
  for (int k = 0; k < 72; ++k) {
    const int n = widths[(k / 4) % 6];
    std::vector<float> logits[2];
    for (int w = 0; w < 2; ++w) {
      Run& r = runs[w];
      std::vector<StepItem> items;
      for (int i = 0; i < n; ++i) items.push_back({r.sessions[size_t(i)].get(), std::span<const int32_t>(&r.next[size_t(i)], 1)});
      Status st = r.e.step(items);
      ASSERT_TRUE(st.ok()) << "step " << k << ": " << st.message();
      for (int i = 0; i < n; ++i) {
        auto l = r.e.logits(size_t(i));
        logits[w].insert(logits[w].end(), l.begin(), l.end());
        r.next[size_t(i)] = argmax(l, 4096);
      }
    }
    ASSERT_EQ(logits[0].size(), logits[1].size());
    EXPECT_EQ(0, std::memcmp(logits[0].data(), logits[1].data(), logits[0].size() * 4))
        << "step " << k << " (" << n << " rows): the " << (graphs_vs_eager ? "replayed" : "side-stream")
        << " step differs from the " << (graphs_vs_eager ? "eager" : "one-stream") << " one";
  }
  const Backend::GraphStats g = with->backend().graph_stats();
  EXPECT_GE(g.captured, 5) << "one recording a width at least";
  EXPECT_GE(g.replayed, 30) << "most steps replay";
  if (graphs_vs_eager) EXPECT_EQ(without->backend().graph_stats().captured, 0);
}

EngineOptions graph_test_options(bool graphs) {
  EngineOptions o;
  o.max_sequences = 24;
  o.max_model_len = 512;
  o.max_batch_tokens = 256;
  o.backend.gpu_graphs = graphs;
  return o;
}

TEST(CudaModel, GraphsGiveTheEagerBits) {
  SKIP_WITHOUT_GPU();
  expect_graphs_give_the_eager_bits([](bool graphs) { return cuda_engine(tiny_model(), graph_test_options(graphs)); });
}

// muse-tiny's sparse layers run the router and its top-k as a side branch
// (Backend::begin_side) on a second stream; with side_stream off every op
// runs in order on one. Both record and replay graphs here (the graphs
// test above compares the side stream's eager steps with its recorded
// ones): the same bits.
TEST(CudaModel, SideStreamGivesTheOneStreamBits) {
  SKIP_WITHOUT_GPU();
  expect_graphs_give_the_eager_bits(
      [](bool side) {
        EngineOptions o = graph_test_options(true);
        o.backend.gpu_side_stream = side;
        return cuda_engine(tiny_model(), o);
      },
      false);
}

TEST(CudaModel, PaddedGraphsGiveTheEagerBits) {
  SKIP_WITHOUT_GPU();
  expect_graphs_give_the_eager_bits([](bool graphs) { return dense_engine(graph_test_options(graphs)); });
}

// The scheduler on the GPU, sampling on the device and on the host (the
// same CUDA logits, downloaded): the same tokens for every kind of request,
// several sharing each step, and logprobs within float rounding.
TEST(CudaModel, DeviceSamplingEqualsHostSampling) {
  SKIP_WITHOUT_GPU();
  std::vector<SamplingConfig> configs(6);
  configs[1].temperature = 0.9, configs[1].top_p = 0.95, configs[1].seed = 3;
  configs[2].temperature = 1.2, configs[2].top_k = 20, configs[2].min_p = 0.01, configs[2].seed = 4;
  configs[3] = configs[1], configs[3].repetition_penalty = 1.3, configs[3].frequency_penalty = 0.4, configs[3].seed = 5;
  configs[4] = configs[1], configs[4].logit_bias = {{100, 3.0f}}, configs[4].min_tokens = 4, configs[4].seed = 6;
  configs[5].repetition_penalty = 1.2;  // greedy, penalised
  auto run = [&](bool device, int logprobs) {
    EngineOptions o;
    o.max_sequences = 4;
    o.max_model_len = 512;
    o.max_batch_tokens = 64;
    o.sample_on_device = device;
    auto e = cuda_engine(tiny_model(), o);
    EXPECT_TRUE(e);
    std::vector<std::pair<std::vector<int32_t>, std::vector<float>>> out(configs.size());
    if (!e) return out;
    Scheduler sched(*e, {});
    std::vector<std::shared_ptr<TokenCollector>> cs;
    for (size_t i = 0; i < configs.size(); ++i) {
      GenerationRequest r;
      r.id = "r" + std::to_string(i);
      r.prompt = tokens(20 + 9 * i, int32_t(i));
      r.max_tokens = 24;
      r.sampling = configs[i];
      r.logprobs = logprobs;
      r.ignore_eos = true;
      cs.push_back(std::make_shared<TokenCollector>());
      EXPECT_EQ(sched.submit(r, cs.back()).status, Scheduler::SubmitStatus::Ok);
    }
    for (size_t i = 0; i < cs.size(); ++i) {
      EXPECT_TRUE(cs[i]->wait());
      out[i] = {cs[i]->tokens, cs[i]->logprobs};
    }
    return out;
  };
  for (int logprobs : {-1, 3}) {
    const auto host = run(false, logprobs), device = run(true, logprobs);
    for (size_t i = 0; i < configs.size(); ++i) {
      EXPECT_EQ(host[i].first.size(), 24u) << "config " << i;
      EXPECT_EQ(device[i].first, host[i].first) << "config " << i << " logprobs " << logprobs;
      ASSERT_EQ(device[i].second.size(), host[i].second.size()) << "config " << i;
      for (size_t k = 0; k < host[i].second.size(); ++k)
        EXPECT_NEAR(device[i].second[k], host[i].second[k], 1e-5) << "config " << i << " token " << k;
    }
  }
}

}  // namespace
}  // namespace muse
