// The one checkpoint-name table (checkpoint-formats.md §5.6): for every
// canonical weight slot (model/weight_table.h), the checkpoint spellings to
// look for, in order (the published name first, then aliases), plus the dtype
// rule and the transform the model code applies after loading. Adapting to a
// new spelling is an edit to the table in name_map.cc, nothing else.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "muse/core/dtype.h"
#include "muse/model/config.h"
#include "muse/model/weight_table.h"

namespace muse {

// What the model code does to a loaded tensor before use. The loader hands
// out raw checkpoint values; these tags say how to interpret them.
enum class WeightTransform {
  None,          // use as stored (matrices; the final norm's gain is absolute)
  NormOffset,    // stored gain w is an offset: the effective gain is 1 + w
                 // (Spark's reference rounds it to bf16 once at load: bf16(1 + w))
  ResidualGate,  // Spark residual-gate logits g: u = g / residual_gate_temperature,
                 // beta = sigmoid(u), alpha = sqrt(max(sigmoid(-u)·(1 + sigmoid(u)), 1e-3)),
                 // fp32, folded once at load (fold_residual_gate below)
};
const char* weight_transform_name(WeightTransform t);

// Which dtypes a slot accepts unquantized.
enum class DTypeRule {
  Float,    // F32, F16 or BF16 (converted as needed)
  F32Only,  // the router and its bias stay FP32 (§5.5 precision floor)
};
bool dtype_allowed(DTypeRule rule, DType dtype);
const char* dtype_rule_text(DTypeRule rule);

enum class SlotFamily { Both, Glimmer, Spark };

struct SlotRule {
  const char* slot;
  SlotFamily family;
  // Candidate names relative to a text-decoder prefix (see kTextPrefixes),
  // with {L} for the layer; the first is the published name.
  std::vector<const char*> names;
  // Absolute candidates tried as-is, without a prefix (lm_head lives at the top level).
  std::vector<const char*> absolute_names;
  // Per-expert 2-D alias path for fused 3-D expert slots, relative to a
  // prefix, with {L} and {E}: the pieces of expert E, concatenated along rows
  // (gate_up: {gate_proj, up_proj}; down: {down_proj}).
  std::vector<const char*> per_expert;
  DTypeRule dtype_rule;
  WeightTransform transform;
  const char* shape_doc;  // the logical shape in config terms, for error messages
};

// Text-decoder prefixes, published first: the nested HF layout, a flat
// text-only export, an older nesting and Nemotron's.
inline constexpr const char* kTextPrefixes[] = {"model.language_model.", "model.", "language_model.model.", "backbone."};

// The whole table.
const std::vector<SlotRule>& name_table();
// The rule for a slot of the given family; nullptr if the slot is unknown.
const SlotRule* find_slot_rule(std::string_view slot, ModelFamily family);

// Expands {L} / {E}.
std::string expand_name(std::string_view pattern, int layer, int expert = -1);
// Every candidate checkpoint name for (rule, layer), in preference order:
// each relative name under each prefix, then the absolute names.
std::vector<std::string> candidate_names(const SlotRule& rule, int layer);

// KV-cache scales (checkpoint-formats.md §6): optional per-layer scalars,
// relative to a text prefix, with {L}; which of K and V each spelling gives
// (the legacy kv_scale gives both). Absent: 1.0.
struct KvScaleName {
  const char* name;
  bool k, v;
};
const std::vector<KvScaleName>& kv_scale_names();

// Tensors of the vision / audio towers and their projectors (skipped with
// --language-model-only): any dotted component starting with "vision" or
// "audio", or named "visual", "multi_modal_projector", "mm_projector".
bool is_multimodal_tensor(std::string_view name);

// Recognises the suffixes of quantized checkpoints (for error hints).
bool looks_quantized_tensor(std::string_view name);

// Transform helpers (fp32). n elements each.
void fold_residual_gate(const float* gate, int64_t n, double temperature, float* alpha, float* beta);
void norm_offset_gain(const float* w, int64_t n, bool round_to_bf16, float* gain);

}  // namespace muse
