// The weight table: every tensor the text decoder's forward pass needs, as
// canonical slots with logical shapes derived from the ModelConfig. The loader
// maps checkpoint names onto these slots (loading/name_map.h), the forward
// pass and `muse plan` read them; nothing else spells a tensor name.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "muse/backends/tensor.h"
#include "muse/core/dtype.h"
#include "muse/core/status.h"
#include "muse/model/config.h"

namespace muse {

enum class WeightPart { Embeddings, Head, Attention, Norms, ResidualGates, Router, Latent, Experts, DenseMlp };

struct WeightSpec {
  std::string slot;              // canonical name, e.g. "attn.q", "moe.experts.gate_up"
  int layer = -1;                // -1 for global slots
  std::vector<int64_t> shape;    // logical, [out, in] for matrices; [E, out, in] for fused experts
  WeightPart part = WeightPart::Attention;
  DType reference_dtype = DType::BF16;  // BF16, except F32 for the router and its bias

  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};

// Canonical slots (the names below are the contract with loader, model and plan):
//   global:        embed_tokens [V,H], final_norm [H], lm_head [V,H]
//   every layer:   attn.q [nh*hd,H], attn.k [kv*hd,H], attn.v [kv*hd,H], attn.gate [nh*hd,H],
//                  attn.o [H,nh*hd], norm.input [H], norm.pre_ffn [H], norm.post_ffn [H]
//   Glimmer:       norm.post_attn [H], mlp.gate [I,H], mlp.up [I,H], mlp.down [H,I]
//   Spark:         resid_gate.attn [H], resid_gate.ffn [H]; on sparse layers moe.router [E,H] F32,
//                  moe.router_bias [E] F32, moe.pre_expert_proj [Hm,H], moe.pre_expert_norm [Hm],
//                  moe.experts.gate_up [E,2I,Hm] (gate rows, then up rows), moe.experts.down [E,Hm,I],
//                  moe.post_expert_norm [Hm], moe.post_expert_proj [H,Hm]; on dense layers
//                  mlp.gate/up/down as Glimmer.
// With tie_word_embeddings, lm_head is still listed; the loader resolves it to
// the embedding tensor (same storage).
std::vector<WeightSpec> describe_weights(const ModelConfig& config);
const char* weight_part_name(WeightPart part);

// Which slots a format stores quantized, by part (checkpoint-formats.md
// "What the engine must do" 9 and §5.5): never the router, norms, gates or
// embeddings; NVFP4 and MXFP4 the routed experts; FP8 also attention, the
// latent projections and dense MLPs (8 bits); INT4 also attention but its
// output gate, and dense MLPs (the latent projections and attn.gate keep
// >= 8 bits). `muse plan` sizes with the same rule.
bool quantizable_slot(QuantKind kind, const WeightSpec& w);
// The slots `--quantization` quantizes while loading a BF16 checkpoint:
// quantizable_slot, except that NVFP4 keeps the experts of the first and
// last layer BF16 as the published NVFP4 release does (§5.5).
bool quantized_at_load(QuantKind kind, const WeightSpec& w, int64_t num_layers);
// "nvfp4" | "mxfp4" | "fp8" | "int4" (vLLM's --quantization names); errors list them.
Result<QuantKind> parse_quant_kind(const std::string& name);

// Sum of numel over a table (parameter count).
int64_t count_parameters(const std::vector<WeightSpec>& weights);

}  // namespace muse
