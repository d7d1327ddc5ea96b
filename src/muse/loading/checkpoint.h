// A Hugging Face model directory, opened strictly: config.json (+
// generation_config.json), model.safetensors or the shards named by
// model.safetensors.index.json, every weight slot of describe_weights(config)
// resolved through the name table, and nothing left over. Tensor data stays in
// the memory mappings; views point into them.
#pragma once

#include <array>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "muse/backends/tensor.h"
#include "muse/loading/name_map.h"
#include "muse/loading/quant.h"
#include "muse/loading/safetensors.h"
#include "muse/model/config.h"
#include "muse/model/weight_table.h"

namespace muse {

struct LoadOptions {
  bool language_model_only = false;         // skip vision/audio tensors (vLLM's --language-model-only)
  std::vector<std::string> ignore_patterns;  // fnmatch patterns of tensors to leave unconsumed (e.g. "mtp.*")
};

// A zero-copy view of (part of) one checkpoint tensor.
struct TensorView {
  std::string name;  // checkpoint tensor name
  std::string file;  // path of the safetensors file holding it
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  const uint8_t* data = nullptr;
  size_t nbytes = 0;

  int64_t numel() const;
};

// Converts a whole view to f32 / bf16 (dst holds numel() elements); large
// views are split across threads.
Status read_f32(const TensorView& view, float* dst);
Status read_bf16(const TensorView& view, uint16_t* dst);

// One resolved slot.
struct ResolvedWeight {
  WeightSpec spec;
  WeightTransform transform = WeightTransform::None;
  // Stored as one tensor (the usual case) ...
  TensorView tensor;
  // ... or, for fused expert slots in a per-expert checkpoint, as 2-D pieces:
  // experts[e] = {gate, up} for moe.experts.gate_up, {down} for moe.experts.down.
  bool per_expert = false;
  std::vector<std::vector<TensorView>> experts;
  bool tied = false;  // lm_head served by embed_tokens (tie_word_embeddings)
  // Quantized slots (decided per tensor: a slot whose tensor is stored
  // plainly is read as stored). `tensor` holds the codes: NVFP4/MXFP4 U8
  // [.., N, K/2] (gpt-oss `_blocks` [E, N, K/32, 16]), FP8 F8_E4M3 [.., N, K],
  // GPTQ/AutoRound I32 qweight [.., K/8, N]; `scales` the block / channel /
  // group scales as stored; `zeros` GPTQ qzeros; `global` NVFP4's
  // weight_scale_2 (compressed-tensors' reciprocal already inverted), one or
  // two per matrix. `format` says how they decode (backends/tensor.h);
  // read_f32 dequantizes with the reference decoders.
  struct Quantized {
    QuantScheme scheme = QuantScheme::None;
    QuantFormat format;
    TensorView scales, zeros;
    TensorView global_scale, input_scale;  // as stored; may be empty
    std::vector<float> global;
    // compressed-tensors pack-quantized INT4: codes I32 [.., N, K/8] and
    // scales [.., N, K/G] (not GPTQ's [K/8, N]); the engine transposes them.
    bool n_major = false;
  } quant;
  // Per-expert layout with quantized pieces: expert_quant[e][i] holds the
  // parts of experts[e][i] (quant.format is their common format).
  std::vector<std::vector<Quantized>> expert_quant;
  bool quantized() const { return quant.format.kind != QuantKind::None; }
};

class Checkpoint {
 public:
  static Result<Checkpoint> open(const std::string& dir, const LoadOptions& options = {});

  const std::string& dir() const { return dir_; }
  const ModelConfig& config() const { return config_; }
  const std::vector<WeightSpec>& weights() const { return weights_; }  // describe_weights(config())
  const std::vector<ResolvedWeight>& resolved() const { return resolved_; }  // same order as weights()

  // nullptr when (slot, layer) is not part of this model.
  const ResolvedWeight* find(std::string_view slot, int layer = -1) const;
  // The single tensor behind a slot; an error for per-expert layouts (use
  // expert_pieces or read_f32 below).
  Result<TensorView> tensor(std::string_view slot, int layer = -1) const;
  // Expert e of a fused expert slot, from either layout: one view sliced out
  // of the 3-D tensor, or the per-expert 2-D tensors (gate, then up). For an
  // NVFP4 slot the view holds expert e's packed codes; use read_expert_f32.
  Result<std::vector<TensorView>> expert_pieces(std::string_view slot, int layer, int expert) const;

  // The whole logical tensor of a slot (spec.numel() elements, spec.shape
  // order), from any layout, converted (NVFP4 slots dequantized).
  Status read_f32(std::string_view slot, int layer, float* dst) const;
  Status read_bf16(std::string_view slot, int layer, uint16_t* dst) const;
  // Expert e's [rows, cols] matrix of a fused expert slot.
  Status read_expert_f32(std::string_view slot, int layer, int expert, float* dst) const;

  size_t num_files() const { return files_.size(); }
  uint64_t tensor_bytes() const;  // bytes of all consumed tensors
  // Tensors present but skipped (ignore patterns, or multimodal with language_model_only).
  const std::vector<std::string>& skipped() const { return skipped_; }
  // Per layer {k_scale, v_scale} of an FP8 KV cache as the checkpoint gives
  // them (kv_scale_names(); 1.0 where absent); one entry per layer.
  const std::vector<std::array<float, 2>>& kv_scales() const { return kv_scales_; }

 private:
  Result<const ResolvedWeight*> lookup(std::string_view slot, int layer) const;

  std::string dir_;
  ModelConfig config_;
  std::vector<WeightSpec> weights_;
  std::vector<ResolvedWeight> resolved_;
  std::unordered_map<std::string, size_t> by_key_;  // "slot#layer" -> index
  std::vector<std::unique_ptr<SafetensorsFile>> files_;
  std::vector<std::string> skipped_;
  std::vector<std::array<float, 2>> kv_scales_;
};

}  // namespace muse
