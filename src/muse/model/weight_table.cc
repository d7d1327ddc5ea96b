#include "muse/model/weight_table.h"

namespace muse {

const char* weight_part_name(WeightPart part) {
  switch (part) {
    case WeightPart::Embeddings: return "embeddings";
    case WeightPart::Head: return "head";
    case WeightPart::Attention: return "attention";
    case WeightPart::Norms: return "norms";
    case WeightPart::ResidualGates: return "residual_gates";
    case WeightPart::Router: return "router";
    case WeightPart::Latent: return "latent";
    case WeightPart::Experts: return "experts";
    case WeightPart::DenseMlp: return "dense_mlp";
  }
  return "unknown";
}

std::vector<WeightSpec> describe_weights(const ModelConfig& c) {
  std::vector<WeightSpec> w;
  const int64_t H = c.hidden_size, V = c.vocab_size, Q = c.q_dim(), KV = c.kv_dim();
  auto add = [&](const char* slot, int layer, std::vector<int64_t> shape, WeightPart part,
                 DType dtype = DType::BF16) {
    w.push_back(WeightSpec{slot, layer, std::move(shape), part, dtype});
  };

  add("embed_tokens", -1, {V, H}, WeightPart::Embeddings);
  for (int64_t i = 0; i < c.num_layers; ++i) {
    const int L = int(i);
    add("attn.q", L, {Q, H}, WeightPart::Attention);
    add("attn.k", L, {KV, H}, WeightPart::Attention);
    add("attn.v", L, {KV, H}, WeightPart::Attention);
    add("attn.gate", L, {Q, H}, WeightPart::Attention);
    add("attn.o", L, {H, Q}, WeightPart::Attention);
    add("norm.input", L, {H}, WeightPart::Norms);
    if (!c.is_spark()) add("norm.post_attn", L, {H}, WeightPart::Norms);
    add("norm.pre_ffn", L, {H}, WeightPart::Norms);
    add("norm.post_ffn", L, {H}, WeightPart::Norms);
    if (c.is_spark()) {
      add("resid_gate.attn", L, {H}, WeightPart::ResidualGates);
      add("resid_gate.ffn", L, {H}, WeightPart::ResidualGates);
    }
    if (c.is_sparse(i)) {
      const int64_t E = c.num_experts, Hm = c.moe_hidden_size, I = c.moe_intermediate_size;
      add("moe.router", L, {E, H}, WeightPart::Router, DType::F32);
      add("moe.router_bias", L, {E}, WeightPart::Router, DType::F32);
      add("moe.pre_expert_proj", L, {Hm, H}, WeightPart::Latent);
      add("moe.pre_expert_norm", L, {Hm}, WeightPart::Norms);
      add("moe.experts.gate_up", L, {E, 2 * I, Hm}, WeightPart::Experts);
      add("moe.experts.down", L, {E, Hm, I}, WeightPart::Experts);
      add("moe.post_expert_norm", L, {Hm}, WeightPart::Norms);
      add("moe.post_expert_proj", L, {H, Hm}, WeightPart::Latent);
    } else {
      const int64_t I = c.intermediate_size;
      add("mlp.gate", L, {I, H}, WeightPart::DenseMlp);
      add("mlp.up", L, {I, H}, WeightPart::DenseMlp);
      add("mlp.down", L, {H, I}, WeightPart::DenseMlp);
    }
  }
  add("final_norm", -1, {H}, WeightPart::Norms);
  add("lm_head", -1, {V, H}, WeightPart::Head);
  return w;
}

int64_t count_parameters(const std::vector<WeightSpec>& weights) {
  int64_t n = 0;
  for (const auto& w : weights) n += w.numel();
  return n;
}

bool quantizable_slot(QuantKind kind, const WeightSpec& w) {
  if (w.reference_dtype != DType::BF16 || w.shape.size() < 2) return false;  // routers, norms, gates
  if (w.part == WeightPart::Embeddings || w.part == WeightPart::Head) return false;
  switch (kind) {
    case QuantKind::None: return false;
    case QuantKind::Nvfp4:
    case QuantKind::Mxfp4: return w.part == WeightPart::Experts;
    case QuantKind::Fp8:
      return w.part == WeightPart::Experts || w.part == WeightPart::Attention || w.part == WeightPart::Latent ||
             w.part == WeightPart::DenseMlp;
    case QuantKind::Int4:
      return w.part == WeightPart::Experts || w.part == WeightPart::DenseMlp ||
             (w.part == WeightPart::Attention && w.slot != "attn.gate");
  }
  return false;
}

bool quantized_at_load(QuantKind kind, const WeightSpec& w, int64_t num_layers) {
  if (!quantizable_slot(kind, w)) return false;
  if (kind == QuantKind::Nvfp4 && w.part == WeightPart::Experts && (w.layer == 0 || w.layer == num_layers - 1))
    return false;
  return true;
}

Result<QuantKind> parse_quant_kind(const std::string& name) {
  for (QuantKind k : {QuantKind::Nvfp4, QuantKind::Mxfp4, QuantKind::Fp8, QuantKind::Int4})
    if (name == quant_kind_name(k)) return k;
  return make_error("unknown quantization '" + name + "' (valid: nvfp4, mxfp4, fp8, int4)");
}

}  // namespace muse
