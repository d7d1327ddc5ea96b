// Quantizing f32 weights into the engine's quantized layouts (tensor.h's
// QuantKind, which are the published checkpoint layouts), for
// `--quantization` on a BF16 checkpoint. Rounding follows the reference
// packers (checkpoint-formats.md §2–3):
//   NVFP4 (ModelOpt): weight_scale_2 = amax / (6·448) per matrix (per half of a
//     fused gate/up), block scale = e4m3(amax_16 / 6 / scale_2), code =
//     e2m1(x / (block · scale_2)), round to nearest, ties to even, saturating.
//   MXFP4 (OCP MX v1.0): per 32 elements X = 2^(floor(log2 amax) − 2) as E8M0,
//     code = e2m1(x / X), nearest-even, saturating at ±6.
//   FP8 per channel (PTPC): s[n] = amax_row / 448, code = e4m3(x / s), nearest-even.
//   INT4 (GPTQ round-to-nearest, symmetric, group 128): s = 2·amax_g / 15
//     (stored F16, and used as stored), q = clamp(round(x / s) + 8, 0, 15),
//     zeros stored as GPTQ v1 (z − 1 = 7).
// Plus the element encoders the known-answer tests pin.
#pragma once

#include <cstdint>
#include <vector>

#include "muse/backends/tensor.h"
#include "muse/core/status.h"

namespace muse {

// f32 → E2M1 code (bit 3 = sign), nearest-even, saturating to ±6.
uint8_t f32_to_e2m1(float x);

// A quantized weight in host memory, laid out as the backend imports it.
struct HostQuantWeight {
  QuantFormat format;
  DType code_dtype = DType::F4;  // F4 (NVFP4, MXFP4, INT4 nibbles) or F8_E4M3
  std::vector<uint8_t> codes, scales, zeros;
  std::vector<int64_t> scale_shape, zero_shape;
  std::vector<float> global;  // F32 [E · global_parts]
};

// Quantizes a [N, K] or [E, N, K] f32 matrix (set). `halves` = 2 gives NVFP4
// separate global scales for the two row halves (fused gate/up). Errors name
// the shape constraint that fails (K a multiple of 16 / 32 / 8).
Result<HostQuantWeight> quantize_weight(QuantKind kind, const float* w, const std::vector<int64_t>& shape,
                                        int halves = 1);

}  // namespace muse
