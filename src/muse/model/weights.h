// The model as a plain struct of backend tensors, one per weight slot of
// model/weight_table.h, filled from a WeightSource (a checkpoint, or random
// weights for tests and benchmarks). Transforms happen here, once:
// offset gains become effective gains c = 1 + w (fp32), Spark's residual
// gates become fp32 α/β, and anything not F32/BF16 is converted to F32.
// F32/BF16 matrices are used in place (zero copy from the mmap'd checkpoint
// on the CPU backend). Quantized matrices stay quantized: a checkpoint's
// codes and scales are imported as stored (zero copy on the CPU), and with
// WeightLoadOptions::quantize a BF16 source is quantized slot by slot while
// loading (model/quantize.h); either way the Tensor carries QuantParts.
#pragma once

#include <array>

#include <cstdint>
#include <memory>
#include <string>
#include <memory>
#include <vector>

#include "muse/backends/backend.h"
#include "muse/model/config.h"
#include "muse/model/quantize.h"
#include "muse/model/sharding.h"
#include "muse/model/weight_table.h"

namespace muse {

// One slot's logical tensor in host memory.
struct HostTensor {
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const void* data = nullptr;
  size_t nbytes = 0;
};

// A quantized slot in host memory as stored (pointers into the source,
// valid while it lives): codes, scales and zero points byte for byte, the
// NVFP4 global multipliers already in ModelOpt's sense.
struct HostQuantView {
  QuantFormat format;
  DType code_dtype = DType::F4;  // F4 or F8_E4M3
  const void* codes = nullptr;
  size_t codes_bytes = 0;
  const void* scales = nullptr;
  size_t scales_bytes = 0;
  std::vector<int64_t> scale_shape;
  const void* zeros = nullptr;
  size_t zeros_bytes = 0;
  std::vector<int64_t> zero_shape;
  std::vector<float> global;
};

// A view of a quantized weight held in host vectors.
HostQuantView quant_view(const HostQuantWeight& q);

// Where weights come from. The checkpoint adapter lives in engine/ (it
// depends on loading/); model/random_weights.h makes random ones.
class WeightSource {
 public:
  virtual ~WeightSource() = default;
  // The slot as stored, when it is one contiguous tensor in host memory that
  // stays valid as long as the source lives. nullopt-like: data == nullptr
  // when the source must convert (per-expert layouts, other dtypes).
  virtual Result<HostTensor> view(const WeightSpec& spec) const = 0;
  // The whole logical tensor converted to f32 (spec.numel() values; a
  // quantized slot dequantized by the reference decoders).
  virtual Status read_f32(const WeightSpec& spec, float* dst) const = 0;
  // A matrix made directly in backend memory in `dtype` (random weights for
  // the GPU benchmark), or an empty tensor: then view()/read_f32() supply it.
  virtual Result<Tensor> create_on(Backend& backend, const WeightSpec& spec, DType dtype) const { return Tensor{}; }
  // The slot as stored quantized, or format.kind None when it is not.
  virtual Result<HostQuantView> quantized(const WeightSpec& spec) const { return HostQuantView{}; }
  // Per layer {k_scale, v_scale} for an FP8 KV cache, as the source gives
  // them; empty: 1.0 everywhere.
  virtual std::vector<std::array<float, 2>> kv_scales() const { return {}; }
  // Bytes a slot the source stores quantized takes resident (codes, scales,
  // zeros, globals), 0 when it is not stored quantized: for refusing a model
  // that cannot fit a device before anything is read. Reads no data.
  virtual uint64_t stored_quantized_bytes(const WeightSpec& spec) const { return 0; }
};

struct WeightLoadOptions {
  // Quantize BF16/F32 slots while loading (--quantization): those
  // quantized_at_load(kind, ...) names. Slots the source already stores
  // quantized are imported as they are.
  QuantKind quantize = QuantKind::None;
  // Tensor/expert parallelism: load this rank's shard of every slot
  // (model/sharding.h shard_weights; the source answers for local specs,
  // model/shard_source.h). Inactive: the whole model.
  ParallelRank shard;
};

struct LayerWeights {
  // Attention: [out, in] matrices.
  Tensor q, k, v, gate, o;
  // Effective F32 gains (c = 1 + w for the stored offsets).
  Tensor norm_input, norm_post_attn /*Glimmer*/, norm_pre_ffn, norm_post_ffn;
  // Spark residual gates, folded: F32 [H].
  Tensor attn_alpha, attn_beta, ffn_alpha, ffn_beta;
  // Dense SwiGLU (Glimmer; Spark's dense layers, if any).
  Tensor mlp_gate, mlp_up, mlp_down;
  // Latent MoE (Spark sparse layers).
  Tensor router /*F32 [E,H]*/, router_bias /*F32 [E]*/, pre_expert_proj, pre_expert_norm /*gain*/;
  Tensor experts_gate_up /*[E,2I,Hm]*/, experts_down /*[E,Hm,I]*/, post_expert_norm /*gain*/, post_expert_proj;
};

struct ModelWeights {
  Tensor embed, final_norm /*absolute gain, F32*/, lm_head;
  std::vector<LayerWeights> layers;
  std::vector<Tensor> owned;  // everything to release
  std::vector<std::unique_ptr<QuantParts>> quant;  // what quantized Tensors point at (stable addresses)
  // Backend bytes of all weights (quantized ones at their stored size).
  uint64_t resident_bytes() const;
};

// Uploads every slot of describe_weights(config). An error names the slot.
Result<ModelWeights> upload_weights(Backend& backend, const ModelConfig& config, const WeightSource& source,
                                   const WeightLoadOptions& options = {});
void release_weights(Backend& backend, ModelWeights& weights);

// One quantized matrix (set) of logical `shape` imported part by part as
// stored; `owner` keeps its QuantParts and releases its buffers. Checks the
// layout against what the kernels assume and that the backend runs the kind.
Result<Tensor> import_quantized(Backend& backend, const std::vector<int64_t>& shape, const HostQuantView& view,
                                bool host_outlives, ModelWeights& owner);

// Bytes one decode token must read from weights: the embedding row, every
// dense matrix and norm, the router, the k chosen experts of each sparse
// layer, and the head (see bench/NOTES.md). Activations and KV excluded.
struct DecodeTraffic {
  uint64_t dense_bytes = 0;     // attention, latent projections, router, norms, dense MLPs
  uint64_t expert_bytes = 0;    // k active experts per sparse layer
  uint64_t head_bytes = 0;      // lm_head + one embedding row
  uint64_t total() const { return dense_bytes + expert_bytes + head_bytes; }
  double flops = 0;             // 2 per multiply-add over the same weights
  double head_flops = 0;        // the lm_head's part of flops (a prefill runs it on its last row only)
};
DecodeTraffic decode_traffic(const ModelConfig& config, const ModelWeights& weights);

}  // namespace muse
