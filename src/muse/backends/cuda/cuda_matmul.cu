// project: out[T, N] = x[T, K] · W[N, K]ᵀ, fp32 accumulation.
//  - T <= 64, x and W both BF16, K % 8 == 0, 16-byte aligned rows: the
//    weight-streaming tensor-core kernel below (mma_gemv); T > 64 the same
//    shapes: the tiled GEMM of cuda_mma_gemm.cu, bit for bit the same sums.
//  - T <= 64 otherwise (F32 x or W, odd K): the warp-dot kernel
//    (cuda_dot_gemv.cu, over cuda_dot.cuh).
//    Both have a reduction order that does not depend on T, so a row's
//    result is bitwise the same alone or in a batch of 64.
//  - T > 64 with x and W of one dtype: cuBLASLt (fp32 compute, no TF32;
//    split-K only with out-of-place reductions, so results are
//    deterministic run to run; they may differ from the T <= 64 kernels in
//    the last bits).
//  - otherwise (mixed x/W dtypes, or no cuBLASLt algorithm): our kernels.
//
// mma_gemv (decode: weights streamed once per step for all T <= 64 rows).
//  - A block owns 16·RW·RWARPS weight rows; its warps are RWARPS row groups
//    × kSplit (4) K-slices. K is cut into granules of 128; warp s of a row
//    group takes granules s, s+4, s+8, ... in ascending order.
//  - Per granule a lane loads, with 16-byte loads, 8 consecutive weights
//    at k = 8·(lane%4) + 32j (j < 4) of rows lane/4 and lane/4+8 of each of
//    its 16-row tiles, and the same 8 k of activation row lane/4 of each
//    8-row tile of x. Those are exactly its fragments of
//    mma.m16n8k16.bf16 (with the k of the 16-wide step permuted the same
//    way in A and B), so no shared memory or shuffles are needed.
//  - Each (weight row, activation row) accumulates in fp32 through the
//    tensor cores: 2 mma steps per 32 k, granules in order, then the four
//    K-slices' partials are added in the order s = 0 + 1 + 2 + 3 (shared
//    memory). Tile shapes (RW, RWARPS, the 8-row tiles NT) follow T and N
//    and change only which rows share a block, never that order; kSplit and
//    the granule are fixed. Padded rows and the K tail are zeros. No atomics.
//  Device code built below sm_80 (the mma needs it) keeps the warp-dot
//  kernel for every T <= 64 product.
#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "muse/backends/cuda/cuda_dot.cuh"
#include "muse/backends/cuda/cuda_mma.cuh"
#include "muse/backends/cuda/cuda_quant.cuh"
#include "muse/backends/cuda/cuda_quant_wgmma.h"

namespace muse::cuda {
namespace {

// ---------------------------------------------------------------------------
// mma_gemv
// ---------------------------------------------------------------------------
template <int NT, int RW, int RWARPS>
__global__ void __launch_bounds__(32 * kSplit * RWARPS)
    mma_gemv_kernel(const __nv_bfloat16* __restrict__ x, int64_t T, const __nv_bfloat16* __restrict__ w, int64_t N,
                    int64_t K, void* out, int odt, int64_t ldo, int chain) {
  constexpr int kAcc = RW * NT * 4;
  __shared__ float part[kSplit - 1][RWARPS][NT * 4][32];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int s = warp % kSplit, rg = warp / kSplit;
  const int g = lane >> 2, tq = lane & 3;
  const int64_t t0 = int64_t(blockIdx.y) * 64;
  x += t0 * K;
  const int64_t nt = T - t0 < 64 ? T - t0 : 64;
  const int64_t n0 = (int64_t(blockIdx.x) * RWARPS + rg) * 16 * RW;
  const __nv_bfloat16* wr[RW][2];
  bool wok[RW][2];
#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const int64_t n = n0 + 16 * r + g + 8 * h;
      wok[r][h] = n < N;
      wr[r][h] = w + (n < N ? n : N - 1) * K + 8 * tq;
    }
  const __nv_bfloat16* xr[NT];
  bool xok[NT];
#pragma unroll
  for (int c = 0; c < NT; ++c) {
    const int64_t t = 8 * c + g;
    xok[c] = t < nt;
    xr[c] = x + (t < nt ? t : nt - 1) * K + 8 * tq;
  }
  float acc[RW][NT][4];
#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int c = 0; c < NT; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][c][i] = 0.0f;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const int64_t kmine = K - 8 * tq;  // this lane's k offset is 8·tq: k0 + 8·tq < K <=> k0 < kmine
  chain_start(chain);
  for (int64_t k0 = int64_t(s) * kGranule; k0 < K; k0 += kSplit * kGranule) {
    uint4 a[RW][2][4];
#pragma unroll
    for (int j = 0; j < 4; ++j)
#pragma unroll
      for (int r = 0; r < RW; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h)
          a[r][h][j] = wok[r][h] && k0 + 32 * j < kmine ? ld_stream(wr[r][h] + k0 + 32 * j) : zero;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint4 bv[NT];
#pragma unroll
      for (int c = 0; c < NT; ++c)
        bv[c] = xok[c] && k0 + 32 * j < kmine ? __ldg(reinterpret_cast<const uint4*>(xr[c] + k0 + 32 * j)) : zero;
#pragma unroll
      for (int r = 0; r < RW; ++r)
#pragma unroll
        for (int c = 0; c < NT; ++c) {
          mma16816(acc[r][c], a[r][0][j].x, a[r][1][j].x, a[r][0][j].y, a[r][1][j].y, bv[c].x, bv[c].y);
          mma16816(acc[r][c], a[r][0][j].z, a[r][1][j].z, a[r][0][j].w, a[r][1][j].w, bv[c].z, bv[c].w);
        }
    }
  }
  // The K-slices' partials, added in the order s = 0, 1, 2, 3; one 16-row tile at a time.
  static_assert(kAcc > 0, "");
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    if (r) __syncthreads();  // part is still read for the previous tile
    if (s) {
#pragma unroll
      for (int c = 0; c < NT; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) part[s - 1][rg][c * 4 + i][lane] = acc[r][c][i];
    }
    __syncthreads();
    if (s == 0) {
#pragma unroll
      for (int c = 0; c < NT; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float v = acc[r][c][i];
#pragma unroll
          for (int q = 0; q < kSplit - 1; ++q) v += part[q][rg][c * 4 + i][lane];
          const int64_t n = n0 + 16 * r + g + 8 * (i >> 1), t = 8 * c + 2 * tq + (i & 1);
          if (n < N && t < nt) st(out, odt, (t0 + t) * ldo + n, v);
        }
    }
  }
  chain_end(chain);
}

// mma_gemv with a cp.async ring: the same fragments and order as the kernel
// above through ring_accumulate (cuda_mma.cuh), so the same bits; 16 weight
// rows and up to 64 activation rows per block of 4 K-slice warps.
// ring_tile: weight rows n0..n0 + 15 of w (N rows) against x's activation
// tile of blockIdx.y.
template <int NT, int STAGES>
__device__ __forceinline__ void ring_tile(const __nv_bfloat16* __restrict__ x, int64_t T,
                                          const __nv_bfloat16* __restrict__ w, int64_t N, int64_t n0, int64_t K,
                                          void* out, int odt, int64_t ldo, int chain) {
  extern __shared__ uint4 ring[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int64_t t0 = int64_t(blockIdx.y) * 64;
  x += t0 * K;
  const int64_t nt = T - t0 < 64 ? T - t0 : 64;
  const __nv_bfloat16* wr[1][2];
  bool wok[1][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = n0 + g + 8 * h;
    wok[0][h] = n < N;
    wr[0][h] = w + (n < N ? n : N - 1) * K + 8 * tq;
  }
  const __nv_bfloat16* xr[NT];
  bool xok[NT];
#pragma unroll
  for (int c = 0; c < NT; ++c) {
    const int64_t t = 8 * c + g;
    xok[c] = t < nt;
    xr[c] = x + (t < nt ? t : nt - 1) * K + 8 * tq;
  }
  float acc[1][NT][4];
  ring_accumulate<1, NT, STAGES>(ring, wr, wok, xr, xok, K, warp, lane, acc, chain);
  ring_reduce<1, NT>(ring, warp, lane, acc, [&](int, int c, int i, float v) {
    const int64_t n = n0 + g + 8 * (i >> 1), t = 8 * c + 2 * tq + (i & 1);
    if (n < N && t < nt) st(out, odt, (t0 + t) * ldo + n, v);
  });
  chain_end(chain);
}

template <int NT, int STAGES>
__global__ void __launch_bounds__(32 * kSplit)
    ring_gemv_kernel(const __nv_bfloat16* __restrict__ x, int64_t T, const __nv_bfloat16* __restrict__ w, int64_t N,
                     int64_t K, void* out, int odt, int64_t ldo, int chain) {
  ring_tile<NT, STAGES>(x, T, w, N, int64_t(blockIdx.x) * 16, K, out, odt, ldo, chain);
}

template <int NT, int STAGES>
cudaError_t launch_ring(cudaStream_t s, const __nv_bfloat16* x, int64_t T, const __nv_bfloat16* w, int64_t N,
                        int64_t K, void* out, int odt, int64_t ldo, int chain) {
  // Programmatic dependent launch: the blocks may start while the kernel
  // before is finishing, stream their first weights (which no kernel
  // writes), and wait (griddepcontrol.wait in ring_accumulate) before they
  // read x. Kernels that feed a product (norms, gates, SwiGLU, attention's
  // merge) let it launch early (pdl_launch_dependents).
  return launch_pdl<ring_gemv_kernel<NT, STAGES>>(s, dim3(unsigned((N + 15) / 16), unsigned((T + 63) / 64)),
                                                  dim3(32 * kSplit), ring_bytes<1, NT, STAGES>(), x, T, w, N, K, out,
                                                  odt, ldo, chain);
}

// gate/up and SwiGLU in one launch at 1..8 rows (project_swiglu): a block
// holds 16 gate rows and the same 16 up rows as its two weight tiles
// (ring_accumulate's sums are per tile, so each is its single product's),
// rounds each sum to its product's out dtype and stores silu(γ) · υ as the
// SwiGLU kernels compute it from those stored values: the bits of project
// then swiglu, without SwiGLU's launch and the grid boundary before it.
template <int STAGES>
__global__ void __launch_bounds__(32 * kSplit)
    ring_swiglu_kernel(const __nv_bfloat16* __restrict__ x, int64_t T, const __nv_bfloat16* __restrict__ wg,
                       const __nv_bfloat16* __restrict__ wu, int64_t I, int64_t K, int gdt, int udt, void* act,
                       int adt) {
  extern __shared__ uint4 ring[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int64_t n0 = int64_t(blockIdx.x) * 16;
  const __nv_bfloat16* wr[2][2];
  bool wok[2][2];
  gate_up_tiles(wg, wu, n0, I, K, lane, wr, wok);
  const __nv_bfloat16* xr[1] = {x + (g < T ? g : T - 1) * K + 8 * tq};
  const bool xok[1] = {g < T};
  float acc[2][1][4];
  ring_accumulate<2, 1, STAGES>(ring, wr, wok, xr, xok, K, warp, lane, acc);
  float sums[2][4];
  ring_reduce<2, 1>(ring, warp, lane, acc, [&](int r, int, int i, float v) { sums[r][i] = v; });
  if (warp == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t n = n0 + g + 8 * (i >> 1), t = 2 * tq + (i & 1);
      if (n < I && t < T) {
        const float a = as_stored(gdt, sums[0][i]), b = as_stored(udt, sums[1][i]);
        st(act, adt, t * I + n, a * sigmoidf_(a) * b);
      }
    }
  }
}

// Two stages of the two tiles: 64 KB of ring, three blocks an SM. Glimmer
// 30B, 1K context (H200, 2026-12-04, same call, two rounds): batch 1 14.06 /
// 14.07 ms a step against 14.23 / 14.29 for project then swiglu, batch 2
// 14.26 / 14.27 against 14.40 / 14.32, batch 4 equal; with three stages
// (96 KB, two blocks an SM) 14.37 / 14.38 at batch 1 and 15.54 / 15.61 at
// batch 4, slower than the two ops.
constexpr int kSwigluStages = 2;

cudaError_t launch_ring_swiglu(cudaStream_t s, const Tensor& x, const Tensor& wg, const Tensor& wu, int gdt, int udt,
                               const Tensor& act) {
  return launch_pdl<ring_swiglu_kernel<kSwigluStages>>(
      s, dim3(unsigned((wg.rows() + 15) / 16)), dim3(32 * kSplit), ring_bytes<2, 1, kSwigluStages>(),
      static_cast<const __nv_bfloat16*>(x.data), x.rows(), static_cast<const __nv_bfloat16*>(wg.data),
      static_cast<const __nv_bfloat16*>(wu.data), wg.rows(), x.cols(), gdt, udt, act.data, dt_code(act.dtype));
}

template <int NT>
cudaError_t launch_ring_nt(cudaStream_t s, int stages, const __nv_bfloat16* x, int64_t T, const __nv_bfloat16* w,
                           int64_t N, int64_t K, void* out, int odt, int64_t ldo, int chain) {
  switch (stages) {
    case 2: return launch_ring<NT, 2>(s, x, T, w, N, K, out, odt, ldo, chain);
    case 3: return launch_ring<NT, 3>(s, x, T, w, N, K, out, odt, ldo, chain);
    case 6: return launch_ring<NT, 6>(s, x, T, w, N, K, out, odt, ldo, chain);
    default: return launch_ring<NT, 4>(s, x, T, w, N, K, out, odt, ldo, chain);
  }
}

// Tile shapes: RW 16-row tiles per warp and RWARPS row groups per block,
// chosen by the fixed rule of launch_mma_nt (no autotuning, no switches);
// results are the same bits whatever the tile.
template <int NT, int RW, int RWARPS>
cudaError_t launch_mma_tile(cudaStream_t s, const __nv_bfloat16* x, int64_t T, const __nv_bfloat16* w, int64_t N,
                            int64_t K, void* out, int odt, int64_t ldo, int chain) {
  constexpr int rows = 16 * RW * RWARPS;
  const dim3 grid(unsigned((N + rows - 1) / rows), unsigned((T + 63) / 64));
  return launch_pdl<mma_gemv_kernel<NT, RW, RWARPS>>(s, grid, dim3(32 * kSplit * RWARPS), 0, x, T, w, N, K, out, odt,
                                                     ldo, chain);
}

// The default rule, from the H200 timings of every tile on Glimmer's shapes
// (bench/NOTES.md, 2026-12-01): one row group per block (128 threads) always;
// two 16-row tiles per warp at T 9..16, and at T <= 8 for N >= 16384;
// otherwise one. (Bigger tiles at T > 16 lost to the occupancy they cost.)
template <int NT>
cudaError_t launch_mma_nt(cudaStream_t s, const __nv_bfloat16* x, int64_t T, const __nv_bfloat16* w, int64_t N,
                          int64_t K, void* out, int odt, int64_t ldo, int chain) {
  const int tile = NT == 2 || (NT == 1 && N >= 16384) ? 21 : 11;
  switch (tile) {
    case 11: return launch_mma_tile<NT, 1, 1>(s, x, T, w, N, K, out, odt, ldo, chain);
    case 12: return launch_mma_tile<NT, 1, 2>(s, x, T, w, N, K, out, odt, ldo, chain);
    case 21: return launch_mma_tile<NT, 2, 1>(s, x, T, w, N, K, out, odt, ldo, chain);
    default: return launch_mma_tile<NT, 2, 2>(s, x, T, w, N, K, out, odt, ldo, chain);
  }
}

// The wgmma kernels (cuda_wgmma_gemm.cu): the prefill GEMM and the decode forms.
constexpr bool is_wgmma_variant(int variant) { return variant >= 11 && variant <= 14; }

// The default rule's choice (see below).
int gemv_rule(int64_t T, int64_t K) {
  if (T > 64) return wgmma_gemm_usable() ? 11 : 7;
  if (T > 4 && wgmma_gemm_usable()) return 14;
  if (T <= 8) return 3;
  if (!mma_cluster_built()) return 1;
  return T > 16 && K >= 16384 ? 9 : 8;
}

// variant: 0 the default rule; 1 the register kernel with its tile rule;
// 2, 3, 4, 6 the ring with that many stages; 5 wide_gemv; 7 the tiled
// prefill GEMM (cuda_mma_gemm.cu); 8 and 9 the cluster kernel
// (cuda_mma_cluster.cu) with 3 or 4 stages; 10 the cluster kernel with the
// products of one project() call in one launch (grouped_rule); 11 and 12
// the wgmma kernels (cuda_wgmma_gemm.cu, sm_90a: 256 or 8..64 activation
// rows a tile; the products of one project() call in one launch; variant 7
// or the cluster rule where the device cannot run them; 13 is 12 reading x
// permuted into scratch first above 16 rows, as 11 does; 14 is 13 with
// its 32-row TMA tiles from one row on). Every
// variant gives the same bits, so the rule may pick by shape freely. The
// rule, from the H200 timings of every variant on Glimmer's shapes
// (tests/backend_cuda Timing.DISABLED_DecodeProducts and whole-model `muse
// bench --product-kernel N`, bench/NOTES.md, 2026-12-01): the 3-stage ring
// up to 8 rows (its 48 KB of shared memory leave 4 blocks per SM: 64-90% of
// HBM at 1 row for one product alone); the cluster kernel at 9..64 rows, with
// four stages where K >= 16384 above 16 rows (down at 64 rows: 57% against
// 52%; elsewhere within 2 points), its products grouped; on sm_90a the
// wgmma decode kernel at 17..64 rows instead (T = 64: 50-78% of HBM per
// matrix against 41-67%; at T = 16 the cluster kernel won, on qkv+gate
// 35 µs against 45, and the whole model, 17.85 ms a step against 18.22,
// 2026-12-04), reading x permuted into scratch above 16 rows (variant 13:
// 16-byte copies instead of 4-byte ones; at 64 rows gate+up 168 µs against
// 177, down 85 against 91, the head 735 against 785, the whole batch-64
// step 22.4 ms against 23.8, Timing.DISABLED_DecodeProducts; at 32 rows it
// lost on the short matrices until the copy engine staged it: batch 32
// 17.9-18.1 ms a step against 18.3-18.5 for variant 12, 2026-12-04), and
// the wgmma GEMM above 64 rows (the mma.sync GEMM, variant 7, elsewhere).
// From 5 rows on the wgmma kernel's 32-row TMA tiles of x permuted
// (variant 14; 13 at 17..64 rows) beat both the ring and the cluster kernel
// once the producers wrote x permuted (2026-12-04, whole-model `muse bench
// --product-kernel 14` against the rule, two runs each: batch 8 15.59-15.65
// ms a step against 16.23-16.28, 13 rows 15.72-15.74 against 16.49-16.67,
// 16 rows 15.75-15.88 against 16.34-16.41, 5 rows 15.31-15.42 against
// 15.48-15.56; at 1, 2 and 4 rows the ring stays ahead, 14.91-14.99 ms
// against 15.31 at 4).
// wide_gemv (once the rule at 9..16 rows for the long matrices) lost on the
// whole model: batch 16 at 24.96 ms a step against 19.00 for the cluster
// kernel.
// chain: kChainNext / kChainXReady (cuda_mma.cuh) for the products of one
// project() call; the GEMMs (variants 7, 11, 12, 13 and 14) are never chained.
cudaError_t launch_mma_gemv(cudaStream_t s, const Tensor& x, const Tensor& w, const Tensor& out, int variant,
                            int chain) {
  const int64_t T = x.rows(), K = x.cols(), N = w.rows();
  auto* xp = static_cast<const __nv_bfloat16*>(x.data);
  auto* wp = static_cast<const __nv_bfloat16*>(w.data);
  const int odt = dt_code(out.dtype);
  const int64_t ldo = out.cols();
  if (variant == 15) variant = 0;  // the streamed ring runs only from project() (its backend's buffers): the rule here
  if (variant == 0) {
    variant = gemv_rule(T, K);
    // A short product on the ring (Spark's pre-expert 4096 rows: 256 blocks,
    // two an SM) keeps too few bytes in flight with three stages (2 × 32 KB
    // an SM against ~70 KB of HBM latency at its share of the bandwidth:
    // 57% of HBM, 2026-12-04 ncu); six stages (96 KB a block) still let every
    // block be resident at once. The same bits (stages change no arithmetic).
    // (Where two such blocks fit an SM: Hopper's 228 KB, not Ampere's 164.)
    if (variant == 3 && (N + 15) / 16 <= 2 * int64_t(sm_count()) &&
        smem_per_sm() >= 2 * int(ring_bytes<1, 1, 6>()) + 2048)
      variant = 6;
  }
  if (is_wgmma_variant(variant) && !wgmma_gemm_usable()) variant = 7;  // the same bits, without wgmma
  if (is_wgmma_variant(variant)) return launch_wgmma_gemm(s, x, {&w, 1}, {&out, 1}, variant, nullptr, 0);
  if (variant == 7) return launch_mma_gemm(s, x, w, out);
  if (variant >= 8 && variant <= 10 && !mma_cluster_built()) variant = 1;  // the same bits, without clusters
  if (variant >= 8 && variant <= 10)
    return launch_mma_cluster(s, x, {&w, 1}, {&out, 1}, variant == 9 ? 4 : 3, chain);
  if (variant == 1) {
    if (T <= 8) return launch_mma_nt<1>(s, xp, T, wp, N, K, out.data, odt, ldo, chain);
    if (T <= 16) return launch_mma_nt<2>(s, xp, T, wp, N, K, out.data, odt, ldo, chain);
    if (T <= 32) return launch_mma_nt<4>(s, xp, T, wp, N, K, out.data, odt, ldo, chain);
    return launch_mma_nt<8>(s, xp, T, wp, N, K, out.data, odt, ldo, chain);
  }
  if (variant == 5) {
    return launch_wide_gemv(s, xp, T, wp, N, K, out.data, odt, ldo, chain);
  }
  const int stages = variant;
  if (T <= 8) return launch_ring_nt<1>(s, stages, xp, T, wp, N, K, out.data, odt, ldo, chain);
  if (T <= 16) return launch_ring_nt<2>(s, stages, xp, T, wp, N, K, out.data, odt, ldo, chain);
  if (T <= 32) return launch_ring_nt<4>(s, stages, xp, T, wp, N, K, out.data, odt, ldo, chain);
  return launch_ring_nt<8>(s, stages, xp, T, wp, N, K, out.data, odt, ldo, chain);
}

// Whether the products of one project() call (BF16, mma-eligible, two to
// four of them; the smallest has min_n rows) run as one cluster launch, and
// with how many stages (0: no). At 9..64 rows always (the cluster kernel is
// the rule there). Up to 8 rows only where a product is too short for the
// ring to fill the GPU (fewer than 2048 rows: under 128 ring blocks), as
// K and V are beside Q and the gate: Glimmer's four at 1 / 4 rows 37 / 36 µs
// grouped against 43 / 47 chained; gate and up (19,968 rows each) stay
// chained on the ring (131 against 143 µs at 1 row; bench/NOTES.md).
int grouped_rule(int variant, int64_t T, int64_t K, size_t count, int64_t min_n) {
  if (count < 2 || count > 4 || !mma_cluster_built()) return 0;
  if (variant == 10) return 3;
  if (variant != 0 || T > 64 || (T <= 8 && min_n >= 2048)) return 0;
  return gemv_rule(T, K) == 9 ? 4 : 3;
}

bool mma_gemv_usable() { return mma_gemv_built(); }

// The tensor-core decode kernels' inputs: BF16 x and W, K % 8 == 0, 16-byte aligned rows.
bool mma_eligible(const Tensor& x, const Tensor& w) {
  return x.dtype == DType::BF16 && w.dtype == DType::BF16 && !w.quant && x.cols() % 8 == 0 && aligned16(x.data) &&
         aligned16(w.data) && mma_gemv_usable();
}

int pointer_alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % uintptr_t(al))) al >>= 1;
  return al;
}

cudaDataType_t lt_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

}  // namespace

cudaError_t CudaBackend::launch_project(cudaStream_t s, const Tensor& x, const Projection& p) {
  if (mma_eligible(x, p.weight)) return launch_mma_gemv(s, x, p.weight, p.out, gemv_variant_, 0);
  launch_dot_gemv(s, x, p.weight, p.out);
  return cudaGetLastError();
}

const CudaBackend::LtPlan* CudaBackend::lt_plan(const LtKey& key) {
  auto it = lt_plans_.find(key);
  if (it != lt_plans_.end()) return it->second.ok ? &it->second : nullptr;
  LtPlan plan;
  const cudaDataType_t at = cudaDataType_t(key.adt), ct = cudaDataType_t(key.cdt);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulPreference_t pref = nullptr;
  bool ok = cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) ==
                CUBLAS_STATUS_SUCCESS &&
            // Column-major view: C[N, T] = W[K, N]ᵀ · x[K, T].
            cublasLtMatrixLayoutCreate(&plan.a, at, uint64_t(key.k), uint64_t(key.m), key.k) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&plan.b, at, uint64_t(key.k), uint64_t(key.n), key.k) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&plan.c, ct, uint64_t(key.m), uint64_t(key.n), key.m) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
  if (ok) {
    const uint64_t ws = kLtWorkspace;
    const uint32_t aa = uint32_t(key.align_a), ab = uint32_t(key.align_b), ac = uint32_t(key.align_c);
    // Deterministic reductions only (no in-place split-K accumulation).
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE |
                             CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof(ac));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    ok = cublasLtMatmulAlgoGetHeuristic(lt_, plan.op, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &found) ==
             CUBLAS_STATUS_SUCCESS &&
         found > 0;
    if (ok) plan.algo = result.algo;
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  plan.ok = ok;
  auto& stored = lt_plans_[key] = plan;
  return ok ? &stored : nullptr;
}

cudaError_t CudaBackend::launch_cublaslt(cudaStream_t s, const Tensor& x, const Projection& p) {
  LtKey key{p.weight.rows(), x.rows(), x.cols(), int(lt_type(x.dtype)), int(lt_type(p.out.dtype)),
            pointer_alignment(p.weight.data), pointer_alignment(x.data), pointer_alignment(p.out.data)};
  const LtPlan* plan = lt_plan(key);
  if (!plan) return launch_project(s, x, p);  // no algorithm for this combination: our kernel
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t st = cublasLtMatmul(lt_, plan->op, &alpha, p.weight.data, plan->a, x.data, plan->b, &beta, p.out.data,
                                     plan->c, p.out.data, plan->c, &plan->algo, lt_workspace_, kLtWorkspace, s);
  if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorLaunchFailure;  // reported as this op's failure
  return cudaGetLastError();
}

constexpr int64_t kCublasLtAboveRows = 0;  // 0: never

namespace {
// The product kernel for T rows of K: the forced one, else the rule's.
int product_variant(int forced, int64_t T, int64_t K) {
  return forced && !(forced == 15 && T > 8) ? forced : gemv_rule(T, K);  // 15: the stream at 1..8 rows only
}
// Whether that kernel reads x permuted into scratch: the prefill GEMM, the
// wgmma decode kernel's TMA tiles (variant 14 at every row count, 13 above
// 16 rows).
bool variant_reads_xperm(int variant, int64_t T) { return variant == 11 || variant == 14 || (variant == 13 && T > 16); }
}  // namespace

// Whether a product of x would read it permuted into scratch (the wgmma
// products: BF16 x in 16-byte-aligned rows of a multiple of 8), as
// project() decides it.
bool CudaBackend::offer_xperm(const Tensor& x, size_t offset, int after) {
  const int64_t T = x.rows(), K = x.cols();
  const bool reads_xperm = wgmma_gemm_usable() && variant_reads_xperm(product_variant(gemv_variant_, T, K), T) &&
                           x.dtype == DType::BF16 && K % 8 == 0 && aligned16(x.data) && mma_gemv_usable() &&
                           !(kCublasLtAboveRows > 0 && T > kCublasLtAboveRows);
  if (!reads_xperm || !try_reserve_scratch(offset + size_t(wgmma_xperm_elements(T, K)) * sizeof(__nv_bfloat16)))
    return false;
  xperm_copy_ = {x.data, T, K, in_order_ops_ + after, offset};
  return true;
}

// At 1..4 rows on the ring (the rule's kernels there honour the chain
// flags), for a gate whose 16-row tiles alone fill a wave of the streamed
// ring's blocks; not while profiling, so each op's time stays its own.
// (H100, 2026-12-07: Spark's 8192-row gate (512 tiles) inside attention
// took the NVFP4 slice's batch-1 step from 3.71 to 3.66 ms, the BF16
// slice's equal; Glimmer's 4096 rows (256 tiles) lost 1.5%: its Q/K/V
// call alone and its gate each run short and ramp on their own.)
bool CudaBackend::gate_in_attention(const Tensor& x, const Tensor& weight) const {
  if (profile_ || x.rank != 2 || weight.rank != 2 || weight.cols() != x.cols() || !mma_eligible(x, weight) ||
      x.rows() > 4)
    return false;
  const int64_t wave = stream_sync_.blocks() > 0 ? stream_sync_.blocks() : 3 * int64_t(sm_count());
  if ((weight.rows() + 15) / 16 < wave) return false;
  int variant = product_variant(gemv_variant_, x.rows(), x.cols());
  if (variant == 15) variant = gemv_rule(x.rows(), x.cols());  // a single product runs the rule's kernel (launch_mma_gemv)
  return variant == 2 || variant == 3 || variant == 4 || variant == 6;
}

cudaError_t CudaBackend::launch_gate_product(cudaStream_t s, const Tensor& x, const Projection& p) {
  return launch_mma_gemv(s, x, p.weight, p.out, gemv_variant_, kChainXReady);
}

bool CudaBackend::xperm_ready(const Tensor& x) const {
  return xperm_copy_.op == in_order_ops_ && xperm_copy_.x == x.data && xperm_copy_.rows == x.rows() &&
         xperm_copy_.cols == x.cols();
}

void CudaBackend::project(const Tensor& x, std::span<const Projection> outputs) {
  std::vector<Projection> outs(outputs.begin(), outputs.end());
  for (const auto& p : outs) {
    if (!check(is_float_dtype(x.dtype) && is_float_dtype(p.out.dtype) &&
                   (p.weight.quant || is_float_dtype(p.weight.dtype)) && p.weight.rank == 2 &&
                   p.weight.cols() == x.cols() && p.out.rows() == x.rows() && p.out.cols() == p.weight.rows() &&
                   x.cols() > 0,
               "project", [&] { return describe(x) + " · " + describe(p.weight) + "ᵀ -> " + describe(p.out); }))
      return;
    // Quantized weights: the decoding kernels take BF16 activations (the
    // GPU's activation dtype) in 16-byte-aligned rows.
    if (p.weight.quant) {
      std::string why = quant_unsupported(p.weight);
      if (why.empty() && !(x.dtype == DType::BF16 && x.cols() % 8 == 0 && aligned16(x.data)))
        why = "quantized weights take BF16 activations in 16-byte-aligned rows";
      if (!check(why.empty(), "project", [&] { return describe(x) + " · " + describe(p.weight) + "ᵀ: " + why; }))
        return;
    }
  }
  if (x.rows() == 0) return;
  // fp32 activations with BF16 weights (Spark's head): through the bf16
  // tensor-core products on x split into three bf16 rows
  // (cuda_split_product.cu), at every T, so a row's bits never depend on the
  // batch.
  const bool split = x.dtype == DType::F32 && x.cols() % 8 == 0 && mma_gemv_usable() &&
                     std::all_of(outs.begin(), outs.end(), [&](const Projection& p) {
                       return !p.weight.quant && p.weight.dtype == DType::BF16 && aligned16(p.weight.data);
                     });
  if (split) {
    const int64_t T = x.rows(), K = x.cols();
    int64_t n_max = 0;
    for (const auto& p : outs) n_max = std::max(n_max, p.weight.rows());
    reserve_scratch(split_product_scratch_bytes(T, K, n_max));
    enqueue("project", [this, x, outs, T, K](cudaStream_t s) {
      char* base = static_cast<char*>(scratch());
      Tensor xs{base, DType::BF16, 2, {3 * T, K}};
      void* o3 = base + split_product_xs_bytes(T, K);
      if (cudaError_t e = launch_split3(s, x, xs.data); e != cudaSuccess) return e;
      for (const Projection& p : outs) {
        const Tensor part{o3, DType::F32, 2, {3 * T, p.weight.rows()}};
        if (cudaError_t e = launch_mma_gemv(s, xs, p.weight, part, gemv_variant_, 0); e != cudaSuccess) return e;
        if (cudaError_t e = launch_combine3(s, o3, p.out); e != cudaSuccess) return e;
      }
      return cudaSuccess;
    });
    return;
  }
  // Every T goes through our fixed-order kernels (mma_gemv and its ring,
  // wide and cluster forms up to 64 rows, the tiled GEMM of cuda_mma_gemm.cu
  // above: the same sum order, which depends only on K), so a row's bits do not depend
  // on how a prompt is chunked or what shares its step: prefix caching and
  // chunked prefill then give the same tokens as one whole prefill, as on the
  // CPU. cuBLASLt (kCublasLtAboveRows) is faster for long prefills but its
  // algorithm changes with T; it stays off until a chunk-invariant tensor-core
  // GEMM replaces both (bench/NOTES.md).
  const bool lt = kCublasLtAboveRows > 0 && x.rows() > kCublasLtAboveRows;
  // Quantized weights above 64 rows (at any T where the prefill GEMM is
  // forced, variant 11): the wgmma GEMM of cuda_quant_wgmma.cu where it
  // takes the layout, from x permuted once into scratch per format order;
  // else the per-tile kernels, which re-stream a weight's codes once per 64
  // rows of x. The same bits either way (QuantTest.ProjectGemmGivesThe-
  // PerTileBits). Glimmer's 4 layers (H100, 2026-12-06, per-tile / GEMM, s):
  // FP8 8K 0.370 / 0.096 (BF16 0.084), 128 tokens 0.008 / 0.004; INT4 8K
  // 0.207 / 0.117, 512 tokens 0.016 / 0.008.
  std::vector<int> qgemm(outs.size(), 0);  // quant_gemm_order of a GEMM product, 0: the per-tile kernel
  if (gemv_variant_ == 11 || (gemv_variant_ == 0 && x.rows() > 64)) {
    bool any = false;
    for (size_t i = 0; i < outs.size(); ++i) {
      const Tensor& w = outs[i].weight;
      if (w.quant && quant_gemm_applies(w.quant->format.kind, quant_dev(w), x.data))
        qgemm[i] = quant_gemm_order(w.quant->format.kind), any = true;
    }
    if (any && !try_reserve_scratch(size_t(x.rows() * x.cols()) * sizeof(__nv_bfloat16)))
      std::fill(qgemm.begin(), qgemm.end(), 0);
  }
  // Runs of outputs the chainable decode kernels take (BF16, T <= 64, not
  // the prefill GEMM) launch as a chain that overlaps (kChainNext /
  // kChainXReady, cuda_mma.cuh); each product's bits are its own launch's.
  std::vector<bool> chainable(outs.size());
  const int variant = product_variant(gemv_variant_, x.rows(), x.cols());
  const bool wg = is_wgmma_variant(variant) && wgmma_gemm_usable();
  const bool gemm = variant == 7 || wg;  // never chained
  bool all = true;
  int64_t min_n = INT64_MAX;
  for (size_t i = 0; i < outs.size(); ++i) {
    chainable[i] = !lt && !gemm && mma_eligible(x, outs[i].weight);
    all = all && chainable[i];
    min_n = std::min(min_n, outs[i].weight.rows());
  }
  // The wgmma kernels take every output of the call, four to a launch (each
  // row's bits are its own product's); the prefill GEMM reads x in the mma's
  // order from scratch, written once for all of them, where the scratch can
  // be had (else it copies x's 4-byte pairs into place itself).
  const bool wg_all = wg && !lt && std::all_of(outs.begin(), outs.end(), [&](const Projection& p) {
                        return mma_eligible(x, p.weight);
                      });
  const bool xperm = wg_all && variant_reads_xperm(variant, x.rows()) &&
                     try_reserve_scratch(size_t(wgmma_xperm_elements(x.rows(), x.cols())) * sizeof(__nv_bfloat16));
  // The op before wrote x permuted into scratch already (offer_xperm), at xoff.
  const bool permuted = xperm && xperm_ready(x);
  const size_t xoff = permuted ? xperm_copy_.offset : 0;
  // All of them in one cluster launch where the rule says so (each row's
  // bits are still its own product's).
  const int grouped = all ? grouped_rule(gemv_variant_, x.rows(), x.cols(), outs.size(), min_n) : 0;
  // Where the rule takes the ring (1..4 rows on sm_90a, 1..8 elsewhere), a
  // call of several products with more 16-row tiles than the streamed
  // ring's blocks (a ring launch would run a second, almost empty wave)
  // streams them in equal shares (cuda_stream_product.cu; the ring's bits);
  // forced (variant 15), every call at 1..8 rows. Not on a side branch: the
  // backend has one set of boundary buffers, used in stream order.
  int64_t tiles16 = 0;
  for (const auto& p : outs) tiles16 += (p.weight.rows() + 15) / 16;
  const int64_t stream_blocks = stream_sync_.blocks();
  const bool stream = all && !side_enqueue_ && x.rows() <= 8 && stream_blocks > 0 &&
                      (gemv_variant_ == 15 || (gemv_variant_ == 0 && outs.size() >= 2 && tiles16 > stream_blocks));
  enqueue("project", [this, x, outs, lt, chainable, grouped, wg_all, variant, xperm, permuted, xoff, qgemm,
                       stream](cudaStream_t s) {
    if (stream) {
      for (size_t i = 0; i < outs.size(); i += kClusterGroupMax) {
        const size_t n = std::min<size_t>(kClusterGroupMax, outs.size() - i);
        Tensor ws[kClusterGroupMax], os[kClusterGroupMax];
        for (size_t q = 0; q < n; ++q) ws[q] = outs[i + q].weight, os[q] = outs[i + q].out;
        if (cudaError_t e = launch_stream_product(s, stream_sync_, x, {ws, n}, {os, n}); e != cudaSuccess) return e;
      }
      return cudaSuccess;
    }
    if (wg_all) {
      const bool ready = permuted && xperm_valid();
      void* xp = xperm ? static_cast<char*>(scratch()) + (ready ? xoff : 0) : nullptr;
      if (xperm && !ready)
        if (cudaError_t e = wgmma_permute_x(s, x, xp); e != cudaSuccess) return e;
      for (size_t i = 0; i < outs.size(); i += kClusterGroupMax) {
        const size_t n = std::min<size_t>(kClusterGroupMax, outs.size() - i);
        Tensor ws[kClusterGroupMax], os[kClusterGroupMax];
        for (size_t q = 0; q < n; ++q) ws[q] = outs[i + q].weight, os[q] = outs[i + q].out;
        if (cudaError_t e = launch_wgmma_gemm(s, x, {ws, n}, {os, n}, variant, xp, 0);
            e != cudaSuccess)
          return e;
      }
      return cudaSuccess;
    }
    if (grouped) {
      Tensor ws[kClusterGroupMax], os[kClusterGroupMax];
      for (size_t i = 0; i < outs.size(); ++i) ws[i] = outs[i].weight, os[i] = outs[i].out;
      return launch_mma_cluster(s, x, {ws, outs.size()}, {os, outs.size()}, grouped, 0);
    }
    int xq_order = 0;  // the order x stands in in scratch
    for (size_t i = 0; i < outs.size(); ++i) {
      const Projection& p = outs[i];
      cudaError_t e;
      if (qgemm[i]) {
        const QuantKind kind = p.weight.quant->format.kind;
        auto* xq = static_cast<__nv_bfloat16*>(scratch());
        if (xq_order != qgemm[i]) {
          if (cudaError_t pe = launch_quant_gemm_permute(s, kind, static_cast<const __nv_bfloat16*>(x.data), x.rows(),
                                                         x.cols(), xq);
              pe != cudaSuccess)
            return pe;
          xq_order = qgemm[i];
        }
        e = launch_quant_gemm(s, kind, xq, x.rows(), quant_dev(p.weight), p.out.data, dt_code(p.out.dtype),
                              p.out.cols());
      } else if (chainable[i]) {
        const int chain = (i > 0 && chainable[i - 1] ? kChainXReady : 0) |
                          (i + 1 < outs.size() && chainable[i + 1] ? kChainNext : 0);
        e = launch_mma_gemv(s, x, p.weight, p.out, gemv_variant_, chain);
      } else {
        e = p.weight.quant                      ? launch_quant_project(s, x, p.weight, p.out)
            : lt && x.dtype == p.weight.dtype ? launch_cublaslt(s, x, p)
                                              : launch_project(s, x, p);
      }
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  });
}

// The ring's 1..8 rows (the rule's 1..4; any ring variant, the fused kernel
// has its own stage count) fuse gate/up and SwiGLU (ring_swiglu_kernel: the
// same bits); elsewhere, and for layouts the ring
// does not take, the two ops run as the default composes them.
void CudaBackend::project_swiglu(const Tensor& x, const Projection& gate, const Projection& up, const Tensor& act) {
  const int64_t T = x.rows(), K = x.cols(), I = gate.weight.rows();
  const int variant = product_variant(gemv_variant_, T, K);
  const auto stored = [](DType t) { return t == DType::BF16 || t == DType::F32; };
  const bool ring = variant == 2 || variant == 3 || variant == 4 || variant == 6;
  const bool fused = ring && x.rank == 2 && T >= 1 && T <= 8 && mma_eligible(x, gate.weight) &&
                     mma_eligible(x, up.weight) && gate.weight.rank == 2 && up.weight.rank == 2 &&
                     gate.weight.cols() == K && up.weight.rows() == I && up.weight.cols() == K &&
                     stored(gate.out.dtype) && stored(up.out.dtype) && stored(act.dtype) && act.rank == 2 &&
                     act.rows() == T && act.cols() == I && I > 0;
  if (!fused) return Backend::project_swiglu(x, gate, up, act);
  const int gdt = dt_code(gate.out.dtype), udt = dt_code(up.out.dtype);
  enqueue("project", [=](cudaStream_t s) { return launch_ring_swiglu(s, x, gate.weight, up.weight, gdt, udt, act); });
}

}  // namespace muse::cuda
