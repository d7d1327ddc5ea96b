#include "muse/loading/checkpoint.h"

#include <fnmatch.h>

#include <cctype>
#include <cstring>

#include <algorithm>

#include "muse/loading/checkpoint_resolver.h"
#include "muse/loading/convert.h"

namespace muse {

namespace {

using namespace checkpoint_detail;

std::string key_of(std::string_view slot, int layer) { return std::string(slot) + "#" + std::to_string(layer); }

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
  auto exclusions = compile_exclusions(quant->excluded);
  if (!exclusions.ok()) return make_error(quant_source + ": exclusion list: " + exclusions.message());
  if (quant->scheme == QuantScheme::Unknown)
    return make_error(quant_source + ": quant_method \"" + quant->method +
                      "\" is not a format muse reads (NVFP4: modelopt, compressed-tensors nvfp4-pack-quantized; MXFP4: "
                      "quark fp4, mxfp4, compressed-tensors mxfp4-pack-quantized; FP8: modelopt, compressed-tensors "
                      "float-quantized, quark fp8_e4m3, fp8, ptpc_fp8 (quantized at load); INT4: gptq, auto-round, "
                      "compressed-tensors pack-quantized)");
  Resolver r{ck.config_, ck.files_, *quant, std::move(*exclusions), {}, {}, {}};
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

  ck.kv_scales_ = r.resolve_kv_scales();

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
