// AVX2 + FMA kernel table (this file is compiled with -mavx2 -mfma -mf16c).
#include <immintrin.h>

#include "muse/backends/cpu/kernels.h"
#include "muse/backends/cpu/simd_kernels_impl.h"

namespace muse::cpu {
namespace {

struct Avx2 {
  using Reg = __m256;
  static constexpr int W = 8;
  static constexpr int MR = 2;   // batched: 2 x rows × 4 w rows = 8 accumulators
  static constexpr int NR = 4;
  static constexpr int NR1 = 8;  // decode: 8 weight rows in flight
  static constexpr int QNB1 = 2;  // INT4 decode: 2 × 8 columns (16 registers)
  static constexpr int QNB = 2;
  using IReg = __m256i;
  static Reg zero() { return _mm256_setzero_ps(); }
  static Reg set1(float a) { return _mm256_set1_ps(a); }
  static Reg load(const float* p) { return _mm256_loadu_ps(p); }
  static __m256i mask(int n) {
    return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  }
  static Reg load_n(const float* p, int n) { return _mm256_maskload_ps(p, mask(n)); }
  static Reg load_bf16(const uint16_t* p) {
    __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
    return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
  }
  static Reg load_bf16_n(const uint16_t* p, int n) {
    alignas(16) uint16_t tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    for (int i = 0; i < n; ++i) tmp[i] = p[i];
    return load_bf16(tmp);
  }
  static Reg fma(Reg a, Reg b, Reg c) { return _mm256_fmadd_ps(a, b, c); }
  static Reg mul(Reg a, Reg b) { return _mm256_mul_ps(a, b); }
  static Reg add(Reg a, Reg b) { return _mm256_add_ps(a, b); }
  static Reg sub(Reg a, Reg b) { return _mm256_sub_ps(a, b); }
  // 8 E2M1 codes from 4 bytes, in element order: the dword in every lane,
  // shifted right by 4·lane; the magnitude from bits 0-2 through an 8-entry
  // table (vpermps reads only those), the sign (bit 3) moved to bit 31
  // (code 8 is -0).
  static Reg fp4(const uint8_t* p) {
    int32_t word;
    __builtin_memcpy(&word, p, 4);
    const __m256i idx = _mm256_srlv_epi32(_mm256_set1_epi32(word), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    const Reg mag = _mm256_permutevar8x32_ps(_mm256_setr_ps(0.0f, 0.5f, 1.0f, 1.5f, 2.0f, 3.0f, 4.0f, 6.0f), idx);
    const __m256i sign = _mm256_slli_epi32(_mm256_and_si256(idx, _mm256_set1_epi32(8)), 28);
    return _mm256_xor_ps(mag, _mm256_castsi256_ps(sign));
  }
  // E4M3 as in kernels_avx512.cc: sign-extended bytes, (v << 20) masked to
  // the sign and bits 20-26 (the value times 2^-120), NaN for 0x7F/0xFF;
  // fp8 multiplies by 2^120.
  static __m256i fp8_finite_bits(__m256i v) {  // codes known not to be NaN
    return _mm256_and_si256(_mm256_slli_epi32(v, 20), _mm256_set1_epi32(int(0x87F00000u)));
  }
  static Reg fp8_raw_lanes(__m256i v) {
    const __m256i bits = fp8_finite_bits(v);
    const __m256i nan = _mm256_cmpeq_epi32(_mm256_and_si256(v, _mm256_set1_epi32(0x7F)), _mm256_set1_epi32(0x7F));
    const __m256i nan_bits =
        _mm256_or_si256(_mm256_and_si256(bits, _mm256_set1_epi32(int(0x80000000u))), _mm256_set1_epi32(0x7FC00000));
    return _mm256_castsi256_ps(_mm256_blendv_epi8(bits, nan_bits, nan));
  }
  static Reg fp8_raw(const uint8_t* p) {
    return fp8_raw_lanes(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p))));
  }
  static Reg fp8_raw_n(const uint8_t* p, int n) {
    alignas(16) uint8_t tmp[16] = {0};
    for (int i = 0; i < n; ++i) tmp[i] = p[i];
    return fp8_raw(tmp);
  }
  static Reg fp8_raw_finite(const uint8_t* p) {
    return _mm256_castsi256_ps(fp8_finite_bits(_mm256_cvtepi8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(p)))));
  }
  static bool fp8_any_nan(const uint8_t* p, int64_t n) {
    const __m256i m7f = _mm256_set1_epi8(0x7F);
    int any = 0;
    int64_t i = 0;
    for (; i + 32 <= n; i += 32)
      any |= _mm256_movemask_epi8(
          _mm256_cmpeq_epi8(_mm256_and_si256(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(p + i)), m7f), m7f));
    for (; i < n; ++i) any |= (p[i] & 0x7F) == 0x7F;
    return any != 0;
  }
  static Reg fp8(const uint8_t* p) { return _mm256_mul_ps(fp8_raw(p), _mm256_set1_ps(0x1p120f)); }
  static Reg fp8_n(const uint8_t* p, int n) { return _mm256_mul_ps(fp8_raw_n(p, n), _mm256_set1_ps(0x1p120f)); }
  static IReg iload(const uint8_t* p) { return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p)); }
  static IReg iload_n(const uint8_t* p, int n) { return _mm256_maskload_epi32(reinterpret_cast<const int*>(p), mask(n)); }
  static Reg fnmadd(Reg a, Reg b, Reg c) { return _mm256_fnmadd_ps(a, b, c); }
  static Reg nibf(IReg v, int shift) {
    return _mm256_cvtepi32_ps(_mm256_and_si256(_mm256_srl_epi32(v, _mm_cvtsi32_si128(shift)), _mm256_set1_epi32(15)));
  }
  static Reg zeros4(const uint8_t* p, int n) {
    int32_t word;
    __builtin_memcpy(&word, p, 4);
    const __m256i v = _mm256_srlv_epi32(_mm256_set1_epi32(word), _mm256_setr_epi32(0, 4, 8, 12, 16, 20, 24, 28));
    const Reg z = _mm256_cvtepi32_ps(_mm256_and_si256(v, _mm256_set1_epi32(15)));
    return _mm256_and_ps(z, _mm256_castsi256_ps(mask(n)));
  }
  static Reg load_f16(const uint8_t* p) { return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(p))); }
  static Reg load_f16_n(const uint8_t* p, int n) {
    alignas(16) uint16_t tmp[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    __builtin_memcpy(tmp, p, size_t(n) * 2);
    return load_f16(reinterpret_cast<const uint8_t*>(tmp));
  }
  static void store(float* p, Reg v) { _mm256_storeu_ps(p, v); }
  static void store_n(float* p, Reg v, int n) { _mm256_maskstore_ps(p, mask(n), v); }
  static float hsum(Reg v) {
    __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));  // lanes i + i+4
    s = _mm_add_ps(s, _mm_movehl_ps(s, s));                                        // + i+2
    s = _mm_add_ss(s, _mm_movehdup_ps(s));                                         // + i+1
    return _mm_cvtss_f32(s);
  }
};

const KernelTable kTable = {
    Isa::Avx2,
    Avx2::QNB1 * Avx2::W,
    matmul_f32_impl<Avx2>,
    matmul_bf16_impl<Avx2>,
    matmul_quant_impl<Avx2>,
    dot_impl<Avx2>,
    sum_squares_impl<Avx2>,
    axpy_impl<Avx2>,
    scale_gain_impl<Avx2>,
    attend_impl<Avx2>,
};

}  // namespace

const KernelTable* avx2_kernels() { return &kTable; }

}  // namespace muse::cpu
