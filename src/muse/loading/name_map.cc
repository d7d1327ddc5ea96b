#include "muse/loading/name_map.h"

#include <cmath>

namespace muse {

namespace {

using F = SlotFamily;
using D = DTypeRule;
using T = WeightTransform;

// Sources: Glimmer = transformers 5.17 muse_glimmer (§5.1); Spark = the
// published BF16 names (§5.4) and the aliases listed there.
const std::vector<SlotRule> kTable = {
    // Global.
    {"embed_tokens", F::Both, {"embed_tokens.weight", "embeddings.weight"}, {}, {}, D::Float, T::None, "[vocab_size, hidden_size]"},
    {"final_norm", F::Both, {"norm.weight", "norm_f.weight"}, {}, {}, D::Float, T::None, "[hidden_size]"},
    {"lm_head", F::Both, {}, {"lm_head.weight", "language_model.lm_head.weight"}, {}, D::Float, T::None,
     "[vocab_size, hidden_size]"},

    // Attention (both).
    {"attn.q", F::Both, {"layers.{L}.self_attn.q_proj.weight"}, {}, {}, D::Float, T::None,
     "[num_attention_heads*head_dim, hidden_size]"},
    {"attn.k", F::Both, {"layers.{L}.self_attn.k_proj.weight"}, {}, {}, D::Float, T::None,
     "[num_key_value_heads*head_dim, hidden_size]"},
    {"attn.v", F::Both, {"layers.{L}.self_attn.v_proj.weight"}, {}, {}, D::Float, T::None,
     "[num_key_value_heads*head_dim, hidden_size]"},
    {"attn.gate", F::Both,
     {"layers.{L}.self_attn.gate_proj.weight", "layers.{L}.self_attn.g_proj.weight",
      "layers.{L}.self_attn.output_gate_proj.weight"},
     {}, {}, D::Float, T::None, "[num_attention_heads*head_dim, hidden_size]"},
    {"attn.o", F::Both, {"layers.{L}.self_attn.o_proj.weight"}, {}, {}, D::Float, T::None,
     "[hidden_size, num_attention_heads*head_dim]"},

    // Norms. Per-layer gains are offsets (1 + w); the final norm is absolute.
    {"norm.input", F::Both, {"layers.{L}.input_layernorm.weight"}, {}, {}, D::Float, T::NormOffset, "[hidden_size]"},
    {"norm.post_attn", F::Glimmer, {"layers.{L}.post_attention_layernorm.weight"}, {}, {}, D::Float, T::NormOffset,
     "[hidden_size]"},
    {"norm.pre_ffn", F::Both, {"layers.{L}.pre_feedforward_layernorm.weight"}, {}, {}, D::Float, T::NormOffset,
     "[hidden_size]"},
    {"norm.post_ffn", F::Both, {"layers.{L}.post_feedforward_layernorm.weight"}, {}, {}, D::Float, T::NormOffset,
     "[hidden_size]"},

    // Dense SwiGLU (Glimmer; Spark layers marked "dense").
    {"mlp.gate", F::Both, {"layers.{L}.mlp.gate_proj.weight"}, {}, {}, D::Float, T::None,
     "[intermediate_size, hidden_size]"},
    {"mlp.up", F::Both, {"layers.{L}.mlp.up_proj.weight"}, {}, {}, D::Float, T::None, "[intermediate_size, hidden_size]"},
    {"mlp.down", F::Both, {"layers.{L}.mlp.down_proj.weight"}, {}, {}, D::Float, T::None,
     "[hidden_size, intermediate_size]"},

    // Spark: gated residual stream.
    {"resid_gate.attn", F::Spark, {"layers.{L}.post_attention_residual_gate.gate"}, {}, {}, D::Float, T::ResidualGate,
     "[hidden_size]"},
    {"resid_gate.ffn", F::Spark, {"layers.{L}.post_feedforward_residual_gate.gate"}, {}, {}, D::Float,
     T::ResidualGate, "[hidden_size]"},

    // Spark: latent mixture of experts.
    {"moe.router", F::Spark, {"layers.{L}.mlp.gate.weight", "layers.{L}.mlp.router.weight"}, {}, {}, D::F32Only,
     T::None, "[num_local_experts, hidden_size]"},
    {"moe.router_bias", F::Spark, {"layers.{L}.mlp.gate.e_score_correction_bias", "layers.{L}.mlp.router.bias"}, {},
     {}, D::F32Only, T::None, "[num_local_experts]"},
    {"moe.pre_expert_proj", F::Spark,
     {"layers.{L}.mlp.pre_expert_proj.weight", "layers.{L}.mlp.pooler.weight", "layers.{L}.mlp.fc1_latent_proj.weight",
      "layers.{L}.mlp.latent_down_proj.weight"},
     {}, {}, D::Float, T::None, "[moe_hidden_size, hidden_size]"},
    {"moe.pre_expert_norm", F::Spark, {"layers.{L}.mlp.pre_expert_norm.weight"}, {}, {}, D::Float, T::NormOffset,
     "[moe_hidden_size]"},
    {"moe.experts.gate_up", F::Spark, {"layers.{L}.mlp.experts.gate_up_proj"}, {},
     {"layers.{L}.mlp.experts.{E}.gate_proj.weight", "layers.{L}.mlp.experts.{E}.up_proj.weight"}, D::Float, T::None,
     "[num_local_experts, 2*moe_intermediate_size, moe_hidden_size] (gate rows, then up rows)"},
    {"moe.experts.down", F::Spark, {"layers.{L}.mlp.experts.down_proj"}, {},
     {"layers.{L}.mlp.experts.{E}.down_proj.weight"}, D::Float, T::None,
     "[num_local_experts, moe_hidden_size, moe_intermediate_size]"},
    {"moe.post_expert_norm", F::Spark, {"layers.{L}.mlp.experts.post_expert_norm.weight"}, {}, {}, D::Float,
     T::NormOffset, "[moe_hidden_size]"},
    {"moe.post_expert_proj", F::Spark,
     {"layers.{L}.mlp.post_expert_proj.weight", "layers.{L}.mlp.unpooler.weight",
      "layers.{L}.mlp.fc2_latent_proj.weight", "layers.{L}.mlp.latent_up_proj.weight"},
     {}, {}, D::Float, T::None, "[hidden_size, moe_hidden_size]"},
};

bool family_matches(SlotFamily f, ModelFamily m) {
  return f == SlotFamily::Both || (f == SlotFamily::Glimmer) == (m == ModelFamily::Glimmer);
}

bool starts_with(std::string_view s, std::string_view p) { return s.substr(0, p.size()) == p; }
bool ends_with(std::string_view s, std::string_view p) {
  return s.size() >= p.size() && s.substr(s.size() - p.size()) == p;
}

}  // namespace

const char* weight_transform_name(WeightTransform t) {
  switch (t) {
    case WeightTransform::None: return "none";
    case WeightTransform::NormOffset: return "norm_offset";
    case WeightTransform::ResidualGate: return "residual_gate";
  }
  return "unknown";
}

bool dtype_allowed(DTypeRule rule, DType dtype) {
  if (rule == DTypeRule::F32Only) return dtype == DType::F32;
  return dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16;
}

const char* dtype_rule_text(DTypeRule rule) {
  return rule == DTypeRule::F32Only ? "F32 (the router stays FP32)" : "BF16, F16 or F32";
}

const std::vector<SlotRule>& name_table() { return kTable; }

const SlotRule* find_slot_rule(std::string_view slot, ModelFamily family) {
  for (const SlotRule& r : kTable)
    if (slot == r.slot && family_matches(r.family, family)) return &r;
  return nullptr;
}

std::string expand_name(std::string_view pattern, int layer, int expert) {
  std::string out;
  out.reserve(pattern.size() + 8);
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern.substr(i, 3) == "{L}") {
      out += std::to_string(layer);
      i += 2;
    } else if (pattern.substr(i, 3) == "{E}") {
      out += std::to_string(expert);
      i += 2;
    } else {
      out.push_back(pattern[i]);
    }
  }
  return out;
}

const std::vector<KvScaleName>& kv_scale_names() {
  static const std::vector<KvScaleName> names = {
      {"layers.{L}.self_attn.k_proj.k_scale", true, false},        // ModelOpt
      {"layers.{L}.self_attn.v_proj.v_scale", false, true},
      {"layers.{L}.self_attn.k_scale", true, false},               // compressed-tensors (kv_cache_scheme)
      {"layers.{L}.self_attn.v_scale", false, true},
      {"layers.{L}.self_attn.attn.k_scale", true, false},          // vLLM's own spelling
      {"layers.{L}.self_attn.attn.v_scale", false, true},
      {"layers.{L}.self_attn.k_proj.output_scale", true, false},   // Quark
      {"layers.{L}.self_attn.v_proj.output_scale", false, true},
      {"layers.{L}.self_attn.kv_scale", true, true},               // legacy: one scale for both
  };
  return names;
}

std::vector<std::string> candidate_names(const SlotRule& rule, int layer) {
  std::vector<std::string> out;
  for (const char* n : rule.names) {
    std::string rel = expand_name(n, layer);
    for (const char* prefix : kTextPrefixes) out.push_back(prefix + rel);
  }
  for (const char* n : rule.absolute_names) out.push_back(expand_name(n, layer));
  return out;
}

bool is_multimodal_tensor(std::string_view name) {
  size_t pos = 0;
  while (pos <= name.size()) {
    size_t dot = name.find('.', pos);
    std::string_view part = name.substr(pos, dot == std::string_view::npos ? std::string_view::npos : dot - pos);
    if (starts_with(part, "vision") || starts_with(part, "audio") || part == "visual" ||
        part == "multi_modal_projector" || part == "mm_projector")
      return true;
    if (dot == std::string_view::npos) break;
    pos = dot + 1;
  }
  return false;
}

bool looks_quantized_tensor(std::string_view name) {
  for (const char* suffix : {"weight_scale", "weight_scale_2", "weight_scale_inv", "input_scale", "weight_packed",
                             "weight_global_scale", "input_global_scale", "qweight", "qzeros", "scales", "g_idx",
                             "_blocks", "weight_zero_point", "k_scale", "v_scale", "output_scale"})
    if (ends_with(name, suffix)) return true;
  return false;
}

void fold_residual_gate(const float* gate, int64_t n, double temperature, float* alpha, float* beta) {
  for (int64_t i = 0; i < n; ++i) {
    double u = double(gate[i]) / temperature;
    double s_pos = 1.0 / (1.0 + std::exp(-u));
    double s_neg = 1.0 / (1.0 + std::exp(u));
    beta[i] = float(s_pos);
    alpha[i] = float(std::sqrt(std::max(s_neg * (1.0 + s_pos), 1e-3)));
  }
}

void norm_offset_gain(const float* w, int64_t n, bool round_to_bf16, float* gain) {
  for (int64_t i = 0; i < n; ++i) {
    float g = 1.0f + w[i];
    gain[i] = round_to_bf16 ? round_bf16(g) : g;
  }
}

}  // namespace muse
