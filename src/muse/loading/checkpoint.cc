#include "muse/loading/checkpoint.h"

#include <fnmatch.h>

#include <cstring>

#include <algorithm>
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

// Everything the resolver needs while it runs.
struct Resolver {
  const ModelConfig& config;
  const std::vector<std::unique_ptr<SafetensorsFile>>& files;
  QuantScheme scheme = QuantScheme::None;  // from config.json quantization_config
  std::unordered_map<std::string, Located> tensors;
  std::unordered_set<std::string> consumed;
  std::vector<std::string> problems;

  bool nvfp4() const {
    return scheme == QuantScheme::ModelOptNvfp4 || scheme == QuantScheme::CompressedTensorsNvfp4;
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
    std::string method = config.quantization_config.get_string("quant_method", "");
    if (!method.empty())
      return "; this is a quantized checkpoint (quant_method \"" + method + "\"), which muse cannot load yet";
    return "";
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

  // An NVFP4 slot: packed codes plus their scale tensors, named by the
  // format's suffix rules (ModelOpt: ".weight_scale" on a module, "_weight_scale"
  // on a 3-D parameter; compressed-tensors: ".weight_packed" / ".weight_global_scale").
  void resolve_nvfp4(const WeightSpec& spec, const SlotRule& rule, ResolvedWeight& out) {
    const std::string& name = out.tensor.name;
    const bool ct = scheme == QuantScheme::CompressedTensorsNvfp4;
    std::string scale, global, input;
    auto strip = [&](const char* suffix, std::string* base) {
      size_t n = std::strlen(suffix);
      if (name.size() < n || name.compare(name.size() - n, n, suffix) != 0) return false;
      *base = name.substr(0, name.size() - n);
      return true;
    };
    std::string base;
    if (ct && strip(".weight_packed", &base)) {
      scale = base + ".weight_scale", global = base + ".weight_global_scale", input = base + ".input_global_scale";
    } else if (!ct && strip(".weight", &base)) {
      scale = base + ".weight_scale", global = base + ".weight_scale_2", input = base + ".input_scale";
    } else if (!ct) {
      scale = name + "_weight_scale", global = name + "_weight_scale_2", input = name + "_input_scale";
    } else {
      problems.push_back("tensor " + name + " in " + out.tensor.file + " is U8 but is not a compressed-tensors NVFP4 "
                         "weight_packed tensor");
      return;
    }
    const int64_t cols = spec.shape.back();
    if (cols % 16 != 0) {
      problems.push_back(slot_text(spec) + " has " + std::to_string(cols) + " inputs, not a multiple of 16 as NVFP4 needs");
      return;
    }
    std::vector<int64_t> packed_shape = spec.shape, scale_shape = spec.shape;
    packed_shape.back() = cols / 2;
    scale_shape.back() = cols / 16;
    const Located* ls = find(scale);
    const Located* lg = find(global);
    if (!ls || !lg) {
      problems.push_back("tensor " + name + " in " + out.tensor.file + " is U8 (NVFP4 codes) but " +
                         (!ls ? scale : global) + " is missing");
      return;
    }
    out.quant.scheme = scheme;
    out.quant.block_scale = view(scale, *ls);
    out.quant.global_scale = view(global, *lg);
    consumed.insert(scale);
    consumed.insert(global);
    if (const Located* li = find(input)) {
      out.quant.input_scale = view(input, *li);  // only W4A4 (Blackwell) uses it
      consumed.insert(input);
    }
    auto fail = [&](const TensorView& v, const std::string& want) {
      problems.push_back("tensor " + v.name + " in " + v.file + " is " + std::string(dtype_name(v.dtype)) + " " +
                         shape_text(v.shape) + " but NVFP4 " + slot_text(spec) + " (" + rule.shape_doc + ") expects " + want);
    };
    if (out.tensor.shape != packed_shape) fail(out.tensor, "U8 " + shape_text(packed_shape));
    const TensorView& bs = out.quant.block_scale;
    if ((bs.dtype != DType::F8_E4M3 && bs.dtype != DType::U8) || bs.shape != scale_shape)
      fail(bs, "F8_E4M3 " + shape_text(scale_shape));
    const TensorView& gs = out.quant.global_scale;
    bool global_ok = gs.dtype == DType::F32;
    if (spec.shape.size() == 3) {
      const int64_t E = spec.shape[0];
      global_ok = global_ok && (gs.shape == std::vector<int64_t>{E} || gs.shape == std::vector<int64_t>{E, 1} ||
                                (gs.shape == std::vector<int64_t>{E, 2} && spec.shape[1] % 2 == 0));
      if (!global_ok) fail(gs, "F32 [" + std::to_string(E) + "], [" + std::to_string(E) + ", 1] or [" + std::to_string(E) + ", 2]");
    } else {
      global_ok = global_ok && gs.numel() == 1;
      if (!global_ok) fail(gs, "one F32 value");
    }
  }

  // Per-expert 2-D alias path: every expert's pieces under one prefix.
  bool resolve_per_expert(const WeightSpec& spec, const SlotRule& rule, ResolvedWeight& out) {
    const int64_t E = spec.shape[0];
    const int64_t pieces = int64_t(rule.per_expert.size());
    const std::vector<int64_t> piece_shape = {spec.shape[1] / pieces, spec.shape[2]};
    const char* prefix = nullptr;
    for (const char* p : kTextPrefixes)
      if (find(p + expand_name(rule.per_expert[0], spec.layer, 0))) {
        prefix = p;
        break;
      }
    if (!prefix) return false;
    out.per_expert = true;
    out.experts.assign(size_t(E), {});
    bool ok = true;
    for (int64_t e = 0; e < E; ++e) {
      for (const char* pattern : rule.per_expert) {
        std::string name = prefix + expand_name(pattern, spec.layer, int(e));
        const Located* l = find(name);
        if (!l) {
          problems.push_back("missing tensor " + name + " " + shape_text(piece_shape) + " for expert " +
                             std::to_string(e) + " of " + slot_text(spec) +
                             " (the checkpoint stores experts one by one, so all " + std::to_string(E) +
                             " must be present)");
          return true;
        }
        TensorView v = view(name, *l);
        consumed.insert(name);
        ok = check(v, spec, rule, piece_shape) && ok;
        out.experts[size_t(e)].push_back(std::move(v));
      }
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
    if (scheme == QuantScheme::CompressedTensorsNvfp4) {
      // compressed-tensors renames a quantized module's weight to weight_packed.
      const size_t n = candidates.size();
      for (size_t i = 0; i < n; ++i)
        if (candidates[i].size() > 7 && candidates[i].compare(candidates[i].size() - 7, 7, ".weight") == 0)
          candidates.push_back(candidates[i] + "_packed");
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
      if (nvfp4() && out.tensor.dtype == DType::U8) {
        resolve_nvfp4(spec, *rule, out);
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

float global_value(const ResolvedWeight& w, int64_t index) {
  float g;
  std::memcpy(&g, w.quant.global_scale.data + 4 * index, 4);
  // compressed-tensors stores the reciprocal of ModelOpt's weight_scale_2.
  return w.quant.scheme == QuantScheme::CompressedTensorsNvfp4 ? 1.0f / g : g;
}

// Dequantizes an NVFP4 slot: the whole 2-D matrix, or experts [begin, end) of
// a fused 3-D one (each half with its own global scale where there are two).
Status decode_quantized(const ResolvedWeight& w, int64_t begin, int64_t end, float* dst) {
  const TensorView& p = w.tensor;
  const TensorView& s = w.quant.block_scale;
  const int64_t cols = w.spec.shape.back();
  if (w.spec.shape.size() != 3) {
    const int64_t rows = w.spec.numel() / cols;
    return decode_nvfp4({p.data, p.nbytes, p.dtype}, {s.data, s.nbytes, s.dtype}, global_value(w, 0), rows, cols, dst);
  }
  const int64_t E = w.spec.shape[0], R = w.spec.shape[1];
  const int64_t halves = w.quant.global_scale.numel() / E;
  const int64_t rows = R / halves;
  for (int64_t e = begin; e < end; ++e)
    for (int64_t h = 0; h < halves; ++h) {
      const int64_t row0 = e * R + h * rows;
      QuantInput packed{p.data + row0 * cols / 2, size_t(rows * cols / 2), p.dtype};
      QuantInput scales{s.data + row0 * cols / 16, size_t(rows * cols / 16), s.dtype};
      MUSE_RETURN_IF_ERROR(decode_nvfp4(packed, scales, global_value(w, e * halves + h), rows, cols,
                                        dst + ((e - begin) * R + h * rows) * cols));
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

  auto quant = describe_quantization(ck.config_.quantization_config);
  if (!quant.ok()) return make_error(dir + "/config.json: quantization_config: " + quant.message());
  Resolver r{ck.config_, ck.files_, quant->scheme, {}, {}, {}};
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
    if (quantized) msg += "; scale/packed tensors mean a quantized checkpoint, which muse cannot load yet";
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
    n += w.tensor.nbytes + w.quant.block_scale.nbytes + w.quant.global_scale.nbytes + w.quant.input_scale.nbytes;
    for (const auto& pieces : w.experts)
      for (const TensorView& v : pieces) n += v.nbytes;
  }
  return n;
}

}  // namespace muse
