// The checkpoint resolver (internal to loading/): finds each weight slot's
// tensor among the checkpoint's spellings (name_map.h), checks dtype and
// shape, resolves a quantized slot's companion tensors per format, and
// collects every problem with its tensor named. Checkpoint::open
// (checkpoint.cc) drives it; nothing outside loading/ includes this header.
#pragma once

#include <array>
#include <cctype>
#include <cstring>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "muse/loading/checkpoint.h"
#include "muse/loading/module_regex.h"

namespace muse::checkpoint_detail {

std::string shape_text(const std::vector<int64_t>& shape);
std::string slot_text(const WeightSpec& spec);

struct Located {
  size_t file = 0;
  const TensorInfo* info = nullptr;
};

// Whether exclusion pattern p names module `base` or a module above it:
// "re:<regex>" (compressed-tensors, GPTQModel) matched from the start, a
// glob (fnmatch) of the module or of a prefix of it ("layers.*.self_attn"
// covers its q_proj), or a name matched on whole dot-separated components
// ("lm_head", "self_attn", "model.layers.0.mlp"), as transformers'
// modules_to_not_convert reads it.
struct Exclusion {
  std::string pattern;             // as written in the config
  std::optional<ModuleRegex> re;   // "re:" patterns, compiled once
};
// The config's exclusion list, compiled; an invalid regular expression is
// an error naming it.
Result<std::vector<Exclusion>> compile_exclusions(const std::vector<std::string>& patterns);
bool module_excluded(const Exclusion& e, const std::string& base);

// Everything the resolver needs while it runs.
struct Resolver {
  const ModelConfig& config;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files;
  QuantInfo info;  // from quantization_config (or hf_quant_config.json)
  std::vector<Exclusion> exclusions;  // info.excluded, compiled
  std::unordered_map<std::string, Located> tensors;
  std::unordered_set<std::string> consumed;
  std::vector<std::string> problems;

  QuantScheme scheme() const { return info.scheme; }
  QuantKind kind() const { return quant_kind_of(info.scheme); }
  std::string kind_upper() const {
    std::string n = quant_kind_name(kind());
    for (char& c : n) c = char(std::toupper(static_cast<unsigned char>(c)));
    return n;
  }
  // The dtype a quantized slot's codes tensor has in this format.
  bool is_codes(DType d) const;

  const Located* find(const std::string& name) const {
    auto it = tensors.find(name);
    return it == tensors.end() ? nullptr : &it->second;
  }

  TensorView view(const std::string& name, const Located& l) const;

  std::string quant_hint(DType dtype) const;

  // Checks shape and dtype of one tensor against what a slot (or an expert
  // piece of it) expects; records a problem and returns false on mismatch.
  bool check(const TensorView& v, const WeightSpec& spec, const SlotRule& rule, const std::vector<int64_t>& want);

  void missing(const WeightSpec& spec, const SlotRule& rule, const std::vector<std::string>& candidates);

  void bad_part(const WeightSpec& spec, const SlotRule& rule, const TensorView& v, const std::string& want) {
    problems.push_back("tensor " + v.name + " in " + v.file + " is " + std::string(dtype_name(v.dtype)) + " " +
                       shape_text(v.shape) + " but " + kind_upper() + " " + slot_text(spec) + " (" +
                       rule.shape_doc + ") expects " + want);
  }

  // A companion tensor by name; records "missing" against the codes tensor.
  const Located* need(const ResolvedWeight& out, const std::string& name, const char* what);

  // The names of a quantized slot's companions: ".x" on a module whose
  // weight is "<module>.weight" (or ".weight_packed" / ".qweight"), "_x" on
  // a fused 3-D parameter.
  struct Naming {
    std::string base;
    bool module = true;
    std::string operator()(const std::string& suffix) const { return base + (module ? "." : "_") + suffix; }
  };
  static bool strip(const std::string& name, const char* suffix, std::string* base) {
    const size_t n = std::strlen(suffix);
    if (name.size() < n || name.compare(name.size() - n, n, suffix) != 0) return false;
    *base = name.substr(0, name.size() - n);
    return true;
  }
  static Naming naming_of(const std::string& name);

  // Exclusion lists (ignore / exclude_modules / exclude / modules_to_not_convert):
  // a quantized tensor inside an excluded module contradicts the config.
  void check_not_excluded(const WeightSpec& spec, const Naming& nm, const ResolvedWeight& out);

  void resolve_quant(const WeightSpec& spec, const SlotRule& rule, ResolvedWeight& out);

  // The leading (expert) dimension of a slot, as a shape prefix.
  static std::vector<int64_t> lead(const WeightSpec& spec, std::vector<int64_t> inner) {
    if (spec.shape.size() == 3) inner.insert(inner.begin(), spec.shape[0]);
    return inner;
  }

  // NVFP4 (ModelOpt or compressed-tensors): U8 codes [.., N, K/2], E4M3
  // block scales [.., N, K/16], F32 global scales (2-D: one value; fused
  // experts: [E], [E, 1] or [E, 2] with separate gate and up halves).
  void resolve_nvfp4(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out);

  // MXFP4 (Quark, compressed-tensors, gpt-oss): U8 codes [.., N, K/2] (or
  // gpt-oss [E, N, K/32, 16]), E8M0 scales (U8 or F8_E8M0) [.., N, K/32]:
  // ".weight_scale" / "_weight_scale", or gpt-oss "_scales" beside "_blocks".
  void resolve_mxfp4(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out);

  // FP8 E4M3 codes [.., N, K] with F32 "weight_scale" (per tensor [] / [1]
  // or per expert [E] / [E, 1]; per channel [N] / [N, 1] (PTPC); or 128×128
  // blocks [ceil(N/128), ceil(K/128)]) or "weight_scale_inv" (blocks, multiplied).
  void resolve_fp8(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out);

  // compressed-tensors pack-quantized W4A16 (symmetric): weight_packed I32
  // [.., N, K/8] (k = 8c + j at bits 4j..4j+3, stored value = q + 8),
  // weight_scale F16/BF16 [.., N, K/G], weight_shape; asymmetric zero points
  // and act-order g_idx are refused by name.
  void resolve_ct_int4(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out, int64_t G);

  // GPTQ / AutoRound 4-bit: qweight I32 [.., K/8, N], qzeros I32 [.., K/G, N/8],
  // scales F16 [.., K/G, N], optional g_idx I32 [K] that must be the plain
  // k / G (act-order permutations are refused by name).
  void resolve_int4(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out);

  // Per-expert 2-D alias path: every expert's pieces under one prefix.
  // The spellings of a per-expert piece in this format (".weight", and
  // compressed-tensors' ".weight_packed" / GPTQ's ".qweight").
  const Located* find_piece(const std::string& name, std::string* found) const;

  // Per-expert 2-D alias path: every expert's pieces under one prefix; in a
  // quantized checkpoint each piece may be quantized (all of them or none).
  bool resolve_per_expert(const WeightSpec& spec, const SlotRule& rule, ResolvedWeight& out);

  void resolve(const WeightSpec& spec, ResolvedWeight& out);

  // KV-cache scales (kv_scale_names(), any text prefix): per layer {k, v}, 1.0
  // where absent; consumed; a bad or doubly given scale is a problem.
  std::vector<std::array<float, 2>> resolve_kv_scales();
};

}  // namespace muse::checkpoint_detail
