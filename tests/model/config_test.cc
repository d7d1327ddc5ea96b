#include "muse/model/config.h"

#include <gtest/gtest.h>

#include <functional>

#include "muse/core/mapped_file.h"
#include "muse/model/weight_table.h"

using namespace muse;

namespace {

std::string testdata() { return std::string(MUSE_SOURCE_DIR) + "/../shared/testdata"; }

// A small Spark config in the published nested layout (checkpoint-formats.md §5.2).
Json spark_config(int64_t layers = 6) {
  Json text = Json::object();
  text.set("model_type", "muse_spark_text");
  text.set("vocab_size", 512);
  text.set("hidden_size", 64);
  text.set("num_hidden_layers", layers);
  text.set("num_attention_heads", 8);
  text.set("num_key_value_heads", 2);
  text.set("head_dim", 16);
  text.set("num_local_experts", 8);
  text.set("num_experts_per_tok", 2);
  text.set("moe_hidden_size", 32);
  text.set("moe_intermediate_size", 48);
  text.set("num_shared_experts", 0);
  text.set("residual_gate_temperature", 0.3);
  text.set("qk_scale_factor", 5.4730064863875);
  text.set("output_multiplier", 0.17677669529663687);
  text.set("final_logit_softcapping", 20.0);
  text.set("sliding_window", 16);
  Json rope = Json::object();
  rope.set("rope_type", "default");
  rope.set("rope_theta", 500000.0);
  text.set("rope_parameters", rope);
  Json types = Json::array(), thetas = Json::array(), mlp = Json::array();
  for (int64_t i = 0; i < layers; ++i) {
    bool full = (layers - 1 - i) % 4 == 0;
    types.push_back(full ? "full_attention" : "sliding_attention");
    thetas.push_back(full ? Json(0.0) : Json(500000.0));
    mlp.push_back("sparse");
  }
  text.set("layer_types", types);
  text.set("layer_rope_theta", thetas);
  text.set("mlp_layer_types", mlp);
  text.set("bos_token_id", 1);
  text.set("eos_token_id", 2);
  Json root = Json::object();
  root.set("architectures", Json(JsonArray{Json("MuseSparkForConditionalGeneration")}));
  root.set("model_type", "muse_spark");
  root.set("text_config", text);
  return root;
}

// Applies `edit` to the text_config of a fresh Spark config, parses it and
// expects an error mentioning every fragment.
void expect_spark_error(const std::function<void(Json&)>& edit, std::vector<std::string> fragments) {
  Json root = spark_config();
  edit(*root.find("text_config"));
  auto r = parse_model_config(root, "config.json");
  ASSERT_FALSE(r.ok()) << "expected an error mentioning " << fragments[0];
  for (const auto& f : fragments) EXPECT_NE(r.message().find(f), std::string::npos) << r.message();
}

}  // namespace

TEST(ModelConfig, ParsesRealGlimmerConfig) {
  std::string path = testdata() + "/muse-glimmer/config.json";
  if (!file_exists(path)) GTEST_SKIP() << "shared testdata not present at " << path;
  auto text = read_file(path);
  ASSERT_TRUE(text.ok());
  auto r = parse_model_config(*text, path);
  ASSERT_TRUE(r.ok()) << r.message();
  const ModelConfig& c = *r;
  EXPECT_EQ(c.family, ModelFamily::Glimmer);
  EXPECT_EQ(c.architecture, "MuseGlimmerForConditionalGeneration");
  EXPECT_EQ(c.vocab_size, 202048);
  EXPECT_EQ(c.sampled_vocab_size, 202048);
  EXPECT_EQ(c.hidden_size, 6656);
  EXPECT_EQ(c.num_layers, 52);
  EXPECT_EQ(c.num_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 2);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate_size, 19968);
  EXPECT_EQ(c.num_full_layers(), 13);
  EXPECT_TRUE(c.is_full(51));
  EXPECT_TRUE(c.is_full(3));
  EXPECT_FALSE(c.is_full(0));
  EXPECT_EQ(c.layer_rope_theta[3], 0.0);
  EXPECT_EQ(c.layer_rope_theta[0], 500000.0);
  EXPECT_DOUBLE_EQ(c.qk_scale_factor, 3.87);
  EXPECT_DOUBLE_EQ(c.output_multiplier, 0.19611613513818404);
  EXPECT_DOUBLE_EQ(c.final_logit_softcapping, 20.0);
  EXPECT_DOUBLE_EQ(c.post_norm_eps, 1e-8);
  EXPECT_EQ(c.bos_token_id, 200000);
  EXPECT_EQ(c.pad_token_id, -1);
  EXPECT_EQ(c.eos_token_ids, std::vector<int64_t>{200001});
  EXPECT_EQ(c.image_token_id, 200092);
  EXPECT_EQ(c.video_token_id, 200091);
  EXPECT_TRUE(c.has_vision);
  EXPECT_FALSE(c.has_audio);
  EXPECT_FALSE(c.is_sparse(0));

  auto w = describe_weights(c);
  EXPECT_EQ(w.size(), size_t(3 + 52 * 12));
  // Text decoder: embeddings + head 2.69B, 52 layers of 484M (the rest of "30B" is vision).
  const int64_t H = 6656, per_layer = 2 * 4096 * H + 2 * 256 * H + H * 4096 + 3 * H * 19968 + 4 * H;
  EXPECT_EQ(count_parameters(w), 2 * 202048 * H + H + 52 * per_layer);
}

TEST(ModelConfig, ParsesNestedSpark) {
  auto r = parse_model_config(spark_config(6));
  ASSERT_TRUE(r.ok()) << r.message();
  const ModelConfig& c = *r;
  EXPECT_TRUE(c.is_spark());
  EXPECT_EQ(c.num_experts, 8);
  EXPECT_EQ(c.num_experts_per_tok, 2);
  EXPECT_EQ(c.moe_hidden_size, 32);
  EXPECT_EQ(c.moe_intermediate_size, 48);
  EXPECT_DOUBLE_EQ(c.residual_gate_temperature, 0.3);
  EXPECT_TRUE(c.is_full(1));
  EXPECT_TRUE(c.is_full(5));
  EXPECT_FALSE(c.is_full(0));
  EXPECT_TRUE(c.is_sparse(0));
  EXPECT_EQ(c.sampled_vocab_size, 512);
  EXPECT_EQ(c.max_position_embeddings, 1048576);
}

TEST(ModelConfig, SparkFullSizeDerivesPatternAndMaskedVocab) {
  // The published 62-layer shape with no layer lists: derived by the Muse rule.
  Json root = spark_config(62);
  Json& t = *root.find("text_config");
  t.erase("layer_types");
  t.erase("layer_rope_theta");
  t.erase("mlp_layer_types");
  t.set("vocab_size", 202048);
  t.set("hidden_size", 8192);
  t.set("num_attention_heads", 128);
  t.set("num_key_value_heads", 16);
  t.set("head_dim", 64);
  t.set("num_local_experts", 256);
  t.set("num_experts_per_tok", 8);
  t.set("moe_hidden_size", 4096);
  t.set("moe_intermediate_size", 4096);
  auto r = parse_model_config(root);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->num_full_layers(), 16);
  for (int i = 0; i < 62; ++i) EXPECT_EQ(r->is_full(i), i % 4 == 1) << i;
  EXPECT_EQ(r->sampled_vocab_size, 201818);
  auto w = describe_weights(*r);
  // ≈ 820B parameters (muse-architecture.md §1).
  double params = double(count_parameters(w));
  EXPECT_GT(params, 819e9);
  EXPECT_LT(params, 821e9);
}

TEST(ModelConfig, FlatSparkAndAliases) {
  Json root = spark_config(5);
  Json text = *root.find("text_config");
  text.set("model_type", "muse_spark");
  text.erase("num_local_experts");
  text.set("n_routed_experts", 8);
  text.erase("moe_hidden_size");
  text.set("moe_latent_size", 32);
  text.erase("layer_rope_theta");
  Json nrl = Json::array();
  for (int i = 0; i < 5; ++i) nrl.push_back((5 - 1 - i) % 4 == 0 ? 0 : 1);
  text.set("no_rope_layers", nrl);
  auto r = parse_model_config(text);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(r->num_experts, 8);
  EXPECT_EQ(r->moe_hidden_size, 32);
  EXPECT_EQ(r->layer_rope_theta[0], 0.0);
  EXPECT_EQ(r->layer_rope_theta[1], 500000.0);
  EXPECT_EQ(r->layer_rope_theta[4], 0.0);
  EXPECT_TRUE(r->is_full(0));
}

TEST(ModelConfig, TieWordEmbeddingsFromTopLevel) {
  Json root = spark_config(6);
  root.set("tie_word_embeddings", true);
  auto r = parse_model_config(root);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_TRUE(r->tie_word_embeddings);
  root.find("text_config")->set("tie_word_embeddings", false);
  r = parse_model_config(root);
  ASSERT_TRUE(r.ok());
  EXPECT_FALSE(r->tie_word_embeddings);
  root.set("tie_word_embeddings", "yes");
  EXPECT_FALSE(parse_model_config(root).ok());
}

TEST(ModelConfig, DenseSparkLayersUseDenseSlots) {
  Json root = spark_config(6);
  Json& t = *root.find("text_config");
  t.find("mlp_layer_types")->as_array()[0] = Json("dense");
  expect_spark_error([&](Json& tt) { tt = t; }, {"intermediate_size", "missing"});
  t.set("intermediate_size", 96);
  auto r = parse_model_config(root);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_FALSE(r->is_sparse(0));
  EXPECT_TRUE(r->is_sparse(1));
  auto w = describe_weights(*r);
  bool dense0 = false, moe0 = false;
  for (const auto& s : w) {
    if (s.layer == 0 && s.slot == "mlp.gate") dense0 = true;
    if (s.layer == 0 && s.slot.rfind("moe.", 0) == 0) moe0 = true;
  }
  EXPECT_TRUE(dense0);
  EXPECT_FALSE(moe0);
}

TEST(ModelConfig, SparkWeightTable) {
  auto r = parse_model_config(spark_config(6));
  ASSERT_TRUE(r.ok());
  auto w = describe_weights(*r);
  EXPECT_EQ(w.size(), size_t(3 + 6 * 18));
  for (const auto& s : w) {
    if (s.layer != 2) continue;
    if (s.slot == "moe.router") {
      EXPECT_EQ(s.shape, (std::vector<int64_t>{8, 64}));
      EXPECT_EQ(s.reference_dtype, DType::F32);
      EXPECT_EQ(s.part, WeightPart::Router);
    }
    if (s.slot == "moe.router_bias") { EXPECT_EQ(s.reference_dtype, DType::F32); }
    if (s.slot == "moe.experts.gate_up") { EXPECT_EQ(s.shape, (std::vector<int64_t>{8, 96, 32})); }
    if (s.slot == "moe.experts.down") { EXPECT_EQ(s.shape, (std::vector<int64_t>{8, 32, 48})); }
    if (s.slot == "moe.pre_expert_proj") { EXPECT_EQ(s.shape, (std::vector<int64_t>{32, 64})); }
    if (s.slot == "moe.post_expert_proj") { EXPECT_EQ(s.shape, (std::vector<int64_t>{64, 32})); }
    if (s.slot == "attn.gate") { EXPECT_EQ(s.shape, (std::vector<int64_t>{128, 64})); }
    if (s.slot == "attn.k") { EXPECT_EQ(s.shape, (std::vector<int64_t>{32, 64})); }
    if (s.slot == "attn.o") { EXPECT_EQ(s.shape, (std::vector<int64_t>{64, 128})); }
    EXPECT_NE(s.slot, "norm.post_attn");
  }
  EXPECT_STREQ(weight_part_name(WeightPart::ResidualGates), "residual_gates");
}

TEST(ModelConfig, GenerationConfigEosList) {
  auto r = parse_model_config(spark_config(6));
  ASSERT_TRUE(r.ok());
  ModelConfig c = *r;
  auto gen = Json::parse(R"({"bos_token_id": 200000, "eos_token_id": [200001, 200008]})");
  ASSERT_TRUE(gen.ok());
  ASSERT_TRUE(apply_generation_config(c, *gen).ok());
  EXPECT_EQ(c.eos_token_ids, (std::vector<int64_t>{200001, 200008}));
  auto bad = Json::parse(R"({"eos_token_id": [1, "x"]})");
  Status s = apply_generation_config(c, *bad, "generation_config.json");
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("eos_token_id[1]"), std::string::npos) << s.message();
}

TEST(ModelConfigErrors, TopLevel) {
  auto expect_err = [](const char* text, const char* fragment) {
    auto r = parse_model_config(text);
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.message().find(fragment), std::string::npos) << r.message();
  };
  expect_err("[1,2]", "top level must be a JSON object");
  expect_err("{\"model_type\": ", "invalid JSON");
  expect_err("{}", "missing required key model_type");
  expect_err(R"({"model_type": "llama"})", "not a Muse model");
  expect_err(R"({"model_type": "muse_spark", "text_config": 3})", "text_config must be an object");
  expect_err(R"({"model_type": "musespark1x_omni"})", "NeMo");
  expect_err(R"({"model_type": "muse_spark", "text_config": {"rms_post_norm_eps": 1e-8}})", "NeMo");
  expect_err(R"({"model_type": "muse_spark", "every_n_layers_nope": 4})", "NeMo");
  expect_err(R"({"model_type": "muse_glimmer", "text_config": {"model_type": "muse_spark_text"}})",
             "does not belong");
  expect_err(R"({"model_type": "muse_glimmer", "architectures": "X", "text_config": {}})", "architectures");
}

TEST(ModelConfigErrors, MissingKeys) {
  for (const char* key : {"vocab_size", "hidden_size", "num_hidden_layers", "num_attention_heads",
                          "num_key_value_heads", "num_experts_per_tok", "moe_intermediate_size"}) {
    expect_spark_error([&](Json& t) { t.erase(key); }, {"missing required key", std::string("text_config.") + key});
  }
  expect_spark_error([](Json& t) { t.erase("num_local_experts"); }, {"missing", "num_local_experts"});
  expect_spark_error([](Json& t) { t.erase("moe_hidden_size"); }, {"missing", "moe_hidden_size"});
}

TEST(ModelConfigErrors, BadValuesNameTheKey) {
  expect_spark_error([](Json& t) { t.set("hidden_size", -64); }, {"text_config.hidden_size", "out of range"});
  expect_spark_error([](Json& t) { t.set("hidden_size", 0); }, {"text_config.hidden_size"});
  expect_spark_error([](Json& t) { t.set("hidden_size", "64"); }, {"text_config.hidden_size", "must be an integer"});
  expect_spark_error([](Json& t) { t.set("hidden_size", 64.5); }, {"hidden_size", "must be an integer"});
  expect_spark_error([](Json& t) { t.set("hidden_size", true); }, {"hidden_size", "must be an integer"});
  expect_spark_error([](Json& t) { t.set("vocab_size", int64_t(1) << 40); }, {"vocab_size", "out of range"});
  expect_spark_error([](Json& t) { t.set("num_hidden_layers", 100000); }, {"num_hidden_layers", "out of range"});
  expect_spark_error([](Json& t) { t.set("hidden_size", 60); }, {"hidden_size", "not divisible", "num_attention_heads"});
  expect_spark_error([](Json& t) { t.set("num_key_value_heads", 3); },
                     {"num_attention_heads", "not divisible by num_key_value_heads"});
  expect_spark_error([](Json& t) { t.set("head_dim", 15); }, {"head_dim", "even"});
  expect_spark_error([](Json& t) { t.set("num_experts_per_tok", 9); }, {"num_experts_per_tok", "exceeds"});
  expect_spark_error([](Json& t) { t.set("num_experts", 16); }, {"num_local_experts", "num_experts", "disagree"});
  expect_spark_error([](Json& t) { t.set("num_shared_experts", 1); }, {"num_shared_experts", "not supported"});
  expect_spark_error([](Json& t) { t.set("rms_norm_eps", -1.0); }, {"rms_norm_eps"});
  expect_spark_error([](Json& t) { t.set("rms_norm_eps", "small"); }, {"rms_norm_eps", "must be a number"});
  expect_spark_error([](Json& t) { t.set("residual_gate_temperature", 0.0); }, {"residual_gate_temperature"});
  expect_spark_error([](Json& t) { t.set("tie_word_embeddings", 1); }, {"tie_word_embeddings", "true or false"});
  expect_spark_error([](Json& t) { t.set("attention_bias", true); }, {"attention_bias"});
  expect_spark_error([](Json& t) { t.set("hidden_act", "gelu"); }, {"hidden_act", "silu"});
  expect_spark_error([](Json& t) { t.set("sliding_window", 0); }, {"sliding_window"});
  expect_spark_error([](Json& t) { t.set("eos_token_id", -5); }, {"eos_token_id"});
  expect_spark_error([](Json& t) { t.set("bos_token_id", "<s>"); }, {"bos_token_id"});
  expect_spark_error([](Json& t) { (*t.find("rope_parameters")).set("rope_type", "yarn"); },
                     {"rope_parameters.rope_type", "yarn"});
  expect_spark_error([](Json& t) { (*t.find("rope_parameters")).set("rope_theta", -1); }, {"rope_theta"});
}

TEST(ModelConfigErrors, LayerPatternDisagreementNamesLayer) {
  expect_spark_error([](Json& t) { t.find("layer_types")->as_array()[2] = Json("full_attention"); },
                     {"layer_types[2]", "layer 2", "Muse rule"});
  expect_spark_error([](Json& t) { t.find("layer_types")->as_array()[1] = Json("sliding_attention"); },
                     {"layer_types[1]", "layer 1"});
  expect_spark_error([](Json& t) { t.find("layer_types")->as_array()[0] = Json("chunked_attention"); },
                     {"layer_types[0]", "full_attention"});
  expect_spark_error([](Json& t) { t.find("layer_types")->as_array().pop_back(); },
                     {"layer_types", "5 entries", "num_hidden_layers = 6"});
  expect_spark_error([](Json& t) { t.find("layer_rope_theta")->as_array()[1] = Json(10000.0); },
                     {"layer_rope_theta[1]", "layer 1", "0 exactly on full"});
  expect_spark_error([](Json& t) { t.find("layer_rope_theta")->as_array()[0] = Json(0); },
                     {"layer_rope_theta[0]", "layer 0"});
  expect_spark_error([](Json& t) { t.find("layer_rope_theta")->as_array()[0] = Json("x"); },
                     {"layer_rope_theta[0]", "finite number"});
  expect_spark_error([](Json& t) { t.set("layer_types", 3); }, {"layer_types", "must be a list"});
  expect_spark_error(
      [](Json& t) {
        Json nrl = Json::array();
        for (int i = 0; i < 6; ++i) nrl.push_back(1);
        t.set("no_rope_layers", nrl);
      },
      {"no_rope_layers[1]", "layer 1"});
  expect_spark_error([](Json& t) { t.find("mlp_layer_types")->as_array()[3] = Json("moe"); },
                     {"mlp_layer_types[3]", "sparse"});
}

TEST(ModelConfig, LoadModelConfigReportsMissingDir) {
  auto r = load_model_config("/nonexistent/model");
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.message().find("no config.json"), std::string::npos);
}
