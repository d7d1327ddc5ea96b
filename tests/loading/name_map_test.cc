#include "muse/loading/name_map.h"

#include <gtest/gtest.h>

#include <cmath>

using namespace muse;

namespace {

ModelConfig parse_or_die(const char* text) {
  auto r = parse_model_config(text);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() ? *r : ModelConfig{};
}

}  // namespace

TEST(NameMap, EverySlotOfBothFamiliesHasARow) {
  ModelConfig glimmer = parse_or_die(R"({"model_type": "muse_glimmer", "text_config": {"vocab_size": 64,
      "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
      "num_key_value_heads": 1}})");
  ModelConfig spark = parse_or_die(R"({"model_type": "muse_spark", "text_config": {"vocab_size": 64,
      "hidden_size": 16, "intermediate_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
      "num_key_value_heads": 1, "num_local_experts": 4, "num_experts_per_tok": 2, "moe_hidden_size": 8,
      "moe_intermediate_size": 8, "mlp_layer_types": ["dense", "sparse"]}})");
  for (const ModelConfig* c : {&glimmer, &spark}) {
    for (const WeightSpec& w : describe_weights(*c)) {
      const SlotRule* rule = find_slot_rule(w.slot, c->family);
      ASSERT_NE(rule, nullptr) << w.slot;
      auto names = candidate_names(*rule, w.layer);
      ASSERT_FALSE(names.empty()) << w.slot;
      if (w.slot == "lm_head") {
        EXPECT_EQ(names[0], "lm_head.weight");
      } else {
        EXPECT_EQ(names[0].rfind("model.language_model.", 0), 0u) << names[0];
      }
      EXPECT_EQ(rule->dtype_rule == DTypeRule::F32Only, w.reference_dtype == DType::F32) << w.slot;
    }
  }
  // Family-specific rows do not leak across.
  EXPECT_EQ(find_slot_rule("norm.post_attn", ModelFamily::Spark), nullptr);
  EXPECT_EQ(find_slot_rule("moe.router", ModelFamily::Glimmer), nullptr);
  EXPECT_EQ(find_slot_rule("nonsense", ModelFamily::Glimmer), nullptr);
}

TEST(NameMap, PublishedNamesAndTransforms) {
  const SlotRule* gu = find_slot_rule("moe.experts.gate_up", ModelFamily::Spark);
  ASSERT_NE(gu, nullptr);
  EXPECT_EQ(candidate_names(*gu, 7)[0], "model.language_model.layers.7.mlp.experts.gate_up_proj");
  ASSERT_EQ(gu->per_expert.size(), 2u);
  EXPECT_EQ(expand_name(gu->per_expert[1], 7, 255), "layers.7.mlp.experts.255.up_proj.weight");
  const SlotRule* bias = find_slot_rule("moe.router_bias", ModelFamily::Spark);
  EXPECT_EQ(candidate_names(*bias, 0)[0], "model.language_model.layers.0.mlp.gate.e_score_correction_bias");
  EXPECT_EQ(find_slot_rule("norm.post_ffn", ModelFamily::Spark)->transform, WeightTransform::NormOffset);
  EXPECT_EQ(find_slot_rule("moe.post_expert_norm", ModelFamily::Spark)->transform, WeightTransform::NormOffset);
  EXPECT_EQ(find_slot_rule("final_norm", ModelFamily::Spark)->transform, WeightTransform::None);
  EXPECT_EQ(find_slot_rule("resid_gate.attn", ModelFamily::Spark)->transform, WeightTransform::ResidualGate);
  EXPECT_STREQ(weight_transform_name(WeightTransform::NormOffset), "norm_offset");
  EXPECT_TRUE(dtype_allowed(DTypeRule::Float, DType::F16));
  EXPECT_FALSE(dtype_allowed(DTypeRule::F32Only, DType::BF16));
  EXPECT_FALSE(dtype_allowed(DTypeRule::Float, DType::U8));
}

TEST(NameMap, MultimodalAndQuantizedNames) {
  EXPECT_TRUE(is_multimodal_tensor("model.vision_tower.layers.0.attn.q_proj.weight"));
  EXPECT_TRUE(is_multimodal_tensor("model.vision_adapter.fc1.weight"));
  EXPECT_TRUE(is_multimodal_tensor("model.vision_projection.weight"));
  EXPECT_TRUE(is_multimodal_tensor("model.audio_tower.stages.0.weight"));
  EXPECT_TRUE(is_multimodal_tensor("visual.blocks.0.norm.weight"));
  EXPECT_FALSE(is_multimodal_tensor("model.language_model.layers.0.self_attn.q_proj.weight"));
  EXPECT_FALSE(is_multimodal_tensor("lm_head.weight"));
  EXPECT_TRUE(looks_quantized_tensor("model.language_model.layers.3.mlp.experts.gate_up_proj_weight_scale_2"));
  EXPECT_TRUE(looks_quantized_tensor("model.layers.0.self_attn.q_proj.qweight"));
  EXPECT_FALSE(looks_quantized_tensor("model.layers.0.self_attn.q_proj.weight"));
}

TEST(NameMap, ResidualGateFoldIsNormPreserving) {
  const float gate[5] = {-3.0f, -0.3f, 0.0f, 0.3f, 3.0f};
  float alpha[5], beta[5];
  fold_residual_gate(gate, 5, 0.3, alpha, beta);
  for (int i = 0; i < 5; ++i) {
    double u = gate[i] / 0.3;
    EXPECT_NEAR(beta[i], 1.0 / (1.0 + std::exp(-u)), 1e-7);
    double a2 = std::max(1.0 - double(beta[i]) * beta[i], 1e-3);
    EXPECT_NEAR(alpha[i], std::sqrt(a2), 1e-6);
  }
  EXPECT_NEAR(beta[2], 0.5f, 1e-7);
  EXPECT_NEAR(alpha[2], std::sqrt(0.75), 1e-7);
  EXPECT_NEAR(alpha[4], std::sqrt(1e-3), 1e-7);  // β ≈ 1: clamped
  const float w[3] = {0.0f, -0.25f, 0.00390625f};
  float g[3];
  norm_offset_gain(w, 3, false, g);
  EXPECT_EQ(g[1], 0.75f);
  EXPECT_EQ(g[2], 1.00390625f);
  norm_offset_gain(w, 3, true, g);
  EXPECT_EQ(g[2], 1.0f);  // 1 + 2^-8 rounds to even in bf16
}
