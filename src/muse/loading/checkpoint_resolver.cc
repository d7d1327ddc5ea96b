#include "muse/loading/checkpoint_resolver.h"

#include <fnmatch.h>

#include <cctype>
#include <cmath>
#include <cstring>

#include <algorithm>
#include <optional>

#include "muse/loading/convert.h"

namespace muse::checkpoint_detail {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

std::string slot_text(const WeightSpec& spec) {
  return "slot " + spec.slot + (spec.layer >= 0 ? " of layer " + std::to_string(spec.layer) : std::string());
}

Result<std::vector<Exclusion>> compile_exclusions(const std::vector<std::string>& patterns) {
  std::vector<Exclusion> out;
  for (const std::string& p : patterns) {
    Exclusion e{p, std::nullopt};
    if (p.rfind("re:", 0) == 0) {
      MUSE_ASSIGN_OR_RETURN(ModuleRegex re, ModuleRegex::compile(std::string_view(p).substr(3)));
      e.re = std::move(re);
    }
    out.push_back(std::move(e));
  }
  return out;
}

bool module_excluded(const Exclusion& e, const std::string& base) {
  if (e.re) return e.re->matches(base);
  const std::string& p = e.pattern;
  if (fnmatch(p.c_str(), base.c_str(), 0) == 0 || fnmatch((p + ".*").c_str(), base.c_str(), 0) == 0) return true;
  if (p.empty() || p.find_first_of("*?[") != std::string::npos) return false;
  const std::string d = "." + base + ".";
  return d.find("." + p + ".") != std::string::npos;
}

bool Resolver::is_codes(DType d) const {
  switch (kind()) {
    case QuantKind::Nvfp4:
    case QuantKind::Mxfp4: return d == DType::U8 || d == DType::F4;  // packed bytes, or F4 of the logical shape
    case QuantKind::Fp8: return d == DType::F8_E4M3;
    case QuantKind::Int4: return d == DType::I32;
    case QuantKind::None: return false;
  }
  return false;
}

TensorView Resolver::view(const std::string& name, const Located& l) const {
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

std::string Resolver::quant_hint(DType dtype) const {
  if (dtype == DType::F32 || dtype == DType::F16 || dtype == DType::BF16) return "";
  if (info.scheme != QuantScheme::None)
    return "; in a " + std::string(quant_scheme_name(info.scheme)) + " checkpoint this slot's codes are " +
           (kind() == QuantKind::Fp8 ? "F8_E4M3" : kind() == QuantKind::Int4 ? "I32 (qweight)" : "U8") +
           "";
  return "; a quantized tensor, but config.json has no quantization_config";
}

bool Resolver::check(const TensorView& v, const WeightSpec& spec, const SlotRule& rule, const std::vector<int64_t>& want) {
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

void Resolver::missing(const WeightSpec& spec, const SlotRule& rule, const std::vector<std::string>& candidates) {
  std::string msg = "missing tensor " + (candidates.empty() ? spec.slot : candidates[0]) + " " +
                    shape_text(spec.shape) + " for " + slot_text(spec);
  if (candidates.size() > 1) msg += " (" + std::to_string(candidates.size() - 1) + " other spellings tried, none present)";
  if (spec.slot == "lm_head") msg += "; config.json has tie_word_embeddings = false";
  problems.push_back(msg);
}

const Located* Resolver::need(const ResolvedWeight& out, const std::string& name, const char* what) {
  const Located* l = find(name);
  if (!l)
    problems.push_back("tensor " + out.tensor.name + " in " + out.tensor.file + " is " +
                       std::string(dtype_name(out.tensor.dtype)) + " (" + kind_upper() + " " + what +
                       ") but " + name + " is missing");
  return l;
}

Resolver::Naming Resolver::naming_of(const std::string& name) {
  Naming nm;
  for (const char* s : {".weight_packed", ".qweight", ".weight"})
    if (strip(name, s, &nm.base)) return nm;
  nm.module = false;
  for (const char* s : {"_blocks", "_qweight"})
    if (strip(name, s, &nm.base)) return nm;
  nm.base = name;
  return nm;
}

void Resolver::check_not_excluded(const WeightSpec& spec, const Naming& nm, const ResolvedWeight& out) {
  for (const Exclusion& e : exclusions) {
    const std::string& p = e.pattern;
    if (module_excluded(e, nm.base)) {
      problems.push_back("tensor " + out.tensor.name + " in " + out.tensor.file + " is stored quantized but "
                         "quantization_config excludes " + nm.base + " (pattern \"" + p + "\"); the checkpoint "
                         "and its config disagree");
      return;
    }
  }
}

void Resolver::resolve_quant(const WeightSpec& spec, const SlotRule& rule, ResolvedWeight& out) {
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

void Resolver::resolve_nvfp4(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out) {
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

void Resolver::resolve_mxfp4(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out) {
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

void Resolver::resolve_fp8(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out) {
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

void Resolver::resolve_ct_int4(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out, int64_t G) {
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

void Resolver::resolve_int4(const WeightSpec& spec, const SlotRule& rule, const Naming& nm, ResolvedWeight& out) {
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

const Located* Resolver::find_piece(const std::string& name, std::string* found) const {
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

bool Resolver::resolve_per_expert(const WeightSpec& spec, const SlotRule& rule, ResolvedWeight& out) {
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

void Resolver::resolve(const WeightSpec& spec, ResolvedWeight& out) {
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

std::vector<std::array<float, 2>> Resolver::resolve_kv_scales() {
  std::vector<std::array<float, 2>> scales(size_t(config.num_layers), std::array<float, 2>{1.0f, 1.0f});
  for (int l = 0; l < int(config.num_layers); ++l) {
    std::string found[2];  // the tensor that gave K, V
    for (const KvScaleName& kn : kv_scale_names())
      for (const char* prefix : kTextPrefixes) {
        const std::string name = prefix + expand_name(kn.name, l);
        const Located* loc = find(name);
        if (!loc) continue;
        consumed.insert(name);
        const TensorView v = view(name, *loc);
        const bool float_dt = v.dtype == DType::F32 || v.dtype == DType::F16 || v.dtype == DType::BF16;
        float value = 0.0f;
        if (!float_dt || v.numel() != 1 || !convert_to_f32(v.dtype, v.data, 0, 1, &value).ok()) {
          problems.push_back("tensor " + name + " in " + v.file + " is " + std::string(dtype_name(v.dtype)) + " " +
                               shape_text(v.shape) + " but a KV-cache scale is one float value (per-head scales " +
                               "are not supported)");
          continue;
        }
        if (!std::isfinite(value) || value <= 0.0f) {
          problems.push_back("tensor " + name + " in " + v.file + " is a KV-cache scale of " + std::to_string(value) +
                               "; it must be finite and positive");
          continue;
        }
        for (int kv = 0; kv < 2; ++kv) {
          if (!(kv == 0 ? kn.k : kn.v)) continue;
          if (!found[kv].empty()) {
            problems.push_back("ambiguous checkpoint: both " + found[kv] + " and " + name + " give layer " +
                                 std::to_string(l) + "'s " + (kv == 0 ? "K" : "V") + "-cache scale");
            continue;
          }
          found[kv] = name;
          scales[size_t(l)][size_t(kv)] = value;
        }
      }
  }
  return scales;
}

}  // namespace muse::checkpoint_detail
