// Models for `muse plan`: built-in profiles (a config.json the engine parses
// like any other, plus a weight format), the towers outside the text decoder
// (vision, audio), and speculative-decoding drafters.
//
// The text decoder is never described here: its shape is the engine's own
// ModelConfig and weight table. Profiles are config.json text, so a built-in
// profile and a downloaded config.json go through the same parser.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"
#include "muse/model/config.h"
#include "muse/plan/weight_format.h"

namespace muse::plan {

struct ResolvedModel {
  std::string name;     // profile name or the config path
  bool builtin = false;
  ModelConfig config;
  Json raw;             // the whole config.json (top-level keys the decoder config does not keep)
  QuantScheme scheme;
};

std::vector<std::string> model_profile_names();
// `name_or_path`: a built-in profile name, a config.json file, or a model
// directory holding config.json (and optionally hf_quant_config.json).
// `format_override` ("" = from the profile / the checkpoint's
// quantization_config) forces a weight format. Unknown names list the valid
// profiles; config errors name the file and key.
Result<ResolvedModel> resolve_model(const std::string& name_or_path, const std::string& format_override);

// A tower outside the text decoder: parameter count and how it was obtained.
struct TowerEstimate {
  int64_t params = 0;
  std::string basis;
};
// Perception Encoder (muse-architecture.md §6) from vision_config: patch
// embedding, position table, pre-norm ViT blocks, 2x2 merge, adapter and
// projection to the text width. Falls back to the published 1.9B figure when
// vision_config lacks the sizes.
TowerEstimate estimate_vision(const ModelConfig& config, const Json& raw_config);
// The audio encoder: 118M parameters (seed 002) when audio_config is present.
TowerEstimate estimate_audio(const ModelConfig& config);

// A draft model for speculative decoding, by shape.
struct DrafterShape {
  std::string name;
  std::string basis;
  int64_t layers = 0;
  int64_t hidden = 0;
  int64_t heads = 0;
  int64_t kv_heads = 0;
  int64_t head_dim = 0;
  int64_t intermediate = 0;   // dense SwiGLU width
  bool attention_gate = false;  // Spark-style full-width output gate
  bool qk_norm_weights = false;
  int64_t fc_inputs = 0;      // width of the concatenated target features
  int64_t vocab = 0;
  bool own_embedding = false;
  bool own_lm_head = false;
  int64_t markov_rank = 0;    // DSpark Markov head W1 [V, r] and W2 [V, r]
  bool confidence_head = false;
  int64_t sliding_window = 0;  // 0 = full-length context KV
  int64_t num_speculative_tokens = 0;
};
int64_t drafter_params(const DrafterShape& d);

std::vector<std::string> drafter_profile_names();
// `drafter`: a profile name (or the Hugging Face id it stands for) or a
// drafter config.json; `speculative_config`: vLLM's --speculative-config JSON
// (method dspark/dflash/draft_model use a drafter; ngram/suffix carry no
// weights). Either may be empty. Returns no drafter when both are empty or
// the method needs none.
struct DrafterChoice {
  bool present = false;   // a draft model with weights
  std::string method;     // "dspark", "dflash", "ngram", ...
  DrafterShape shape;
  int64_t num_speculative_tokens = 0;
};
Result<DrafterChoice> resolve_drafter(const std::string& drafter, const std::string& speculative_config,
                                      const ModelConfig& target);

}  // namespace muse::plan
