#include "muse/plan/weight_format.h"

#include "muse/model/sharding.h"

#include <algorithm>
#include <cctype>

namespace muse::plan {

namespace {

int64_t ceil_div(int64_t a, int64_t b) { return (a + b - 1) / b; }

std::string lower(std::string_view s) {
  std::string out(s);
  for (char& c : out) c = char(std::tolower(static_cast<unsigned char>(c)));
  return out;
}

// One allocated tensor of a quantized (or plain) matrix set: `leading` copies
// (experts) of an [n, k] matrix, `shards` fused row blocks (gate+up = 2).
struct Piece {
  std::string suffix;  // vLLM parameter suffix: weight, weight_scale, qweight, ...
  int64_t bytes;
  int64_t params;      // logical parameters (on the main tensor only)
};

// Layouts (checkpoint-formats.md §2-3, as vLLM allocates them):
//   NVFP4 (ModelOpt): U8 [N, K/2] + E4M3 [N, K/16] + F32 weight_scale_2 and
//     input_scale per shard (per expert for MoE).
//   MXFP4 (OCP MX / Quark): U8 [N, K/2] + E8M0 [N, K/32].
//   FP8 (per-channel, Quark PTPC / ModelOpt FP8_PER_CHANNEL): E4M3 [N, K] + F32 [N].
//   INT4 (GPTQ, group 128): I32 qweight [K/8, N] + I32 qzeros [K/128, N/8]
//     + F16 scales [K/128, N] + I32 g_idx [K].
std::vector<Piece> matrix_pieces(WeightFormat f, int64_t leading, int64_t n, int64_t k, int64_t shards,
                                 int reference_bits) {
  const int64_t params = leading * n * k;
  switch (f) {
    case WeightFormat::BF16:
      return {{"weight", params * reference_bits / 8, params}};
    case WeightFormat::NVFP4:
      return {{"weight", leading * n * ceil_div(k, 2), params},
              {"weight_scale", leading * n * ceil_div(k, 16), 0},
              {"weight_scale_2", leading * shards * 4, 0},
              {"input_scale", leading * shards * 4, 0}};
    case WeightFormat::MXFP4:
      return {{"weight", leading * n * ceil_div(k, 2), params}, {"weight_scale", leading * n * ceil_div(k, 32), 0}};
    case WeightFormat::FP8:
      return {{"weight", params, params}, {"weight_scale", leading * n * 4, 0}};
    case WeightFormat::INT4: {
      const int64_t groups = ceil_div(k, 128);
      return {{"qweight", leading * ceil_div(k, 8) * n * 4, params},
              {"qzeros", leading * groups * ceil_div(n, 8) * 4, 0},
              {"scales", leading * groups * n * 2, 0},
              {"g_idx", leading * k * 4, 0}};
    }
  }
  return {};
}

// The serving engine's module path for a weight-table slot (vLLM naming: q/k/v
// fuse into qkv_proj, the dense gate/up into gate_up_proj).
std::string module_path(const std::string& slot) {
  static const std::pair<const char*, const char*> map[] = {
      {"attn.q", "self_attn.qkv_proj"},
      {"attn.k", "self_attn.qkv_proj"},
      {"attn.v", "self_attn.qkv_proj"},
      {"attn.gate", "self_attn.gate_proj"},
      {"attn.o", "self_attn.o_proj"},
      {"norm.input", "input_layernorm"},
      {"norm.post_attn", "post_attention_layernorm"},
      {"norm.pre_ffn", "pre_feedforward_layernorm"},
      {"norm.post_ffn", "post_feedforward_layernorm"},
      {"resid_gate.attn", "post_attention_residual_gate"},
      {"resid_gate.ffn", "post_feedforward_residual_gate"},
      {"moe.router", "mlp.gate"},
      {"moe.router_bias", "mlp.gate"},
      {"moe.pre_expert_proj", "mlp.pre_expert_proj"},
      {"moe.pre_expert_norm", "mlp.pre_expert_norm"},
      {"moe.post_expert_norm", "mlp.post_expert_norm"},
      {"moe.post_expert_proj", "mlp.post_expert_proj"},
      {"mlp.gate", "mlp.gate_up_proj"},
      {"mlp.up", "mlp.gate_up_proj"},
      {"mlp.down", "mlp.down_proj"},
      {"embed_tokens", "embed_tokens"},
      {"final_norm", "norm"},
      {"lm_head", "lm_head"},
  };
  for (const auto& [s, m] : map)
    if (slot == s) return m;
  return slot;
}

std::string param_suffix(const std::string& slot, const std::string& piece_suffix) {
  if (slot == "moe.router_bias") return "e_score_correction_bias";
  if (slot == "resid_gate.attn" || slot == "resid_gate.ffn") return "gate";
  return piece_suffix;
}

QuantKind kind_of(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16: return QuantKind::None;
    case WeightFormat::NVFP4: return QuantKind::Nvfp4;
    case WeightFormat::MXFP4: return QuantKind::Mxfp4;
    case WeightFormat::FP8: return QuantKind::Fp8;
    case WeightFormat::INT4: return QuantKind::Int4;
  }
  return QuantKind::None;
}

// Which slots a format stores quantized: the engine's own rule
// (model/weight_table.h quantizable_slot: the precision floors of
// checkpoint-formats.md item 9), with the scheme's per-layer BF16 experts.
bool quantized_in(const QuantScheme& s, const WeightSpec& w) {
  if (w.part == WeightPart::Experts && w.layer >= 0 && size_t(w.layer) < s.bf16_expert_layer.size() &&
      s.bf16_expert_layer[size_t(w.layer)])
    return false;
  return quantizable_slot(kind_of(s.format), w);
}

bool is_replicated(const WeightSpec& w) { return weight_split(w) == WeightSplit::Replicated; }

}  // namespace

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16: return "bf16";
    case WeightFormat::NVFP4: return "nvfp4";
    case WeightFormat::MXFP4: return "mxfp4";
    case WeightFormat::FP8: return "fp8";
    case WeightFormat::INT4: return "int4";
  }
  return "unknown";
}

Result<WeightFormat> parse_weight_format(std::string_view name) {
  const std::string n = lower(name);
  for (WeightFormat f : {WeightFormat::BF16, WeightFormat::NVFP4, WeightFormat::MXFP4, WeightFormat::FP8,
                         WeightFormat::INT4})
    if (n == weight_format_name(f)) return f;
  return make_error("unknown weight format '" + std::string(name) + "' (valid: bf16, nvfp4, mxfp4, fp8, int4)");
}

Result<WeightFormat> detect_weight_format(const Json& q) {
  if (q.is_null()) return WeightFormat::BF16;
  if (!q.is_object()) return make_error("quantization_config must be an object");
  const std::string method = lower(q.get_string("quant_method", ""));
  // ModelOpt: quant_algo at the top (config.json) or under "quantization" (hf_quant_config.json).
  std::string algo = lower(q.get_string("quant_algo", ""));
  if (const Json* inner = q.find("quantization"); inner && inner->is_object())
    algo = lower(inner->get_string("quant_algo", algo));
  if (method.rfind("modelopt", 0) == 0 || (method.empty() && !algo.empty())) {
    if (algo.find("nvfp4") != std::string::npos) return WeightFormat::NVFP4;
    if (algo.rfind("fp8", 0) == 0) return WeightFormat::FP8;
    return make_error("unsupported ModelOpt quant_algo '" + algo + "' (pass --weight-format)");
  }
  if (method == "compressed-tensors") {
    const std::string format = lower(q.get_string("format", ""));
    if (format.find("nvfp4") != std::string::npos) return WeightFormat::NVFP4;
    if (format.find("mxfp4") != std::string::npos) return WeightFormat::MXFP4;
    if (format == "float-quantized" || format.find("fp8") != std::string::npos) return WeightFormat::FP8;
    if (format == "pack-quantized") return WeightFormat::INT4;
    return make_error("unsupported compressed-tensors format '" + format + "' (pass --weight-format)");
  }
  if (method == "quark") {
    std::string dtype;
    if (const Json* g = q.find("global_quant_config"); g && g->is_object())
      if (const Json* w = g->find("weight"); w && w->is_object()) dtype = lower(w->get_string("dtype", ""));
    if (dtype.find("fp4") != std::string::npos) return WeightFormat::MXFP4;
    if (dtype.find("fp8") != std::string::npos) return WeightFormat::FP8;
    return make_error("unsupported Quark weight dtype '" + dtype + "' (pass --weight-format)");
  }
  if (method == "gptq" || method == "auto-round" || method == "autoround" || method == "awq") {
    if (q.get_int("bits", 4) != 4)
      return make_error(method + " with bits = " + std::to_string(q.get_int("bits", 4)) +
                        " is not a format muse plan sizes (pass --weight-format)");
    return WeightFormat::INT4;
  }
  if (method == "fp8" || method == "ptpc_fp8") return WeightFormat::FP8;
  if (method == "mxfp4") return WeightFormat::MXFP4;
  return make_error("unsupported quantization_config quant_method '" + method +
                    "' (pass --weight-format bf16|nvfp4|mxfp4|fp8|int4)");
}

bool wildcard_match(std::string_view t, std::string_view p) {
  size_t ti = 0, pi = 0, star = std::string_view::npos, mark = 0;
  while (ti < t.size()) {
    if (pi < p.size() && (p[pi] == '?' || p[pi] == t[ti])) {
      ++ti;
      ++pi;
    } else if (pi < p.size() && p[pi] == '*') {
      star = pi++;
      mark = ti;
    } else if (star != std::string_view::npos) {
      pi = star + 1;
      ti = ++mark;
    } else {
      return false;
    }
  }
  while (pi < p.size() && p[pi] == '*') ++pi;
  return pi == p.size();
}

QuantScheme make_quant_scheme(const ModelConfig& c, WeightFormat format, const Json& q, std::string basis) {
  QuantScheme s;
  s.format = format;
  s.basis = std::move(basis);
  s.bf16_expert_layer.assign(size_t(c.num_layers), false);
  if (format == WeightFormat::BF16) return s;

  // An exclusion list in the checkpoint decides per layer (vLLM matches
  // fnmatch wildcards and plain substrings of the module prefix).
  std::vector<std::string> patterns;
  if (q.is_object()) {
    const Json* lists[] = {q.find("ignore"), q.find("exclude_modules"), q.find("exclude"),
                           q.find("modules_to_not_convert"),
                           q.find("quantization") ? q.find("quantization")->find("exclude_modules") : nullptr};
    for (const Json* l : lists)
      if (l && l->is_array())
        for (const Json& e : l->as_array())
          if (e.is_string()) patterns.push_back(e.as_string());
  }
  if (!patterns.empty()) {
    bool any = false;
    for (int64_t L = 0; L < c.num_layers; ++L) {
      const std::string n = std::to_string(L);
      for (const std::string& prefix :
           {"model.language_model.layers." + n + ".mlp.experts", "model.layers." + n + ".mlp.experts",
            "language_model.model.layers." + n + ".mlp.experts", "layers." + n + ".mlp.experts"}) {
        for (const std::string& p : patterns) {
          const bool wild = p.find_first_of("*?") != std::string::npos;
          if (wildcard_match(prefix, p) || wildcard_match(prefix + ".w", p) ||
              (!wild && prefix.rfind(p, 0) == 0 && (prefix.size() == p.size() || prefix[p.size()] == '.'))) {
            s.bf16_expert_layer[size_t(L)] = true;
            any = true;
          }
        }
      }
    }
    s.basis += any ? "; experts excluded per the checkpoint's ignore list" : "; ignore list excludes no experts";
    return s;
  }
  if (format == WeightFormat::NVFP4 && c.num_layers >= 1) {
    // The published release: experts of the first and last layer stay BF16
    // (checkpoint-formats.md §5.5).
    s.bf16_expert_layer.front() = true;
    s.bf16_expert_layer.back() = true;
  }
  return s;
}

int64_t quantized_matrix_bytes(WeightFormat format, int64_t leading, int64_t n, int64_t k) {
  int64_t b = 0;
  for (const Piece& p : matrix_pieces(format, leading, n, k, 1, 16)) b += p.bytes;
  return b;
}

std::vector<StoredTensor> stored_tensors(const ModelConfig& c, const std::vector<WeightSpec>& weights,
                                         const QuantScheme& s) {
  std::vector<StoredTensor> out;
  const double expert_fraction =
      c.num_experts > 0 ? double(c.num_experts_per_tok) / double(c.num_experts) : 1.0;

  auto base_name = [](int layer, const std::string& module) {
    return layer >= 0 ? "layers." + std::to_string(layer) + "." + module : module;
  };
  auto read_fraction = [&](const WeightSpec& w) {
    if (w.part == WeightPart::Experts) return expert_fraction;
    if (w.part == WeightPart::Embeddings) return c.tie_word_embeddings ? 1.0 : 1.0 / double(w.shape[0]);
    return 1.0;
  };

  for (size_t i = 0; i < weights.size(); ++i) {
    const WeightSpec& w = weights[i];
    if (w.slot == "lm_head" && c.tie_word_embeddings) continue;  // same storage as embed_tokens
    const bool q = quantized_in(s, w);
    const WeightFormat f = q ? s.format : WeightFormat::BF16;
    const int bits = dtype_bits(w.reference_dtype);

    if (w.part == WeightPart::Experts && w.shape.size() == 3) {
      // A fused-MoE layer: every expert slot of this layer in one group,
      // emitted kind by kind (w13_weight, w2_weight, w13_weight_scale, ...).
      std::vector<const WeightSpec*> group;
      size_t j = i;
      while (j < weights.size() && weights[j].part == WeightPart::Experts && weights[j].layer == w.layer &&
             weights[j].shape.size() == 3)
        group.push_back(&weights[j++]);
      std::vector<std::vector<Piece>> per;
      for (const WeightSpec* g : group) {
        const int64_t shards = g->slot == "moe.experts.gate_up" ? 2 : 1;
        per.push_back(matrix_pieces(f, g->shape[0], g->shape[1], g->shape[2], shards, bits));
      }
      for (size_t kind = 0; kind < per.front().size(); ++kind) {
        for (size_t g = 0; g < group.size(); ++g) {
          const std::string tag = group[g]->slot == "moe.experts.gate_up" ? "w13_"
                                  : group[g]->slot == "moe.experts.down"  ? "w2_"
                                                                          : group[g]->slot + "_";
          StoredTensor t;
          t.name = base_name(w.layer, "mlp.experts." + tag + per[g][kind].suffix);
          t.layer = w.layer;
          t.part = WeightPart::Experts;
          t.quantized = q;
          t.params = per[g][kind].params;
          t.bytes = per[g][kind].bytes;
          t.decode_read_fraction = expert_fraction;
          t.logical = {*group[g]};
          out.push_back(std::move(t));
        }
      }
      i = j - 1;
      continue;
    }

    // Fuse q/k/v and the dense gate/up as vLLM does (one allocation each).
    int64_t rows = w.shape.size() >= 2 ? w.shape[0] : 0;
    int64_t params = w.numel();
    int64_t shards = 1;
    const std::string module = module_path(w.slot);
    size_t j = i + 1;
    if (w.slot == "attn.q" || w.slot == "mlp.gate") {
      while (j < weights.size() && weights[j].layer == w.layer && module_path(weights[j].slot) == module &&
             weights[j].shape.size() == 2 && weights[j].shape[1] == w.shape[1]) {
        rows += weights[j].shape[0];
        params += weights[j].numel();
        ++shards;
        ++j;
      }
    }
    std::vector<Piece> pieces;
    if (w.shape.size() >= 2) {
      int64_t leading = 1;
      for (size_t d = 0; d + 2 < w.shape.size(); ++d) leading *= w.shape[d];
      pieces = matrix_pieces(f, leading, rows, w.shape.back(), shards, bits);
    } else {
      pieces = {{"weight", params * bits / 8, params}};
    }
    for (const Piece& p : pieces) {
      StoredTensor t;
      t.name = base_name(w.layer, module + "." + param_suffix(w.slot, p.suffix));
      t.layer = w.layer;
      t.part = w.part;
      t.quantized = q;
      t.params = p.params;
      t.bytes = p.bytes;
      t.decode_read_fraction = read_fraction(w);
      t.replicated = is_replicated(w);
      t.logical.assign(weights.begin() + long(i), weights.begin() + long(j));
      out.push_back(std::move(t));
    }
    i = j - 1;
  }
  return out;
}

}  // namespace muse::plan
