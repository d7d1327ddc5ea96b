// The sigmoid router and the latent experts.
//
// moe_route: one block per row; p = σ(z · multiplier) in fp32; k rounds of an
// argmax of p + bias (ties to the lower index; one warp's rounds where that
// order is total, else the block's); weights p / (Σ p_top + 1e-15) · scaling,
// summed in selection order.
//
// moe_experts: the T·k (token, slot) pairs are grouped by expert on the
// device (a counting sort in pair order: deterministic), cut into tiles of
// at most kRT pairs of one expert, and each tile is multiplied by its
// expert's weights with the fixed-order warp dot of cuda_dot.cuh: gate/up
// rows → a = silu(γ) ⊙ υ (fp32 scratch), then down rows → y (fp32 scratch).
// Finally each token's k outputs are normed (ŷ = rms(y ⊙ c)) and summed with
// the router weights in the order of `ids`, and stored once. A pair's
// values never depend on which other pairs share its tile, so a token's
// result is the same alone or in any batch. With BF16 activations and
// experts the two products run on the tensor cores instead (below), and in
// steps with many pairs an expert (prefill) as one grouped wgmma GEMM of
// up to 256 pairs a tile (cuda_moe_wgmma.cu; quantized experts:
// cuda_quant_wgmma.cu), with the same bits.
#include <algorithm>

#include "muse/backends/cuda/cuda_dot.cuh"
#include "muse/backends/cuda/cuda_mma.cuh"
#include "muse/backends/cuda/cuda_moe_combine.h"
#include "muse/backends/cuda/cuda_quant_wgmma.h"
#include "muse/backends/cuda/cuda_quant.cuh"

namespace muse::cuda {
namespace {

constexpr int kWarps = 8;
constexpr int kRowsPerWarp = 4;
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;
constexpr int kWarpRouteExperts = 1024;  // moe_route's one-warp rounds: up to 32 experts a lane
// Experts per layer: the router and the grouping keep 2 words per expert in
// shared memory (32 KB at 4096, under the 48 KB default).

struct Pick {
  float v;
  int i;  // -1: none
};
__device__ __forceinline__ bool better(const Pick& a, const Pick& b) {
  if (a.i < 0) return false;
  if (b.i < 0) return true;
  return a.v > b.v || (a.v == b.v && a.i < b.i);
}

// PER: experts a lane of the one-warp rounds holds (E <= 32 · PER); 0: the
// block rounds only.
template <int PER>
__global__ void moe_route_kernel(int32_t* ids, float* weights, const float* logits, const float* bias, int E, int K,
                                 float multiplier, float scaling) {
  pdl_launch_dependents();  // light: the grouping may launch; it waits for us
  pdl_wait();
  extern __shared__ float sm[];
  float* p = sm;         // [E]
  float* sel = sm + E;   // [E]
  __shared__ Pick warp_best[32];
  __shared__ int chosen[kMoeMaxTopK];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    const float z = logits[t * E + e] * multiplier;
    p[e] = 1.0f / (1.0f + expf(-z));
    sel[e] = bias ? p[e] + bias[e] : p[e];
  }
  // The k best of (p + bias, then the lower index). Where no value is NaN
  // that order is total, so k rounds of a warp argmax pick what k rounds of
  // the block argmax below pick, in the same order: warp 0 alone, with each
  // lane's experts (lane, lane + 32, ...) in registers and no barrier per
  // round (ncu, one row of 256 experts, top-8: 12.8 µs with the block
  // rounds' barriers and serial merges, 10.1 µs with the warp's; the rest is
  // the kernel's fixed latency). With a NaN, or more than kWarpRouteExperts,
  // the block rounds decide, as before.
  const bool any_nan = __syncthreads_or([&] {
    int n = 0;
    for (int e = threadIdx.x; e < E; e += blockDim.x) n |= isnan(sel[e]);
    return n;
  }());
  if (PER > 0 && !any_nan) {
    if (warp == 0) {
      constexpr int kPer = PER > 0 ? PER : 1;
      float v[kPer];
#pragma unroll
      for (int j = 0; j < kPer; ++j) v[j] = lane + 32 * j < E ? sel[lane + 32 * j] : 0.0f;
      uint32_t taken = 0;  // bit j: expert lane + 32 j chosen (or absent)
#pragma unroll
      for (int j = 0; j < kPer; ++j)
        if (lane + 32 * j >= E) taken |= 1u << j;
      for (int k = 0; k < K; ++k) {
        Pick best{0.0f, -1};
#pragma unroll
        for (int j = 0; j < kPer; ++j) {
          const Pick c{v[j], (taken >> j) & 1u ? -1 : lane + 32 * j};
          if (better(c, best)) best = c;
        }
#pragma unroll
        for (int o = 16; o > 0; o >>= 1) {
          const Pick c{__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.i, o)};
          if (better(c, best)) best = c;
        }
        // K <= E: some expert is left, and every lane holds the same winner.
        if ((best.i & 31) == lane) taken |= 1u << (best.i >> 5);
        if (lane == 0) chosen[k] = best.i;
      }
    }
    __syncthreads();
  } else {
    for (int k = 0; k < K; ++k) {
      Pick best{0.0f, -1};
      for (int e = threadIdx.x; e < E; e += blockDim.x) {
        bool taken = false;
        for (int j = 0; j < k; ++j) taken |= chosen[j] == e;
        const Pick c{sel[e], taken ? -1 : e};
        if (better(c, best)) best = c;
      }
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) {
        const Pick c{__shfl_xor_sync(0xffffffffu, best.v, o), __shfl_xor_sync(0xffffffffu, best.i, o)};
        if (better(c, best)) best = c;
      }
      if (lane == 0) warp_best[warp] = best;
      __syncthreads();
      if (threadIdx.x == 0) {
        Pick b = warp_best[0];
        for (int w = 1; w < nw; ++w)
          if (better(warp_best[w], b)) b = warp_best[w];
        chosen[k] = b.i < 0 ? 0 : b.i;  // all NaN: degenerate, keep a valid id
      }
      __syncthreads();
    }
  }
  if (threadIdx.x == 0) {
    float sum = 0.0f;
    for (int k = 0; k < K; ++k) sum += p[chosen[k]];
    const float denom = sum + 1e-15f;
    for (int k = 0; k < K; ++k) {
      ids[t * K + k] = chosen[k];
      weights[t * K + k] = p[chosen[k]] / denom * scaling;
    }
  }
}

// Groups pairs by expert. Scratch: order[R] (pair of each grouped row),
// slot_of[R] (grouped row of each pair, -1 when its id is bad or, with
// expert parallelism, another rank's), tiles [3 * max_tiles] (expert, first
// grouped row, rows) and the tile count. base < 0: every expert is here;
// else the weights hold experts [base, base + E) and ids are offset by base.
__device__ __forceinline__ int local_expert(int id, int base) { return base < 0 ? id : id - base; }

//
// big > 0 (the grouped GEMM, cuda_moe_wgmma.cu): also each expert's first
// grouped row, starts_out[E + 1], and its first tile of `big` rows,
// tile_starts_out[E + 1].
__global__ void moe_group_kernel(const int32_t* ids, int R, int E, int base, int32_t* order, int32_t* slot_of,
                                 int32_t* tiles, int32_t* ntiles, DeviceError* err, int op, int big,
                                 int32_t* starts_out, int32_t* tile_starts_out) {
  pdl_launch_dependents();  // light: the experts' product may launch; it waits for us
  pdl_wait();
  extern __shared__ int32_t cnt[];  // count[E], start[E + 1]
  int32_t* start = cnt + E;
  for (int r = threadIdx.x; r < R; r += blockDim.x) {
    slot_of[r] = -1;
    if (base < 0 && (ids[r] < 0 || ids[r] >= E)) report_error(err, op, kErrExpert, ids[r], E);
  }
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int c = 0;
    for (int r = 0; r < R; ++r) c += local_expert(ids[r], base) == e;
    cnt[e] = c;
  }
  __syncthreads();
  // Experts' starts and tile offsets: a block-wide exclusive scan of (pairs,
  // tiles) over contiguous runs of experts per thread (the serial loop of
  // one thread over 256 experts took ~10 of this kernel's 17 µs). The same
  // order, starts and tiles as that loop.
  {
    __shared__ int wc[32], wt[32], wb[32];
    const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = (blockDim.x + 31) >> 5;
    const int per = (E + int(blockDim.x) - 1) / int(blockDim.x);
    const int e0 = min(E, int(threadIdx.x) * per), e1 = min(E, e0 + per);
    const int bt = big > 0 ? big : 1;
    int c = 0, n = 0, b = 0;
    for (int e = e0; e < e1; ++e) c += cnt[e], n += (cnt[e] + kRT - 1) / kRT, b += (cnt[e] + bt - 1) / bt;
    int ci = c, ni = n, bi = b;  // inclusive scan within the warp
#pragma unroll
    for (int o = 1; o < 32; o <<= 1) {
      const int uc = __shfl_up_sync(0xffffffffu, ci, o), un = __shfl_up_sync(0xffffffffu, ni, o),
                ub = __shfl_up_sync(0xffffffffu, bi, o);
      if (lane >= o) ci += uc, ni += un, bi += ub;
    }
    if (lane == 31) wc[warp] = ci, wt[warp] = ni, wb[warp] = bi;
    __syncthreads();
    int cb = 0, nb = 0, bb = 0;
    for (int w = 0; w < warp; ++w) cb += wc[w], nb += wt[w], bb += wb[w];
    int g = cb + ci - c, nt = nb + ni - n, btile = bb + bi - b;  // exclusive
    for (int e = e0; e < e1; ++e) {
      start[e] = g;
      if (big > 0) starts_out[e] = g, tile_starts_out[e] = btile, btile += (cnt[e] + bt - 1) / bt;
      for (int g0 = g; g0 < g + cnt[e]; g0 += kRT)
        tiles[3 * nt] = e, tiles[3 * nt + 1] = g0, tiles[3 * nt + 2] = min(kRT, g + cnt[e] - g0), ++nt;
      g += cnt[e];
    }
    if (threadIdx.x == blockDim.x - 1) {
      int tc = 0, tn = 0, tb = 0;
      for (int w = 0; w < nw; ++w) tc += wc[w], tn += wt[w], tb += wb[w];
      start[E] = tc, *ntiles = tn;
      if (big > 0) starts_out[E] = tc, tile_starts_out[E] = tb;
    }
  }
  __syncthreads();
  for (int e = threadIdx.x; e < E; e += blockDim.x) {
    int g = start[e];
    for (int r = 0; r < R; ++r)
      if (local_expert(ids[r], base) == e) order[g] = r, slot_of[r] = g++;
  }
}

// a[g, i] = silu(u_g · gate_up[e, i]) · (u_g · gate_up[e, I + i]).
template <typename XT, typename WT, bool VEC>
__global__ void __launch_bounds__(256) moe_gate_up_kernel(const XT* __restrict__ u, int64_t Hm, int K,
                                                          const WT* __restrict__ gate_up, int64_t I,
                                                          const int32_t* order, const int32_t* tiles,
                                                          const int32_t* ntiles, float* A) {
  if (int(blockIdx.y) >= *ntiles) return;
  const int e = tiles[3 * blockIdx.y], g0 = tiles[3 * blockIdx.y + 1], nr = tiles[3 * blockIdx.y + 2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const XT* xr[kRT];
#pragma unroll
  for (int r = 0; r < kRT; ++r) xr[r] = u + int64_t(order[g0 + min(r, nr - 1)] / K) * Hm;
  const WT* w = gate_up + int64_t(e) * 2 * I * Hm;
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int64_t i = int64_t(blockIdx.x) * kRowsPerBlock + warp * kRowsPerWarp + j;
    if (i >= I) break;
    float gv[kRT], uv[kRT];
    warp_dot<XT, WT, VEC>(w + i * Hm, xr, nr, Hm, lane, gv);
    warp_dot<XT, WT, VEC>(w + (I + i) * Hm, xr, nr, Hm, lane, uv);
#pragma unroll
    for (int r = 0; r < kRT; ++r)
      if (r < nr && lane == r) A[int64_t(g0 + r) * I + i] = gv[r] / (1.0f + expf(-gv[r])) * uv[r];
  }
}

// y[g, n] = a_g · down[e, n].
template <typename WT, bool VEC>
__global__ void __launch_bounds__(256) moe_down_kernel(const float* __restrict__ A, int64_t I,
                                                       const WT* __restrict__ down, int64_t Hm, const int32_t* tiles,
                                                       const int32_t* ntiles, float* Y) {
  if (int(blockIdx.y) >= *ntiles) return;
  const int e = tiles[3 * blockIdx.y], g0 = tiles[3 * blockIdx.y + 1], nr = tiles[3 * blockIdx.y + 2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const float* xr[kRT];
#pragma unroll
  for (int r = 0; r < kRT; ++r) xr[r] = A + int64_t(g0 + min(r, nr - 1)) * I;
  const WT* w = down + int64_t(e) * Hm * I;
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + warp * kRowsPerWarp + j;
    if (n >= Hm) break;
    float acc[kRT];
    warp_dot<float, WT, VEC>(w + n * I, xr, nr, I, lane, acc);
#pragma unroll
    for (int r = 0; r < kRT; ++r)
      if (r < nr && lane == r) Y[int64_t(g0 + r) * Hm + n] = acc[r];
  }
}

// The same two products on the tensor cores (BF16 activations and experts,
// widths multiples of 8): ring_accumulate (cuda_mma.cuh) over one grouping
// tile (at most kRT = 8 pairs = one 8-row activation tile) per blockIdx.y and
// 16 weight rows per blockIdx.x; a pair's values depend only on its own row
// (fixed-order mma), never on the tile's other pairs. gate/up: the warp
// holds gate rows i.. and up rows I + i.. as its two weight tiles, so
// a = silu(γ) ⊙ υ is formed where both sums land; a is stored in bf16 (the
// down product's mma input), y in fp32.
constexpr int kMoeGateUpStages = 2;  // 2 weight tiles per warp: 64 KB of ring per block
constexpr int kMoeDownStages = 3;    // 48 KB

__global__ void __launch_bounds__(32 * kSplit)
    moe_gate_up_mma_kernel(const __nv_bfloat16* __restrict__ u, int64_t Hm, int K,
                           const __nv_bfloat16* __restrict__ gate_up, int64_t I, const int32_t* order,
                           const int32_t* tiles, const int32_t* ntiles, __nv_bfloat16* A) {
  pdl_wait();  // launched with PDL: the grouping before us; no early trigger (a heavy product)
  extern __shared__ uint4 ring[];
  if (int(blockIdx.y) >= *ntiles) return;
  const int e = tiles[3 * blockIdx.y], g0 = tiles[3 * blockIdx.y + 1], nr = tiles[3 * blockIdx.y + 2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t i0 = int64_t(blockIdx.x) * 16;
  const __nv_bfloat16* w = gate_up + int64_t(e) * 2 * I * Hm;
  const __nv_bfloat16* wr[2][2];
  bool wok[2][2];
  gate_up_tiles(w, w + I * Hm, i0, I, Hm, lane, wr, wok);
  const __nv_bfloat16* xr[1] = {u + int64_t(order[g0 + min(g, nr - 1)] / K) * Hm + 8 * tq};
  const bool xok[1] = {g < nr};
  float acc[2][1][4];
  ring_accumulate<2, 1, kMoeGateUpStages>(ring, wr, wok, xr, xok, Hm, warp, lane, acc);
  float sums[2][4];
  ring_reduce<2, 1>(ring, warp, lane, acc, [&](int r, int, int i, float v) { sums[r][i] = v; });
  if (warp == 0) {
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      const int64_t n = i0 + g + 8 * (i >> 1);
      const int t = 2 * tq + (i & 1);
      const float gv = sums[0][i], uv = sums[1][i];
      if (n < I && t < nr) A[int64_t(g0 + t) * I + n] = __float2bfloat16_rn(gv / (1.0f + expf(-gv)) * uv);
    }
  }
}

__global__ void __launch_bounds__(32 * kSplit)
    moe_down_mma_kernel(const __nv_bfloat16* __restrict__ A, int64_t I, const __nv_bfloat16* __restrict__ down,
                        int64_t Hm, const int32_t* tiles, const int32_t* ntiles, float* Y) {
  pdl_wait();  // the gate/up product before us
  extern __shared__ uint4 ring[];
  if (int(blockIdx.y) >= *ntiles) return;
  const int e = tiles[3 * blockIdx.y], g0 = tiles[3 * blockIdx.y + 1], nr = tiles[3 * blockIdx.y + 2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t n0 = int64_t(blockIdx.x) * 16;
  const __nv_bfloat16* w = down + int64_t(e) * Hm * I;
  const __nv_bfloat16* wr[1][2];
  bool wok[1][2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = n0 + g + 8 * h;
    wok[0][h] = n < Hm;
    wr[0][h] = w + (n < Hm ? n : Hm - 1) * I + 8 * tq;
  }
  const __nv_bfloat16* xr[1] = {A + int64_t(g0 + min(g, nr - 1)) * I + 8 * tq};
  const bool xok[1] = {g < nr};
  float acc[1][1][4];
  ring_accumulate<1, 1, kMoeDownStages>(ring, wr, wok, xr, xok, I, warp, lane, acc);
  ring_reduce<1, 1>(ring, warp, lane, acc, [&](int, int, int i, float v) {
    const int64_t n = n0 + g + 8 * (i >> 1);
    const int t = 2 * tq + (i & 1);
    if (n < Hm && t < nr) Y[int64_t(g0 + t) * Hm + n] = v;
  });
}

cudaError_t launch_experts_mma(cudaStream_t s, const Tensor& u, const Tensor& gate_up, const Tensor& down, int K,
                               const int32_t* order, const int32_t* tiles, const int32_t* ntiles, int max_tiles,
                               __nv_bfloat16* A, float* Y) {
  const int64_t Hm = u.cols(), I = down.dim(2);
  constexpr size_t gu_smem = ring_bytes<2, 1, kMoeGateUpStages>(), dn_smem = ring_bytes<1, 1, kMoeDownStages>();
  cudaError_t e = launch_pdl<moe_gate_up_mma_kernel>(
      s, dim3(blocks_for(I, 16), unsigned(max_tiles)), dim3(32 * kSplit), gu_smem,
      static_cast<const __nv_bfloat16*>(u.data), Hm, K, static_cast<const __nv_bfloat16*>(gate_up.data), I, order,
      tiles, ntiles, A);
  if (e != cudaSuccess) return e;
  return launch_pdl<moe_down_mma_kernel>(s, dim3(blocks_for(Hm, 16), unsigned(max_tiles)), dim3(32 * kSplit), dn_smem,
                                         static_cast<const __nv_bfloat16*>(A), I,
                                         static_cast<const __nv_bfloat16*>(down.data), Hm,
                                         static_cast<const int32_t*>(tiles), static_cast<const int32_t*>(ntiles), Y);
}

size_t align256(size_t n) { return (n + 255) / 256 * 256; }

// Where moe_group_kernel's outputs for R pairs of E experts lie in a buffer:
// order [R] at 0, slot_of [R], tiles [3 · max_tiles], the tile count; `end`
// bytes in all (moe_experts' scratch goes on from there; the route's plan
// buffer holds just these).
struct GroupLayout {
  int max_tiles;
  size_t slot, tiles, nt, end;
};
GroupLayout group_layout(int64_t R, int64_t E) {
  GroupLayout g;
  g.max_tiles = int(R / kRT + std::min<int64_t>(E, R) + 1);
  g.slot = align256(size_t(R) * 4), g.tiles = g.slot + align256(size_t(R) * 4);
  g.nt = g.tiles + align256(size_t(g.max_tiles) * 12), g.end = g.nt + 256;
  return g;
}

// The grouped GEMM's rule: from 8 pairs an expert on average (an 8-pair
// tile per expert is what the per-tile kernels stream its weights for), in
// tiles of 128 pairs, or 256 from 256 pairs an expert on average. Spark
// slice, 2 layers, H100, 2026-12-06 (per-tile / 256 / 128, s): 512-token
// prefill 0.044 / 0.039 / 0.028, 2048 0.143 / 0.051 / 0.040, 8192 0.566 /
// 0.131 / 0.138.
constexpr int64_t kMoeGemmMinPairs = 8;
constexpr int64_t kMoeGemmWidePairs = 256;
// NVFP4 / MXFP4 experts (the per-tile kernels stream a quarter of BF16's
// bytes, so the grouped GEMM pays later): from 32 pairs an expert, always
// in tiles of 128. NVFP4 Spark slice, 2 layers, H100, 2026-12-06 (per-tile
// / 256 / 128, s): 512 tokens (16 pairs an expert) 0.021 / 0.050 / 0.023,
// 2048 (64) 0.081 / 0.062 / 0.034-0.035, 8192 0.335 / 0.148 / 0.126-0.128.
// 32 lies between the two measured counts; it was not measured itself.
// FP8 (per tensor / channel) and INT4 take the same count (H100,
// 2026-12-06, per-tile / grouped in tiles of 128, s): FP8 512 tokens 0.020 /
// 0.025, 2048 0.069 / 0.037, 8192 0.355 / 0.198; INT4 2048 0.057 / 0.046,
// 8192 0.248 / 0.166.
constexpr int64_t kQuantGemmMinPairs = 32;

template <typename XT, typename WT>
void launch_experts(cudaStream_t s, const Tensor& u, const Tensor& gate_up, const Tensor& down, int K,
                    const int32_t* order, const int32_t* tiles, const int32_t* ntiles, int max_tiles, float* A,
                    float* Y) {
  const int64_t Hm = u.cols(), I = down.dim(2);
  const bool vec_gu = Hm % 8 == 0 && aligned16(u.data) && aligned16(gate_up.data);
  const dim3 g1(blocks_for(I, kRowsPerBlock), unsigned(max_tiles));
  auto* up = static_cast<const XT*>(u.data);
  auto* gp = static_cast<const WT*>(gate_up.data);
  if (vec_gu)
    moe_gate_up_kernel<XT, WT, true><<<g1, 256, 0, s>>>(up, Hm, K, gp, I, order, tiles, ntiles, A);
  else
    moe_gate_up_kernel<XT, WT, false><<<g1, 256, 0, s>>>(up, Hm, K, gp, I, order, tiles, ntiles, A);
  const bool vec_dn = I % 8 == 0 && aligned16(down.data);
  const dim3 g2(blocks_for(Hm, kRowsPerBlock), unsigned(max_tiles));
  auto* dp = static_cast<const WT*>(down.data);
  if (vec_dn)
    moe_down_kernel<WT, true><<<g2, 256, 0, s>>>(A, I, dp, Hm, tiles, ntiles, Y);
  else
    moe_down_kernel<WT, false><<<g2, 256, 0, s>>>(A, I, dp, Hm, tiles, ntiles, Y);
}

}  // namespace

void CudaBackend::moe_route(const Tensor& ids, const Tensor& weights, const Tensor& logits, const Tensor& bias,
                            float multiplier, float scaling) {
  const int64_t E = logits.cols(), K = ids.cols();
  if (!check(ids.dtype == DType::I32 && weights.dtype == DType::F32 && logits.dtype == DType::F32 &&
                 ids.numel() == weights.numel() && ids.rows() == logits.rows() && K >= 1 && K <= E &&
                 K <= kMoeMaxTopK && E <= 4096 && (bias.empty() || (bias.dtype == DType::F32 && bias.numel() == E)),
             "moe_route", [&] { return describe(logits) + " -> " + describe(ids); }))
    return;
  const int64_t T = logits.rows();
  if (T == 0) return;
  // The grouping of these ids for moe_experts (route_plan_), where its rule
  // takes the per-tile kernels: fewer pairs than the grouped GEMM's least
  // (BF16's, the lower of the two), unless that GEMM is forced.
  const int64_t R = T * K;
  const GroupLayout g = group_layout(R, E);
  const bool grouped = expert_gemm_ < 2 && R < kMoeGemmMinPairs * E && reserve_plan(g.end);
  route_plan_ = grouped ? RoutePlan{ids.data, T, K, E, plan_generation_} : RoutePlan{};
  const int op = op_index();
  enqueue("moe_route", [=, this](cudaStream_t s) {
    const size_t smem = size_t(E) * 2 * sizeof(float);
    auto* id = static_cast<int32_t*>(ids.data);
    auto* w = static_cast<float*>(weights.data);
    auto* z = static_cast<const float*>(logits.data);
    auto* b = static_cast<const float*>(bias.data);
    cudaError_t e;
    if (E <= 32 * 8)
      e = launch_pdl<moe_route_kernel<8>>(s, dim3(unsigned(T)), dim3(256), smem, id, w, z, b, int(E), int(K),
                                          multiplier, scaling);
    else if (E <= kWarpRouteExperts)
      e = launch_pdl<moe_route_kernel<kWarpRouteExperts / 32>>(s, dim3(unsigned(T)), dim3(256), smem, id, w, z, b,
                                                               int(E), int(K), multiplier, scaling);
    else
      e = launch_pdl<moe_route_kernel<0>>(s, dim3(unsigned(T)), dim3(256), smem, id, w, z, b, int(E), int(K),
                                          multiplier, scaling);
    if (e != cudaSuccess || !grouped) return e;
    char* pb = static_cast<char*>(plan_buf_);
    return launch_pdl<moe_group_kernel>(s, dim3(1), dim3(1024), size_t(2 * E + 1) * 4, static_cast<const int32_t*>(id),
                                        int(R), int(E), -1, reinterpret_cast<int32_t*>(pb),
                                        reinterpret_cast<int32_t*>(pb + g.slot), reinterpret_cast<int32_t*>(pb + g.tiles),
                                        reinterpret_cast<int32_t*>(pb + g.nt), dev_error(), op, 0, nullptr, nullptr);
  });
}

void CudaBackend::moe_experts(const Tensor& out, const Tensor& u, const Tensor& gate_up, const Tensor& down,
                              const Tensor& post_gain, const Tensor& ids, const Tensor& weights, float eps,
                              int64_t expert_base) {
  const int64_t E = gate_up.dim(0), I2 = gate_up.dim(1), Hm = u.cols();
  // Expert parallelism: other ranks' slots get no grouped row (slot_of -1)
  // and the combine skips them. Compiled, not yet run on a GPU.
  if (!check(gate_up.rank == 3 && down.rank == 3 && down.dim(0) == E && gate_up.dim(2) == Hm && down.dim(1) == Hm &&
                 down.dim(2) * 2 == I2 && I2 > 0 && Hm > 0 && out.numel() == u.numel() && ids.rows() == u.rows() &&
                 ids.dtype == DType::I32 && weights.dtype == DType::F32 && weights.numel() == ids.numel() &&
                 post_gain.numel() == Hm && post_gain.dtype == DType::F32 &&
                 ((!gate_up.quant && !down.quant && gate_up.dtype == down.dtype && is_float_dtype(gate_up.dtype)) ||
                  (gate_up.quant && down.quant)) &&
                 is_float_dtype(u.dtype) && is_float_dtype(out.dtype) && ids.cols() >= 1 && ids.cols() <= kMoeMaxTopK &&
                 E <= 4096,
             "moe_experts", [&] { return describe(u) + " experts " + describe(gate_up) + " / " + describe(down); }))
    return;
  // Quantized experts (both sets): decoded in the tensor-core kernels'
  // registers (cuda_quant_moe.cu), which take BF16 activations.
  const bool quant = gate_up.quant != nullptr;
  if (quant) {
    std::string why = quant_unsupported(gate_up);
    if (why.empty()) why = quant_unsupported(down);
    if (why.empty() && gate_up.quant->format.kind != down.quant->format.kind)
      why = "gate_up and down must be quantized the same way";
    if (why.empty() && !(u.dtype == DType::BF16 && aligned16(u.data)))
      why = "quantized experts take BF16 activations in 16-byte-aligned rows";
    if (!check(why.empty(), "moe_experts",
               [&] { return describe(u) + " experts " + describe(gate_up) + " / " + describe(down) + ": " + why; }))
      return;
  }
  const int64_t T = u.rows(), K = ids.cols(), I = I2 / 2, R = T * K;
  if (T == 0) return;
  if (!check(R < (int64_t(1) << 24), "moe_experts", "too many (token, expert) pairs in one step")) return;
  const GroupLayout g = group_layout(R, E);
  const int max_tiles = g.max_tiles;
  if (!check(max_tiles < 65535, "moe_experts", "too many expert tiles in one step")) return;
  // Scratch: order, slot_of, tiles, tile count, the grouped GEMM's expert
  // and tile starts, A [R, I], Y [R, Hm]. The grouped GEMM keeps its
  // permuted a (bf16) in A and the gathered u (bf16) in Y, which only its
  // last product writes.
  const size_t o_st = g.end, o_tst = o_st + align256(size_t(E + 1) * 4), o_a = o_tst + align256(size_t(E + 1) * 4),
               o_y = o_a + align256(size_t(R) * size_t(I) * 4), total = o_y + align256(size_t(R) * size_t(Hm) * 4);
  reserve_scratch(total);
  const int op = op_index();
  const bool mma = !quant && mma_gemv_built() && u.dtype == DType::BF16 && gate_up.dtype == DType::BF16 && Hm % 8 == 0 &&
                   I % 8 == 0 && aligned16(u.data) && aligned16(gate_up.data) && aligned16(down.data);
  // The grouped GEMM where there are enough pairs an expert to fill its
  // tiles (the rule), or as forced (CudaBackendOptions::expert_gemm).
  // Quantized experts in their aligned layouts (cuda_quant_wgmma.cu: the
  // codes decoded in registers): every format by its own count.
  const QuantKind qkind = quant ? gate_up.quant->format.kind : QuantKind::None;
  const QuantDev gu_dev = quant ? quant_dev(gate_up) : QuantDev{}, dn_dev = quant ? quant_dev(down) : QuantDev{};
  const bool gemm = expert_gemm_ != 1 &&
                    (expert_gemm_ >= 2 || (!quant && R >= kMoeGemmMinPairs * E) ||
                     (quant && R >= kQuantGemmMinPairs * E)) &&
                    (mma ? moe_gemm_applies(Hm, I, u.data, gate_up.data, down.data)
                         : quant && moe_q_gemm_applies(qkind, gu_dev, dn_dev, Hm, I, u.data));
  // INT4 runs in tiles of 128 pairs only (its second accumulator set).
  const int gemm_rows = expert_gemm_ == 3 || qkind == QuantKind::Int4 ? 128
                        : expert_gemm_ == 2                         ? 256
                        : !quant && R >= kMoeGemmWidePairs * E      ? 256
                                                                    : 128;
  // The route grouped these ids already (route_plan_: the same kernel and
  // arguments, so the same order and tiles), unless ranks split the experts
  // or the grouped GEMM runs (its tile starts).
  const RoutePlan plan = route_plan_;
  const bool planned_at_enqueue = !gemm && expert_base < 0 && plan.ids == ids.data && plan.rows == T &&
                                  plan.cols == K && plan.experts == E;
  enqueue("moe_experts", [=, this](cudaStream_t s) {
    // (the buffer the route grouped into is still the buffer: no later route
    // grew it before this launch)
    const bool planned = planned_at_enqueue && plan.generation == plan_generation_;
    char* base = static_cast<char*>(scratch());
    char* grouping = planned ? static_cast<char*>(plan_buf_) : base;  // the same layout in either
    auto* order = reinterpret_cast<int32_t*>(grouping);
    auto* slot_of = reinterpret_cast<int32_t*>(grouping + g.slot);
    auto* tiles = reinterpret_cast<int32_t*>(grouping + g.tiles);
    auto* ntiles = reinterpret_cast<int32_t*>(grouping + g.nt);
    auto* A = reinterpret_cast<float*>(base + o_a);
    auto* Y = reinterpret_cast<float*>(base + o_y);
    auto* starts = reinterpret_cast<int32_t*>(base + o_st);
    auto* tile_starts = reinterpret_cast<int32_t*>(base + o_tst);
    if (!planned)
      if (cudaError_t e = launch_pdl<moe_group_kernel>(s, dim3(1), dim3(1024), size_t(2 * E + 1) * 4,
                                                       static_cast<const int32_t*>(ids.data), int(R), int(E),
                                                       int(expert_base), order, slot_of, tiles, ntiles, dev_error(), op,
                                                       gemm ? gemm_rows : 0, starts, tile_starts);
          e != cudaSuccess)
        return e;
    const bool xb = u.dtype == DType::BF16, wb = gate_up.dtype == DType::BF16;
    if (gemm) {
      MoeGemmArgs a;
      a.u = static_cast<const __nv_bfloat16*>(u.data);
      if (!quant) {
        a.gate_up = static_cast<const __nv_bfloat16*>(gate_up.data);
        a.down = static_cast<const __nv_bfloat16*>(down.data);
      }
      a.order = order, a.starts = starts, a.tile_starts = tile_starts;
      a.Hm = Hm, a.I = I, a.R = R, a.E = int(E), a.topk = int(K), a.nx = gemm_rows;
      a.xg = reinterpret_cast<__nv_bfloat16*>(Y), a.ap = reinterpret_cast<__nv_bfloat16*>(A), a.Y = Y;
      if (cudaError_t e = quant ? launch_moe_q_gemm(s, a, gu_dev, dn_dev, qkind)
                                : launch_moe_gemm(s, a);
          e != cudaSuccess)
        return e;
    } else if (quant) {
      cudaError_t e = launch_quant_experts(s, u, gate_up, down, int(K), order, tiles, ntiles, max_tiles,
                                           reinterpret_cast<__nv_bfloat16*>(A), Y, expert_kernel_);
      if (e != cudaSuccess) return e;
    } else if (mma) {
      cudaError_t e = launch_experts_mma(s, u, gate_up, down, int(K), order, tiles, ntiles, max_tiles,
                                         reinterpret_cast<__nv_bfloat16*>(A), Y);
      if (e != cudaSuccess) return e;
    } else if (xb && wb) launch_experts<__nv_bfloat16, __nv_bfloat16>(s, u, gate_up, down, int(K), order, tiles, ntiles, max_tiles, A, Y);
    else if (xb) launch_experts<__nv_bfloat16, float>(s, u, gate_up, down, int(K), order, tiles, ntiles, max_tiles, A, Y);
    else if (wb) launch_experts<float, __nv_bfloat16>(s, u, gate_up, down, int(K), order, tiles, ntiles, max_tiles, A, Y);
    else launch_experts<float, float>(s, u, gate_up, down, int(K), order, tiles, ntiles, max_tiles, A, Y);
    return launch_moe_combine(s, moe_combine_, out.data, out.dtype, Y, static_cast<const int32_t*>(slot_of),
                              static_cast<const float*>(weights.data), static_cast<const float*>(post_gain.data), T,
                              int(K), Hm, eps);
  });
}

}  // namespace muse::cuda
