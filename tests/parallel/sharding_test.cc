// The split table (model/sharding.h) on the real Muse shapes, the rank's
// slice of a source (model/shard_source.h), and the checks that refuse a
// split the model cannot take.
#include <gtest/gtest.h>

#include <map>
#include <numeric>

#include "muse/model/shard_source.h"
#include "muse/model/sharding.h"
#include "muse/plan/model_profiles.h"

namespace muse {
namespace {

ModelConfig profile(const std::string& name) {
  auto m = plan::resolve_model(name, "");
  EXPECT_TRUE(m.ok()) << (m.ok() ? "" : m.message());
  return m->config;
}

TEST(Sharding, SparkHeadsExpertsAndVocabularyOverSixteenRanks) {
  const ModelConfig c = profile("muse-spark-open");  // 128 Q / 16 KV heads × 64, 256 experts
  for (int64_t n : {2, 4, 8, 16}) {
    EXPECT_TRUE(check_parallel(c, {n, true}).ok()) << n;
    std::vector<int64_t> kv_heads;
    for (int64_t r = 0; r < n; ++r) {
      const RankWidths w = rank_widths(c, {n, r, true});
      EXPECT_EQ(w.q_heads, 128 / n);
      EXPECT_EQ(w.kv_heads, 16 / n);
      EXPECT_EQ(w.kv_head_begin, r * 16 / n);
      EXPECT_EQ(w.experts, 256 / n);
      EXPECT_EQ(w.expert_begin, r * 256 / n);
    }
  }
  // Every split slot's shards over the ranks add up to the whole.
  for (int64_t n : {4, 16}) {
    for (const WeightSpec& s : describe_weights(c)) {
      if (s.layer > 1) break;
      int64_t covered = 0;
      for (int64_t r = 0; r < n; ++r) {
        const ShardSlice sl = shard_of(s, c, {n, r, true});
        covered += sl.whole() ? 0 : sl.count;
        if (sl.whole()) EXPECT_EQ(sl.shape, s.shape) << s.slot;
      }
      const ShardSlice first = shard_of(s, c, {n, 0, true});
      if (!first.whole()) EXPECT_EQ(covered, first.extent) << s.slot << " over " << n;
    }
  }
  // What is split and how (docs/parallel.md's table).
  auto split = [&](const std::string& slot) {
    for (const WeightSpec& s : describe_weights(c))
      if (s.slot == slot) return weight_split(s);
    return WeightSplit::Replicated;
  };
  EXPECT_EQ(split("attn.q"), WeightSplit::Column);
  EXPECT_EQ(split("attn.k"), WeightSplit::Column);
  EXPECT_EQ(split("attn.gate"), WeightSplit::Column);
  EXPECT_EQ(split("attn.o"), WeightSplit::Row);
  EXPECT_EQ(split("moe.experts.gate_up"), WeightSplit::Expert);
  EXPECT_EQ(split("moe.router"), WeightSplit::Replicated);
  EXPECT_EQ(split("moe.pre_expert_proj"), WeightSplit::Replicated);
  EXPECT_EQ(split("moe.post_expert_proj"), WeightSplit::Replicated);
  EXPECT_EQ(split("embed_tokens"), WeightSplit::Replicated);
  EXPECT_EQ(split("lm_head"), WeightSplit::Vocab);
}

TEST(Sharding, GlimmerReplicatesItsTwoKvHeadsBeyondTwoRanks) {
  const ModelConfig c = profile("muse-glimmer-30b");  // 32 Q / 2 KV heads
  const int64_t n = 8;
  ASSERT_TRUE(check_parallel(c, {n, false}).ok());
  for (int64_t r = 0; r < n; ++r) {
    const RankWidths w = rank_widths(c, {n, r, false});
    EXPECT_EQ(w.kv_heads, 1);
    EXPECT_EQ(w.kv_head_begin, r / 4);  // ranks 0-3 read KV head 0, ranks 4-7 head 1
    // This rank's query heads all read that KV head (GQA group of 16).
    EXPECT_EQ((r * w.q_heads) / (c.num_heads / c.num_kv_heads), w.kv_head_begin);
    EXPECT_EQ(rank_kv_config(c, {n, r, false}).kv_dim(), c.head_dim);
  }
  EXPECT_EQ(rank_widths(c, {2, 1, false}).kv_head_begin, 1);
}

TEST(Sharding, RefusesWhatTheModelCannotTake) {
  const ModelConfig spark = profile("muse-spark-open");
  Status s = check_parallel(spark, {8, false});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("--enable-expert-parallel"), std::string::npos) << s.message();
  s = check_parallel(spark, {3, true});
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("attention heads"), std::string::npos) << s.message();
  EXPECT_TRUE(check_parallel(spark, {1, false}).ok());
  const ModelConfig glimmer = profile("muse-glimmer-30b");
  EXPECT_FALSE(check_parallel(glimmer, {64, false}).ok());
}

// A source holding [rows, cols] F32 matrices whose values are their indices.
class IotaSource final : public WeightSource {
 public:
  explicit IotaSource(const ModelConfig& c) {
    for (const WeightSpec& s : describe_weights(c)) {
      auto& v = data_[{s.layer, s.slot}];
      v.resize(size_t(s.numel()));
      std::iota(v.begin(), v.end(), 0.0f);
    }
  }
  Result<HostTensor> view(const WeightSpec& s) const override {
    const auto& v = data_.at({s.layer, s.slot});
    return HostTensor{DType::F32, s.shape, v.data(), v.size() * 4};
  }
  Status read_f32(const WeightSpec& s, float* dst) const override {
    const auto& v = data_.at({s.layer, s.slot});
    std::copy(v.begin(), v.end(), dst);
    return Status::Ok();
  }

 private:
  std::map<std::pair<int, std::string>, std::vector<float>> data_;
};

TEST(ShardSource, RowsAreViewsColumnsAreGatheredVocabularyIsPadded) {
  ModelConfig c = profile("muse-glimmer-30b");
  c.num_layers = 1, c.layer_types = {c.layer_types[0]}, c.layer_rope_theta = {c.layer_rope_theta[0]};
  c.hidden_size = 8, c.num_heads = 4, c.num_kv_heads = 2, c.head_dim = 2, c.intermediate_size = 6, c.vocab_size = 7;
  IotaSource inner(c);
  const ParallelRank r1{2, 1, false};
  ShardWeightSource src(inner, c, r1);
  for (const WeightSpec& s : shard_weights(c, r1)) {
    auto v = src.view(s);
    ASSERT_TRUE(v.ok()) << s.slot << ": " << v.message();
    const float* x = static_cast<const float*>(v->data);
    if (s.slot == "attn.q") {  // rows 4..7 of [8, 8]: a view into the source
      EXPECT_EQ(s.shape, (std::vector<int64_t>{4, 8}));
      EXPECT_EQ(x[0], 32.0f);
      EXPECT_EQ(x, static_cast<const float*>(inner.view(describe_weights(c)[1]).value().data) + 32);
    } else if (s.slot == "attn.o") {  // columns 4..7 of [8, 8]
      EXPECT_EQ(s.shape, (std::vector<int64_t>{8, 4}));
      EXPECT_EQ(x[0], 4.0f);
      EXPECT_EQ(x[4], 12.0f);
    } else if (s.slot == "mlp.down") {  // columns 3..5 of [8, 6]
      EXPECT_EQ(x[0], 3.0f);
      EXPECT_EQ(x[3], 9.0f);
    } else if (s.slot == "lm_head") {  // rows 4..6 of 7, padded to 4 with zeros
      EXPECT_EQ(s.shape, (std::vector<int64_t>{4, 8}));
      EXPECT_EQ(x[0], 32.0f);
      EXPECT_EQ(x[3 * 8], 0.0f);
      std::vector<float> f(size_t(4 * 8), -1.0f);
      ASSERT_TRUE(src.read_f32(s, f.data()).ok());
      EXPECT_EQ(f[0], 32.0f);
      EXPECT_EQ(f[31], 0.0f);
    } else if (s.slot == "embed_tokens") {
      EXPECT_EQ(s.shape, (std::vector<int64_t>{7, 8}));  // replicated
    }
  }
}

}  // namespace
}  // namespace muse
