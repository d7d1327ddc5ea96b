// AVX-512 kernel table (this file is compiled with -mavx512f/bw/vl/dq and
// -mfma). Only selected when the CPU reports those features.
// GCC 12 warns about its own intrinsics (_mm512_undefined_* patterns).
#pragma GCC diagnostic ignored "-Wuninitialized"
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#include <immintrin.h>

#include "muse/backends/cpu/kernels.h"
#include "muse/backends/cpu/simd_kernels_impl.h"

namespace muse::cpu {
namespace {

struct Avx512 {
  using Reg = __m512;
  static constexpr int W = 16;
  static constexpr int MR = 4;  // batched: 4 × 4 = 16 of the 32 registers accumulate
  static constexpr int NR = 4;
  static constexpr int NR1 = 8;
  static __mmask16 mask(int n) { return __mmask16((1u << n) - 1u); }
  static Reg zero() { return _mm512_setzero_ps(); }
  static Reg set1(float a) { return _mm512_set1_ps(a); }
  static Reg load(const float* p) { return _mm512_loadu_ps(p); }
  static Reg load_n(const float* p, int n) { return _mm512_maskz_loadu_ps(mask(n), p); }
  static Reg widen(__m256i h) { return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16)); }
  static Reg load_bf16(const uint16_t* p) { return widen(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Reg load_bf16_n(const uint16_t* p, int n) { return widen(_mm256_maskz_loadu_epi16(mask(n), p)); }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm512_fmadd_ps(a, b, c); }
  static Reg mul(Reg a, Reg b) { return _mm512_mul_ps(a, b); }
  static Reg add(Reg a, Reg b) { return _mm512_add_ps(a, b); }
  static void store(float* p, Reg v) { _mm512_storeu_ps(p, v); }
  static void store_n(float* p, Reg v, int n) { _mm512_mask_storeu_ps(p, mask(n), v); }
  static float hsum(Reg v) {
    __m256 a = _mm256_add_ps(_mm512_castps512_ps256(v), _mm512_extractf32x8_ps(v, 1));  // i + i+8
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(a), _mm256_extractf128_ps(a, 1));      // + i+4
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));
    s = _mm_add_ss(s, _mm_movehdup_ps(s));
    return _mm_cvtss_f32(s);
  }
};

const KernelTable kTable = {
    Isa::Avx512,
    matmul_f32_impl<Avx512>,
    matmul_bf16_impl<Avx512>,
    dot_impl<Avx512>,
    sum_squares_impl<Avx512>,
    axpy_impl<Avx512>,
    scale_gain_impl<Avx512>,
    attend_impl<Avx512>,
};

}  // namespace

const KernelTable* avx512_kernels() { return &kTable; }

}  // namespace muse::cpu
