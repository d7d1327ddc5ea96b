#include "muse/plan/model_profiles.h"

#include <sys/stat.h>

#include "muse/core/mapped_file.h"

namespace muse::plan {

namespace {

// The Perception Encoder's vision_config as published in Muse Glimmer 30B's
// config.json; Spark uses the same tower (muse-architecture.md §6).
constexpr const char* kVisionConfig = R"({
  "hidden_size": 1536, "intermediate_size": 8960, "num_hidden_layers": 50, "num_attention_heads": 16,
  "patch_size": 14, "patch_temporal": 2, "pos_emb_height": 32, "pos_emb_width": 32, "merge_size": 2,
  "hidden_act": "gelu", "model_type": "muse_glimmer_vision"})";

// Muse Spark Open's config.json: text_config per checkpoint-formats.md §5.2
// (the keys the public ports read and assert), towers per §5.2 / §6.
std::string spark_config() {
  return std::string(R"({
  "architectures": ["MuseSparkForConditionalGeneration"], "model_type": "muse_spark",
  "image_token_id": 200092, "video_token_id": 200091, "audio_token_id": 200038,
  "projector_hidden_size": 4096, "out_hidden_size": 6144,
  "text_config": {
    "model_type": "muse_spark_text", "hidden_size": 8192, "num_hidden_layers": 62,
    "num_attention_heads": 128, "num_key_value_heads": 16, "head_dim": 64, "vocab_size": 202048,
    "max_position_embeddings": 1048576, "rms_norm_eps": 1e-05, "post_norm_eps": 1e-08,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "sliding_window": 2048,
    "num_local_experts": 256, "num_experts_per_tok": 8, "moe_hidden_size": 4096, "moe_intermediate_size": 4096,
    "num_shared_experts": 0, "routed_scaling_factor": 1.0, "residual_gate_temperature": 0.3,
    "qk_scale_factor": 5.4730064863875, "output_multiplier": 0.17677669529663687,
    "final_logit_softcapping": 20.0, "attention_bias": false, "hidden_act": "silu",
    "tie_word_embeddings": false, "bos_token_id": 200000, "pad_token_id": 200018, "eos_token_id": 200001},
  "vision_config": )") + kVisionConfig + R"(,
  "audio_config": {"sampling_rate": 24000, "samples_per_token": 1920}})";
}

// Muse Glimmer 30B's published config.json (checkpoint-formats.md §5.1),
// without the per-layer lists the parser derives from the Muse rule.
std::string glimmer_config() {
  return std::string(R"({
  "architectures": ["MuseGlimmerForConditionalGeneration"], "model_type": "muse_glimmer",
  "image_token_id": 200092, "video_token_id": 200091, "projector_hidden_size": 4096, "out_hidden_size": 6144,
  "text_config": {
    "model_type": "muse_glimmer_text", "hidden_size": 6656, "num_hidden_layers": 52,
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 19968,
    "vocab_size": 202048, "max_position_embeddings": 131072, "rms_norm_eps": 1e-05, "post_norm_eps": 1e-08,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "sliding_window": 2048,
    "qk_scale_factor": 3.87, "output_multiplier": 0.19611613513818404, "final_logit_softcapping": 20.0,
    "attention_bias": false, "hidden_activation": "silu", "tie_word_embeddings": false,
    "bos_token_id": 200000, "eos_token_id": 200001},
  "vision_config": )") + kVisionConfig + "}";
}

struct ModelProfile {
  const char* name;
  bool spark;
  WeightFormat format;
  const char* basis;
};

const ModelProfile kProfiles[] = {
    {"muse-spark-open", true, WeightFormat::BF16, "built-in: meta-models/Muse-Spark-Open-816B-A42B (BF16)"},
    {"muse-spark-open-nvfp4", true, WeightFormat::NVFP4,
     "built-in: meta-models/Muse-Spark-Open-816B-A42B-NVFP4 (ModelOpt; experts of layers 0 and 61 BF16)"},
    {"muse-spark-open-mxfp4", true, WeightFormat::MXFP4,
     "built-in: amd/Muse-Spark-Open-816B-A42B-Quark-MXFP4 (assumed: routed experts MXFP4, rest BF16)"},
    {"muse-spark-open-fp8", true, WeightFormat::FP8,
     "built-in: amd/Muse-Spark-Open-816B-A42B-Quark-PTPC-FP8 (assumed: all decoder linears FP8 per channel)"},
    {"muse-spark-open-int4", true, WeightFormat::INT4,
     "built-in: intel-ai/Muse-Spark-Open-816B-A42B-INT4 (assumed: GPTQ g128; latent and attention gate BF16)"},
    {"muse-glimmer-30b", false, WeightFormat::BF16, "built-in: meta-models/Muse-Glimmer-30B (BF16)"},
};

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

int64_t int_key(const Json& obj, const char* key) {
  const Json* v = obj.find(key);
  return v && v->is_int() ? v->as_int() : 0;
}

}  // namespace

std::vector<std::string> model_profile_names() {
  std::vector<std::string> names;
  for (const auto& p : kProfiles) names.push_back(p.name);
  return names;
}

Result<ResolvedModel> resolve_model(const std::string& name_or_path, const std::string& format_override) {
  ResolvedModel m;
  m.name = name_or_path;
  std::string text, source;
  const ModelProfile* profile = nullptr;
  for (const auto& p : kProfiles)
    if (name_or_path == p.name) profile = &p;
  Json hf_quant;  // legacy ModelOpt hf_quant_config.json beside a config.json
  if (profile) {
    m.builtin = true;
    text = profile->spark ? spark_config() : glimmer_config();
    source = std::string("built-in profile ") + profile->name;
  } else {
    std::string path = name_or_path;
    if (is_directory(path)) {
      const std::string hq = path + "/hf_quant_config.json";
      if (file_exists(hq)) {
        MUSE_ASSIGN_OR_RETURN(std::string qtext, read_file(hq));
        auto parsed = Json::parse(qtext);
        if (!parsed.ok()) return make_error(hq + ": " + parsed.message());
        hf_quant = std::move(parsed).value();
      }
      path += "/config.json";
    }
    if (!file_exists(path)) {
      std::string list;
      for (const auto& n : model_profile_names()) list += (list.empty() ? "" : ", ") + n;
      return make_error("unknown model '" + name_or_path + "': not a built-in profile (" + list +
                        ") and no such config.json or model directory");
    }
    MUSE_ASSIGN_OR_RETURN(text, read_file(path));
    source = path;
  }
  auto raw = Json::parse(text);
  if (!raw.ok()) return make_error(source + ": " + raw.message());
  m.raw = std::move(raw).value();
  MUSE_ASSIGN_OR_RETURN(m.config, parse_model_config(m.raw, source));

  const Json& qc = !m.config.quantization_config.is_null() ? m.config.quantization_config : hf_quant;
  WeightFormat format = WeightFormat::BF16;
  std::string basis;
  if (!format_override.empty()) {
    MUSE_ASSIGN_OR_RETURN(format, parse_weight_format(format_override));
    basis = std::string("--weight-format ") + weight_format_name(format);
    if (profile) basis += std::string(" on ") + profile->name;
  } else if (profile) {
    format = profile->format;
    basis = profile->basis;
  } else {
    auto detected = detect_weight_format(qc);
    if (!detected.ok()) return make_error(source + ": " + detected.message());
    format = *detected;
    basis = qc.is_null() ? std::string("config.json has no quantization_config: BF16")
                         : "quantization_config (" + qc.get_string("quant_method", "?") + ")";
  }
  m.scheme = make_quant_scheme(m.config, format, qc, basis);
  return m;
}

TowerEstimate estimate_vision(const ModelConfig& c, const Json& raw) {
  TowerEstimate t;
  if (!c.has_vision) return t;
  const Json& v = c.vision_config;
  const int64_t h = int_key(v, "hidden_size"), inter = int_key(v, "intermediate_size"),
                layers = int_key(v, "num_hidden_layers");
  const bool sane = h > 0 && h < (1 << 16) && inter > 0 && inter < (1 << 18) && layers > 0 && layers < 1024;
  if (!sane) {
    t.params = 1'900'000'000;
    t.basis = "published figure (vLLM day-0 blog, seed 002: 1.9B); vision_config lacks sizes";
    return t;
  }
  const int64_t patch = int_key(v, "patch_size") > 0 ? int_key(v, "patch_size") : 14;
  const int64_t temporal = int_key(v, "patch_temporal") > 0 ? int_key(v, "patch_temporal") : 1;
  const int64_t pos = std::max<int64_t>(1, int_key(v, "pos_emb_height")) * std::max<int64_t>(1, int_key(v, "pos_emb_width"));
  const int64_t merge = int_key(v, "merge_size") > 0 ? int_key(v, "merge_size") : 2;
  // Each block: LayerNorm (w+b) twice, qkv and out projections with bias, GELU MLP with bias.
  const int64_t block = 4 * h + (3 * h * h + 3 * h) + (h * h + h) + (h * inter + inter) + (inter * h + h);
  int64_t params = layers * block + 3 * temporal * patch * patch * h + h + pos * h + 4 * h;  // + ln_pre/ln_post
  // Adapter (two linears over the 2x2-merged width) and the projection to the text width.
  const int64_t merged = merge * merge * h;
  const int64_t proj_hidden = int_key(raw, "projector_hidden_size") > 0 ? int_key(raw, "projector_hidden_size") : merged;
  const int64_t out_hidden = int_key(raw, "out_hidden_size") > 0 ? int_key(raw, "out_hidden_size") : merged;
  params += merged * proj_hidden + proj_hidden + proj_hidden * out_hidden + out_hidden + out_hidden * c.hidden_size;
  t.params = params;
  t.basis = "from vision_config (" + std::to_string(layers) + " blocks x " + std::to_string(h) +
            " wide, adapter and projection; our estimate, see docs/plan.md)";
  return t;
}

TowerEstimate estimate_audio(const ModelConfig& c) {
  TowerEstimate t;
  if (!c.has_audio) return t;
  t.params = 118'000'000;
  t.basis = "published figure (vLLM day-0 blog, seed 002: 118M)";
  return t;
}

}  // namespace muse::plan
