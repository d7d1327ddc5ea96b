// Tiny random Glimmer/Spark engines (weights generated in memory) for the
// engine tests: determinism, batching, KV rings, errors.
#pragma once

#include <gtest/gtest.h>

#include <memory>
#include <string>

#include "muse/engine/engine.h"
#include "muse/model/random_weights.h"

namespace muse::testing {

// A config.json for a tiny model: 6 layers (full at 1 and 5), window 4,
// GQA 2, Spark with 6 experts top-2 (layer 3 dense, to cover Spark's dense
// layers), Glimmer dense.
inline std::string tiny_config_json(bool spark, int64_t window = 4) {
  std::string mlp = R"("mlp_layer_types": ["sparse","sparse","sparse","dense","sparse","sparse"],
      "num_local_experts": 6, "num_experts_per_tok": 2, "moe_hidden_size": 24, "moe_intermediate_size": 16,
      "residual_gate_temperature": 0.3, "routed_scaling_factor": 1.0, "intermediate_size": 40,)";
  return std::string(R"({"model_type": ")") + (spark ? "muse_spark" : "muse_glimmer") + R"(",
    "text_config": {
      "vocab_size": 97, "hidden_size": 32, "num_hidden_layers": 6, "num_attention_heads": 4,
      "num_key_value_heads": 2, "head_dim": 8, "rms_norm_eps": 1e-5, "post_norm_eps": 1e-8,
      "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
      "sliding_window": )" + std::to_string(window) + R"(, "max_position_embeddings": 4096,
      "qk_scale_factor": 3.87, "output_multiplier": 0.25, "final_logit_softcapping": 20.0,
      )" + (spark ? mlp : std::string(R"("intermediate_size": 40,)")) + R"(
      "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": false
    }})";
}

inline ModelConfig tiny_config(bool spark, int64_t window = 4) {
  auto c = parse_model_config(tiny_config_json(spark, window), "tiny config");
  EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.message());
  return c.ok() ? *c : ModelConfig{};
}

inline std::unique_ptr<Engine> tiny_engine(bool spark, int threads = 2, EngineOptions o = {}, uint64_t seed = 5,
                                           DType dtype = DType::BF16) {
  ModelConfig c = tiny_config(spark);
  RandomWeightOptions ro;
  ro.seed = seed;
  ro.dtype = dtype;
  o.backend.cpu.threads = threads;
  if (o.max_model_len == 0) o.max_model_len = 256;
  if (o.kv_block_size == 64) o.kv_block_size = 4;
  auto e = Engine::create(c, std::make_unique<RandomWeightSource>(c, ro), o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.message());
  return e.ok() ? std::move(e).value() : nullptr;
}

inline std::vector<int32_t> some_tokens(size_t n, int32_t salt = 0) {
  std::vector<int32_t> t;
  for (size_t i = 0; i < n; ++i) t.push_back(int32_t((i * 37 + 11 + size_t(salt) * 13) % 90 + 4));
  return t;
}

inline bool bits_equal(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && std::memcmp(a.data(), b.data(), a.size() * 4) == 0;
}

}  // namespace muse::testing
