// Parsing and validation of Muse config.json files (checkpoint-formats.md
// §5.1–5.2). Every rejection names the key, so a user can fix the file.
#include "muse/model/config.h"

#include <cmath>
#include <optional>

#include "muse/core/mapped_file.h"

namespace muse {

namespace {

// Limits well above any real model (Spark: 62 layers, 256 experts, hidden
// 8192) and low enough that no tensor reaches 2^50 elements and a model's
// parameter count stays below 2^60, so sizes never overflow int64 anywhere
// downstream. A value outside them is a corrupt or hostile file, not a model.
constexpr int64_t kMaxVocab = int64_t(1) << 24;
constexpr int64_t kMaxHidden = int64_t(1) << 17;
constexpr int64_t kMaxLayers = 1024;
constexpr int64_t kMaxHeads = 8192;
constexpr int64_t kMaxHeadDim = 4096;
constexpr int64_t kMaxIntermediate = int64_t(1) << 18;
constexpr int64_t kMaxExperts = int64_t(1) << 12;
constexpr int64_t kMaxPositions = int64_t(1) << 30;

std::string describe(const Json& v) {
  std::string s = v.dump();
  if (s.size() > 60) s = s.substr(0, 57) + "...";
  return std::string(v.type_name()) + " " + s;
}

// Typed access to the members of one JSON object; errors read
// "<source>: <path><key> ...".
class KeyReader {
 public:
  KeyReader(const Json& obj, std::string source, std::string path)
      : obj_(obj), source_(std::move(source)), path_(std::move(path)) {}

  const Json* find(std::string_view key) const {
    const Json* v = obj_.find(key);
    return (v && !v->is_null()) ? v : nullptr;
  }
  bool has(std::string_view key) const { return find(key) != nullptr; }
  std::string name(std::string_view key) const { return path_ + std::string(key); }
  Error error(std::string_view key, const std::string& what) const {
    return make_error(source_ + ": " + name(key) + " " + what);
  }
  Error missing(std::string_view key) const {
    return make_error(source_ + ": missing required key " + name(key));
  }

  Result<int64_t> int_value(std::string_view key, const Json& v, int64_t lo, int64_t hi) const {
    int64_t x;
    if (v.is_int()) {
      x = v.as_int();
    } else if (v.is_double() && std::isfinite(v.as_double()) && std::floor(v.as_double()) == v.as_double() &&
               std::fabs(v.as_double()) < 9e18) {
      x = int64_t(v.as_double());
    } else {
      return error(key, "must be an integer, got " + describe(v));
    }
    if (x < lo || x > hi)
      return error(key, "= " + std::to_string(x) + " is out of range [" + std::to_string(lo) + ", " +
                            std::to_string(hi) + "]");
    return x;
  }
  Result<int64_t> req_int(std::string_view key, int64_t lo, int64_t hi) const {
    const Json* v = find(key);
    if (!v) return missing(key);
    return int_value(key, *v, lo, hi);
  }
  Result<int64_t> opt_int(std::string_view key, int64_t fallback, int64_t lo, int64_t hi) const {
    const Json* v = find(key);
    if (!v) return fallback;
    return int_value(key, *v, lo, hi);
  }
  // A positive, finite number (or zero when allow_zero).
  Result<double> opt_positive(std::string_view key, double fallback, bool allow_zero = false,
                              double hi = 1e300) const {
    const Json* v = find(key);
    if (!v) return fallback;
    if (!v->is_number()) return error(key, "must be a number, got " + describe(*v));
    double d = v->as_double();
    if (!std::isfinite(d) || d < 0 || (d == 0 && !allow_zero) || d > hi)
      return error(key, "= " + v->dump() + " must be " + (allow_zero ? "a finite number >= 0" : "a finite number > 0") +
                            (hi < 1e300 ? " and <= " + Json(hi).dump() : ""));
    return d;
  }
  Result<bool> opt_bool(std::string_view key, bool fallback) const {
    const Json* v = find(key);
    if (!v) return fallback;
    if (!v->is_bool()) return error(key, "must be true or false, got " + describe(*v));
    return v->as_bool();
  }
  Result<std::string> opt_string(std::string_view key, std::string_view fallback) const {
    const Json* v = find(key);
    if (!v) return std::string(fallback);
    if (!v->is_string()) return error(key, "must be a string, got " + describe(*v));
    return v->as_string();
  }
  // A list of exactly n elements.
  Result<const JsonArray*> list(std::string_view key, int64_t n) const {
    const Json* v = find(key);
    if (!v->is_array()) return error(key, "must be a list, got " + describe(*v));
    if (int64_t(v->size()) != n)
      return error(key, "has " + std::to_string(v->size()) + " entries but num_hidden_layers = " + std::to_string(n));
    return &v->as_array();
  }

  // The first present key among aliases; two present with different values is an error.
  Result<const char*> pick_alias(std::initializer_list<const char*> keys) const {
    const char* chosen = nullptr;
    for (const char* k : keys) {
      const Json* v = find(k);
      if (!v) continue;
      if (!chosen) {
        chosen = k;
      } else if (!(*v == *find(chosen))) {
        return make_error(source_ + ": " + name(chosen) + " = " + find(chosen)->dump() + " and its alias " + name(k) +
                          " = " + v->dump() + " disagree");
      }
    }
    return chosen;
  }

  const std::string& source() const { return source_; }
  const std::string& path() const { return path_; }

 private:
  const Json& obj_;
  std::string source_;
  std::string path_;
};

Result<int64_t> token_id(const KeyReader& k, std::string_view key) {
  const Json* v = k.find(key);
  if (!v) return int64_t(-1);
  return k.int_value(key, *v, 0, kMaxVocab * 4);
}

// eos_token_id: an integer or a list of integers.
Status token_id_list(const KeyReader& k, std::string_view key, std::vector<int64_t>* out) {
  const Json* v = k.find(key);
  if (!v) return Status::Ok();
  out->clear();
  if (v->is_array()) {
    for (size_t i = 0; i < v->size(); ++i) {
      MUSE_ASSIGN_OR_RETURN(int64_t id, k.int_value(std::string(key) + "[" + std::to_string(i) + "]",
                                                    v->as_array()[i], 0, kMaxVocab * 4));
      out->push_back(id);
    }
    return Status::Ok();
  }
  MUSE_ASSIGN_OR_RETURN(int64_t id, k.int_value(key, *v, 0, kMaxVocab * 4));
  out->push_back(id);
  return Status::Ok();
}

// Layer types, RoPE thetas and MLP kinds, each cross-checked against the Muse
// rule: full attention (and NoPE) where (L-1-i) % 4 == 0.
Status parse_layer_pattern(const KeyReader& k, ModelConfig& c) {
  const int64_t n = c.num_layers;
  c.layer_types.resize(size_t(n));
  for (int64_t i = 0; i < n; ++i)
    c.layer_types[size_t(i)] = muse_full_layer_rule(i, n) ? AttentionKind::Full : AttentionKind::Sliding;
  auto rule_text = [&](int64_t i) {
    return std::string(muse_full_layer_rule(i, n) ? "full" : "sliding") + " by the Muse rule (full where (" +
           std::to_string(n) + "-1-i) % 4 == 0)";
  };

  if (k.has("layer_types")) {
    MUSE_ASSIGN_OR_RETURN(const JsonArray* types, k.list("layer_types", n));
    for (int64_t i = 0; i < n; ++i) {
      const Json& t = (*types)[size_t(i)];
      std::string key = "layer_types[" + std::to_string(i) + "]";
      if (!t.is_string() || (t.as_string() != "full_attention" && t.as_string() != "sliding_attention"))
        return k.error(key, "must be \"full_attention\" or \"sliding_attention\", got " + describe(t));
      bool full = t.as_string() == "full_attention";
      if (full != muse_full_layer_rule(i, n))
        return k.error(key, "= \"" + t.as_string() + "\" disagrees with layer " + std::to_string(i) + " being " +
                                rule_text(i));
    }
  }

  // Per-layer theta: explicit list, or Llama-4-style no_rope_layers (1 = RoPE,
  // 0 = NoPE: inverted relative to its name), or derived.
  std::vector<double> theta(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) theta[size_t(i)] = c.is_full(i) ? 0.0 : c.rope_theta;
  if (k.has("no_rope_layers")) {
    MUSE_ASSIGN_OR_RETURN(const JsonArray* flags, k.list("no_rope_layers", n));
    for (int64_t i = 0; i < n; ++i) {
      const Json& f = (*flags)[size_t(i)];
      std::string key = "no_rope_layers[" + std::to_string(i) + "]";
      bool rope;
      if (f.is_bool()) rope = f.as_bool();
      else if (f.is_int() && (f.as_int() == 0 || f.as_int() == 1)) rope = f.as_int() == 1;
      else return k.error(key, "must be 0 or 1 (1 = RoPE, 0 = NoPE), got " + describe(f));
      if (rope == c.is_full(i))
        return k.error(key, "= " + f.dump() + " (" + (rope ? "RoPE" : "NoPE") + ") disagrees with layer " +
                                std::to_string(i) + " being " + rule_text(i) +
                                "; full layers are NoPE, sliding layers use RoPE");
    }
  }
  if (k.has("layer_rope_theta")) {
    MUSE_ASSIGN_OR_RETURN(const JsonArray* thetas, k.list("layer_rope_theta", n));
    for (int64_t i = 0; i < n; ++i) {
      const Json& t = (*thetas)[size_t(i)];
      std::string key = "layer_rope_theta[" + std::to_string(i) + "]";
      if (!t.is_number() || !std::isfinite(t.as_double()) || t.as_double() < 0)
        return k.error(key, "must be a finite number >= 0 (0 = NoPE), got " + describe(t));
      double v = t.as_double();
      if ((v == 0) != c.is_full(i))
        return k.error(key, "= " + t.dump() + " disagrees with layer " + std::to_string(i) + " being " + rule_text(i) +
                                "; the theta must be 0 exactly on full (NoPE) layers");
      theta[size_t(i)] = v;
    }
  }
  c.layer_rope_theta = std::move(theta);

  c.mlp_layer_types.assign(size_t(n), c.is_spark() ? MlpKind::Sparse : MlpKind::Dense);
  if (c.is_spark() && k.has("mlp_layer_types")) {
    MUSE_ASSIGN_OR_RETURN(const JsonArray* kinds, k.list("mlp_layer_types", n));
    for (int64_t i = 0; i < n; ++i) {
      const Json& t = (*kinds)[size_t(i)];
      if (!t.is_string() || (t.as_string() != "sparse" && t.as_string() != "dense"))
        return k.error("mlp_layer_types[" + std::to_string(i) + "]", "must be \"sparse\" or \"dense\", got " + describe(t));
      c.mlp_layer_types[size_t(i)] = t.as_string() == "dense" ? MlpKind::Dense : MlpKind::Sparse;
    }
  }
  return Status::Ok();
}

Status parse_rope(const KeyReader& k, ModelConfig& c) {
  // transformers 5 writes rope_parameters; older exports rope_theta (+ rope_scaling).
  if (const Json* rp = k.find("rope_parameters")) {
    if (!rp->is_object()) return k.error("rope_parameters", "must be an object, got " + describe(*rp));
    KeyReader r(*rp, k.source(), k.path() + "rope_parameters.");
    MUSE_ASSIGN_OR_RETURN(std::string type, r.opt_string("rope_type", "default"));
    if (type != "default")
      return r.error("rope_type", "= \"" + type + "\" is not supported (Muse models use \"default\" RoPE)");
    MUSE_ASSIGN_OR_RETURN(c.rope_theta, r.opt_positive("rope_theta", c.rope_theta));
  }
  if (k.has("rope_theta")) {
    MUSE_ASSIGN_OR_RETURN(double t, k.opt_positive("rope_theta", c.rope_theta));
    if (k.has("rope_parameters") && t != c.rope_theta)
      return k.error("rope_theta", "= " + Json(t).dump() + " disagrees with rope_parameters.rope_theta = " +
                                       Json(c.rope_theta).dump());
    c.rope_theta = t;
  }
  if (const Json* rs = k.find("rope_scaling")) {
    if (!rs->is_object()) return k.error("rope_scaling", "must be an object or null, got " + describe(*rs));
    KeyReader r(*rs, k.source(), k.path() + "rope_scaling.");
    MUSE_ASSIGN_OR_RETURN(std::string type, r.opt_string("rope_type", r.has("type") ? "" : "default"));
    if (type.empty()) {
      MUSE_ASSIGN_OR_RETURN(type, r.opt_string("type", "default"));
    }
    if (type != "default")
      return k.error("rope_scaling", "asks for \"" + type + "\" RoPE scaling, which Muse models do not use");
  }
  return Status::Ok();
}

Status parse_text(const KeyReader& k, ModelConfig& c) {
  const bool spark = c.is_spark();
  MUSE_ASSIGN_OR_RETURN(c.vocab_size, k.req_int("vocab_size", 1, kMaxVocab));
  MUSE_ASSIGN_OR_RETURN(c.hidden_size, k.req_int("hidden_size", 1, kMaxHidden));
  MUSE_ASSIGN_OR_RETURN(c.num_layers, k.req_int("num_hidden_layers", 1, kMaxLayers));
  MUSE_ASSIGN_OR_RETURN(c.num_heads, k.req_int("num_attention_heads", 1, kMaxHeads));
  MUSE_ASSIGN_OR_RETURN(c.num_kv_heads, k.req_int("num_key_value_heads", 1, kMaxHeads));
  if (c.hidden_size % c.num_heads != 0)
    return k.error("hidden_size", "= " + std::to_string(c.hidden_size) + " is not divisible by num_attention_heads = " +
                                      std::to_string(c.num_heads));
  if (c.num_heads % c.num_kv_heads != 0)
    return k.error("num_attention_heads", "= " + std::to_string(c.num_heads) +
                                              " is not divisible by num_key_value_heads = " +
                                              std::to_string(c.num_kv_heads) + " (grouped-query attention)");
  MUSE_ASSIGN_OR_RETURN(c.head_dim, k.opt_int("head_dim", c.hidden_size / c.num_heads, 2, kMaxHeadDim));
  if (c.head_dim % 2 != 0)
    return k.error("head_dim", "= " + std::to_string(c.head_dim) + " must be even (rotate-half RoPE)");
  MUSE_ASSIGN_OR_RETURN(c.max_position_embeddings,
                        k.opt_int("max_position_embeddings", spark ? 1048576 : 131072, 1, kMaxPositions));
  MUSE_ASSIGN_OR_RETURN(c.sliding_window, k.opt_int("sliding_window", 2048, 1, kMaxPositions));

  MUSE_ASSIGN_OR_RETURN(c.rms_norm_eps, k.opt_positive("rms_norm_eps", 1e-5, false, 1.0));
  MUSE_ASSIGN_OR_RETURN(c.post_norm_eps, k.opt_positive("post_norm_eps", 1e-8, false, 1.0));
  MUSE_ASSIGN_OR_RETURN(c.qk_scale_factor, k.opt_positive("qk_scale_factor", spark ? 5.4730064863875 : 3.87));
  MUSE_ASSIGN_OR_RETURN(c.output_multiplier,
                        k.opt_positive("output_multiplier", spark ? 0.17677669529663687 : 0.19611613513818404));
  MUSE_ASSIGN_OR_RETURN(c.final_logit_softcapping, k.opt_positive("final_logit_softcapping", 20.0, true));
  MUSE_ASSIGN_OR_RETURN(c.tie_word_embeddings, k.opt_bool("tie_word_embeddings", c.tie_word_embeddings));

  MUSE_ASSIGN_OR_RETURN(bool bias, k.opt_bool("attention_bias", false));
  if (bias) return k.error("attention_bias", "= true is not supported (Muse attention has no biases)");
  for (const char* act_key : {"hidden_act", "hidden_activation"}) {
    MUSE_ASSIGN_OR_RETURN(std::string act, k.opt_string(act_key, "silu"));
    if (act != "silu") return k.error(act_key, "= \"" + act + "\" is not supported (Muse FFNs use silu)");
  }
  MUSE_RETURN_IF_ERROR(parse_rope(k, c));
  MUSE_RETURN_IF_ERROR(parse_layer_pattern(k, c));

  bool any_dense = false;
  for (MlpKind m : c.mlp_layer_types) any_dense |= m == MlpKind::Dense;
  if (any_dense) {
    MUSE_ASSIGN_OR_RETURN(c.intermediate_size, k.req_int("intermediate_size", 1, kMaxIntermediate));
  } else {
    MUSE_ASSIGN_OR_RETURN(c.intermediate_size, k.opt_int("intermediate_size", 0, 0, kMaxIntermediate));
  }

  if (spark) {
    MUSE_ASSIGN_OR_RETURN(const char* experts_key, k.pick_alias({"num_local_experts", "num_experts", "n_routed_experts"}));
    if (!experts_key) return k.missing("num_local_experts");
    MUSE_ASSIGN_OR_RETURN(c.num_experts, k.req_int(experts_key, 1, kMaxExperts));
    MUSE_ASSIGN_OR_RETURN(c.num_experts_per_tok, k.req_int("num_experts_per_tok", 1, kMaxExperts));
    if (c.num_experts_per_tok > c.num_experts)
      return k.error("num_experts_per_tok", "= " + std::to_string(c.num_experts_per_tok) + " exceeds " + k.name(experts_key) +
                                                " = " + std::to_string(c.num_experts));
    MUSE_ASSIGN_OR_RETURN(const char* latent_key, k.pick_alias({"moe_hidden_size", "moe_latent_size"}));
    if (!latent_key) return k.missing("moe_hidden_size");
    MUSE_ASSIGN_OR_RETURN(c.moe_hidden_size, k.req_int(latent_key, 1, kMaxHidden));
    MUSE_ASSIGN_OR_RETURN(c.moe_intermediate_size, k.req_int("moe_intermediate_size", 1, kMaxIntermediate));
    MUSE_ASSIGN_OR_RETURN(c.num_shared_experts, k.opt_int("num_shared_experts", 0, 0, kMaxExperts));
    if (c.num_shared_experts != 0)
      return k.error("num_shared_experts", "= " + std::to_string(c.num_shared_experts) +
                                               " is not supported (Muse Spark has no shared experts)");
    MUSE_ASSIGN_OR_RETURN(c.routed_scaling_factor, k.opt_positive("routed_scaling_factor", 1.0));
    MUSE_ASSIGN_OR_RETURN(c.residual_gate_temperature, k.opt_positive("residual_gate_temperature", 0.3));
  }

  MUSE_ASSIGN_OR_RETURN(c.bos_token_id, token_id(k, "bos_token_id"));
  MUSE_ASSIGN_OR_RETURN(c.pad_token_id, token_id(k, "pad_token_id"));
  MUSE_RETURN_IF_ERROR(token_id_list(k, "eos_token_id", &c.eos_token_ids));
  return Status::Ok();
}

// NeMo's raw-dump schema looks similar but is not a Hugging Face config; read
// as one, its differently named keys would silently fall back to defaults.
bool looks_like_nemo_raw_dump(const Json& root, std::string* why) {
  if (root.get_string("model_type", "") == "musespark1x_omni") {
    *why = "model_type \"musespark1x_omni\"";
    return true;
  }
  for (const Json* obj : {&root, root.find("text_config")}) {
    if (!obj || !obj->is_object()) continue;
    for (const char* key : {"rms_post_norm_eps", "every_n_layers_nope"}) {
      if (obj->contains(key)) {
        *why = std::string("key \"") + key + "\"";
        return true;
      }
    }
  }
  return false;
}

}  // namespace

int64_t ModelConfig::num_full_layers() const {
  int64_t n = 0;
  for (AttentionKind k : layer_types) n += k == AttentionKind::Full;
  return n;
}

Result<ModelConfig> parse_model_config(const Json& root, const std::string& source) {
  if (!root.is_object()) return make_error(source + ": the top level must be a JSON object, got " + describe(root));
  std::string why;
  if (looks_like_nemo_raw_dump(root, &why))
    return make_error(source + ": this is NeMo's raw-dump schema (" + why +
                      "), not a Hugging Face config.json; export the model with its Hugging Face config "
                      "(model_type \"muse_spark\" with text_config)");

  ModelConfig c;
  KeyReader top(root, source, "");
  MUSE_ASSIGN_OR_RETURN(c.model_type, top.opt_string("model_type", ""));
  if (const Json* archs = top.find("architectures")) {
    if (!archs->is_array()) return top.error("architectures", "must be a list of strings, got " + describe(*archs));
    if (archs->size() > 0) {
      if (!archs->as_array()[0].is_string())
        return top.error("architectures[0]", "must be a string, got " + describe(archs->as_array()[0]));
      c.architecture = archs->as_array()[0].as_string();
    }
  }
  if (c.model_type.empty())
    return make_error(source + ": missing required key model_type (expected \"muse_glimmer\" or \"muse_spark\")");
  if (c.model_type == "muse_glimmer" || c.model_type == "muse_glimmer_text") {
    c.family = ModelFamily::Glimmer;
  } else if (c.model_type == "muse_spark" || c.model_type == "muse_spark_text") {
    c.family = ModelFamily::Spark;
  } else {
    return top.error("model_type", "= \"" + c.model_type +
                                       "\" is not a Muse model (expected \"muse_glimmer\" or \"muse_spark\")");
  }

  // Nested (text_config) or flat (text-only export: the top level is the text config).
  const Json* text = top.find("text_config");
  std::string text_path;
  if (text) {
    if (!text->is_object()) return top.error("text_config", "must be an object, got " + describe(*text));
    text_path = "text_config.";
  } else {
    text = &root;
  }
  KeyReader k(*text, source, text_path);
  if (text != &root) {
    MUSE_ASSIGN_OR_RETURN(std::string text_type, k.opt_string("model_type", ""));
    std::string family_prefix = c.is_spark() ? "muse_spark" : "muse_glimmer";
    if (!text_type.empty() && text_type.rfind(family_prefix, 0) != 0)
      return k.error("model_type", "= \"" + text_type + "\" does not belong to a \"" + c.model_type + "\" model");
  }
  // transformers 5 may write tie_word_embeddings on the composite (top-level)
  // config; the text config's own value wins when both exist.
  if (text != &root) {
    MUSE_ASSIGN_OR_RETURN(c.tie_word_embeddings, top.opt_bool("tie_word_embeddings", false));
  }
  MUSE_RETURN_IF_ERROR(parse_text(k, c));

  // Spark's tokenizer has 201,818 ids; embedding rows above it are untrained
  // padding and must never be sampled (checkpoint-formats.md §5.2).
  c.sampled_vocab_size = c.is_spark() ? std::min<int64_t>(c.vocab_size, 201818) : c.vocab_size;

  for (auto [key, dst] : {std::pair{"image_token_id", &c.image_token_id}, std::pair{"video_token_id", &c.video_token_id},
                          std::pair{"audio_token_id", &c.audio_token_id}}) {
    const KeyReader& r = top.has(key) ? top : k;
    MUSE_ASSIGN_OR_RETURN(*dst, token_id(r, key));
  }
  if (const Json* v = top.find("vision_config")) {
    if (!v->is_object()) return top.error("vision_config", "must be an object, got " + describe(*v));
    c.has_vision = true;
    c.vision_config = *v;
  }
  if (const Json* a = top.find("audio_config")) {
    if (!a->is_object()) return top.error("audio_config", "must be an object, got " + describe(*a));
    c.has_audio = true;
    c.audio_config = *a;
  }
  const KeyReader& qr = top.has("quantization_config") ? top : k;
  if (const Json* q = qr.find("quantization_config")) {
    if (!q->is_object()) return qr.error("quantization_config", "must be an object, got " + describe(*q));
    c.quantization_config = *q;
  }
  return c;
}

Result<ModelConfig> parse_model_config(std::string_view json_text, const std::string& source) {
  JsonParseOptions opts;
  opts.max_depth = 64;
  auto json = Json::parse(json_text, opts);
  if (!json.ok()) return make_error(source + ": " + json.message());
  return parse_model_config(*json, source);
}

Status apply_generation_config(ModelConfig& config, const Json& generation, const std::string& source) {
  if (!generation.is_object())
    return make_error(source + ": the top level must be a JSON object, got " + describe(generation));
  KeyReader k(generation, source, "");
  std::vector<int64_t> eos;
  MUSE_RETURN_IF_ERROR(token_id_list(k, "eos_token_id", &eos));
  if (!eos.empty()) config.eos_token_ids = std::move(eos);
  if (k.has("bos_token_id")) {
    MUSE_ASSIGN_OR_RETURN(config.bos_token_id, token_id(k, "bos_token_id"));
  }
  if (k.has("pad_token_id")) {
    MUSE_ASSIGN_OR_RETURN(config.pad_token_id, token_id(k, "pad_token_id"));
  }
  return Status::Ok();
}

Result<ModelConfig> load_model_config(const std::string& model_dir) {
  std::string path = model_dir + "/config.json";
  if (!file_exists(path)) return make_error(model_dir + " has no config.json (is it a Hugging Face model directory?)");
  MUSE_ASSIGN_OR_RETURN(std::string text, read_file(path));
  MUSE_ASSIGN_OR_RETURN(ModelConfig config, parse_model_config(text, path));
  std::string gen_path = model_dir + "/generation_config.json";
  if (file_exists(gen_path)) {
    MUSE_ASSIGN_OR_RETURN(std::string gen_text, read_file(gen_path));
    JsonParseOptions opts;
    opts.max_depth = 64;
    auto gen = Json::parse(gen_text, opts);
    if (!gen.ok()) return make_error(gen_path + ": " + gen.message());
    MUSE_RETURN_IF_ERROR(apply_generation_config(config, *gen, gen_path));
  }
  return config;
}

}  // namespace muse
