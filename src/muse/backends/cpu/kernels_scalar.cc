// The scalar kernel table: plain loops, sequential fp32 sums. It is the
// fallback on CPUs without AVX2 and a readable statement of what the SIMD
// tables compute (they differ only in summation order). Also ISA selection.
#include <array>
#include <cmath>
#include <cstring>

#include "muse/backends/cpu/kernels.h"
#include "muse/core/dtype.h"

namespace muse::cpu {
namespace {

inline float bf16_value(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  __builtin_memcpy(&f, &u, 4);
  return f;
}
inline float weight_value(float w) { return w; }
inline float weight_value(uint16_t w) { return bf16_value(w); }

template <class WT>
void matmul_scalar(const float* x, int64_t ldx, int64_t T, const WT* w, int64_t ldw, int64_t N, int64_t K, float* out,
                   int64_t ldo) {
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < K; ++k) acc += x[t * ldx + k] * weight_value(w[n * ldw + k]);
      out[t * ldo + n] = acc;
    }
  }
}

// The scalar statement of matmul_quant: the dequantized value of every
// code, exactly as loading/quant.cc's reference decoders compute it, summed
// in order.
float quant_scale(const QuantMatrix& w, int64_t n, int64_t k) {
  const int64_t i = (n / w.block_rows) * w.scale_ld + k / w.block_cols;
  float s;
  if (w.scale_lut) s = w.scale_lut[w.scales[i]];
  else std::memcpy(&s, w.scales + 4 * i, 4);
  return s * w.global[n / w.global_rows];
}

float quant_value(const QuantMatrix& w, int64_t n, int64_t k) {
  if (w.kind == QuantMatrix::Fp4) {
    const uint8_t byte = w.codes[n * (w.cols / 2) + k / 2];
    return e2m1_to_f32(k % 2 ? byte >> 4 : byte & 15) * quant_scale(w, n, k);
  }
  if (w.kind == QuantMatrix::Fp8) return f8_e4m3_to_f32(w.codes[n * w.cols + k]) * quant_scale(w, n, k);
  const int64_t N = w.rows, g = k / w.block_cols;
  uint32_t word;
  std::memcpy(&word, w.codes + ((k / 8) * N + n) * 4, 4);
  const int q = int((word >> (4 * (k % 8))) & 15u);
  int z = 8;
  if (w.zeros) {
    std::memcpy(&word, w.zeros + (g * (N / 8) + n / 8) * 4, 4);
    z = int((word >> (4 * (n % 8))) & 15u) + w.zero_offset;
  }
  uint16_t h;
  std::memcpy(&h, w.scales + (g * N + n) * 2, 2);
  return (w.bf16_scales ? bf16_to_f32(h) : f16_to_f32(h)) * float(q - z);
}

void matmul_quant_scalar(const float* x, int64_t ldx, int64_t T, const QuantMatrix& w, int64_t n0, int64_t N,
                         float* out, int64_t ldo) {
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      float acc = 0.0f;
      for (int64_t k = 0; k < w.cols; ++k) acc += x[t * ldx + k] * quant_value(w, n0 + n, k);
      out[t * ldo + n] = acc;
    }
}

float dot_scalar(const float* a, const float* b, int64_t n) {
  float acc = 0.0f;
  for (int64_t i = 0; i < n; ++i) acc += a[i] * b[i];
  return acc;
}

float sum_squares_scalar(const float* x, int64_t n) { return dot_scalar(x, x, n); }

void axpy_scalar(float a, const float* x, float* y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] += a * x[i];
}

void scale_gain_scalar(float* y, const float* x, float r, const float* gain, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = gain ? x[i] * r * gain[i] : x[i] * r;
}

void attend_scalar(const float* q, const float* const* krows, const float* const* vrows, int64_t kv_offset,
                   int64_t nkeys, int64_t d, float scale, float* scores, float* out) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < nkeys; ++j) {
    scores[j] = dot_scalar(q, krows[j] + kv_offset, d) * scale;
    mx = scores[j] > mx ? scores[j] : mx;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < nkeys; ++j) {
    scores[j] = std::exp(scores[j] - mx);
    sum += scores[j];
  }
  for (int64_t i = 0; i < d; ++i) out[i] = 0.0f;
  float inv = 1.0f / sum;
  for (int64_t j = 0; j < nkeys; ++j) axpy_scalar(scores[j] * inv, vrows[j] + kv_offset, out, d);
}

const KernelTable kScalar = {
    Isa::Scalar,
    1,
    matmul_scalar<float>,
    matmul_scalar<uint16_t>,
    matmul_quant_scalar,
    dot_scalar,
    sum_squares_scalar,
    axpy_scalar,
    scale_gain_scalar,
    attend_scalar,
};

}  // namespace

const char* isa_name(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return "scalar";
    case Isa::Avx2: return "avx2";
    case Isa::Avx512: return "avx512";
  }
  return "?";
}

const KernelTable* scalar_kernels() { return &kScalar; }

const float* e4m3_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[size_t(i)] = f8_e4m3_to_f32(uint8_t(i));
    return a;
  }();
  return t.data();
}

const float* e8m0_table() {
  static const std::array<float, 256> t = [] {
    std::array<float, 256> a{};
    for (int i = 0; i < 256; ++i) a[size_t(i)] = f8_e8m0_to_f32(uint8_t(i));
    return a;
  }();
  return t.data();
}

bool cpu_has_avx2() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
#else
  return false;
#endif
}

bool cpu_has_avx512() {
#if defined(__x86_64__)
  __builtin_cpu_init();
  return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
         __builtin_cpu_supports("avx512vl") && __builtin_cpu_supports("avx512dq") && cpu_has_avx2();
#else
  return false;
#endif
}

const KernelTable* kernels_for(Isa isa) {
  switch (isa) {
    case Isa::Scalar: return scalar_kernels();
    case Isa::Avx2: return cpu_has_avx2() ? avx2_kernels() : nullptr;
    case Isa::Avx512: return cpu_has_avx512() ? avx512_kernels() : nullptr;
  }
  return nullptr;
}

const KernelTable& best_kernels() {
  static const KernelTable* best = cpu_has_avx512() ? avx512_kernels()
                                   : cpu_has_avx2() ? avx2_kernels()
                                                    : scalar_kernels();
  return *best;
}

}  // namespace muse::cpu
