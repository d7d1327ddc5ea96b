// Weight formats and the tensors a serving engine actually holds for them.
//
// The model's logical weights come from the engine's weight table
// (model/weight_table.h). This file turns each logical weight into the
// tensors vLLM allocates for it in a given format (packed weight, block
// scales, global scales; q/k/v and gate/up fused), because pinned-buffer
// rounding and offload selection work per allocated tensor.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"
#include "muse/model/config.h"
#include "muse/model/weight_table.h"

namespace muse::plan {

enum class WeightFormat { BF16, NVFP4, MXFP4, FP8, INT4 };
const char* weight_format_name(WeightFormat format);  // "bf16", "nvfp4", ...
// Accepts bf16|nvfp4|mxfp4|fp8|int4 (case-insensitive); errors list them.
Result<WeightFormat> parse_weight_format(std::string_view name);

// Which logical weights a format stores quantized, and the exceptions.
struct QuantScheme {
  WeightFormat format = WeightFormat::BF16;
  // Per layer: routed experts kept BF16 (the NVFP4 release leaves layers 0 and
  // L-1 unquantized; a checkpoint's ignore list can say otherwise).
  std::vector<bool> bf16_expert_layer;
  std::string basis;  // how the scheme was decided, for the report
};

// Reads a Hugging Face quantization_config (ModelOpt, compressed-tensors,
// Quark, GPTQ/AutoRound, fp8, mxfp4). A null/absent config is BF16. Unknown
// methods are an error that suggests --weight-format.
Result<WeightFormat> detect_weight_format(const Json& quantization_config);

// The scheme for `format` on this model. `quantization_config` (may be null)
// supplies an exclusion list; without one, NVFP4 keeps the experts of the
// first and last layer BF16 as the published release does.
QuantScheme make_quant_scheme(const ModelConfig& config, WeightFormat format, const Json& quantization_config,
                              std::string basis);

// One tensor as the serving engine allocates it.
struct StoredTensor {
  std::string name;   // vLLM-style, e.g. "layers.3.mlp.experts.w13_weight_scale"
  int layer = -1;     // -1: global (embeddings, final norm, head)
  WeightPart part = WeightPart::Attention;
  bool quantized = false;       // stored in the scheme's low-precision format
  int64_t params = 0;           // logical parameters this tensor carries (0 for scale tensors)
  int64_t bytes = 0;
  double decode_read_fraction = 1.0;  // share of its bytes one decoded token reads (batch 1)
  bool replicated = false;      // held whole on every GPU under tensor parallelism
  // The logical weights it holds (q, k, v for a fused qkv_proj): what a GPU
  // holds of it under tensor parallelism follows their splits
  // (model/sharding.h), the rule the engine loads shards with.
  std::vector<WeightSpec> logical;
};

// All tensors of the text decoder in module order (layer by layer; inside a
// fused-MoE layer all weights, then all block scales, then global scales, as
// vLLM registers them).
std::vector<StoredTensor> stored_tensors(const ModelConfig& config, const std::vector<WeightSpec>& weights,
                                         const QuantScheme& scheme);

// Bytes of one quantized [.., N, K] matrix set with `leading` copies (experts)
// in `format`, weight and scales together (used for per-expert figures).
int64_t quantized_matrix_bytes(WeightFormat format, int64_t leading, int64_t n, int64_t k);

// Shell-style wildcard match (`*`, `?`), as Python's fnmatch without classes.
bool wildcard_match(std::string_view text, std::string_view pattern);

}  // namespace muse::plan
