// Decoders from the quantized checkpoint formats of checkpoint-formats.md
// §2–3 to f32, row-major [out_features, in_features] (nn.Linear layout).
// Inputs are raw checkpoint bytes (any alignment); each decoder checks the
// sizes it is given against the shapes. These are reference decoders for
// load-time conversion and for testing fast kernels, not the fast path.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "muse/backends/tensor.h"
#include "muse/core/dtype.h"
#include "muse/core/json.h"
#include "muse/core/status.h"

namespace muse {

// A raw tensor argument: bytes plus how to read them.
struct QuantInput {
  const uint8_t* data = nullptr;
  size_t nbytes = 0;
  DType dtype = DType::U8;
};

// NVFP4: E2M1 codes two per byte along K (even element in the low nibble),
// one E4M3 scale per 16 consecutive K elements ([N, K/16]), times a global
// multiplier. ModelOpt: global = weight_scale_2. compressed-tensors: global =
// 1 / weight_global_scale (its global scale is the reciprocal).
Status decode_nvfp4(QuantInput packed, QuantInput block_scales, float global, int64_t rows, int64_t cols, float* out);

// MXFP4 (OCP MX): E2M1 codes two per byte along K, one E8M0 scale (stored U8
// or F8_E8M0) per 32 K elements: x = e2m1 · 2^(s − 127). gpt-oss `_blocks`
// [.., N, K/32, 16] are the same bytes as [N, K/2].
Status decode_mxfp4(QuantInput packed, QuantInput scales, int64_t rows, int64_t cols, float* out);

// FP8 weights (F8_E4M3 or F8_E5M2) with F32/BF16/F16 scales, by scale shape:
// per tensor (1 value), per output channel (rows values), or blocks of
// block_rows × block_cols ([ceil(N/br), ceil(K/bc)], DeepSeek "weight_scale_inv":
// multiplied despite the name).
enum class Fp8Scaling { PerTensor, PerChannel, Block };
Status decode_fp8(QuantInput weight, QuantInput scale, Fp8Scaling scaling, int64_t rows, int64_t cols, float* out,
                  int64_t block_rows = 128, int64_t block_cols = 128);

// GPTQ / AutoRound 4-bit (vLLM layout): qweight I32 [K/8, N] packed along K,
// qzeros I32 [K/G, N/8] packed along N (element j at bits 4j..4j+3 in both),
// scales F16 [K/G, N], optional g_idx I32 [K] (act-order). With
// zeros_minus_one (GPTQ v1, AutoRound "auto_round:auto_gptq") the stored zero
// is z − 1. out is [N, K] (transposed from the checkpoint's [K, N]).
struct GptqArgs {
  QuantInput qweight, qzeros, scales, g_idx;  // g_idx.data may be null
  int64_t in_features = 0;                    // K
  int64_t out_features = 0;                   // N
  int64_t group_size = 128;                   // -1: one group over all of K
  bool zeros_minus_one = true;
};
Status decode_gptq_int4(const GptqArgs& args, float* out);

// compressed-tensors "pack-quantized" 4-bit: weight_packed I32 [N, K/8]
// packed along K, low bits first, stored value = signed value + 8;
// weight_scale [N, K/G] (F16/BF16/F32); symmetric (no zero point).
Status decode_ct_int4(QuantInput packed, QuantInput scales, int64_t rows, int64_t cols, int64_t group_size, float* out);

// What a config.json quantization_config describes, for routing tensors to a
// decoder. Unknown is returned (not an error) for an absent config.
enum class QuantScheme {
  None, ModelOptNvfp4, ModelOptFp8, CompressedTensorsNvfp4, CompressedTensorsInt4, CompressedTensorsFp8,
  Mxfp4, QuarkMxfp4, QuarkFp8, Fp8Block, Gptq, AutoRound, Unknown
};
struct QuantInfo {
  QuantScheme scheme = QuantScheme::None;
  std::string method;            // quant_method as written
  int64_t group_size = 0;        // where the config says
  bool zeros_minus_one = false;  // GPTQ v1 / AutoRound auto_gptq packing
  // Modules left unquantized (ignore, exclude_modules, exclude,
  // modules_to_not_convert, AutoRound extra_config at 16 bits, GPTQModel
  // dynamic "-:" entries): fnmatch patterns, module names (matched whole
  // dot-separated components) or "re:" regular expressions.
  std::vector<std::string> excluded;
  bool fp8_blocks = false;  // quant_method fp8: 128 x 128 block scales only
  // A method that quantizes a BF16 checkpoint at load (vLLM's ptpc_fp8):
  // the engine applies it unless --quantization says otherwise.
  QuantKind online = QuantKind::None;
};
// Errors, each naming the setting: a config that is not an object, a known
// method with a variant muse does not read (ModelOpt quant_algo, compressed-
// tensors format or weights, Quark dtype or per-layer configs, FP8 block
// sizes, GPTQ checkpoint_format / dynamic overrides, AutoRound packing_format
// / data_type / extra_config), bits != 4, desc_act = true (act-order).
Result<QuantInfo> describe_quantization(const Json& quantization_config);
const char* quant_scheme_name(QuantScheme s);
// Every scale finite (E4M3 and E8M0 NaN codes, F16/BF16/F32 NaN or inf):
// otherwise an error naming the first bad element ("scale 17 of 4096 (F16)
// is NaN"). A corrupt scale would make every output of the weight NaN.
Status check_scale_values(const QuantFormat& format, const void* scales, size_t bytes);
// The same for the per-matrix multipliers (NVFP4's global scales, as used).
Status check_global_values(const std::vector<float>& global);
// The in-memory kind a scheme's tensors are (None for None / Unknown).
QuantKind quant_kind_of(QuantScheme s);
// ModelOpt's hf_quant_config.json ({"producer", "quantization": {"quant_algo",
// "exclude_modules", "group_size"}}) as the quantization_config it stands for.
Result<Json> modelopt_quant_config(const Json& hf_quant_config);

}  // namespace muse
