// Kernel bodies shared by the AVX2 and AVX-512 tables, written once over a
// vector type `V` (see kernels_avx2.cc / kernels_avx512.cc). Included only by
// those files, each compiled with its own ISA flags; everything here has
// internal linkage so the two instantiations can never be merged by the
// linker (which would run AVX-512 code on an AVX2-only machine). No standard
// library templates are used here for the same reason.
//
// V provides: W (lanes), zero(), load(const float*), load_bf16(const
// uint16_t*), load_n / load_bf16_n (first n lanes, rest zero), fma(a, b, c),
// mul, add, set1, store, store_n, hsum (a fixed tree).
#pragma once

#include <cmath>
#include <cstdint>
#include <type_traits>

namespace {

// One output block: MR rows of x times NR rows of w. Each output uses one
// accumulator stepping through K in W-wide chunks, then a zero-padded tail,
// then V::hsum: identical for every (MR, NR), which makes results
// independent of how the work was blocked.
template <class V, int MR, int NR, class WT>
inline void dot_block(const float* x, int64_t ldx, const WT* w, int64_t ldw, int64_t K, float* out, int64_t ldo) {
  typename V::Reg acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = V::zero();
  int64_t k = 0;
  for (; k + V::W <= K; k += V::W) {
    typename V::Reg wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = V::load_w(w + j * ldw + k);
    for (int i = 0; i < MR; ++i) {
      typename V::Reg xv = V::load(x + i * ldx + k);
      for (int j = 0; j < NR; ++j) acc[i][j] = V::fma(xv, wv[j], acc[i][j]);
    }
  }
  if (k < K) {
    int n = int(K - k);
    typename V::Reg wv[NR];
    for (int j = 0; j < NR; ++j) wv[j] = V::load_w_n(w + j * ldw + k, n);
    for (int i = 0; i < MR; ++i) {
      typename V::Reg xv = V::load_n(x + i * ldx + k, n);
      for (int j = 0; j < NR; ++j) acc[i][j] = V::fma(xv, wv[j], acc[i][j]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) out[i * ldo + j] = V::hsum(acc[i][j]);
}

template <class V, int MR, class WT>
inline void dot_rows(const float* x, int64_t ldx, const WT* w, int64_t ldw, int64_t N, int64_t K, float* out,
                     int64_t ldo) {
  constexpr int NR = V::NR;
  int64_t n = 0;
  for (; n + NR <= N; n += NR) dot_block<V, MR, NR>(x, ldx, w + n * ldw, ldw, K, out + n, ldo);
  for (; n < N; ++n) dot_block<V, MR, 1>(x, ldx, w + n * ldw, ldw, K, out + n, ldo);
}

template <class V, class WT>
void matmul_impl(const float* x, int64_t ldx, int64_t T, const WT* w, int64_t ldw, int64_t N, int64_t K, float* out,
                 int64_t ldo) {
  constexpr int MR = V::MR;
  if (T == 1) {  // decode: more weight rows in flight per pass
    constexpr int NR1 = V::NR1;
    int64_t n = 0;
    for (; n + NR1 <= N; n += NR1) dot_block<V, 1, NR1>(x, ldx, w + n * ldw, ldw, K, out + n, ldo);
    for (; n < N; ++n) dot_block<V, 1, 1>(x, ldx, w + n * ldw, ldw, K, out + n, ldo);
    return;
  }
  // Weight rows outer (they stay in L1/L2), x rows inner.
  constexpr int NR = V::NR;
  for (int64_t n = 0; n < N; n += NR) {
    int64_t nb = N - n < NR ? N - n : NR;
    const WT* wb = w + n * ldw;
    int64_t t = 0;
    for (; t + MR <= T; t += MR) {
      if (nb == NR) dot_block<V, MR, NR>(x + t * ldx, ldx, wb, ldw, K, out + t * ldo + n, ldo);
      else dot_rows<V, MR>(x + t * ldx, ldx, wb, ldw, nb, K, out + t * ldo + n, ldo);
    }
    for (; t < T; ++t) {
      if (nb == NR) dot_block<V, 1, NR>(x + t * ldx, ldx, wb, ldw, K, out + t * ldo + n, ldo);
      else dot_rows<V, 1>(x + t * ldx, ldx, wb, ldw, nb, K, out + t * ldo + n, ldo);
    }
  }
}

// Wrappers selecting the weight loader.
template <class V>
struct F32W : V {
  static typename V::Reg load_w(const float* p) { return V::load(p); }
  static typename V::Reg load_w_n(const float* p, int n) { return V::load_n(p, n); }
};
template <class V>
struct Bf16W : V {
  static typename V::Reg load_w(const uint16_t* p) { return V::load_bf16(p); }
  static typename V::Reg load_w_n(const uint16_t* p, int n) { return V::load_bf16_n(p, n); }
};

template <class V>
void matmul_f32_impl(const float* x, int64_t ldx, int64_t T, const float* w, int64_t ldw, int64_t N, int64_t K,
                     float* out, int64_t ldo) {
  matmul_impl<F32W<V>, float>(x, ldx, T, w, ldw, N, K, out, ldo);
}
template <class V>
void matmul_bf16_impl(const float* x, int64_t ldx, int64_t T, const uint16_t* w, int64_t ldw, int64_t N, int64_t K,
                      float* out, int64_t ldo) {
  matmul_impl<Bf16W<V>, uint16_t>(x, ldx, T, w, ldw, N, K, out, ldo);
}

template <class V>
float dot_impl(const float* a, const float* b, int64_t n) {
  typename V::Reg acc = V::zero();
  int64_t i = 0;
  for (; i + V::W <= n; i += V::W) acc = V::fma(V::load(a + i), V::load(b + i), acc);
  if (i < n) acc = V::fma(V::load_n(a + i, int(n - i)), V::load_n(b + i, int(n - i)), acc);
  return V::hsum(acc);
}

// Four accumulators: a long row (8192) is latency-bound with one.
template <class V>
float sum_squares_impl(const float* x, int64_t n) {
  typename V::Reg a0 = V::zero(), a1 = V::zero(), a2 = V::zero(), a3 = V::zero();
  int64_t i = 0;
  for (; i + 4 * V::W <= n; i += 4 * V::W) {
    typename V::Reg v0 = V::load(x + i), v1 = V::load(x + i + V::W);
    typename V::Reg v2 = V::load(x + i + 2 * V::W), v3 = V::load(x + i + 3 * V::W);
    a0 = V::fma(v0, v0, a0);
    a1 = V::fma(v1, v1, a1);
    a2 = V::fma(v2, v2, a2);
    a3 = V::fma(v3, v3, a3);
  }
  for (; i + V::W <= n; i += V::W) {
    typename V::Reg v = V::load(x + i);
    a0 = V::fma(v, v, a0);
  }
  if (i < n) {
    typename V::Reg v = V::load_n(x + i, int(n - i));
    a0 = V::fma(v, v, a0);
  }
  return V::hsum(V::add(V::add(a0, a1), V::add(a2, a3)));
}

template <class V>
void axpy_impl(float a, const float* x, float* y, int64_t n) {
  typename V::Reg av = V::set1(a);
  int64_t i = 0;
  for (; i + V::W <= n; i += V::W) V::store(y + i, V::fma(av, V::load(x + i), V::load(y + i)));
  if (i < n) V::store_n(y + i, V::fma(av, V::load_n(x + i, int(n - i)), V::load_n(y + i, int(n - i))), int(n - i));
}

template <class V>
void scale_gain_impl(float* y, const float* x, float r, const float* gain, int64_t n) {
  typename V::Reg rv = V::set1(r);
  int64_t i = 0;
  if (gain) {
    for (; i + V::W <= n; i += V::W) V::store(y + i, V::mul(V::mul(V::load(x + i), rv), V::load(gain + i)));
    if (i < n) {
      int m = int(n - i);
      V::store_n(y + i, V::mul(V::mul(V::load_n(x + i, m), rv), V::load_n(gain + i, m)), m);
    }
  } else {
    for (; i + V::W <= n; i += V::W) V::store(y + i, V::mul(V::load(x + i), rv));
    if (i < n) V::store_n(y + i, V::mul(V::load_n(x + i, int(n - i)), rv), int(n - i));
  }
}

template <class V>
void attend_impl(const float* q, const float* const* krows, const float* const* vrows, int64_t kv_offset,
                 int64_t nkeys, int64_t d, float scale, float* scores, float* out) {
  float mx = -INFINITY;
  for (int64_t j = 0; j < nkeys; ++j) {
    float s = dot_impl<V>(q, krows[j] + kv_offset, d) * scale;
    scores[j] = s;
    mx = s > mx ? s : mx;
  }
  float sum = 0.0f;
  for (int64_t j = 0; j < nkeys; ++j) {
    float p = std::exp(scores[j] - mx);
    scores[j] = p;
    sum += p;
  }
  for (int64_t i = 0; i < d; ++i) out[i] = 0.0f;
  float inv = 1.0f / sum;
  for (int64_t j = 0; j < nkeys; ++j) axpy_impl<V>(scores[j] * inv, vrows[j] + kv_offset, out, d);
}

}  // namespace

// ---------------------------------------------------------------------------
// Quantized products (kernels.h: matmul_quant). V additionally provides
// IReg, sub, fnmadd, fp4(p) (W E2M1 codes from W/2 bytes, even element in the low
// nibble), fp8(p) / fp8_n(p, n) (W E4M3 bytes), iload / iload_n (W int32),
// nibf(v, shift) (float of (v >> shift) & 15), load_f16 / load_f16_n,
// zeros4(p, n) (n 4-bit zero points packed along N, 8 per word from p).
// ---------------------------------------------------------------------------
namespace {

using QMat = muse::cpu::QuantMatrix;

inline float qscale_value(const QMat& w, int64_t index) {
  if (w.scale_lut) return w.scale_lut[w.scales[index]];
  float s;
  __builtin_memcpy(&s, w.scales + 4 * index, 4);
  return s;
}

// Row-major codes (FP4 / FP8): rows n..n+NR of w against MR rows of x. The
// scale is applied to the decoded codes (the dequantized value, exactly as
// the reference decoders compute it), then the same fma chain, tail and
// tree as dot_block: the result equals matmul_f32 on the dequantized matrix.
// FP8 blocks whose scales are below 2^8 in magnitude take the scale times
// 2^120 against the code's value times 2^-120 (V::fp8_raw): 2^120·s is
// exact there, so each weight is the same single rounding of code·s, one
// multiply fewer per 16 weights; and a block whose codes hold no NaN
// (checked 64 bytes an instruction) decodes without the NaN lanes.
template <class V, int MR, int NR, bool FP4>
inline void qdot_block(const float* x, int64_t ldx, const QMat& w, int64_t n, float* out, int64_t ldo) {
  const int64_t K = w.cols, bc = w.block_cols;
  const int64_t row_bytes = FP4 ? K / 2 : K;
  typename V::Reg acc[MR][NR];
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) acc[i][j] = V::zero();
  const uint8_t* crow[NR];
  int64_t sbase[NR];
  float g[NR];
  for (int j = 0; j < NR; ++j) {
    crow[j] = w.codes + (n + j) * row_bytes;
    sbase[j] = ((n + j) / w.block_rows) * w.scale_ld;
    g[j] = w.global[(n + j) / w.global_rows];
  }
  // One block of columns [kb, ke): the decoded weights times s, into acc.
  auto block = [&](int64_t kb, int64_t ke, const typename V::Reg (&s)[NR], auto raw, auto finite) {
    constexpr bool RAW = decltype(raw)::value, FINITE = decltype(finite)::value;
    auto decode = [&](const uint8_t* p) {
      if constexpr (FP4) return V::fp4(p);
      else if constexpr (RAW && FINITE) return V::fp8_raw_finite(p);
      else if constexpr (RAW) return V::fp8_raw(p);
      else return V::fp8(p);
    };
    int64_t k = kb;
    for (; k + V::W <= ke; k += V::W) {
      typename V::Reg wv[NR];
      for (int j = 0; j < NR; ++j) wv[j] = V::mul(decode(FP4 ? crow[j] + k / 2 : crow[j] + k), s[j]);
      for (int i = 0; i < MR; ++i) {
        typename V::Reg xv = V::load(x + i * ldx + k);
        for (int j = 0; j < NR; ++j) acc[i][j] = V::fma(xv, wv[j], acc[i][j]);
      }
    }
    if (k < ke) {  // only at the end of K (FP4 rows are whole chunks; FP8 blocks are multiples of W or all of K)
      const int r = int(ke - k);
      typename V::Reg wv[NR];
      for (int j = 0; j < NR; ++j) wv[j] = V::mul(RAW ? V::fp8_raw_n(crow[j] + k, r) : V::fp8_n(crow[j] + k, r), s[j]);
      for (int i = 0; i < MR; ++i) {
        typename V::Reg xv = V::load_n(x + i * ldx + k, r);
        for (int j = 0; j < NR; ++j) acc[i][j] = V::fma(xv, wv[j], acc[i][j]);
      }
    }
  };
  int64_t b = 0;
  for (int64_t kb = 0; kb < K; kb += bc, ++b) {
    const int64_t ke = kb + bc < K ? kb + bc : K;
    float sv[NR];
    bool fold = !FP4;
    for (int j = 0; j < NR; ++j) {
      sv[j] = qscale_value(w, sbase[j] + b) * g[j];
      fold = fold && std::fabs(sv[j]) < 256.0f;  // false for inf and NaN too
    }
    typename V::Reg s[NR];
    for (int j = 0; j < NR; ++j) s[j] = V::set1(fold ? sv[j] * 0x1p120f : sv[j]);
    bool finite = fold;
    for (int j = 0; j < NR && finite; ++j) finite = !V::fp8_any_nan(crow[j] + kb, ke - kb);
    if (finite)
      block(kb, ke, s, std::true_type{}, std::true_type{});
    else if (fold)
      block(kb, ke, s, std::true_type{}, std::false_type{});
    else
      block(kb, ke, s, std::false_type{}, std::false_type{});
  }
  for (int i = 0; i < MR; ++i)
    for (int j = 0; j < NR; ++j) out[i * ldo + j] = V::hsum(acc[i][j]);
}

template <class V, bool FP4>
void qmatmul_rows(const float* x, int64_t ldx, int64_t T, const QMat& w, int64_t n0, int64_t N, float* out,
                  int64_t ldo) {
  if (T == 1) {
    constexpr int NR1 = V::NR1;
    int64_t n = 0;
    for (; n + NR1 <= N; n += NR1) qdot_block<V, 1, NR1, FP4>(x, ldx, w, n0 + n, out + n, ldo);
    for (; n < N; ++n) qdot_block<V, 1, 1, FP4>(x, ldx, w, n0 + n, out + n, ldo);
    return;
  }
  constexpr int MR = V::MR, NR = V::NR;
  for (int64_t n = 0; n < N; n += NR) {
    const bool full = N - n >= NR;
    int64_t t = 0;
    for (; t + MR <= T; t += MR) {
      if (full) qdot_block<V, MR, NR, FP4>(x + t * ldx, ldx, w, n0 + n, out + t * ldo + n, ldo);
      else
        for (int64_t j = n; j < N; ++j) qdot_block<V, MR, 1, FP4>(x + t * ldx, ldx, w, n0 + j, out + t * ldo + j, ldo);
    }
    for (; t < T; ++t) {
      if (full) qdot_block<V, 1, NR, FP4>(x + t * ldx, ldx, w, n0 + n, out + t * ldo + n, ldo);
      else
        for (int64_t j = n; j < N; ++j) qdot_block<V, 1, 1, FP4>(x + t * ldx, ldx, w, n0 + j, out + t * ldo + j, ldo);
    }
  }
}

// INT4 (GPTQ layout: words [K/8, N], N contiguous): NB registers of W
// columns starting at column c against MR rows of x; the last register has
// `last` valid lanes. Per group g of G inputs the scale and zero factor out:
// Σ_k x_k·s·(q_k − z) = s·(Σ_k x_k·q_k − z·Σ_k x_k), so the inner loop is a
// nibble to float (V::nibf) and one fma per 16 weights, and each group ends
// with acc = fma(s, a_g − z·xs_g, acc). Every column's output is one fixed
// sequence (k in order, groups in order), whatever the blocking.
constexpr int64_t kInt4Prefetch = 16;  // rows of words ahead

template <class V, int MR, int NB>
inline void int4_block(const float* x, int64_t ldx, const QMat& w, int64_t c, int last, float* out, int64_t ldo) {
  const int64_t K = w.cols, N = w.rows, G = w.block_cols;
  typename V::Reg acc[MR][NB];
  for (int i = 0; i < MR; ++i)
    for (int b = 0; b < NB; ++b) acc[i][b] = V::zero();
  int64_t g = 0;
  for (int64_t k0 = 0; k0 < K; k0 += G, ++g) {
    const int64_t k1 = k0 + G < K ? k0 + G : K;
    typename V::Reg s[NB], z[NB];
    for (int b = 0; b < NB; ++b) {
      const int64_t col = c + b * V::W;
      const int cnt = b == NB - 1 ? last : V::W;
      const uint8_t* sp = w.scales + (g * N + col) * 2;
      if (w.bf16_scales) {
        const uint16_t* bp = reinterpret_cast<const uint16_t*>(sp);
        s[b] = cnt == V::W ? V::load_bf16(bp) : V::load_bf16_n(bp, cnt);
      } else {
        s[b] = cnt == V::W ? V::load_f16(sp) : V::load_f16_n(sp, cnt);
      }
      if (w.zeros && col % 8 == 0) {
        z[b] = V::add(V::zeros4(w.zeros + (g * (N / 8) + col / 8) * 4, cnt), V::set1(float(w.zero_offset)));
      } else {
        float zt[16] = {0};
        for (int l = 0; l < cnt; ++l) {
          const int64_t n = col + l;
          int zv = 8;
          if (w.zeros) {
            uint32_t word;
            __builtin_memcpy(&word, w.zeros + (g * (N / 8) + n / 8) * 4, 4);
            zv = int((word >> (4 * (n % 8))) & 15u) + w.zero_offset;
          }
          zt[l] = float(zv);
        }
        z[b] = V::load(zt);
      }
    }
    typename V::Reg a[MR][NB];
    for (int i = 0; i < MR; ++i)
      for (int b = 0; b < NB; ++b) a[i][b] = V::zero();
    for (int64_t r = k0 / 8; r < k1 / 8; ++r) {
      typename V::IReg q[NB];
      for (int b = 0; b < NB; ++b) {
        const uint8_t* qp = w.codes + (r * N + c + b * V::W) * 4;
        q[b] = (b == NB - 1 && last != V::W) ? V::iload_n(qp, last) : V::iload(qp);
        // Rows are N·4 bytes apart (a new page each for large N), which the
        // hardware prefetcher does not follow: ask for a row well ahead.
        if (r + kInt4Prefetch < K / 8) __builtin_prefetch(qp + kInt4Prefetch * N * 4);
      }
      for (int j = 0; j < 8; ++j) {
        typename V::Reg qf[NB];
        for (int b = 0; b < NB; ++b) qf[b] = V::nibf(q[b], 4 * j);
        for (int i = 0; i < MR; ++i) {
          typename V::Reg xv = V::set1(x[i * ldx + 8 * r + j]);
          for (int b = 0; b < NB; ++b) a[i][b] = V::fma(xv, qf[b], a[i][b]);
        }
      }
    }
    for (int i = 0; i < MR; ++i) {
      // Σ x over the group: W-wide partial sums in order, then the tree.
      typename V::Reg xa = V::zero();
      int64_t k = k0;
      for (; k + V::W <= k1; k += V::W) xa = V::add(xa, V::load(x + i * ldx + k));
      if (k < k1) xa = V::add(xa, V::load_n(x + i * ldx + k, int(k1 - k)));
      const typename V::Reg xsv = V::set1(V::hsum(xa));
      for (int b = 0; b < NB; ++b) acc[i][b] = V::fma(s[b], V::fnmadd(z[b], xsv, a[i][b]), acc[i][b]);
    }
  }
  for (int i = 0; i < MR; ++i)
    for (int b = 0; b < NB; ++b) {
      float* o = out + i * ldo + b * V::W;
      if (b == NB - 1 && last != V::W) V::store_n(o, acc[i][b], last);
      else V::store(o, acc[i][b]);
    }
}

// The columns left after the whole NB-register blocks: one block of `regs`
// (<= NB) registers, the last with `last` lanes. Fewer registers would each be
// one FMA chain: a single register runs at ~40% of NB = 4's rate.
template <class V, int MR, int NB>
void int4_tail(const float* x, int64_t ldx, int64_t t0, int64_t t1, const QMat& w, int64_t c, int regs, int last,
               float* out, int64_t ldo) {
  if constexpr (NB > 1) {
    if (regs < NB) return int4_tail<V, MR, NB - 1>(x, ldx, t0, t1, w, c, regs, last, out, ldo);
  }
  for (int64_t t = t0; t + MR <= t1; t += MR) int4_block<V, MR, NB>(x + t * ldx, ldx, w, c, last, out + t * ldo, ldo);
}

template <class V, int MR, int NB>
void int4_rows(const float* x, int64_t ldx, int64_t t0, int64_t t1, const QMat& w, int64_t n0, int64_t N,
               float* out, int64_t ldo) {
  // Whole NB·W column blocks, then one block of the registers left (the last one partial).
  int64_t n = 0;
  for (; n + NB * V::W <= N; n += NB * V::W)
    for (int64_t t = t0; t + MR <= t1; t += MR) int4_block<V, MR, NB>(x + t * ldx, ldx, w, n0 + n, V::W, out + t * ldo + n, ldo);
  if (n < N) {
    const int regs = int((N - n + V::W - 1) / V::W);
    int4_tail<V, MR, NB>(x, ldx, t0, t1, w, n0 + n, regs, int(N - n - (regs - 1) * V::W), out + n, ldo);
  }
}

template <class V>
void matmul_quant_impl(const float* x, int64_t ldx, int64_t T, const QMat& w, int64_t n0, int64_t N, float* out,
                       int64_t ldo) {
  switch (w.kind) {
    case QMat::Fp4: qmatmul_rows<V, true>(x, ldx, T, w, n0, N, out, ldo); return;
    case QMat::Fp8: qmatmul_rows<V, false>(x, ldx, T, w, n0, N, out, ldo); return;
    case QMat::Int4: {
      if (T == 1) {
        int4_rows<V, 1, V::QNB1>(x, ldx, 0, 1, w, n0, N, out, ldo);
        return;
      }
      constexpr int MR = V::MR;
      const int64_t tm = T / MR * MR;
      int4_rows<V, MR, V::QNB>(x, ldx, 0, tm, w, n0, N, out, ldo);
      int4_rows<V, 1, V::QNB>(x, ldx, tm, T, w, n0, N, out, ldo);
      return;
    }
  }
}

}  // namespace
