// The CPU backend's inner loops, one table per instruction set: scalar
// (the reference, and the fallback), AVX2+FMA and AVX-512. The table is
// picked once at startup from the CPU's features; threading lives outside
// (cpu_backend.cc splits work and calls these on disjoint ranges).
//
// Determinism: every output element is one fixed sequence of operations:
// a dot product of length K always uses one vector accumulator of the ISA's
// width stepping through K in order, a zero-padded tail, and the same
// horizontal-sum tree, whatever block shape (rows of x, rows of W) it is
// computed in. So results do not depend on the thread count, the batch, or
// whether a row is decoded alone or prefilled with others. (They do differ
// between ISAs, by rounding.)
#pragma once

#include <cstdint>

namespace muse::cpu {

enum class Isa { Scalar, Avx2, Avx512 };
const char* isa_name(Isa isa);

// One quantized matrix (a weight, or one expert of a fused-expert weight) as
// the kernels read it; built from a Tensor + QuantParts by the backend
// (cpu_matmul.cc). Layouts are tensor.h's QuantKind.
struct QuantMatrix {
  enum Kind : uint8_t { Fp4, Fp8, Int4 } kind = Fp4;  // Fp4: NVFP4 and MXFP4 (same codes)
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  const uint8_t* zeros = nullptr;  // Int4 only; null = symmetric (zero point 8)
  int64_t rows = 0, cols = 0;      // N, K of the whole matrix
  // Row-major kinds: scale(n, k) = scale_value[(n / block_rows) · scale_ld + k / block_cols]
  // · global[n / global_rows]; scales are bytes through scale_lut (E4M3,
  // E8M0: 256 entries) or F32 (scale_lut null).
  // Int4: scales are F16 (or BF16) [ceil(K/G), N] with G = block_cols, zeros I32 [ceil(K/G), N/8].
  int64_t block_rows = 1, block_cols = 16, scale_ld = 0;
  const float* scale_lut = nullptr;
  float global[2] = {1.0f, 1.0f};
  int64_t global_rows = 0;  // rows per global multiplier (N when there is one)
  int32_t zero_offset = 0;
  bool bf16_scales = false;  // Int4: scales BF16 instead of F16 (compressed-tensors)
};
// 256-entry tables: f8_e4m3 and f8_e8m0 values of every byte.
const float* e4m3_table();
const float* e8m0_table();

struct KernelTable {
  Isa isa;
  // Int4 products vectorize over output columns (N contiguous) and keep
  // several column registers in flight: a call over fewer columns than this
  // runs one FMA chain and is latency-bound (2.6x slower on AVX-512), so the
  // backend splits Int4 work in multiples of it.
  int64_t int4_cols;
  // out[t*ldo + n] = Σ_k x[t*ldx + k] · w[n*ldw + k] for t < T, n < N.
  void (*matmul_f32)(const float* x, int64_t ldx, int64_t T, const float* w, int64_t ldw, int64_t N, int64_t K,
                     float* out, int64_t ldo);
  void (*matmul_bf16)(const float* x, int64_t ldx, int64_t T, const uint16_t* w, int64_t ldw, int64_t N, int64_t K,
                      float* out, int64_t ldo);
  // The same product over rows [n0, n0+N) of a quantized matrix, decoding
  // codes and scales in registers. Row-major kinds compute every output
  // exactly as matmul_f32 does on the dequantized matrix (same chunks, same
  // tree), so the two agree bit for bit; Int4 (codes along K, N contiguous)
  // vectorizes over N with one accumulator per output running through K in
  // order. Either way each output is one fixed sequence of operations.
  void (*matmul_quant)(const float* x, int64_t ldx, int64_t T, const QuantMatrix& w, int64_t n0, int64_t N,
                       float* out, int64_t ldo);
  float (*dot)(const float* a, const float* b, int64_t n);
  float (*sum_squares)(const float* x, int64_t n);
  // y[i] += a · x[i]
  void (*axpy)(float a, const float* x, float* y, int64_t n);
  // y[i] = x[i] · r · (gain ? gain[i] : 1)   (y may alias x)
  void (*scale_gain)(float* y, const float* x, float r, const float* gain, int64_t n);
  // Attention for one query row and one head over `nkeys` keys given as row
  // pointers (each + kv_offset): scores = q·k · scale, fp32 softmax,
  // out = Σ p_j v_j / Σ p_j. `scores` is scratch of nkeys floats.
  void (*attend)(const float* q, const float* const* krows, const float* const* vrows, int64_t kv_offset,
                 int64_t nkeys, int64_t head_dim, float scale, float* scores, float* out);
};

// Tables by ISA; nullptr when this build or this CPU lacks it.
const KernelTable* scalar_kernels();
const KernelTable* avx2_kernels();    // kernels_avx2.cc
const KernelTable* avx512_kernels();  // kernels_avx512.cc
bool cpu_has_avx2();
bool cpu_has_avx512();
// The best table this CPU supports.
const KernelTable& best_kernels();
const KernelTable* kernels_for(Isa isa);  // nullptr when unsupported here

}  // namespace muse::cpu
