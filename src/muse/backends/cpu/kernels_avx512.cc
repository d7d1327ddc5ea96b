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
  static constexpr int QNB1 = 4;  // INT4 decode: 4 × 16 columns
  static constexpr int QNB = 2;   // INT4 batched: 4 x rows × 2 × 16 columns
  using IReg = __m512i;
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
  static Reg sub(Reg a, Reg b) { return _mm512_sub_ps(a, b); }
  // 16 E2M1 codes from 8 bytes, in element order: lanes 0-7 take the low
  // dword, 8-15 the high one, each shifted right by 4·(lane % 8) so its
  // nibble is in bits 0-3, and vpermps reads only those 4 bits as the index
  // into the 16-entry value table (no masking, no widening).
  static Reg fp4(const uint8_t* p) {
    static const float kE2M1[16] = {0.0f,  0.5f,  1.0f,  1.5f,  2.0f,  3.0f,  4.0f,  6.0f,
                                    -0.0f, -0.5f, -1.0f, -1.5f, -2.0f, -3.0f, -4.0f, -6.0f};
    int64_t q;
    __builtin_memcpy(&q, p, 8);
    const __m512i dw = _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1),
                                                _mm512_set1_epi64(q));
    const __m512i idx = _mm512_srlv_epi32(dw, _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28));
    return _mm512_permutexvar_ps(idx, _mm512_loadu_ps(kE2M1));
  }
  // E4M3 (e4m3fn) bytes sign-extended to 32-bit lanes: (v << 20) masked to
  // the sign and bits 20-26 is the f32 of the value times 2^-120
  // (subnormals included, exactly); 0x7F/0xFF become a quiet NaN with the
  // sign. fp8_raw returns that (for a scale already multiplied by 2^120),
  // fp8 the value (one multiply by 2^120, exact).
  static __m512i fp8_finite_bits(__m512i v) {  // codes known not to be NaN
    return _mm512_and_si512(_mm512_slli_epi32(v, 20), _mm512_set1_epi32(int(0x87F00000u)));
  }
  static Reg fp8_raw_lanes(__m512i v) {
    __m512i bits = fp8_finite_bits(v);
    const __mmask16 nan =
        _mm512_cmpeq_epi32_mask(_mm512_and_si512(v, _mm512_set1_epi32(0x7F)), _mm512_set1_epi32(0x7F));
    // (bits & sign) | quiet NaN, in the NaN lanes: vpternlogd 0xEA is (A & B) | C.
    bits = _mm512_mask_ternarylogic_epi32(bits, nan, _mm512_set1_epi32(int(0x80000000u)), _mm512_set1_epi32(0x7FC00000),
                                          0xEA);
    return _mm512_castsi512_ps(bits);
  }
  static Reg fp8_raw(const uint8_t* p) {
    return fp8_raw_lanes(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))));
  }
  static Reg fp8_raw_n(const uint8_t* p, int n) { return fp8_raw_lanes(_mm512_cvtepi8_epi32(_mm_maskz_loadu_epi8(mask(n), p))); }
  // fp8_raw for codes known not to be NaN (fp8_any_nan false): no NaN lanes.
  static Reg fp8_raw_finite(const uint8_t* p) {
    return _mm512_castsi512_ps(fp8_finite_bits(_mm512_cvtepi8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p)))));
  }
  // Whether any of the n codes at p is a NaN (0x7F or 0xFF).
  static bool fp8_any_nan(const uint8_t* p, int64_t n) {
    const __m512i m7f = _mm512_set1_epi8(0x7F);
    __mmask64 any = 0;
    int64_t i = 0;
    for (; i + 64 <= n; i += 64) any |= _mm512_cmpeq_epi8_mask(_mm512_and_si512(_mm512_loadu_si512(p + i), m7f), m7f);
    if (i < n) {
      const __mmask64 tail = ~0ull >> (64 - (n - i));  // n - i in 1..63
      any |= _mm512_mask_cmpeq_epi8_mask(tail, _mm512_and_si512(_mm512_maskz_loadu_epi8(tail, p + i), m7f), m7f);
    }
    return any != 0;
  }
  static Reg fp8(const uint8_t* p) { return _mm512_mul_ps(fp8_raw(p), _mm512_set1_ps(0x1p120f)); }
  static Reg fp8_n(const uint8_t* p, int n) { return _mm512_mul_ps(fp8_raw_n(p, n), _mm512_set1_ps(0x1p120f)); }
  static IReg iload(const uint8_t* p) { return _mm512_loadu_si512(p); }
  static IReg iload_n(const uint8_t* p, int n) { return _mm512_maskz_loadu_epi32(mask(n), p); }
  static Reg fnmadd(Reg a, Reg b, Reg c) { return _mm512_fnmadd_ps(a, b, c); }
  // float((v >> shift) & 15): vpermps reads only the low 4 bits of each
  // index, so the shifted word indexes the table 0..15 directly.
  static Reg nibf(IReg v, int shift) {
    const Reg values = _mm512_setr_ps(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
    return _mm512_permutexvar_ps(_mm512_srl_epi32(v, _mm_cvtsi32_si128(shift)), values);
  }
  static Reg zeros4(const uint8_t* p, int n) {
    const __m512i words = _mm512_maskz_loadu_epi32(__mmask16((1u << ((n + 7) / 8)) - 1u), p);
    const __m512i lane_word = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    const __m512i shift = _mm512_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28, 0, 4, 8, 12, 16, 20, 24, 28);
    const __m512i v = _mm512_srlv_epi32(_mm512_permutexvar_epi32(lane_word, words), shift);
    return _mm512_maskz_mov_ps(mask(n), _mm512_cvtepi32_ps(_mm512_and_si512(v, _mm512_set1_epi32(15))));
  }
  static Reg load_f16(const uint8_t* p) { return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p))); }
  static Reg load_f16_n(const uint8_t* p, int n) { return _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask(n), p)); }
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
    Avx512::QNB1 * Avx512::W,
    matmul_f32_impl<Avx512>,
    matmul_bf16_impl<Avx512>,
    matmul_quant_impl<Avx512>,
    dot_impl<Avx512>,
    sum_squares_impl<Avx512>,
    axpy_impl<Avx512>,
    scale_gain_impl<Avx512>,
    attend_impl<Avx512>,
};

}  // namespace

const KernelTable* avx512_kernels() { return &kTable; }

}  // namespace muse::cpu
