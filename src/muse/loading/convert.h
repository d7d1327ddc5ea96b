// Bulk element conversion from checkpoint dtypes to f32 / bf16. Works on any
// element range (callers split large tensors across threads by range); the
// *_parallel forms split internally. Source pointers need no alignment
// (safetensors data offsets are only byte-aligned).
#pragma once

#include <cstdint>

#include "muse/core/dtype.h"
#include "muse/core/status.h"

namespace muse {

// True for dtypes convert_to_f32 accepts: every float (F32, F16, BF16, F64,
// all F8 variants incl. E8M0, F4 as E2M1 with two codes per byte, low nibble
// first), BOOL and the integers (by value). Not: F6_*, C64.
bool convertible_to_float(DType dtype);

// Converts `count` elements starting at element `first` of the tensor at
// `src`. For F4 (two per byte) `first` and `count` must be even.
Status convert_to_f32(DType dtype, const uint8_t* src, int64_t first, int64_t count, float* dst);
// Same, rounding to bf16 (nearest-even); BF16 input is copied bit-exactly.
Status convert_to_bf16(DType dtype, const uint8_t* src, int64_t first, int64_t count, uint16_t* dst);

// Whole-range conversion split across up to `threads` threads (0: hardware
// concurrency, capped at 16) when the range is large; small ranges run inline.
Status convert_to_f32_parallel(DType dtype, const uint8_t* src, int64_t count, float* dst, int threads = 0);
Status convert_to_bf16_parallel(DType dtype, const uint8_t* src, int64_t count, uint16_t* dst, int threads = 0);

// A branch-free IEEE half -> float conversion, exact for every finite value,
// subnormals and infinities; NaN stays NaN (signalling NaNs come back quiet).
float f16_to_f32_fast(uint16_t h);

}  // namespace muse
