// Speculative-decoding drafters for `muse plan` (dspark.md §1, §3).
#include <algorithm>
#include <cctype>

#include "muse/core/mapped_file.h"
#include "muse/plan/model_profiles.h"

namespace muse::plan {

namespace {

// Inferact/Muse-Spark-Open-DSpark per its model card (dspark.md §3 e): 5
// layers at the target's width, 128/16 heads x 64, FFN 16384, Spark's
// full-width output gate, taps at 5 layers plus the final hidden state,
// rank-512 Markov and confidence heads, its own embedding copy (the card's
// 10.6 GB only adds up with one), the target's LM head, window 2048, 7 drafts.
DrafterShape spark_dspark(const ModelConfig& t) {
  DrafterShape d;
  d.name = "muse-spark-open-dspark";
  d.basis = "Inferact/Muse-Spark-Open-DSpark model card (dspark.md 3e); card: 10.6 GB";
  d.layers = 5;
  d.hidden = t.hidden_size > 0 ? t.hidden_size : 8192;
  d.heads = 128;
  d.kv_heads = 16;
  d.head_dim = 64;
  d.intermediate = 16384;
  d.attention_gate = true;
  d.qk_norm_weights = true;
  d.fc_inputs = 6 * d.hidden;
  d.vocab = t.vocab_size > 0 ? t.vocab_size : 202048;
  d.own_embedding = true;
  d.markov_rank = 512;
  d.confidence_head = true;
  d.sliding_window = 2048;
  d.num_speculative_tokens = 7;
  return d;
}

// meta-models/Muse-Glimmer-30B-assistant (dspark.md §1, §3 d): a DFlash block
// drafter without embedding or LM head.
DrafterShape glimmer_assistant(const ModelConfig& t) {
  DrafterShape d;
  d.name = "muse-glimmer-30b-assistant";
  d.basis = "meta-models/Muse-Glimmer-30B-assistant config (dspark.md 1, 3d)";
  d.layers = 5;
  d.hidden = 6656;
  d.heads = 32;
  d.kv_heads = 8;
  d.head_dim = 128;
  d.intermediate = 19968;
  d.qk_norm_weights = true;
  d.fc_inputs = 5 * (t.hidden_size > 0 ? t.hidden_size : 6656);
  d.vocab = t.vocab_size;
  d.sliding_window = 2048;
  d.num_speculative_tokens = 15;  // block_size 16: the mask rows emit
  return d;
}

Result<int64_t> req_int(const Json& obj, const std::string& source, const char* key, int64_t lo, int64_t hi) {
  const Json* v = obj.find(key);
  if (!v || v->is_null()) return make_error(source + ": missing required key " + key);
  if (!v->is_int() || v->as_int() < lo || v->as_int() > hi)
    return make_error(source + ": " + key + " must be an integer in [" + std::to_string(lo) + ", " +
                      std::to_string(hi) + "], got " + v->dump());
  return v->as_int();
}

// A drafter config.json (the Glimmer assistant's schema; DSpark keys where present).
Result<DrafterShape> drafter_from_config(const std::string& path, const ModelConfig& t) {
  MUSE_ASSIGN_OR_RETURN(std::string text, read_file(path));
  auto parsed = Json::parse(text);
  if (!parsed.ok()) return make_error(path + ": " + parsed.message());
  const Json& j = *parsed;
  if (!j.is_object()) return make_error(path + ": the top level must be a JSON object");
  DrafterShape d;
  d.name = path;
  d.basis = "drafter config " + path;
  MUSE_ASSIGN_OR_RETURN(d.layers, req_int(j, path, "num_hidden_layers", 1, 256));
  MUSE_ASSIGN_OR_RETURN(d.hidden, req_int(j, path, "hidden_size", 1, 1 << 18));
  MUSE_ASSIGN_OR_RETURN(d.heads, req_int(j, path, "num_attention_heads", 1, 8192));
  MUSE_ASSIGN_OR_RETURN(d.kv_heads, req_int(j, path, "num_key_value_heads", 1, 8192));
  MUSE_ASSIGN_OR_RETURN(d.intermediate, req_int(j, path, "intermediate_size", 1, 1 << 20));
  d.head_dim = j.get_int("head_dim", d.hidden / d.heads);
  if (d.head_dim <= 0 || d.head_dim > 4096) return make_error(path + ": head_dim is out of range");
  d.qk_norm_weights = true;
  int64_t taps = 0;
  if (const Json* ids = j.find("target_layer_ids"); ids && ids->is_array()) taps = int64_t(ids->size());
  if (const Json* ids = j.find("aux_hidden_state_layer_ids"); ids && ids->is_array()) taps = int64_t(ids->size());
  if (taps == 0) return make_error(path + ": missing required key target_layer_ids");
  d.fc_inputs = taps * t.hidden_size;
  d.vocab = t.vocab_size;
  d.sliding_window = j.get_int("sliding_window", 0);
  d.markov_rank = j.get_int("markov_rank", 0);
  d.confidence_head = j.get_bool("enable_confidence_head", false);
  const int64_t block = j.get_int("block_size", 0);
  const bool from_anchor = j.get_bool("sample_from_anchor", j.get_string("model_type", "").find("dspark") != std::string::npos);
  d.num_speculative_tokens = block > 0 ? (from_anchor ? block : block - 1) : 0;
  return d;
}

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

Result<DrafterShape> drafter_by_name(const std::string& name, const ModelConfig& target) {
  const std::string n = lower(name);
  if (n == "muse-spark-open-dspark" || n == "inferact/muse-spark-open-dspark") return spark_dspark(target);
  if (n == "muse-glimmer-30b-assistant" || n == "meta-models/muse-glimmer-30b-assistant")
    return glimmer_assistant(target);
  std::string path = name;
  if (file_exists(path + "/config.json")) path += "/config.json";
  if (file_exists(path)) return drafter_from_config(path, target);
  std::string list;
  for (const auto& d : drafter_profile_names()) list += (list.empty() ? "" : ", ") + d;
  return make_error("unknown drafter '" + name + "' (valid: " + list + ", or a drafter config.json)");
}

}  // namespace

int64_t drafter_params(const DrafterShape& d) {
  const int64_t q = d.heads * d.head_dim, kv = d.kv_heads * d.head_dim;
  int64_t layer = d.hidden * q + 2 * d.hidden * kv + q * d.hidden + 3 * d.hidden * d.intermediate + 2 * d.hidden;
  if (d.attention_gate) layer += d.hidden * q;
  if (d.qk_norm_weights) layer += 2 * d.head_dim;
  int64_t n = d.layers * layer + d.fc_inputs * d.hidden + 2 * d.hidden;  // fc, its norm, final norm
  if (d.own_embedding) n += d.vocab * d.hidden;
  if (d.own_lm_head) n += d.vocab * d.hidden;
  n += 2 * d.vocab * d.markov_rank;
  if (d.confidence_head) n += d.hidden + d.markov_rank + 1;
  return n;
}

std::vector<std::string> drafter_profile_names() { return {"muse-spark-open-dspark", "muse-glimmer-30b-assistant"}; }

Result<DrafterChoice> resolve_drafter(const std::string& drafter, const std::string& speculative_config,
                                      const ModelConfig& target) {
  DrafterChoice c;
  std::string model = drafter;
  if (!speculative_config.empty()) {
    auto parsed = Json::parse(speculative_config);
    if (!parsed.ok()) return make_error("--speculative-config: " + parsed.message());
    const Json& j = *parsed;
    if (!j.is_object()) return make_error("--speculative-config must be a JSON object");
    c.method = lower(j.get_string("method", ""));
    if (c.method.empty()) return make_error("--speculative-config needs a \"method\" (dspark, dflash, draft_model, ngram, suffix)");
    if (const Json* k = j.find("num_speculative_tokens"); k && !k->is_null()) {
      if (!k->is_int() || k->as_int() < 1 || k->as_int() > 64)
        return make_error("--speculative-config num_speculative_tokens must be an integer from 1 to 64, got " + k->dump());
      c.num_speculative_tokens = k->as_int();
    }
    if (c.method == "ngram" || c.method == "suffix") {
      if (!drafter.empty()) return make_error("--drafter conflicts with --speculative-config method " + c.method);
      return c;  // no draft model, no weights
    }
    if (c.method != "dspark" && c.method != "dflash" && c.method != "draft_model")
      return make_error("--speculative-config method '" + c.method +
                        "' is not one muse plan sizes (dspark, dflash, draft_model, ngram, suffix)");
    const std::string m = j.get_string("model", "");
    if (!m.empty() && !drafter.empty() && lower(m) != lower(drafter))
      return make_error("--drafter '" + drafter + "' and --speculative-config model '" + m + "' disagree");
    if (!m.empty()) model = m;
    if (model.empty()) model = target.is_spark() ? "muse-spark-open-dspark" : "muse-glimmer-30b-assistant";
  }
  if (model.empty()) return c;
  MUSE_ASSIGN_OR_RETURN(c.shape, drafter_by_name(model, target));
  if (c.method.empty()) c.method = c.shape.markov_rank > 0 ? "dspark" : "dflash";
  if (c.num_speculative_tokens == 0) c.num_speculative_tokens = c.shape.num_speculative_tokens;
  c.present = true;
  return c;
}

}  // namespace muse::plan
