#include "muse/loading/checkpoint.h"

#include <fnmatch.h>

#include <cctype>
#include <cmath>
#include <cstring>

#include <algorithm>
#include <optional>
#include <regex>
#include <unordered_set>

#include "muse/loading/convert.h"

namespace muse {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string slot_text(const WeightSpec& spec) {
  return "slot " + spec.slot + (spec.layer >= 0 ? " of layer " + std::to_string(spec.layer) : std::string());
}

std::string key_of(std::string_view slot, int layer) { return std::string(slot) + "#" + std::to_string(layer); }

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
bool module_excluded(const std::string& p, const std::string& base) {
  if (p.rfind("re:", 0) == 0) {
    try {
      return std::regex_search(base, std::regex(p.substr(3)), std::regex_constants::match_continuous);
    } catch (const std::regex_error&) {
      return false;  // reported once by Checkpoint::open
    }
  }
  if (fnmatch(p.c_str(), base.c_str(), 0) == 0 || fnmatch((p + ".*").c_str(), base.c_str(), 0) == 0) return true;
  if (p.empty() || p.find_first_of("*?[") != std::string::npos) return false;
  const std::string d = "." + base + ".";
  return d.find("." + p + ".") != std::string::npos;
}

// Everything the resolver needs while it runs.
struct Resolver {
  const ModelConfig& config;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files;
  QuantInfo info;  // from quantization_config (or hf_quant_config.json)
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
  bool is_codes(DType d) const {
    switch (kind()) {
      case QuantKind::Nvfp4:
      case QuantKind::Mxfp4: return d == DType::U8 || d == DType::F4;  // packed bytes, or F4 of the logical shape
      case QuantKind::Fp8: return d == DType::F8_E4M3;
      case QuantKind::Int4: return d == DType::I32;
      case QuantKind::None: return false;
    }
    return false;
  }

  const Located* find(const std::string& name) const {
    auto it = tensors.find(name);
    return it == tensors.end() ? nullptr : &it->second;
  }

  TensorView view(const std::string& name, const Located& l) const {
    const SafetensorsFile& f = *files[l.file];
    TensorView v;
    v.name = name;
    v.file = f.path();
    v.dtype = l.info->dtype;
    v.shape = l.info->shape;
    v.data = f.data(*l.info);
    v.nbytes = size_t(l.info->nbytes());
    return v;
  }

  std::string quant_hint(DType dtype) const {
    if (dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16) return "";
    if (info.scheme != QuantScheme::None)
      return "; in a " + std::string(quant_scheme_name(info.scheme)) + " checkpoint this slot's codes are " +
             (kind() == QuantKind::Fp8 ? "F8_E4M3" : kind() == QuantKind::Int4 ? "I32 (qweight)" : "U8") +
             "";
    return "; a quantized tensor, but config.json has no quantization_config";
  }

  // Checks shape and dtype of one tensor against what a slot (or an expert
  // piece of it) expects; records a problem and returns false on mismatch.
  bool check(const TensorView& v, const WeightSpec& spec, const SlotRule& rule, const std::vector<int64_t>& want) {
    if (v.shape != want) {
      problems.push_back("tensor " + v.name + " in " + v.file + " has shape " + shape_text(v.shape) + " but " +
                         slot_text(spec) + " expects " + shape_text(want) + " = " + rule.shape_doc +
                         " from config.json; the checkpoint does not match its config");
      return false;
    }
    if (!dtype_allowed(rule.dtype_rule, v.dtype)) {
      problems.push_back("tensor " + v.name + " in " + v.file + " is " + std::string(dtype_name(v.dtype)) + " but " +
                         slot_text(spec) + " expects " + dtype_rule_text(rule.dtype_rule) + quant_hint(v.dtype));
      return false;
    }
    return true;
  }

  void missing(const WeightSpec& spec, const SlotRule& rule, const std::vector<std::string>& candidates) {
    std::string msg = "missing tensor " + (candidates.empty() ? spec.slot : candidates[0]) + " " +
                      shape_text(spec.shape) + " for " + slot_text(spec);
    if (candidates.size() > 1) msg += " (" + std::to_string(candidates.size() - 1) + " other spellings tried, none present)";
    if (spec.slot == "lm_head") msg += "; config.json has tie_word_embeddings = false";
    problems.push_back(msg);
  }

  void bad_part(const WeightSpec& spec, const SlotRule& rule, const TensorView& v, const std::string& want) {
    problems.push_back("tensor " + v.name + " in " + v.file + " is " + std::string(dtype_name(v.dtype)) + " " +
                       shape_text(v.shape) + " but " + kind_upper() + " " + slot_text(spec) + " (" +
                       rule.shape_doc + ") expects " + want);
  }

  // A companion tensor by name; records "missing" against the codes tensor.
  const Located* need(const ResolvedWeight& out, const std::string& name, const char* what) {
    const Located* l = find(name);
    if (!l)
      problems.push_back("tensor " + out.tensor.name + " in " + out.tensor.file + " is " +
                         std::string(dtype_name(out.tensor.dtype)) + " (" + kind_upper() + " " + what +
                         ") but " + name + " is missing");
    return l;
  }

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
  static Naming naming_of(const std::string& name) {
    Naming nm;
    for (const char* s : {".weight_packed", ".qweight", ".weight"})
      if (strip(name, s, &nm.base)) return nm;
    nm.module = false;
    for (const char* s : {"_blocks", "_qweight"})
      if (strip(name, s, &nm.base)) return nm;
    nm.base = name;
    return nm;
  }

  // Exclusion lists (ignore / exclude_modules / exclude / modules_to_not_convert):
  // a quantized tensor inside an excluded module contradicts the config.
  void check_not_excluded(const WeightSpec& spec, const Naming& nm, const ResolvedWeight& out) {
    for (const std::string& p : info.excluded) {
      if (module_excluded(p, nm.base)) {
        problems.push_back("tensor " + out.tensor.name + " in " + out.tensor.file + " is stored quantized but "
                           "quantization_config excludes " + nm.base + " (pattern \"" + p + "\"); the checkpoint "
                           "and its config disagree");
        return;
      }
    }
  }

  void resolve_quant(const WeightSpec& spec, const SlotRule& rule, ResolvedWeight& out) {
    const Naming nm = naming_of(out.tensor.name);
    check_not_excluded(spec, nm, out);
    switch (kind()) {
      case QuantKind::Nvfp4: resolve_nvfp4(spec, rule, nm, out); break;
      case QuantKind::Mxfp4: resolve_mxfp4(spec, rule, nm, out); break;
      case QuantKind::Fp8: resolve_fp8(spec, rule, nm, out); break;
      case QuantKind::Int4: resolve_int4(spec, rule, nm, out); break;
      case QuantKind::None: break;
    }
    if (!out.quantized()) return;
    out.quant.scheme = scheme();
    out.quant.format.kind = kind();
    const std::string input = nm(scheme() == QuantScheme::CompressedTensorsNvfp4 ? "input_global_scale" : "input_scale");
    if (const Located* li = find(input)) {
      out.quant.input_scale = view(input, *li);
      consumed.insert(input);  // activations stay BF16/F32 here (W4A16 / W8A16): checked, not used
      const TensorView& v = out.quant.input_scale;
      const int64_t n = v.numel(), E = spec.shape.size() == 3 ? spec.shape[0] : 1;
      const bool float_dt = v.dtype == DType::F32 || v.dtype == DType::F16 || v.dtype == DType::BF16;
      if (!float_dt || !(n == 1 || n == E || n == 2 * E))
        bad_part(spec, rule, v, "a float activation scale (one value" + std::string(E > 1 ? ", or one or two an expert" : "") + ")");
    }
  }

  // The leading (expert) dimension of a slot, as a shape prefix.
  static std::vector<int64_t> lead(const WeightSpec& spec, std::vector<int64_t> inner) {
    if (spec.shape.size() == 3) inner.insert(inner.begin(), spec.shape[0]);
    return inner;
  }

  // NVFP4 (ModelOpt or compressed-tensors): U8 codes [.., N, K/2], E4M3
  // block scales [.., N, K/16], F32 global scales (2-D: one value; fused
  // experts: [E], [E, 1] or [E, 2] with separate gate and up halves).
  void resolve_nvfp4(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out) {
    const bool ct = scheme() == QuantScheme::CompressedTensorsNvfp4;
    const int64_t cols = spec.shape.back(), N = spec.shape[spec.shape.size() - 2];
    if (cols % 16 != 0) {
      problems.push_back(slot_text(spec) + " has " + std::to_string(cols) + " inputs, not a multiple of 16 as NVFP4 needs");
      return;
    }
    const std::string scale = nm("weight_scale"), global = nm(ct ? "weight_global_scale" : "weight_scale_2");
    const Located* ls = need(out, scale, "codes");
    const Located* lg = need(out, global, "codes");
    if (!ls || !lg) {
      for (const std::string& n : {scale, global})
        if (find(n)) consumed.insert(n);  // reported once, as the missing companion
      return;
    }
    ResolvedWeight::Quantized& q = out.quant;
    q.scales = view(scale, *ls);
    q.global_scale = view(global, *lg);
    consumed.insert(scale);
    consumed.insert(global);
    std::vector<int64_t> packed = spec.shape, scale_shape = lead(spec, {N, cols / 16});
    packed.back() = cols / 2;
    bool ok = true;
    if (out.tensor.dtype == DType::F4 ? out.tensor.shape != spec.shape : out.tensor.shape != packed)
      bad_part(spec, rule, out.tensor, "U8 " + shape_text(packed) + " or F4 " + shape_text(spec.shape)), ok = false;
    if ((q.scales.dtype != DType::F8_E4M3 && q.scales.dtype != DType::U8) || q.scales.shape != scale_shape)
      bad_part(spec, rule, q.scales, "F8_E4M3 " + shape_text(scale_shape)), ok = false;
    const TensorView& gs = q.global_scale;
    int parts = 1;
    if (spec.shape.size() == 3) {
      const int64_t E = spec.shape[0];
      const bool two = gs.shape == std::vector<int64_t>{E, 2} && N % 2 == 0 && spec.slot == "moe.experts.gate_up";
      if (gs.dtype != DType::F32 || !(gs.shape == std::vector<int64_t>{E} || gs.shape == std::vector<int64_t>{E, 1} || two)) {
        bad_part(spec, rule, gs,
                 "F32 [" + std::to_string(E) + "] or [" + std::to_string(E) + ", 1]" +
                     (spec.slot == "moe.experts.gate_up" ? " or [" + std::to_string(E) + ", 2] (gate and up halves)"
                                                         : std::string()));
        ok = false;
      }
      parts = two ? 2 : 1;
    } else if (gs.dtype != DType::F32 || gs.numel() != 1) {
      bad_part(spec, rule, gs, "one F32 value"), ok = false;
    }
    if (!ok) return;
    q.global.resize(size_t(gs.numel()));
    for (size_t i = 0; i < q.global.size(); ++i) {
      float g;
      std::memcpy(&g, gs.data + 4 * i, 4);
      q.global[i] = ct ? 1.0f / g : g;  // compressed-tensors stores the reciprocal of ModelOpt's weight_scale_2
    }
    q.format.scale_dtype = DType::F8_E4M3;
    q.format.block_rows = 1, q.format.block_cols = 16, q.format.global_parts = parts;
    q.format.kind = QuantKind::Nvfp4;
  }

  // MXFP4 (Quark, compressed-tensors, gpt-oss): U8 codes [.., N, K/2] (or
  // gpt-oss [E, N, K/32, 16]), E8M0 scales (U8 or F8_E8M0) [.., N, K/32]:
  // ".weight_scale" / "_weight_scale", or gpt-oss "_scales" beside "_blocks".
  void resolve_mxfp4(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out) {
    const int64_t cols = spec.shape.back(), N = spec.shape[spec.shape.size() - 2];
    if (cols % 32 != 0) {
      problems.push_back(slot_text(spec) + " has " + std::to_string(cols) + " inputs, not a multiple of 32 as MXFP4 needs");
      return;
    }
    const bool gpt_oss = !nm.module && out.tensor.name.size() > 7 &&
                         out.tensor.name.compare(out.tensor.name.size() - 7, 7, "_blocks") == 0;
    const std::string scale = gpt_oss ? nm("scales") : nm("weight_scale");
    const Located* ls = need(out, scale, "codes");
    if (!ls) return;
    ResolvedWeight::Quantized& q = out.quant;
    q.scales = view(scale, *ls);
    consumed.insert(scale);
    std::vector<int64_t> packed = spec.shape, blocks = lead(spec, {N, cols / 32, 16});
    packed.back() = cols / 2;
    const std::vector<int64_t> scale_shape = lead(spec, {N, cols / 32});
    bool ok = true;
    const bool shape_ok = out.tensor.dtype == DType::F4 ? out.tensor.shape == spec.shape
                                                        : out.tensor.shape == packed || (gpt_oss && out.tensor.shape == blocks);
    if (!shape_ok)
      bad_part(spec, rule, out.tensor,
               "U8 " + shape_text(gpt_oss ? blocks : packed) + (gpt_oss ? "" : " or F4 " + shape_text(spec.shape))),
          ok = false;
    if ((q.scales.dtype != DType::U8 && q.scales.dtype != DType::F8_E8M0) || q.scales.shape != scale_shape)
      bad_part(spec, rule, q.scales, "U8 (E8M0) " + shape_text(scale_shape)), ok = false;
    if (!ok) return;
    q.format.scale_dtype = DType::F8_E8M0;
    q.format.block_rows = 1, q.format.block_cols = 32;
    q.format.kind = QuantKind::Mxfp4;
  }

  // FP8 E4M3 codes [.., N, K] with F32 "weight_scale" (per tensor [] / [1]
  // or per expert [E] / [E, 1]; per channel [N] / [N, 1] (PTPC); or 128×128
  // blocks [ceil(N/128), ceil(K/128)]) or "weight_scale_inv" (blocks, multiplied).
  void resolve_fp8(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out) {
    const int64_t K = spec.shape.back(), N = spec.shape[spec.shape.size() - 2];
    std::string scale = nm("weight_scale");
    if (!find(scale) && find(nm("weight_scale_inv"))) scale = nm("weight_scale_inv");
    const Located* ls = need(out, scale, "codes");
    if (!ls) return;
    ResolvedWeight::Quantized& q = out.quant;
    q.scales = view(scale, *ls);
    consumed.insert(scale);
    bool ok = true;
    if (out.tensor.shape != spec.shape) bad_part(spec, rule, out.tensor, "F8_E4M3 " + shape_text(spec.shape)), ok = false;
    const int64_t bn = (N + 127) / 128, bk = (K + 127) / 128;
    const std::vector<int64_t>& ss = q.scales.shape;
    auto is = [&](std::vector<int64_t> inner) { return ss == lead(spec, inner); };
    const bool per_tensor = spec.shape.size() == 3 ? (is({}) || is({1}) || is({1, 1})) : (ss.empty() || is({1}) || is({1, 1}));
    const bool per_channel = is({N}) || is({N, 1});
    const bool block = is({bn, bk});
    if (info.fp8_blocks && !block && !(bn == 1 && bk == 1 && per_tensor)) {
      bad_part(spec, rule, q.scales,
               "F32 scales per 128x128 block " + shape_text(lead(spec, {bn, bk})) +
                   " (quantization_config: quant_method fp8, weight_block_size [128, 128])");
      return;
    }
    // Scales in F32, or in the model's F16 / BF16 (compressed-tensors writes
    // them so): widened to F32 where the weight is read.
    const bool float_scales = q.scales.dtype == DType::F32 || q.scales.dtype == DType::F16 || q.scales.dtype == DType::BF16;
    if (!float_scales || !(per_tensor || per_channel || block)) {
      bad_part(spec, rule, q.scales,
               "F32 (or F16 / BF16) scales per tensor, per output channel " + shape_text(lead(spec, {N})) +
                   " or per 128x128 block " + shape_text(lead(spec, {bn, bk})));
      ok = false;
    }
    if (!ok) return;
    q.format.scale_dtype = DType::F32;
    if (per_channel && !(N == 1 && per_tensor)) q.format.block_rows = 1, q.format.block_cols = int32_t(K);
    else if (per_tensor) q.format.block_rows = int32_t(N), q.format.block_cols = int32_t(K);
    else q.format.block_rows = 128, q.format.block_cols = 128;
    q.format.kind = QuantKind::Fp8;
  }

  // compressed-tensors pack-quantized W4A16 (symmetric): weight_packed I32
  // [.., N, K/8] (k = 8c + j at bits 4j..4j+3, stored value = q + 8),
  // weight_scale F16/BF16 [.., N, K/G], weight_shape; asymmetric zero points
  // and act-order g_idx are refused by name.
  void resolve_ct_int4(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out, int64_t G) {
    const int64_t K = spec.shape.back(), N = spec.shape[spec.shape.size() - 2];
    if (K % 8 || N % 8 || G % 8) {
      problems.push_back(slot_text(spec) + " is [" + std::to_string(N) + ", " + std::to_string(K) + "] with group " +
                         std::to_string(G) + ": INT4 needs all three multiples of 8");
      return;
    }
    for (const char* refused : {"weight_zero_point", "weight_g_idx"})
      if (find(nm(refused))) {
        problems.push_back("tensor " + nm(refused) + " in " + out.tensor.file + ": compressed-tensors INT4 with " +
                           (std::string(refused) == "weight_g_idx" ? "act-order (g_idx)" : "asymmetric zero points") +
                           " is not supported");
        return;
      }
    const std::string scale = nm("weight_scale");
    const Located* ls = need(out, scale, "weight_packed");
    if (!ls) return;
    ResolvedWeight::Quantized& q = out.quant;
    q.scales = view(scale, *ls);
    consumed.insert(scale);
    if (const Located* lw = find(nm("weight_shape"))) {  // the logical [N, K], as integers
      const TensorView v = view(nm("weight_shape"), *lw);
      consumed.insert(v.name);
      const bool i64 = v.dtype == DType::I64, i32 = v.dtype == DType::I32;
      bool same = (i64 || i32) && v.numel() == 2;
      for (int64_t i = 0; same && i < 2; ++i) {
        int64_t d = 0;
        if (i64) std::memcpy(&d, v.data + 8 * i, 8);
        else {
          int32_t d32;
          std::memcpy(&d32, v.data + 4 * i, 4);
          d = d32;
        }
        same = d == (i == 0 ? N : K);
      }
      if (!same) {
        bad_part(spec, rule, v, "I64 [2] holding [" + std::to_string(N) + ", " + std::to_string(K) + "]");
        return;
      }
    }
    const int64_t groups = (K + G - 1) / G;
    bool ok = true;
    if (out.tensor.dtype != DType::I32 || out.tensor.shape != lead(spec, {N, K / 8}))
      bad_part(spec, rule, out.tensor, "I32 " + shape_text(lead(spec, {N, K / 8}))), ok = false;
    if ((q.scales.dtype != DType::F16 && q.scales.dtype != DType::BF16) || q.scales.shape != lead(spec, {N, groups}))
      bad_part(spec, rule, q.scales, "F16 or BF16 " + shape_text(lead(spec, {N, groups}))), ok = false;
    if (!ok) return;
    q.n_major = true;
    q.format.scale_dtype = q.scales.dtype;
    q.format.block_rows = 1, q.format.block_cols = int32_t(G);
    q.format.kind = QuantKind::Int4;
  }

  // GPTQ / AutoRound 4-bit: qweight I32 [.., K/8, N], qzeros I32 [.., K/G, N/8],
  // scales F16 [.., K/G, N], optional g_idx I32 [K] that must be the plain
  // k / G (act-order permutations are refused by name).
  void resolve_int4(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out) {
    const int64_t K = spec.shape.back(), N = spec.shape[spec.shape.size() - 2];
    const int64_t G = info.group_size > 0 ? info.group_size : K;
    if (info.scheme == QuantScheme::CompressedTensorsInt4) {
      resolve_ct_int4(spec, rule, nm, out, G);
      return;
    }
    if (K % 8 || N % 8 || G % 8) {
      problems.push_back(slot_text(spec) + " is [" + std::to_string(N) + ", " + std::to_string(K) + "] with group " +
                         std::to_string(G) + ": GPTQ INT4 needs all three multiples of 8");
      return;
    }
    const std::string zeros = nm("qzeros"), scales = nm("scales"), g_idx = nm("g_idx");
    const Located* lz = need(out, zeros, "qweight");
    const Located* ls = need(out, scales, "qweight");
    if (!lz || !ls) {
      for (const std::string& n : {zeros, scales, g_idx})
        if (find(n)) consumed.insert(n);
      return;
    }
    ResolvedWeight::Quantized& q = out.quant;
    q.zeros = view(zeros, *lz);
    q.scales = view(scales, *ls);
    consumed.insert(zeros);
    consumed.insert(scales);
    const int64_t groups = (K + G - 1) / G;
    bool ok = true;
    auto expect = [&](const TensorView& v, DType dt, const std::vector<int64_t>& shape) {
      if (v.dtype != dt || v.shape != shape) bad_part(spec, rule, v, std::string(dtype_name(dt)) + " " + shape_text(shape)), ok = false;
    };
    expect(out.tensor, DType::I32, lead(spec, {K / 8, N}));
    expect(q.zeros, DType::I32, lead(spec, {groups, N / 8}));
    if (q.scales.dtype == DType::BF16) expect(q.scales, DType::BF16, lead(spec, {groups, N}));  // a BF16 model's GPTQModel export
    else expect(q.scales, DType::F16, lead(spec, {groups, N}));
    if (const Located* lg = find(g_idx)) {
      TensorView gv = view(g_idx, *lg);
      consumed.insert(g_idx);
      expect(gv, DType::I32, lead(spec, {K}));
      if (ok)
        for (int64_t i = 0; i < gv.numel(); ++i) {
          int32_t g;
          std::memcpy(&g, gv.data + 4 * i, 4);
          if (g != int32_t((i % K) / G)) {
            problems.push_back("tensor " + g_idx + " in " + gv.file + " is an act-order permutation (g_idx[" +
                               std::to_string(i % K) + "] = " + std::to_string(g) + ", not " + std::to_string((i % K) / G) +
                               "): desc_act GPTQ checkpoints are not supported");
            return;
          }
        }
    }
    if (!ok) return;
    q.format.scale_dtype = q.scales.dtype;
    q.format.block_rows = 1, q.format.block_cols = int32_t(G);
    q.format.zero_offset = info.zeros_minus_one ? 1 : 0;
    q.format.kind = QuantKind::Int4;
  }

  // Per-expert 2-D alias path: every expert's pieces under one prefix.
  // The spellings of a per-expert piece in this format (".weight", and
  // compressed-tensors' ".weight_packed" / GPTQ's ".qweight").
  const Located* find_piece(const std::string& name, std::string* found) const {
    std::vector<std::string> names = {name};
    const bool module = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
    if (module && kind() != QuantKind::None) {
      names.push_back(name + "_packed");
      names.push_back(name.substr(0, name.size() - 7) + ".qweight");
    }
    for (const std::string& n : names)
      if (const Located* l = find(n)) {
        *found = n;
        return l;
      }
    return nullptr;
  }

  // Per-expert 2-D alias path: every expert's pieces under one prefix; in a
  // quantized checkpoint each piece may be quantized (all of them or none).
  bool resolve_per_expert(const WeightSpec& spec, const SlotRule& rule, ResolvedWeight& out) {
    const int64_t E = spec.shape[0];
    const int64_t pieces = int64_t(rule.per_expert.size());
    const std::vector<int64_t> piece_shape = {spec.shape[1] / pieces, spec.shape[2]};
    const char* prefix = nullptr;
    std::string found;
    for (const char* p : kTextPrefixes)
      if (find_piece(p + expand_name(rule.per_expert[0], spec.layer, 0), &found)) {
        prefix = p;
        break;
      }
    if (!prefix) return false;
    out.per_expert = true;
    out.experts.assign(size_t(E), {});
    bool ok = true;
    int quantized_pieces = 0, coded_pieces = 0;  // resolved quantized; stored as codes (resolved or not)
    std::optional<QuantFormat> first_format;
    for (int64_t e = 0; e < E; ++e) {
      for (const char* pattern : rule.per_expert) {
        std::string name = prefix + expand_name(pattern, spec.layer, int(e));
        const Located* l = find_piece(name, &found);
        if (!l) {
          problems.push_back("missing tensor " + name + " " + shape_text(piece_shape) + " for expert " +
                             std::to_string(e) + " of " + slot_text(spec) +
                             " (the checkpoint stores experts one by one, so all " + std::to_string(E) +
                             " must be present)");
          return true;
        }
        TensorView v = view(found, *l);
        consumed.insert(found);
        if (is_codes(v.dtype) && spec.reference_dtype == DType::BF16) {
          ++coded_pieces;
          WeightSpec ps = spec;
          ps.shape = piece_shape;
          ResolvedWeight tmp;
          tmp.spec = ps;
          tmp.tensor = v;
          resolve_quant(ps, rule, tmp);
          if (!tmp.quantized()) {
            ok = false;
          } else {
            if (tmp.quant.n_major) {
              problems.push_back("tensor " + v.name + " in " + v.file + ": per-expert compressed-tensors INT4 pieces "
                                 "are not supported (fused or GPTQ-layout experts are)");
              return true;
            }
            const QuantFormat& f = tmp.quant.format;
            if (!first_format) first_format = f;  // the first piece that resolved (expert 0's may have failed)
            const QuantFormat& f0 = *first_format;
            if (f.kind != f0.kind || f.block_cols != f0.block_cols || f.block_rows != f0.block_rows ||
                f.zero_offset != f0.zero_offset) {
              problems.push_back("tensor " + v.name + " in " + v.file + " is quantized differently from the first piece of " +
                                 slot_text(spec) + " (scale blocks or zero points differ)");
              ok = false;
            }
            if (f.kind == QuantKind::Fp8 && f.block_rows == 128 && piece_shape[0] % 128) {
              problems.push_back("tensor " + v.name + " has 128x128 FP8 blocks but " + std::to_string(piece_shape[0]) +
                                 " rows: the pieces of " + slot_text(spec) + " cannot be stacked");
              ok = false;
            }
            if (out.expert_quant.empty()) out.expert_quant.assign(size_t(E), {});
            out.expert_quant[size_t(e)].push_back(tmp.quant);
            ++quantized_pieces;
          }
        } else {
          ok = check(v, spec, rule, piece_shape) && ok;
        }
        out.experts[size_t(e)].push_back(std::move(v));
      }
    }
    if (coded_pieces && coded_pieces != E * pieces) {
      problems.push_back(slot_text(spec) + ": " + std::to_string(coded_pieces) + " of " + std::to_string(E * pieces) +
                         " per-expert pieces are quantized; all or none must be");
      return true;
    }
    if (quantized_pieces && ok) {
      out.quant.scheme = scheme();
      out.quant.format = out.expert_quant[0][0].format;
      if (out.quant.format.kind == QuantKind::Nvfp4) out.quant.format.global_parts = int32_t(pieces);
    }
    return true;
  }

  void resolve(const WeightSpec& spec, ResolvedWeight& out) {
    const SlotRule* rule = find_slot_rule(spec.slot, config.family);
    if (!rule) {
      problems.push_back("internal: no name-table row for " + slot_text(spec));
      return;
    }
    out.spec = spec;
    out.transform = rule->transform;
    std::vector<std::string> candidates = candidate_names(*rule, spec.layer);
    {
      // Quantized spellings of the same slot: compressed-tensors renames a
      // module's weight to weight_packed, GPTQ to qweight; gpt-oss and GPTQ
      // fused 3-D parameters get "_blocks" / "_qweight".
      const size_t n = candidates.size();
      const QuantKind k = kind();
      for (size_t i = 0; i < n; ++i) {
        const std::string& c = candidates[i];
        const bool module = c.size() > 7 && c.compare(c.size() - 7, 7, ".weight") == 0;
        const std::string base = module ? c.substr(0, c.size() - 7) : c;
        if (module && (scheme() == QuantScheme::CompressedTensorsNvfp4 || scheme() == QuantScheme::CompressedTensorsInt4 ||
                       (scheme() == QuantScheme::Mxfp4 && info.method == "compressed-tensors")))
          candidates.push_back(c + "_packed");
        if (k == QuantKind::Int4) candidates.push_back(module ? base + ".qweight" : c + "_qweight");
        if (k == QuantKind::Mxfp4 && !module) candidates.push_back(c + "_blocks");
      }
    }
    std::vector<std::string> present;
    for (const auto& c : candidates)
      if (find(c)) present.push_back(c);
    if (present.size() > 1) {
      problems.push_back("ambiguous checkpoint: both " + present[0] + " and " + present[1] + " could be " +
                         slot_text(spec) + "; remove one or ignore it explicitly");
      return;
    }
    if (present.size() == 1) {
      out.tensor = view(present[0], *find(present[0]));
      consumed.insert(present[0]);
      if (is_codes(out.tensor.dtype) && spec.reference_dtype == DType::BF16 && spec.shape.size() >= 2) {
        if (spec.slot == "embed_tokens") {  // gathered by row, never a product: kept in a float dtype
          problems.push_back("tensor " + out.tensor.name + " in " + out.tensor.file + " is stored quantized (" +
                             std::string(dtype_name(out.tensor.dtype)) + ", " + kind_upper() +
                             "): quantized token embeddings are not supported; the embedding table must be F32, "
                             "BF16 or F16 (list it in the quantization config's ignore list when re-quantizing)");
          return;
        }
        resolve_quant(spec, *rule, out);
        return;
      }
      check(out.tensor, spec, *rule, spec.shape);
      return;
    }
    if (!rule->per_expert.empty() && resolve_per_expert(spec, *rule, out)) return;
    missing(spec, *rule, candidates);
  }
};

bool matches_any(const std::vector<std::string>& patterns, const std::string& name) {
  for (const auto& p : patterns)
    if (fnmatch(p.c_str(), name.c_str(), 0) == 0) return true;
  return false;
}

// Dequantizes experts [begin, end) of a quantized slot (a 2-D slot is one
// "expert") with the reference decoders (loading/quant.h).
Status decode_quantized(const ResolvedWeight& w, int64_t begin, int64_t end, float* dst) {
  const bool fused = w.spec.shape.size() == 3;
  const int64_t E = fused ? w.spec.shape[0] : 1, K = w.spec.shape.back(), N = w.spec.shape[w.spec.shape.size() - 2];
  const ResolvedWeight::Quantized& q = w.quant;
  const QuantFormat& f = q.format;
  const size_t cb = w.tensor.nbytes / size_t(E), sb = q.scales.nbytes / size_t(E);
  for (int64_t e = begin; e < end; ++e) {
    float* out = dst + (e - begin) * N * K;
    const uint8_t* codes = w.tensor.data + size_t(e) * cb;
    const uint8_t* scales = q.scales.data + size_t(e) * sb;
    switch (f.kind) {
      case QuantKind::Nvfp4: {
        const int64_t rows = N / f.global_parts;
        for (int64_t h = 0; h < f.global_parts; ++h)
          MUSE_RETURN_IF_ERROR(decode_nvfp4({codes + h * rows * K / 2, size_t(rows * K / 2), DType::U8},
                                            {scales + h * rows * K / 16, size_t(rows * K / 16), q.scales.dtype},
                                            q.global[size_t(e * f.global_parts + h)], rows, K, out + h * rows * K));
        break;
      }
      case QuantKind::Mxfp4:
        MUSE_RETURN_IF_ERROR(decode_mxfp4({codes, cb, DType::U8}, {scales, sb, q.scales.dtype}, N, K, out));
        break;
      case QuantKind::Fp8: {
        const Fp8Scaling sc = f.block_rows == 1 && f.block_cols == K ? Fp8Scaling::PerChannel
                              : f.block_rows == N && f.block_cols == K ? Fp8Scaling::PerTensor
                                                                       : Fp8Scaling::Block;
        MUSE_RETURN_IF_ERROR(decode_fp8({codes, cb, DType::F8_E4M3}, {scales, sb, q.scales.dtype}, sc, N, K, out,
                                        f.block_rows, f.block_cols));
        break;
      }
      case QuantKind::Int4: {
        if (q.n_major) {
          MUSE_RETURN_IF_ERROR(decode_ct_int4({codes, cb, DType::I32}, {scales, sb, q.scales.dtype}, N, K, f.block_cols, out));
          break;
        }
        GptqArgs a;
        a.qweight = {codes, cb, DType::I32};
        a.qzeros = {q.zeros.data + size_t(e) * (q.zeros.nbytes / size_t(E)), q.zeros.nbytes / size_t(E), DType::I32};
        a.scales = {scales, sb, q.scales.dtype};
        a.in_features = K, a.out_features = N, a.group_size = f.block_cols, a.zeros_minus_one = f.zero_offset == 1;
        MUSE_RETURN_IF_ERROR(decode_gptq_int4(a, out));
        break;
      }
      case QuantKind::None: return make_error("not quantized");
    }
  }
  return Status::Ok();
}

// One quantized 2-D piece of a per-expert layout, dequantized.
Status decode_piece(const ResolvedWeight& w, const TensorView& codes, const ResolvedWeight::Quantized& q, float* dst) {
  ResolvedWeight tmp;
  tmp.spec = w.spec;
  tmp.spec.shape = {w.spec.shape[1] / int64_t(w.experts[0].size()), w.spec.shape[2]};
  tmp.tensor = codes;
  tmp.quant = q;
  return decode_quantized(tmp, 0, 1, dst);
}

Status decode_per_expert(const ResolvedWeight& w, int64_t begin, int64_t end, float* dst) {
  for (int64_t e = begin; e < end; ++e)
    for (size_t i = 0; i < w.experts[size_t(e)].size(); ++i) {
      const TensorView& v = w.experts[size_t(e)][i];
      MUSE_RETURN_IF_ERROR(decode_piece(w, v, w.expert_quant[size_t(e)][i], dst));
      dst += w.spec.shape[1] / int64_t(w.experts[0].size()) * w.spec.shape[2];
    }
  return Status::Ok();
}

std::string join_problems(const std::string& dir, const std::vector<std::string>& problems) {
  if (problems.size() == 1) return dir + ": " + problems[0];
  std::string msg = dir + ": " + std::to_string(problems.size()) + " problems with the checkpoint:";
  const size_t shown = std::min<size_t>(problems.size(), 12);
  for (size_t i = 0; i < shown; ++i) msg += "\n  " + problems[i];
  if (shown < problems.size()) msg += "\n  ... and " + std::to_string(problems.size() - shown) + " more";
  return msg;
}

}  // namespace

int64_t TensorView::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

Status read_f32(const TensorView& view, float* dst) {
  return convert_to_f32_parallel(view.dtype, view.data, view.numel(), dst);
}

Status read_bf16(const TensorView& view, uint16_t* dst) {
  return convert_to_bf16_parallel(view.dtype, view.data, view.numel(), dst);
}

Result<Checkpoint> Checkpoint::open(const std::string& dir, const LoadOptions& options) {
  Checkpoint ck;
  ck.dir_ = dir;
  MUSE_ASSIGN_OR_RETURN(ck.config_, load_model_config(dir));
  ck.weights_ = describe_weights(ck.config_);

  std::string quant_source = dir + "/config.json: quantization_config";
  if (file_exists(dir + "/hf_quant_config.json")) {
    // ModelOpt's legacy file: read when config.json has no quantization_config,
    // and checked against it when both say what the checkpoint is.
    const std::string hf_path = dir + "/hf_quant_config.json";
    MUSE_ASSIGN_OR_RETURN(std::string text, read_file(hf_path));
    auto j = Json::parse(text);
    if (!j.ok()) return make_error(hf_path + ": " + j.message());
    auto converted = modelopt_quant_config(*j);
    if (!converted.ok()) return make_error(hf_path + ": " + converted.message());
    const Json& qc = ck.config_.quantization_config;
    if (qc.is_null()) {
      ck.config_.quantization_config = *converted;
      quant_source = hf_path;
    } else {
      const std::string method = qc.is_object() ? qc.get_string("quant_method", "") : "";
      std::string a = qc.is_object() ? qc.get_string("quant_algo", "") : "", b = converted->get_string("quant_algo", "");
      for (std::string* t : {&a, &b})
        for (char& c : *t) c = char(std::toupper(static_cast<unsigned char>(c)));
      if (method != "modelopt" || a != b)
        return make_error(dir + ": config.json's quantization_config (quant_method \"" + method + "\"" +
                          (a.empty() ? "" : ", quant_algo \"" + a + "\"") + ") and hf_quant_config.json (modelopt " +
                          b + ") disagree about the checkpoint's format; remove the stale one");
    }
  }
  auto quant = describe_quantization(ck.config_.quantization_config);
  if (!quant.ok()) return make_error(quant_source + ": " + quant.message());
  for (const std::string& p : quant->excluded)
    if (p.rfind("re:", 0) == 0) {
      try {
        std::regex check(p.substr(3));
      } catch (const std::regex_error& e) {
        return make_error(quant_source + ": exclusion \"" + p + "\" is not a valid regular expression (" + e.what() + ")");
      }
    }
  if (quant->scheme == QuantScheme::Unknown)
    return make_error(quant_source + ": quant_method \"" + quant->method +
                      "\" is not a format muse reads (NVFP4: modelopt, compressed-tensors nvfp4-pack-quantized; MXFP4: "
                      "quark fp4, mxfp4, compressed-tensors mxfp4-pack-quantized; FP8: modelopt, compressed-tensors "
                      "float-quantized, quark fp8_e4m3, fp8, ptpc_fp8 (quantized at load); INT4: gptq, auto-round, "
                      "compressed-tensors pack-quantized)");
  Resolver r{ck.config_, ck.files_, *quant, {}, {}, {}};
  auto add_file = [&](const std::string& path) -> Result<size_t> {
    MUSE_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(path));
    ck.files_.push_back(std::make_unique<SafetensorsFile>(std::move(f)));
    return ck.files_.size() - 1;
  };

  const std::string index_path = dir + "/model.safetensors.index.json";
  if (file_exists(index_path)) {
    MUSE_ASSIGN_OR_RETURN(std::string text, read_file(index_path));
    MUSE_ASSIGN_OR_RETURN(ShardIndex index, parse_shard_index(text, index_path));
    std::unordered_map<std::string, size_t> file_ids;
    for (const std::string& name : index.files) {
      std::string path = dir + "/" + name;
      if (!file_exists(path))
        return make_error(index_path + " names shard " + name + ", which is not in " + dir +
                          " (incomplete download?)");
      MUSE_ASSIGN_OR_RETURN(size_t id, add_file(path));
      file_ids[name] = id;
    }
    for (const auto& [tensor, file] : index.weight_map) {
      size_t id = file_ids[file];
      const TensorInfo* info = ck.files_[id]->find(tensor);
      if (!info)
        return make_error(index_path + " places tensor " + tensor + " in " + file + ", but " + ck.files_[id]->path() +
                          " does not contain it (index and shards disagree)");
      r.tensors[tensor] = Located{id, info};
    }
    for (size_t id = 0; id < ck.files_.size(); ++id)
      for (const TensorInfo& t : ck.files_[id]->tensors()) {
        auto it = r.tensors.find(t.name);
        if (it == r.tensors.end() || it->second.file != id)
          return make_error(ck.files_[id]->path() + " contains tensor " + t.name + ", which " + index_path +
                            (it == r.tensors.end() ? " does not list" : " places in another shard") +
                            " (index and shards disagree)");
      }
  } else if (file_exists(dir + "/model.safetensors")) {
    MUSE_ASSIGN_OR_RETURN(size_t id, add_file(dir + "/model.safetensors"));
    for (const TensorInfo& t : ck.files_[id]->tensors()) r.tensors[t.name] = Located{id, &t};
  } else {
    return make_error(dir + " has neither model.safetensors nor model.safetensors.index.json");
  }

  ck.resolved_.resize(ck.weights_.size());
  for (size_t i = 0; i < ck.weights_.size(); ++i) {
    const WeightSpec& spec = ck.weights_[i];
    ck.by_key_[key_of(spec.slot, spec.layer)] = i;
    if (spec.slot == "lm_head" && ck.config_.tie_word_embeddings) {
      // Tied: an explicit lm_head tensor is used if present, else the embedding.
      bool present = false;
      for (const auto& c : candidate_names(*find_slot_rule("lm_head", ck.config_.family), -1)) present |= r.find(c) != nullptr;
      if (!present) {
        ResolvedWeight& out = ck.resolved_[i];
        out = ck.resolved_[ck.by_key_.at(key_of("embed_tokens", -1))];
        out.spec = spec;
        out.tied = true;
        continue;
      }
    }
    r.resolve(spec, ck.resolved_[i]);
  }

  // KV-cache scales: optional F32 scalars per layer, in any of the spellings.
  ck.kv_scales_.assign(size_t(ck.config_.num_layers), std::array<float, 2>{1.0f, 1.0f});
  for (int l = 0; l < int(ck.config_.num_layers); ++l) {
    std::string found[2];  // the tensor that gave K, V
    for (const KvScaleName& kn : kv_scale_names())
      for (const char* prefix : kTextPrefixes) {
        const std::string name = prefix + expand_name(kn.name, l);
        const Located* loc = r.find(name);
        if (!loc) continue;
        r.consumed.insert(name);
        const TensorView v = r.view(name, *loc);
        const bool float_dt = v.dtype == DType::F32 || v.dtype == DType::F16 || v.dtype == DType::BF16;
        float value = 0.0f;
        if (!float_dt || v.numel() != 1 || !convert_to_f32(v.dtype, v.data, 0, 1, &value).ok()) {
          r.problems.push_back("tensor " + name + " in " + v.file + " is " + std::string(dtype_name(v.dtype)) + " " +
                               shape_text(v.shape) + " but a KV-cache scale is one float value (per-head scales " +
                               "are not supported)");
          continue;
        }
        if (!std::isfinite(value) || value <= 0.0f) {
          r.problems.push_back("tensor " + name + " in " + v.file + " is a KV-cache scale of " + std::to_string(value) +
                               "; it must be finite and positive");
          continue;
        }
        for (int kv = 0; kv < 2; ++kv) {
          if (!(kv == 0 ? kn.k : kn.v)) continue;
          if (!found[kv].empty()) {
            r.problems.push_back("ambiguous checkpoint: both " + found[kv] + " and " + name + " give layer " +
                                 std::to_string(l) + "'s " + (kv == 0 ? "K" : "V") + "-cache scale");
            continue;
          }
          found[kv] = name;
          ck.kv_scales_[size_t(l)][size_t(kv)] = value;
        }
      }
  }

  // Strictness: everything in the checkpoint must have been used.
  std::vector<std::string> unconsumed;
  bool multimodal = false, quantized = false;
  std::vector<std::string> names;
  names.reserve(r.tensors.size());
  for (const auto& [name, l] : r.tensors) names.push_back(name);
  std::sort(names.begin(), names.end());
  for (const std::string& name : names) {
    if (r.consumed.count(name)) continue;
    if (matches_any(options.ignore_patterns, name) || (options.language_model_only && is_multimodal_tensor(name))) {
      ck.skipped_.push_back(name);
      continue;
    }
    multimodal |= is_multimodal_tensor(name);
    quantized |= looks_quantized_tensor(name);
    unconsumed.push_back(name);
  }
  if (!unconsumed.empty()) {
    std::string msg = std::to_string(unconsumed.size()) + " tensor" + (unconsumed.size() == 1 ? " is" : "s are") +
                      " in the checkpoint but not used by the " + ck.config_.model_type + " text decoder: ";
    for (size_t i = 0; i < std::min<size_t>(unconsumed.size(), 8); ++i)
      msg += (i ? ", " : "") + unconsumed[i] + " (" + ck.files_[r.tensors[unconsumed[i]].file]->path() + ")";
    if (unconsumed.size() > 8) msg += ", ...";
    if (multimodal) msg += "; vision/audio tensors can be skipped with --language-model-only";
    if (quantized)
      msg += quant->scheme == QuantScheme::None
                 ? "; scale/packed tensors mean a quantized checkpoint, but config.json has no quantization_config"
                 : "; these look like quantization tensors that the " + std::string(quant_scheme_name(quant->scheme)) +
                       " layout does not name for any slot";
    msg += "; a checkpoint that does not match the config is refused rather than half-loaded (ignore extra "
           "tensors explicitly with an ignore pattern)";
    r.problems.push_back(msg);
  }
  if (!r.problems.empty()) return make_error(join_problems(dir, r.problems));
  return ck;
}

const ResolvedWeight* Checkpoint::find(std::string_view slot, int layer) const {
  auto it = by_key_.find(key_of(slot, layer));
  return it == by_key_.end() ? nullptr : &resolved_[it->second];
}

Result<const ResolvedWeight*> Checkpoint::lookup(std::string_view slot, int layer) const {
  const ResolvedWeight* w = find(slot, layer);
  if (!w)
    return make_error("no weight slot " + std::string(slot) + (layer >= 0 ? " in layer " + std::to_string(layer) : "") +
                      " in this " + config_.model_type + " model");
  return w;
}

Result<TensorView> Checkpoint::tensor(std::string_view slot, int layer) const {
  MUSE_ASSIGN_OR_RETURN(const ResolvedWeight* w, lookup(slot, layer));
  if (w->per_expert)
    return make_error(slot_text(w->spec) + " is stored one expert at a time in this checkpoint; use expert_pieces()");
  return w->tensor;
}

Result<std::vector<TensorView>> Checkpoint::expert_pieces(std::string_view slot, int layer, int expert) const {
  MUSE_ASSIGN_OR_RETURN(const ResolvedWeight* w, lookup(slot, layer));
  if (w->spec.shape.size() != 3) return make_error(slot_text(w->spec) + " is not a fused expert tensor");
  if (expert < 0 || expert >= w->spec.shape[0])
    return make_error("expert " + std::to_string(expert) + " out of range for " + slot_text(w->spec));
  if (w->per_expert) return w->experts[size_t(expert)];
  const TensorView& t = w->tensor;
  TensorView v;
  v.name = t.name + "[" + std::to_string(expert) + "]";
  v.file = t.file;
  v.dtype = t.dtype;
  v.shape = {t.shape[1], t.shape[2]};
  v.nbytes = t.nbytes / size_t(t.shape[0]);
  v.data = t.data + size_t(expert) * v.nbytes;
  return std::vector<TensorView>{v};
}

Status Checkpoint::read_f32(std::string_view slot, int layer, float* dst) const {
  MUSE_ASSIGN_OR_RETURN(const ResolvedWeight* w, lookup(slot, layer));
  if (w->quantized() && w->per_expert) return decode_per_expert(*w, 0, w->spec.shape[0], dst);
  if (w->quantized()) return decode_quantized(*w, 0, w->spec.shape.size() == 3 ? w->spec.shape[0] : 1, dst);
  if (!w->per_expert) return muse::read_f32(w->tensor, dst);
  for (const auto& pieces : w->experts)
    for (const TensorView& v : pieces) {
      MUSE_RETURN_IF_ERROR(muse::read_f32(v, dst));
      dst += v.numel();
    }
  return Status::Ok();
}

Status Checkpoint::read_bf16(std::string_view slot, int layer, uint16_t* dst) const {
  MUSE_ASSIGN_OR_RETURN(const ResolvedWeight* w, lookup(slot, layer));
  if (w->quantized()) {
    std::vector<float> tmp(static_cast<size_t>(w->spec.numel()));
    MUSE_RETURN_IF_ERROR(read_f32(slot, layer, tmp.data()));
    return convert_to_bf16_parallel(DType::F32, reinterpret_cast<const uint8_t*>(tmp.data()), w->spec.numel(), dst);
  }
  if (!w->per_expert) return muse::read_bf16(w->tensor, dst);
  for (const auto& pieces : w->experts)
    for (const TensorView& v : pieces) {
      MUSE_RETURN_IF_ERROR(muse::read_bf16(v, dst));
      dst += v.numel();
    }
  return Status::Ok();
}

Status Checkpoint::read_expert_f32(std::string_view slot, int layer, int expert, float* dst) const {
  MUSE_ASSIGN_OR_RETURN(std::vector<TensorView> pieces, expert_pieces(slot, layer, expert));
  const ResolvedWeight* w = find(slot, layer);
  if (w->quantized() && w->per_expert) return decode_per_expert(*w, expert, expert + 1, dst);
  if (w->quantized()) return decode_quantized(*w, expert, expert + 1, dst);
  for (const TensorView& v : pieces) {
    MUSE_RETURN_IF_ERROR(muse::read_f32(v, dst));
    dst += v.numel();
  }
  return Status::Ok();
}

uint64_t Checkpoint::tensor_bytes() const {
  uint64_t n = 0;
  for (const ResolvedWeight& w : resolved_) {
    if (w.tied) continue;
    n += w.tensor.nbytes + w.quant.scales.nbytes + w.quant.zeros.nbytes + w.quant.global_scale.nbytes +
         w.quant.input_scale.nbytes;
    for (const auto& pieces : w.experts)
      for (const TensorView& v : pieces) n += v.nbytes;
    for (const auto& pieces : w.expert_quant)
      for (const ResolvedWeight::Quantized& q : pieces)
        n += q.scales.nbytes + q.zeros.nbytes + q.global_scale.nbytes + q.input_scale.nbytes;
  }
  return n;
}

}  // namespace muse
