#include "muse/model/weights.h"

#include <algorithm>
#include <cmath>

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

}  // namespace

Result<ModelWeights> upload_weights(Backend& backend, const ModelConfig& config, const WeightSource& source) {
  ModelWeights w;
  w.layers.resize(size_t(config.num_layers));
  auto fail = [&](const WeightSpec& spec, const std::string& why) -> Error {
    release_weights(backend, w);
    return make_error("weight " + slot_name(spec) + ": " + why);
  };
  std::vector<float> buf, alpha;
  std::vector<uint16_t> bf16_buf;
  for (const WeightSpec& spec : describe_weights(config)) {
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

DecodeTraffic decode_traffic(const ModelConfig& config, const ModelWeights& w) {
  DecodeTraffic d;
  auto add = [&](uint64_t& into, const Tensor& t) {
    if (t.empty()) return;
    into += t.bytes();
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
      d.expert_bytes += uint64_t(double(lw.experts_gate_up.bytes() + lw.experts_down.bytes()) * frac);
      d.flops += 2.0 * double(lw.experts_gate_up.numel() + lw.experts_down.numel()) * frac;
    }
  }
  add(d.head_bytes, w.lm_head);
  d.head_bytes += uint64_t(w.embed.cols()) * w.embed.element_bytes() + w.final_norm.bytes();
  return d;
}

}  // namespace muse
