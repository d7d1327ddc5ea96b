#include "muse/speculative/spec_config.h"

#include "muse/core/json.h"

namespace muse {

const char* to_string(SpecMethod m) { return m == SpecMethod::DSpark ? "dspark" : "dflash"; }
const char* to_string(DraftSampleMethod m) { return m == DraftSampleMethod::Greedy ? "greedy" : "probabilistic"; }
const char* to_string(RejectionSampleMethod m) { return m == RejectionSampleMethod::Standard ? "standard" : "block"; }

namespace {

Error bad(const std::string& key, const std::string& want, const Json& got) {
  return make_error("--speculative-config: " + key + " must be " + want + ", got " + got.dump());
}

// One string-valued key restricted to `names` (mapped to `values`).
template <class E, size_t N>
Status enum_value(const std::string& key, const Json& v, const char* const (&names)[N], const E (&values)[N], E* out) {
  std::string list;
  for (size_t i = 0; i < N; ++i) list += std::string(i ? "|" : "") + names[i];
  if (!v.is_string()) return bad(key, "one of " + list, v);
  for (size_t i = 0; i < N; ++i)
    if (v.as_string() == names[i]) {
      *out = values[i];
      return Status::Ok();
    }
  return bad(key, "one of " + list, v);
}

}  // namespace

Result<SpeculativeConfig> parse_speculative_config(std::string_view json_text) {
  SpeculativeConfig c;
  if (json_text.empty()) return c;
  auto parsed = Json::parse(json_text);
  if (!parsed.ok()) return make_error("--speculative-config is not valid JSON: " + parsed.message());
  const Json& j = *parsed;
  if (!j.is_object()) return make_error("--speculative-config must be a JSON object");
  bool has_method = false;
  for (const auto& [key, v] : j.as_object()) {
    if (key == "method") {
      static const char* const names[] = {"dspark", "dflash"};
      static const SpecMethod values[] = {SpecMethod::DSpark, SpecMethod::DFlash};
      MUSE_RETURN_IF_ERROR(enum_value(key, v, names, values, &c.method));
      has_method = true;
    } else if (key == "model") {
      if (!v.is_string() || v.as_string().empty()) return bad(key, "a drafter directory", v);
      c.model = v.as_string();
    } else if (key == "num_speculative_tokens") {
      if (!v.is_int() || v.as_int() < 1 || v.as_int() > 64) return bad(key, "an integer in [1, 64]", v);
      c.num_speculative_tokens = int(v.as_int());
    } else if (key == "draft_sample_method") {
      static const char* const names[] = {"greedy", "probabilistic"};
      static const DraftSampleMethod values[] = {DraftSampleMethod::Greedy, DraftSampleMethod::Probabilistic};
      MUSE_RETURN_IF_ERROR(enum_value(key, v, names, values, &c.draft_sample_method));
    } else if (key == "rejection_sample_method") {
      static const char* const names[] = {"standard", "block"};
      static const RejectionSampleMethod values[] = {RejectionSampleMethod::Standard, RejectionSampleMethod::Block};
      MUSE_RETURN_IF_ERROR(enum_value(key, v, names, values, &c.rejection_sample_method));
    } else if (key == "enable_adaptive_verification") {
      if (!v.is_bool()) return bad(key, "true or false", v);
      c.enable_adaptive_verification = v.as_bool();
    } else {
      return make_error("--speculative-config: unknown key \"" + key +
                        "\" (known: method, model, num_speculative_tokens, draft_sample_method, "
                        "rejection_sample_method, enable_adaptive_verification)");
    }
  }
  if (!has_method) return make_error("--speculative-config: method is required (dspark or dflash)");
  if (c.model.empty()) return make_error("--speculative-config: model (the drafter's directory) is required");
  c.enabled = true;
  return c;
}

}  // namespace muse
