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
    matmul_f32_impl<Avx2>,
    matmul_bf16_impl<Avx2>,
    dot_impl<Avx2>,
    sum_squares_impl<Avx2>,
    axpy_impl<Avx2>,
    scale_gain_impl<Avx2>,
    attend_impl<Avx2>,
};

}  // namespace

const KernelTable* avx2_kernels() { return &kTable; }

}  // namespace muse::cpu
