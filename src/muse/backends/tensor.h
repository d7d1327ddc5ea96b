// Tensor: a handle to backend memory (data pointer, dtype, shape). Split from
// backend.h so the step plan (step_plan.h) can name it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "muse/core/dtype.h"

namespace muse {

// ---------------------------------------------------------------------------
// Quantized weights stay quantized in backend memory (docs/formats.md,
// "Quantized weights in memory"). A quantized weight is a Tensor of codes
// whose shape is the logical matrix ([N, K] or [E, N, K] for fused experts)
// and whose `quant` points at the rest: the format and the scale (and zero
// point) tensors, each imported as it is stored in the checkpoint.
// ---------------------------------------------------------------------------
enum class QuantKind : uint8_t {
  None,
  Nvfp4,  // E2M1 codes (F4, two per byte, even k in the low nibble) [.., N, K]; E4M3 scale per 1×16; F32 globals
  Mxfp4,  // E2M1 codes as NVFP4; E8M0 scale per 1×32 (stored U8)
  Fp8,    // E4M3 codes (F8_E4M3) [.., N, K]; F32 scale per tensor, per row or per 128×128 block
  Int4,   // GPTQ: I32 words [.., K/8, N] (k = 8r + j at bits 4j..4j+3); F16 scales [.., K/G, N];
          // I32 zeros [.., K/G, N/8] (n = 8c + j at bits 4j..4j+3), value = s · (q − (z + zero_offset))
};
const char* quant_kind_name(QuantKind kind);  // "nvfp4", ...

// How a quantized weight's codes and scales decode.
struct QuantFormat {
  QuantKind kind = QuantKind::None;
  // Scale element type: F8_E4M3 (NVFP4), F8_E8M0 (MXFP4), F32 (FP8), F16 or BF16 (INT4).
  DType scale_dtype = DType::F32;
  // Row-major kinds: one scale per block_rows × block_cols codes, the grid
  // [.., ceil(N/block_rows), ceil(K/block_cols)] row-major (per tensor:
  // block_rows = N, block_cols = K; per output channel: 1 × K).
  // INT4: block_cols is the group size G along K (block_rows 1).
  int32_t block_rows = 1, block_cols = 16;
  // NVFP4: F32 multipliers per matrix (1, or 2 for fused gate/up halves with
  // their own weight_scale_2), in ModelOpt's sense (value = e2m1 · scale · global;
  // compressed-tensors' reciprocal global scales are inverted at load). 0: none.
  int32_t global_parts = 0;
  // INT4: added to the stored zero points (GPTQ v1 / AutoRound auto_gptq: 1).
  int32_t zero_offset = 0;
};

struct QuantParts;

// A handle to backend memory: row-major, outermost dimension first.
struct Tensor {
  void* data = nullptr;  // backend address; never dereferenced outside the backend
  DType dtype = DType::F32;
  int rank = 0;
  std::array<int64_t, 4> shape{};
  // Set on quantized weights (see above); owned by the model's weights.
  const QuantParts* quant = nullptr;

  bool empty() const { return data == nullptr; }
  int64_t dim(int i) const { return shape[size_t(i)]; }
  int64_t numel() const {
    int64_t n = rank ? 1 : 0;
    for (int i = 0; i < rank; ++i) n *= shape[size_t(i)];
    return n;
  }
  int64_t cols() const { return rank ? shape[size_t(rank - 1)] : 0; }  // innermost extent
  int64_t rows() const { return cols() ? numel() / cols() : 0; }      // everything else
  size_t element_bytes() const { return size_t(dtype_bits(dtype) / 8); }
  // Sub-byte codes (F4) count half a byte per element.
  size_t bytes() const { return size_t(numel()) * size_t(dtype_bits(dtype)) / 8; }

  // Rows [begin, begin+count) of the outermost dimension, as a tensor of the
  // same rank. Valid on every backend: it is pointer arithmetic only.
  Tensor rows(int64_t begin, int64_t count) const {
    Tensor t = *this;
    int64_t inner = numel() / shape[0];
    t.data = static_cast<char*>(data) + size_t(begin * inner) * size_t(dtype_bits(dtype)) / 8;
    t.shape[0] = count;
    return t;
  }
  // The same memory seen with another shape (same element count).
  Tensor reshaped(std::initializer_list<int64_t> dims) const {
    Tensor t = *this;
    t.rank = int(dims.size());
    t.shape = {};
    int i = 0;
    for (int64_t d : dims) t.shape[size_t(i++)] = d;
    return t;
  }
};

// The companion tensors of a quantized weight, in backend memory.
struct QuantParts {
  QuantFormat format;
  Tensor scales;  // the scale grid as stored (INT4: [.., K/G, N])
  Tensor global;  // F32 [E · global_parts] (NVFP4), else empty
  Tensor zeros;   // INT4 packed zero points, else empty
  // Backend bytes of codes + scales + globals + zeros.
  size_t bytes(const Tensor& codes) const { return codes.bytes() + scales.bytes() + global.bytes() + zeros.bytes(); }
};

inline const char* quant_kind_name(QuantKind kind) {
  switch (kind) {
    case QuantKind::None: return "bf16";
    case QuantKind::Nvfp4: return "nvfp4";
    case QuantKind::Mxfp4: return "mxfp4";
    case QuantKind::Fp8: return "fp8";
    case QuantKind::Int4: return "int4";
  }
  return "?";
}

// Resident bytes of a weight, quantized or not.
inline size_t weight_bytes(const Tensor& t) { return t.quant ? t.quant->bytes(t) : t.bytes(); }

// "BF16[64, 128]", for error messages ("NVFP4[256, 64]" for a quantized weight).
inline std::string describe(const Tensor& t) {
  std::string s(t.quant ? quant_kind_name(t.quant->format.kind) : dtype_name(t.dtype));
  s += '[';
  for (int i = 0; i < t.rank; ++i) s += (i ? ", " : "") + std::to_string(t.shape[size_t(i)]);
  return s + ']';
}

}  // namespace muse
