// The engine's one description of a Muse model's text decoder, filled from a
// Hugging Face config.json (nested `text_config` or flat) for both family
// members. It feeds the loader (tensor shapes), the forward pass, the KV cache
// and `muse plan`. Parsing lives in config.cc; key aliases are normalised there.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"

namespace muse {

enum class ModelFamily { Glimmer, Spark };
enum class AttentionKind { Sliding, Full };  // Full layers are also NoPE (theta 0)
enum class MlpKind { Dense, Sparse };

struct ModelConfig {
  ModelFamily family = ModelFamily::Glimmer;
  std::string model_type;    // top-level model_type: "muse_glimmer" | "muse_spark"
  std::string architecture;  // architectures[0], informational

  // Decoder shape.
  int64_t vocab_size = 0;            // embedding / lm_head rows
  int64_t sampled_vocab_size = 0;    // ids >= this are never sampled (Spark: min(vocab_size, 201818)); == vocab_size otherwise
  int64_t hidden_size = 0;
  int64_t num_layers = 0;
  int64_t num_heads = 0;
  int64_t num_kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate_size = 0;     // dense SwiGLU width (Glimmer; Spark dense layers if any)
  int64_t max_position_embeddings = 0;

  // Norms.
  double rms_norm_eps = 1e-5;
  double post_norm_eps = 1e-8;

  // Attention pattern.
  int64_t sliding_window = 2048;     // keys visible to a query, itself included
  std::vector<AttentionKind> layer_types;
  std::vector<double> layer_rope_theta;  // 0 = NoPE
  double rope_theta = 500000.0;
  double qk_scale_factor = 1.0;

  // Head.
  double output_multiplier = 1.0;
  double final_logit_softcapping = 0.0;  // 0 = none
  bool tie_word_embeddings = false;

  // Latent mixture of experts (Spark).
  std::vector<MlpKind> mlp_layer_types;  // one per layer: Glimmer all Dense, Spark from the config (default Sparse)
  int64_t num_experts = 0;
  int64_t num_experts_per_tok = 0;
  int64_t moe_hidden_size = 0;        // latent width
  int64_t moe_intermediate_size = 0;  // expert SwiGLU width
  int64_t num_shared_experts = 0;
  double routed_scaling_factor = 1.0;
  double residual_gate_temperature = 1.0;

  // Special tokens.
  int64_t bos_token_id = -1;
  int64_t pad_token_id = -1;
  std::vector<int64_t> eos_token_ids;
  int64_t image_token_id = -1;
  int64_t video_token_id = -1;
  int64_t audio_token_id = -1;

  // Multimodal towers present in the checkpoint's config (vision_config /
  // audio_config); the text decoder does not need them.
  bool has_vision = false;
  bool has_audio = false;
  Json vision_config;  // raw, for the multimodal module and `muse plan`
  Json audio_config;

  // Checkpoint quantization_config, raw (the loader interprets it).
  Json quantization_config;

  // Derived helpers.
  bool is_spark() const { return family == ModelFamily::Spark; }
  bool is_full(int64_t layer) const { return layer_types[size_t(layer)] == AttentionKind::Full; }
  bool is_sparse(int64_t layer) const {
    return !mlp_layer_types.empty() && mlp_layer_types[size_t(layer)] == MlpKind::Sparse;
  }
  int64_t q_dim() const { return num_heads * head_dim; }
  int64_t kv_dim() const { return num_kv_heads * head_dim; }
  int64_t num_full_layers() const;
  int64_t num_sliding_layers() const { return num_layers - num_full_layers(); }
};

// Parses and validates config.json text. `source` names the file in errors.
// Derives layer types / RoPE thetas by the Muse rule (full where
// (L-1-i) % 4 == 0) when the config does not list them, and cross-checks them
// when it does: any disagreement is an error naming the layer.
Result<ModelConfig> parse_model_config(std::string_view json_text, const std::string& source = "config.json");
Result<ModelConfig> parse_model_config(const Json& config, const std::string& source = "config.json");
// Text overloads (a std::string or literal converts to both string_view and Json).
inline Result<ModelConfig> parse_model_config(const std::string& json_text, const std::string& source = "config.json") {
  return parse_model_config(std::string_view(json_text), source);
}
inline Result<ModelConfig> parse_model_config(const char* json_text, const std::string& source = "config.json") {
  return parse_model_config(std::string_view(json_text), source);
}
// Applies generation_config.json: its eos_token_id (an integer or a list)
// replaces the config's; bos/pad ids likewise when present.
Status apply_generation_config(ModelConfig& config, const Json& generation,
                               const std::string& source = "generation_config.json");
// Reads <dir>/config.json (and <dir>/generation_config.json for EOS lists).
Result<ModelConfig> load_model_config(const std::string& model_dir);

// The Muse rule for full-attention (NoPE) layers.
inline bool muse_full_layer_rule(int64_t layer, int64_t num_layers) { return (num_layers - 1 - layer) % 4 == 0; }

}  // namespace muse
