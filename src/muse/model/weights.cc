#include "muse/model/weights.h"

#include <algorithm>
#include <cmath>

#include "muse/model/quantize.h"

namespace muse {
namespace {

enum class Kind {
  Matrix,      // F32/BF16 used as stored; other dtypes converted to F32
  F32,         // converted to F32 (router and its bias)
  Gain,        // absolute gain, F32
  OffsetGain,  // stored w, effective c = 1 + w, F32
  ResidualGate,
};

struct SlotBinding {
  const char* slot;
  Kind kind;
  Tensor LayerWeights::*field;   // per-layer slots
  Tensor LayerWeights::*field2;  // α for residual gates (field holds β)
};

const SlotBinding kLayerSlots[] = {
    {"attn.q", Kind::Matrix, &LayerWeights::q, nullptr},
    {"attn.k", Kind::Matrix, &LayerWeights::k, nullptr},
    {"attn.v", Kind::Matrix, &LayerWeights::v, nullptr},
    {"attn.gate", Kind::Matrix, &LayerWeights::gate, nullptr},
    {"attn.o", Kind::Matrix, &LayerWeights::o, nullptr},
    {"norm.input", Kind::OffsetGain, &LayerWeights::norm_input, nullptr},
    {"norm.post_attn", Kind::OffsetGain, &LayerWeights::norm_post_attn, nullptr},
    {"norm.pre_ffn", Kind::OffsetGain, &LayerWeights::norm_pre_ffn, nullptr},
    {"norm.post_ffn", Kind::OffsetGain, &LayerWeights::norm_post_ffn, nullptr},
    {"resid_gate.attn", Kind::ResidualGate, &LayerWeights::attn_beta, &LayerWeights::attn_alpha},
    {"resid_gate.ffn", Kind::ResidualGate, &LayerWeights::ffn_beta, &LayerWeights::ffn_alpha},
    {"mlp.gate", Kind::Matrix, &LayerWeights::mlp_gate, nullptr},
    {"mlp.up", Kind::Matrix, &LayerWeights::mlp_up, nullptr},
    {"mlp.down", Kind::Matrix, &LayerWeights::mlp_down, nullptr},
    {"moe.router", Kind::F32, &LayerWeights::router, nullptr},
    {"moe.router_bias", Kind::F32, &LayerWeights::router_bias, nullptr},
    {"moe.pre_expert_proj", Kind::Matrix, &LayerWeights::pre_expert_proj, nullptr},
    {"moe.pre_expert_norm", Kind::OffsetGain, &LayerWeights::pre_expert_norm, nullptr},
    {"moe.experts.gate_up", Kind::Matrix, &LayerWeights::experts_gate_up, nullptr},
    {"moe.experts.down", Kind::Matrix, &LayerWeights::experts_down, nullptr},
    {"moe.post_expert_norm", Kind::OffsetGain, &LayerWeights::post_expert_norm, nullptr},
    {"moe.post_expert_proj", Kind::Matrix, &LayerWeights::post_expert_proj, nullptr},
};

const SlotBinding* find_binding(const std::string& slot) {
  for (const auto& b : kLayerSlots)
    if (slot == b.slot) return &b;
  return nullptr;
}

Result<Tensor> import(Backend& backend, DType dtype, const std::vector<int64_t>& shape, const void* data,
                      bool host_outlives) {
  switch (shape.size()) {
    case 1: return backend.import_weight(dtype, {shape[0]}, data, host_outlives);
    case 2: return backend.import_weight(dtype, {shape[0], shape[1]}, data, host_outlives);
    case 3: return backend.import_weight(dtype, {shape[0], shape[1], shape[2]}, data, host_outlives);
    default: return make_error("weights of rank " + std::to_string(shape.size()) + " are not supported");
  }
}

std::string slot_name(const WeightSpec& spec) {
  return spec.layer >= 0 ? spec.slot + " (layer " + std::to_string(spec.layer) + ")" : spec.slot;
}

// What the CPU kernels (and any backend's) assume of a quantized layout.
Status check_quant_layout(const WeightSpec& spec, const HostQuantView& v) {
  const QuantFormat& f = v.format;
  const int64_t K = spec.shape.back(), N = spec.shape[spec.shape.size() - 2];
  auto bad = [&](const std::string& why) {
    return make_error(std::string(quant_kind_name(f.kind)) + " weight " + std::to_string(N) + "x" + std::to_string(K) +
                      ": " + why);
  };
  const int bits = dtype_bits(v.code_dtype);
  if (v.codes_bytes * 8 != size_t(spec.numel()) * size_t(bits)) return bad("codes hold " + std::to_string(v.codes_bytes) + " bytes");
  if (f.block_rows < 1 || f.block_cols < 1) return bad("scale block is empty");
  switch (f.kind) {
    case QuantKind::Nvfp4:
    case QuantKind::Mxfp4:
      if (v.code_dtype != DType::F4 || K % 16 || f.block_rows != 1 || f.block_cols % 16)
        return bad("4-bit float codes need in_features and the scale block a multiple of 16, one row per block");
      if (f.kind == QuantKind::Nvfp4 && (f.global_parts < 1 || f.global_parts > 2 || N % f.global_parts))
        return bad("NVFP4 needs one or two global scales per matrix");
      break;
    case QuantKind::Fp8:
      if (v.code_dtype != DType::F8_E4M3 || (f.block_cols % 16 && f.block_cols < K) || f.scale_dtype != DType::F32)
        return bad("FP8 needs E4M3 codes, F32 scales and scale blocks of a multiple of 16 columns (or all of them)");
      break;
    case QuantKind::Int4:
      if (K % 8 || N % 8 || f.block_cols % 8 || (f.scale_dtype != DType::F16 && f.scale_dtype != DType::BF16))
        return bad("INT4 (GPTQ layout) needs in/out features and the group size multiples of 8 and F16/BF16 scales");
      break;
    case QuantKind::None: return bad("no format");
  }
  return Status::Ok();
}

Result<Tensor> import_bytes(Backend& b, DType dtype, const std::vector<int64_t>& shape, const void* data, size_t bytes,
                            bool host_outlives) {
  MUSE_ASSIGN_OR_RETURN(Tensor t, b.import_weight(DType::U8, {int64_t(bytes)}, data, host_outlives));
  t.dtype = dtype;
  t.rank = int(shape.size());
  t.shape = {};
  for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
  return t;
}

// Imports a quantized slot part by part, as stored, and ties the parts to
// the codes tensor through a QuantParts the weights own.
Result<Tensor> import_quant(Backend& b, const WeightSpec& spec, const HostQuantView& v, bool host_outlives,
                            ModelWeights& w) {
  if (!b.supports_quant(v.format.kind))
    return make_error("the " + b.name() + " backend does not run " + quant_kind_name(v.format.kind) +
                      " weights yet (quantized products are implemented on the CPU backend): use --device cpu, or "
                      "a BF16 checkpoint without --quantization");
  MUSE_RETURN_IF_ERROR(check_quant_layout(spec, v));
  auto parts = std::make_unique<QuantParts>();
  parts->format = v.format;
  MUSE_ASSIGN_OR_RETURN(Tensor codes, import_bytes(b, v.code_dtype, spec.shape, v.codes, v.codes_bytes, host_outlives));
  w.owned.push_back(codes);
  MUSE_ASSIGN_OR_RETURN(parts->scales,
                        import_bytes(b, v.format.scale_dtype, v.scale_shape, v.scales, v.scales_bytes, host_outlives));
  w.owned.push_back(parts->scales);
  if (v.zeros) {
    MUSE_ASSIGN_OR_RETURN(parts->zeros, import_bytes(b, DType::I32, v.zero_shape, v.zeros, v.zeros_bytes, host_outlives));
    w.owned.push_back(parts->zeros);
  }
  if (!v.global.empty()) {
    MUSE_ASSIGN_OR_RETURN(parts->global, b.import_weight(DType::F32, {int64_t(v.global.size())}, v.global.data(), false));
    w.owned.push_back(parts->global);
  }
  codes.quant = parts.get();
  w.quant.push_back(std::move(parts));
  return codes;
}

}  // namespace

HostQuantView quant_view(const HostQuantWeight& q) {
  HostQuantView v;
  v.format = q.format;
  v.code_dtype = q.code_dtype;
  v.codes = q.codes.data(), v.codes_bytes = q.codes.size();
  v.scales = q.scales.data(), v.scales_bytes = q.scales.size(), v.scale_shape = q.scale_shape;
  if (!q.zeros.empty()) v.zeros = q.zeros.data(), v.zeros_bytes = q.zeros.size(), v.zero_shape = q.zero_shape;
  v.global = q.global;
  return v;
}

Result<Tensor> import_quantized(Backend& backend, const std::vector<int64_t>& shape, const HostQuantView& view,
                                bool host_outlives, ModelWeights& owner) {
  WeightSpec spec;
  spec.shape = shape;
  if (shape.size() != 2 && shape.size() != 3) return make_error("quantized weights are [N, K] or [E, N, K]");
  return import_quant(backend, spec, view, host_outlives, owner);
}


Result<ModelWeights> upload_weights(Backend& backend, const ModelConfig& config, const WeightSource& source,
                                    const WeightLoadOptions& options) {
  ModelWeights w;
  w.layers.resize(size_t(config.num_layers));
  auto fail = [&](const WeightSpec& spec, const std::string& why) -> Error {
    release_weights(backend, w);
    return make_error("weight " + slot_name(spec) + ": " + why);
  };
  std::vector<float> buf, alpha;
  std::vector<uint16_t> bf16_buf;
  for (const WeightSpec& spec : shard_weights(config, options.shard)) {
    Kind kind = Kind::Matrix;
    Tensor* dst = nullptr;
    Tensor* dst2 = nullptr;
    if (spec.layer < 0) {
      if (spec.slot == "embed_tokens") dst = &w.embed;
      else if (spec.slot == "lm_head") dst = &w.lm_head;
      else if (spec.slot == "final_norm") dst = &w.final_norm, kind = Kind::Gain;
      else return fail(spec, "unknown global slot");
    } else {
      const SlotBinding* b = find_binding(spec.slot);
      if (!b) return fail(spec, "unknown layer slot");
      LayerWeights& lw = w.layers[size_t(spec.layer)];
      kind = b->kind;
      dst = &(lw.*(b->field));
      if (b->field2) dst2 = &(lw.*(b->field2));
    }

    if (kind == Kind::Matrix) {
      auto made = source.create_on(backend, spec, backend.matrix_dtype(DType::BF16));
      if (!made.ok()) return fail(spec, made.message());
      if (!made->empty()) {
        *dst = *made;
        w.owned.push_back(*made);
        // A quantized matrix made where it lives (the GPU benchmark's random
        // quantized experts): its parts become the weights' own, as
        // import_quant's do.
        if (made->quant) {
          if (!backend.supports_quant(made->quant->format.kind))
            return fail(spec, std::string("the backend does not run ") + quant_kind_name(made->quant->format.kind));
          auto parts = std::make_unique<QuantParts>(*made->quant);
          for (const Tensor* t : {&parts->scales, &parts->global, &parts->zeros})
            if (!t->empty()) w.owned.push_back(*t);
          dst->quant = parts.get();
          w.quant.push_back(std::move(parts));
        }
        continue;
      }
      auto qv = source.quantized(spec);
      if (!qv.ok()) return fail(spec, qv.message());
      if (qv->format.kind != QuantKind::None) {  // stored quantized: imported as stored
        auto t = import_quant(backend, spec, *qv, true, w);
        if (!t.ok()) return fail(spec, t.message());
        *dst = *t;
        continue;
      }
      if (options.quantize != QuantKind::None && quantized_at_load(options.quantize, spec, config.num_layers)) {
        buf.resize(size_t(spec.numel()));
        Status s = source.read_f32(spec, buf.data());
        if (!s.ok()) return fail(spec, s.message());
        auto q = quantize_weight(options.quantize, buf.data(), spec.shape, spec.slot == "moe.experts.gate_up" ? 2 : 1);
        if (!q.ok()) return fail(spec, "--quantization " + std::string(quant_kind_name(options.quantize)) + ": " + q.message());
        auto t = import_quant(backend, spec, quant_view(*q), false, w);
        if (!t.ok()) return fail(spec, t.message());
        *dst = *t;
        continue;
      }
      auto v = source.view(spec);
      if (!v.ok()) return fail(spec, v.message());
      const bool plain = v->data && (v->dtype == DType::F32 || v->dtype == DType::BF16);
      if (plain && v->shape != spec.shape) return fail(spec, "shape disagrees with the weight table");
      if (plain && backend.matrix_dtype(v->dtype) == v->dtype) {
        auto t = import(backend, v->dtype, spec.shape, v->data, true);
        if (!t.ok()) return fail(spec, t.message());
        *dst = *t;
        continue;
      }
      if (backend.matrix_dtype(plain ? v->dtype : DType::F32) == DType::BF16) {
        // Rounded to BF16 once, here (round to nearest even, as torch's cast).
        buf.resize(size_t(spec.numel()));
        Status s = source.read_f32(spec, buf.data());
        if (!s.ok()) return fail(spec, s.message());
        bf16_buf.resize(buf.size());
        for (size_t i = 0; i < buf.size(); ++i) bf16_buf[i] = f32_to_bf16(buf[i]);
        auto t = import(backend, DType::BF16, spec.shape, bf16_buf.data(), false);
        if (!t.ok()) return fail(spec, t.message());
        *dst = *t;
        w.owned.push_back(*t);
        continue;
      }
    }
    // Everything else goes through fp32 in host memory.
    buf.resize(size_t(spec.numel()));
    Status s = source.read_f32(spec, buf.data());
    if (!s.ok()) return fail(spec, s.message());
    const int64_t n = spec.numel();
    if (kind == Kind::OffsetGain) {
      for (int64_t i = 0; i < n; ++i) buf[size_t(i)] = 1.0f + buf[size_t(i)];
    } else if (kind == Kind::ResidualGate) {
      // u = g / T; β = σ(u); α = sqrt(max(σ(-u)·(1 + σ(u)), 1e-3)) (= sqrt(1 - β²), norm preserving).
      alpha.resize(size_t(n));
      for (int64_t i = 0; i < n; ++i) {
        double u = double(buf[size_t(i)]) / config.residual_gate_temperature;
        double sp = 1.0 / (1.0 + std::exp(-u)), sn = 1.0 / (1.0 + std::exp(u));
        buf[size_t(i)] = float(sp);
        alpha[size_t(i)] = float(std::sqrt(std::max(sn * (1.0 + sp), 1e-3)));
      }
      auto a = import(backend, DType::F32, spec.shape, alpha.data(), false);
      if (!a.ok()) return fail(spec, a.message());
      *dst2 = *a;
      w.owned.push_back(*a);
    }
    auto t = import(backend, DType::F32, spec.shape, buf.data(), false);
    if (!t.ok()) return fail(spec, t.message());
    *dst = *t;
    w.owned.push_back(*t);
  }
  return w;
}

void release_weights(Backend& backend, ModelWeights& weights) {
  for (auto& t : weights.owned) backend.release(t);
  weights = ModelWeights{};
}

uint64_t ModelWeights::resident_bytes() const {
  uint64_t n = weight_bytes(embed) + weight_bytes(final_norm) + (lm_head.data == embed.data ? 0 : weight_bytes(lm_head));
  for (const LayerWeights& lw : layers)
    for (const Tensor* t : {&lw.q, &lw.k, &lw.v, &lw.gate, &lw.o, &lw.norm_input, &lw.norm_post_attn, &lw.norm_pre_ffn,
                            &lw.norm_post_ffn, &lw.attn_alpha, &lw.attn_beta, &lw.ffn_alpha, &lw.ffn_beta, &lw.mlp_gate,
                            &lw.mlp_up, &lw.mlp_down, &lw.router, &lw.router_bias, &lw.pre_expert_proj,
                            &lw.pre_expert_norm, &lw.experts_gate_up, &lw.experts_down, &lw.post_expert_norm,
                            &lw.post_expert_proj})
      n += weight_bytes(*t);
  return n;
}

DecodeTraffic decode_traffic(const ModelConfig& config, const ModelWeights& w) {
  DecodeTraffic d;
  auto add = [&](uint64_t& into, const Tensor& t) {
    if (t.empty()) return;
    into += weight_bytes(t);
    if (t.rank >= 2) d.flops += 2.0 * double(t.numel());
  };
  for (int64_t l = 0; l < config.num_layers; ++l) {
    const LayerWeights& lw = w.layers[size_t(l)];
    for (const Tensor* t : {&lw.q, &lw.k, &lw.v, &lw.gate, &lw.o, &lw.norm_input, &lw.norm_post_attn,
                            &lw.norm_pre_ffn, &lw.norm_post_ffn, &lw.attn_alpha, &lw.attn_beta, &lw.ffn_alpha,
                            &lw.ffn_beta, &lw.mlp_gate, &lw.mlp_up, &lw.mlp_down, &lw.router, &lw.router_bias,
                            &lw.pre_expert_proj, &lw.pre_expert_norm, &lw.post_expert_norm, &lw.post_expert_proj})
      add(d.dense_bytes, *t);
    if (!lw.experts_gate_up.empty()) {
      const int64_t E = lw.experts_gate_up.dim(0), k = config.num_experts_per_tok;
      const double frac = double(k) / double(E);
      d.expert_bytes += uint64_t(double(weight_bytes(lw.experts_gate_up) + weight_bytes(lw.experts_down)) * frac);
      d.flops += 2.0 * double(lw.experts_gate_up.numel() + lw.experts_down.numel()) * frac;
    }
  }
  const double flops_before_head = d.flops;
  add(d.head_bytes, w.lm_head);
  d.head_flops = d.flops - flops_before_head;
  d.head_bytes += uint64_t(w.embed.cols()) * w.embed.element_bytes() + weight_bytes(w.final_norm);
  return d;
}

}  // namespace muse
