// The engine's per-rank memory under tensor/expert parallelism is what
// `muse plan` predicts for the same split: both come from the one split
// table (model/sharding.h). Weights: the plan counts BF16 checkpoints at 2
// bytes everywhere, while the engine keeps norm gains and Spark's folded
// residual gates (α and β) in fp32; those are replicated, so the engine's
// excess over the plan is the same at every TP size, and the split weights
// must agree to the byte. KV: a rank stores its KV heads, a KV head
// replicated on TP / num_kv_heads ranks when TP exceeds them, as the plan's
// replication says.
#include <gtest/gtest.h>

#include "muse/engine/engine.h"
#include "muse/plan/plan.h"

namespace muse {
namespace {

struct Case {
  const char* dir;
  bool spark;
};

TEST(ParallelMemory, PerRankWeightsAndKvMatchThePlan) {
  for (const Case& c : {Case{"tests/data/fixtures/glimmer-a", false}, Case{"models/muse-tiny", true}}) {
    const std::string dir = std::string(MUSE_SOURCE_DIR) + "/" + c.dir;
    int64_t offset = -1;  // engine − plan at TP 1
    for (int64_t tp : {1, 2, 4}) {
      EngineOptions o;
      o.backend.cpu.threads = 1;
      o.load.language_model_only = true;
      o.max_model_len = 64;
      o.parallel = {tp, c.spark};
      auto engine = Engine::open(dir, o);
      ASSERT_TRUE(engine.ok()) << dir << " tp " << tp << ": " << engine.message();
      const int64_t engine_bytes = int64_t((*engine)->model().weights().resident_bytes());

      plan::PlanOptions po;
      po.model = dir;
      po.language_model_only = true;
      po.max_model_len = 64;
      po.overrides.gpus = int(tp);
      po.overrides.gpu_memory_gib = 80;
      po.overrides.gpu_bandwidth_gbs = 1000;
      auto p = plan::make_plan(po);
      ASSERT_TRUE(p.ok()) << p.message();
      const int64_t plan_bytes = p->memory.decoder_weights;
      if (tp == 1) offset = engine_bytes - plan_bytes;
      std::printf("%s TP %lld: engine rank 0 %lld B of weights, plan %lld B per GPU (+%lld B of fp32 gains)\n", c.dir,
                  (long long)tp, (long long)engine_bytes, (long long)plan_bytes, (long long)offset);
      EXPECT_EQ(engine_bytes - plan_bytes, offset) << c.dir << " tp " << tp;
      if (tp > 1) EXPECT_LT(plan_bytes, p->bytes.total()) << "split weights are smaller per GPU";

      const ModelConfig& cfg = (*engine)->config();
      EXPECT_EQ((*engine)->kv_cache().geometry().kv_dim * tp, cfg.kv_dim() * p->kv.replication) << c.dir << " tp " << tp;
    }
  }
}


// The bytes each rank sends, counted by the communicator, are the design's:
// per step of T rows a ring all-reduce (2·(N−1)/N of the payload) of T × H
// after each attention and dense MLP, and of T × Hm (the latent width) after
// each latent MoE, never T × H; the logits' shards gathered once.
TEST(ParallelTraffic, TheMoeReducesAtTheLatentWidth) {
  const std::string dir = std::string(MUSE_SOURCE_DIR) + "/models/muse-tiny";
  for (int64_t n : {2, 4}) {
    EngineOptions o;
    o.backend.cpu.threads = 1;
    o.max_model_len = 64;
    o.max_batch_tokens = 32;
    o.parallel = {n, true};
    auto engine = Engine::open(dir, o);
    ASSERT_TRUE(engine.ok()) << engine.message();
    const ModelConfig& c = (*engine)->config();
    auto session = (*engine)->new_session();
    ASSERT_TRUE(session.ok());
    const int64_t T = 20;
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < T; ++i) prompt.push_back(int32_t(7 + 13 * i));
    ASSERT_TRUE((*session)->feed(prompt).ok());  // one step, one logits row
    int64_t sparse = 0;
    for (int64_t l = 0; l < c.num_layers; ++l) sparse += c.is_sparse(l);
    const int64_t dense = c.num_layers - sparse;
    const auto ring = [&](int64_t values) { return uint64_t(2 * values * 4 * (n - 1) / n); };  // F32 on the CPU
    const uint64_t attention = ring(T * c.hidden_size) * uint64_t(c.num_layers);
    const uint64_t moe = ring(T * c.moe_hidden_size) * uint64_t(sparse);
    const uint64_t mlp = ring(T * c.hidden_size) * uint64_t(dense);
    const int64_t shard = (c.vocab_size + n - 1) / n;
    for (const CollectiveTraffic& t : (*engine)->parallel_traffic()) {
      EXPECT_EQ(t.all_reduce, attention + moe + mlp) << "tp " << n;
      EXPECT_EQ(t.all_gather, uint64_t(shard * 4 * (n - 1))) << "tp " << n;
      EXPECT_EQ(t.all_to_all, 0u);
    }
    std::printf("muse-tiny TP %lld EP, %lld rows: all-reduce %llu B per rank (attention %llu, latent MoE %llu; at the "
                "hidden width the MoE would send %llu)\n",
                (long long)n, (long long)T, (unsigned long long)(attention + moe + mlp), (unsigned long long)attention,
                (unsigned long long)moe, (unsigned long long)(ring(T * c.hidden_size) * uint64_t(sparse)));
  }
}

}  // namespace
}  // namespace muse
