// The fixed-order dot product behind project (T <= 64) and the experts:
// one warp computes weight row n against up to kRT activation rows. Lane l
// takes the elements {8l .. 8l+7} + 256i (vector path: K % 8 == 0 and
// 16-byte aligned rows) or {l + 32i} (scalar path), adds them into its own
// fp32 accumulator in that order (fmaf), then the warp adds the 32 lanes by
// a butterfly. A result therefore depends only on the two rows and K, never
// on how many other rows share the launch: decode is batch-invariant.
#pragma once

#include "muse/backends/cuda/cuda_impl.cuh"

namespace muse::cuda {

constexpr int kRT = 8;  // activation rows per warp pass

// A lane's piece (8 elements) as loaded, unconverted: two float4s or one
// uint4 of bf16 (so that AHEAD pieces of both operands fit in registers).
template <typename T>
struct RawPiece;
template <>
struct RawPiece<float> {
  float4 a, b;
  __device__ __forceinline__ void load(const float* p) {
    a = *reinterpret_cast<const float4*>(p), b = *reinterpret_cast<const float4*>(p + 4);
  }
  __device__ __forceinline__ void values(float (&v)[8]) const {
    v[0] = a.x, v[1] = a.y, v[2] = a.z, v[3] = a.w, v[4] = b.x, v[5] = b.y, v[6] = b.z, v[7] = b.w;
  }
};
template <>
struct RawPiece<__nv_bfloat16> {
  uint4 u;
  __device__ __forceinline__ void load(const __nv_bfloat16* p) { u = *reinterpret_cast<const uint4*>(p); }
  __device__ __forceinline__ void values(float (&v)[8]) const {
    const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      v[2 * i] = __uint_as_float(w[i] << 16);
      v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
    }
  }
};

// A lane's piece as fp32 values.
template <typename T>
__device__ __forceinline__ void load8(const T* p, float (&v)[8]) {
  RawPiece<T> r;
  r.load(p);
  r.values(v);
}

// acc[r] += the lane's piece of weights wv (elements k0..k0+7) times the
// same elements of activation row r, for r < nr, in element order: the one
// fold every fixed-order warp dot uses.
template <typename XT>
__device__ __forceinline__ void fold_piece(const float (&wv)[8], const XT* const (&xr)[kRT], int nr, int64_t k0,
                                           float (&acc)[kRT]) {
#pragma unroll
  for (int r = 0; r < kRT; ++r) {
    if (r < nr) {
      float xv[8];
      load8(xr[r] + k0, xv);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc[r] = fmaf(wv[j], xv[j], acc[r]);
    }
  }
}

// acc[r] = Σ_k w[k] · xr[r][k] for r < nr (every lane returns the sums).
template <typename XT, typename WT, bool VEC>
__device__ __forceinline__ void warp_dot(const WT* __restrict__ w, const XT* const (&xr)[kRT], int nr, int64_t K,
                                         int lane, float (&acc)[kRT]) {
#pragma unroll
  for (int r = 0; r < kRT; ++r) acc[r] = 0.0f;
  if constexpr (VEC) {
    // kDotAhead weight pieces are loaded before the first of them is used,
    // so a warp has that many 512-byte reads in flight, not one (a 202,048
    // × 8192 head with fp32 activations ran at 42% of HBM with one). The
    // fmas keep the order of the one-piece loop: the same bits.
    constexpr int kDotAhead = 4;
    int64_t k0 = int64_t(lane) * 8;
    for (; k0 + 256 * (kDotAhead - 1) < K; k0 += 256 * kDotAhead) {
      float wv[kDotAhead][8];
#pragma unroll
      for (int u = 0; u < kDotAhead; ++u) load8(w + k0 + 256 * u, wv[u]);
#pragma unroll
      for (int u = 0; u < kDotAhead; ++u) fold_piece(wv[u], xr, nr, k0 + 256 * u, acc);
    }
    for (; k0 < K; k0 += 256) {
      float wv[8];
      load8(w + k0, wv);
      fold_piece(wv, xr, nr, k0, acc);
    }
  } else {
    for (int64_t k = lane; k < K; k += 32) {
      const float wv = to_f(w[k]);
#pragma unroll
      for (int r = 0; r < kRT; ++r)
        if (r < nr) acc[r] = fmaf(wv, to_f(xr[r][k]), acc[r]);
    }
  }
#pragma unroll
  for (int r = 0; r < kRT; ++r)
    if (r < nr) acc[r] = warp_sum(acc[r]);
}

// warp_dot for one activation row (vector path): AHEAD weight pieces and
// the same AHEAD pieces of x are loaded before the first fold, so a warp
// waits for memory once a batch instead of twice (warp_dot loads x in the
// fold). Short matrices run one warp a row on a few SMs (Spark's 256-expert
// router, fp32 weights: 8 MB on 32 blocks), where that latency is the whole
// time: 22.7 → 16.1 µs a layer (ncu, H200, 2026-12-04). The fmas keep
// warp_dot's order: the same bits (Project.DecodeRowIsBatchInvariant...,
// F32 weights: one row alone against the row in batches).
template <int AHEAD, typename XT, typename WT>
__device__ __forceinline__ float warp_dot_row(const WT* __restrict__ w, const XT* __restrict__ x, int64_t K, int lane) {
  float acc = 0.0f;
  int64_t k0 = int64_t(lane) * 8;
  for (; k0 + 256 * (AHEAD - 1) < K; k0 += 256 * AHEAD) {
    RawPiece<WT> wp[AHEAD];
    RawPiece<XT> xp[AHEAD];
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) wp[u].load(w + k0 + 256 * u), xp[u].load(x + k0 + 256 * u);
#pragma unroll
    for (int u = 0; u < AHEAD; ++u) {
      float wv[8], xv[8];
      wp[u].values(wv), xp[u].values(xv);
#pragma unroll
      for (int j = 0; j < 8; ++j) acc = fmaf(wv[j], xv[j], acc);
    }
  }
  for (; k0 < K; k0 += 256) {
    float wv[8], xv[8];
    load8(w + k0, wv), load8(x + k0, xv);
#pragma unroll
    for (int j = 0; j < 8; ++j) acc = fmaf(wv[j], xv[j], acc);
  }
  return warp_sum(acc);
}

inline bool aligned16(const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; }

}  // namespace muse::cuda
