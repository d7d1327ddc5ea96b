// Long context on the shipped muse-tiny (max_position_embeddings 4096, the
// longest it holds): a prompt filling the whole context is admitted by the
// scheduler and answered, with prefix caching on; the KV bytes one sequence
// holds equal `muse plan`'s paged-pool arithmetic for the same dtype; and
// `muse plan` and `muse serve`'s sizing agree on the pool and the tokens that fit.
#include <gtest/gtest.h>

#include <chrono>

#include "muse/engine/default_model.h"
#include "muse/engine/engine.h"
#include "muse/engine/scheduler.h"
#include "muse/engine/token_collector.h"
#include "muse/plan/plan.h"
#include "muse/server/backend_factory.h"

namespace muse {
namespace {

std::vector<int32_t> long_prompt(size_t n) {
  std::vector<int32_t> t;
  for (size_t i = 0; i < n; ++i) t.push_back(int32_t((i * 2654435761u) % 3900 + 20));
  return t;
}


TEST(LongContext, WholeContextPromptIsAnsweredAndKvBytesMatchThePlan) {
  auto dir = default_model_dir();
  if (!dir.ok()) GTEST_SKIP() << dir.message();
  for (DType dt : {DType::F32}) {  // other dtypes: the same arithmetic (PlanAndServeAgreeOnThePool)
    EngineOptions o;
    o.backend.cpu.threads = 2;
    o.load.language_model_only = true;
    o.max_sequences = 2;
    o.max_batch_tokens = 512;
    o.kv_cache_dtype = dt;
    o.prefix_caching = true;
    auto e = Engine::open(*dir, o);
    ASSERT_TRUE(e.ok()) << e.message();
    const int64_t L = (*e)->max_model_len();
    ASSERT_EQ(L, 4096) << "muse-tiny's max_position_embeddings";

    // The plan for the same model, dtype and block size.
    plan::PlanOptions po;
    po.model = *dir;
    po.kv_cache_dtype = dt == DType::F32 ? "f32" : "fp8";
    po.block_size = (*e)->kv_cache().block_size();
    auto pl = plan::make_plan(po);
    ASSERT_TRUE(pl.ok()) << pl.message();

    // One sequence filling the context: its pages, in bytes, are the plan's.
    {
      auto s = (*e)->new_session();
      ASSERT_TRUE(s.ok());
      ASSERT_TRUE((*s)->feed(long_prompt(size_t(L))).ok());
      const KvCache& kv = (*e)->kv_cache();
      EXPECT_EQ(kv.used_pages() * kv.geometry().page_bytes(), pl->kv.pool.bytes_at_max_model_len) << dtype_name(dt);
      EXPECT_EQ(kv.used_pages(), pl->kv.pool.pages_at_max_model_len);
    }

    // Through the scheduler: the longest prompt that leaves one token to generate.
    Scheduler sched(**e, {});
    GenerationRequest r;
    r.id = "long";
    r.prompt = long_prompt(size_t(L - 1));
    r.max_tokens = 1;
    auto obs = std::make_shared<TokenCollector>();
    auto st = sched.submit(r, obs);
    ASSERT_EQ(st.status, Scheduler::SubmitStatus::Ok) << st.message;
    ASSERT_TRUE(obs->wait(std::chrono::minutes(5)));
    EXPECT_TRUE(obs->summary.error.empty()) << obs->summary.error;
    EXPECT_EQ(obs->tokens.size(), 1u);
    EXPECT_GE(obs->summary.cached_tokens, L - 1 - 64 - 1) << "the session above left its blocks in the cache";
  }
}

// `muse plan --kv-cache-memory-bytes B` and `muse serve --kv-cache-memory-bytes B`
// size the same pool and report the same longest sequence.
TEST(LongContext, PlanAndServeAgreeOnThePool) {
  auto dir = default_model_dir();
  if (!dir.ok()) GTEST_SKIP() << dir.message();
  auto config = load_model_config(*dir);
  ASSERT_TRUE(config.ok());
  for (auto [dt, name] : {std::pair{DType::F32, "f32"}, std::pair{DType::BF16, "bf16"}, std::pair{DType::F8_E4M3, "fp8"}}) {
    for (int64_t budget : {int64_t(64) << 20, int64_t(1) << 30}) {
      server::EngineServeOptions so;
      so.max_num_seqs = 8;
      so.kv_cache_memory_bytes = budget;
      auto pages = server::kv_cache_pages(*config, so, 4096, 64, dt);
      ASSERT_TRUE(pages.ok()) << pages.message();
      plan::PlanOptions po;
      po.model = *dir;
      po.kv_cache_dtype = name;
      po.max_num_seqs = 8;
      po.kv_cache_memory_bytes = budget;
      auto pl = plan::make_plan(po);
      ASSERT_TRUE(pl.ok()) << pl.message();
      EXPECT_EQ(pl->kv.pool.pages, *pages) << name << " " << budget;
      const KvGeometry g = KvGeometry::of(*config, 64, kDefaultKvMaxRollback, dtype_bits(dt) / 8);
      EXPECT_EQ(pl->kv.pool.longest_sequence_tokens,
                g.tokens_fitting(*pages - g.step_transient_pages(std::min<int64_t>(so.max_num_batched_tokens, 4096))));
    }
  }
}

}  // namespace
}  // namespace muse
