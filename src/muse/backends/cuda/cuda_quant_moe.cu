// The latent experts' products with quantized weights: moe_experts
// (cuda_moe.cu) groups the (token, expert) pairs into tiles of at most 8
// pairs of one expert and calls launch_quant_experts, which runs the two
// products of each tile through the decoding ring of cuda_quant.cuh:
//   gate/up: a warp holds gate rows i.. and up rows I + i.. as its two weight
//     tiles, so a = silu(γ) · υ is formed where both sums land, and stored in
//     bf16 (the down product's mma input, as for BF16 experts);
//   down: y = a · down[e]ᵀ in fp32.
// A pair's values depend only on its own activation row (each column of the
// mma is its own sum, in the fixed order of K), never on the tile's other
// pairs: a token's result is the same alone or in any batch.
#include "muse/backends/cuda/cuda_quant_fp8_int4.cuh"

namespace muse::cuda {
namespace {

// Tiles per format: weight tiles per warp (gate/up: the gate rows' and the
// up rows' tiles; INT4 works in groups of 32 rows, two tiles each), ring
// stages: few, for more blocks an SM (the rings once took up to ~74 KB, three
// blocks an SM). The kernels are latency-bound on their decode, and more
// warps hide it better than deeper rings: FP4 gate/up one stage (~37 KB,
// four blocks by registers), down two (six); FP8 two and three; INT4 two and
// three (four and five blocks, by registers). Spark slice, batch 16 / 64
// (H200, 2026-12-04, against the deeper rings in the same call): NVFP4 59.1
// / 52.3% of HBM against 53.1 / 45.9, MXFP4 61.3 / 54.0 against 57.2 / 50.3
// (12 layers), FP8 77.1 / 64.8 against 68.7 / 57.5 (8 layers), INT4 47.4 /
// 34.0 against 46.3 / 33.3 (12 layers); batch 1 within 2%, FP8 +1.5%.
// The FP4 gate/up slot holds the gate and the up tile as two copy groups,
// each refilled as soon as its products are done (fp4_accumulate), so one
// stage still overlaps copies and products (128 registers: four blocks).
template <QFmt F>
struct ExpertTiles {
  static constexpr int kGateUpRW = F == QFmt::Int4 ? 4 : 2;
  static constexpr int kDownRW = F == QFmt::Int4 ? 2 : 1;
  static constexpr int kGateUpStages = fp4_format(F) ? 1 : 2;
  static constexpr int kDownStages = fp4_format(F) ? 2 : 3;
  static constexpr int kRows = F == QFmt::Int4 ? 32 : 16;  // output rows per block (gate/up: of each half)
};

// Accumulates a block's weight rows of expert e for one grouping tile's
// activation rows: the gate/up kernel passes two row bases (gate i0, up
// I + i0: RW / 2 tiles each), the down kernel one; `limit` bounds the row
// within its half. xrow: the tile's activation row g (not offset).
template <QFmt F, bool ALIGNED, bool BLOCK, int RW, int STAGES, int BASES>
__device__ __forceinline__ void expert_rows(uint4* ring, uint32_t* lut, const QuantDev& w, int64_t e,
                                            const int64_t (&base)[BASES], int64_t limit,
                                            const __nv_bfloat16* xrow, bool xok1, int warp, int lane,
                                            float (&acc)[RW][1][4]) {
  const int g = lane >> 2, tq = lane & 3;
  const int64_t K = w.K, N = w.N;
  const __nv_bfloat16* xr[1] = {xrow + (fp4_format(F) ? 128 : 32) * tq};
  const bool xok[1] = {xok1};
  const uint8_t* codes = w.codes + e * w.codes_stride;
  const uint8_t* scales = w.scales + e * w.scales_stride;
  if constexpr (F == QFmt::Int4) {
    Int4Rows rows[BASES];
#pragma unroll
    for (int q = 0; q < BASES; ++q) {
      const int64_t i = base[0] + 4 * g, n = base[q] + 4 * g;  // i: the first row within its half
      rows[q].ok = i < limit;
      rows[q].pair_ok = base[0] + 4 * (g | 1) < limit;
      const int64_t nc = rows[q].ok ? n : 0;
      rows[q].words = codes + nc * 4;
      const bool cok = base[0] + 4 * (lane & 7) < limit;  // the copies' columns
      rows[q].cok = cok;
      rows[q].cwords = codes + (cok ? base[q] + 4 * (lane & 7) : 0) * 4;
      rows[q].scales = scales + nc * 2;
      rows[q].zeros = w.zeros ? w.zeros + e * w.zeros_stride + (nc / 8) * 4 : nullptr;
      rows[q].zshift = int(4 * (nc % 8));
    }
    int4_accumulate<ALIGNED, BASES, 1, STAGES>(ring, rows, xr, xok, K, N, w.block_cols, w.zero_offset,
                                               w.bf16_scales != 0, warp, lane, acc);
  } else {
    constexpr int PER = RW / BASES;  // tiles per base
    const int64_t code_ld = fp4_format(F) ? K / 2 : K;
    QTile tile[RW];
    const uint8_t* srow[RW][2];
    const float* sblk[RW][2];
    bool wok[RW][2];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      const int q = r / PER;
      const int64_t half = base[q] - base[0];  // the first row of the tile's half
      tile[r] = quant_tile(codes + half * code_ld, scales + half * w.scale_ld, base[0] + 16 * (r % PER), limit,
                           code_ld, w.scale_ld);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t i = base[0] + 16 * (r % PER) + g + 8 * h;  // the row within its half
        const int64_t n = base[q] + 16 * (r % PER) + g + 8 * h, nc = i < limit ? n : base[q];
        wok[r][h] = i < limit;
        srow[r][h] = scales + nc * w.scale_ld;
        sblk[r][h] = reinterpret_cast<const float*>(scales) + (nc / w.block_rows) * w.scale_ld;
      }
    }
    if constexpr (fp4_format(F)) {
      constexpr bool MX = F == QFmt::Mxfp4;
      fp4_accumulate<MX, ALIGNED, RW, 1, STAGES>(ring, lut, tile, srow, wok, xr, xok, K, w.block_cols, warp, lane,
                                                 acc);
    } else {
      fp8_accumulate<ALIGNED, BLOCK, RW, 1, STAGES>(ring, tile, sblk, wok, xr, xok, K, w.block_cols, warp, lane, acc);
    }
  }
}

// Output row (within its half) of fragment element i of tile r.
template <QFmt F>
__device__ __forceinline__ int64_t expert_row(int64_t n0, int r, int i, int g) {
  return F == QFmt::Int4 ? n0 + 4 * g + 2 * (r % 2) + (i >> 1) : n0 + g + 8 * (i >> 1);  // FP4/FP8: one tile per half
}

// MINB: the blocks an SM the compiler must leave registers for (0: no
// bound; the FP4 kernels then take ~128 registers, four blocks an SM). Five
// (96 registers, ~100 bytes of spill) is expert_kernel 3's A/B: one more
// block of latency hiding on a kernel that is neither issue- nor
// bandwidth-bound at batch 1 (bench/NOTES.md, 2026-12-05).
template <QFmt F, bool ALIGNED, bool BLOCK, int MINB = 0>
__global__ void __launch_bounds__(32 * kSplit, MINB)
    quant_gate_up_kernel(const __nv_bfloat16* __restrict__ u, int K, QuantDev w, int64_t I, const int32_t* order,
                         const int32_t* tiles, const int32_t* ntiles, __nv_bfloat16* A) {
  using Tiles = ExpertTiles<F>;
  constexpr int RW = Tiles::kGateUpRW, HALF = RW / 2;
  extern __shared__ uint4 ring[];
  __shared__ uint32_t lut[256];
  if constexpr (fp4_format(F)) fp4_fill_lut<F == QFmt::Mxfp4>(lut);  // needs no input: before the wait
  // Launched with PDL after the grouping: resident while it runs, reading
  // its tiles only past the wait. The trigger comes after the wait, because
  // the down product reads the tiles before its own wait: it may launch only
  // once every block of ours has seen the grouping complete.
  pdl_wait();
  pdl_launch_dependents();  // the down product may start streaming its codes; it waits for our A
  if (int(blockIdx.y) >= *ntiles) return;
  const int e = tiles[3 * blockIdx.y], g0 = tiles[3 * blockIdx.y + 1], nr = tiles[3 * blockIdx.y + 2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t Hm = w.K, i0 = int64_t(blockIdx.x) * Tiles::kRows;
  float acc[RW][1][4];
  const int64_t base[2] = {i0, I + i0};
  expert_rows<F, ALIGNED, BLOCK, RW, Tiles::kGateUpStages, 2>(
      ring, lut, w, e, base, I, u + int64_t(order[g0 + min(g, nr - 1)] / K) * Hm, g < nr, warp, lane, acc);
  float sums[RW][4];
  ring_reduce<RW, 1>(ring, warp, lane, acc, [&](int r, int, int i, float v) { sums[r][i] = v; });
  if (warp == 0) {
#pragma unroll
    for (int r = 0; r < HALF; ++r)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t n = expert_row<F>(i0, r, i, g);
        const int t = 2 * tq + (i & 1);
        if (n < I && t < nr) {
          const float gv = sums[r][i] * quant_row_factor<F>(w, e, n);
          const float uv = sums[r + HALF][i] * quant_row_factor<F>(w, e, I + n);
          A[int64_t(g0 + t) * I + n] = __float2bfloat16_rn(gv / (1.0f + expf(-gv)) * uv);
        }
      }
  }
}

template <QFmt F, bool ALIGNED, bool BLOCK>
__global__ void __launch_bounds__(32 * kSplit)
    quant_down_kernel(const __nv_bfloat16* __restrict__ A, QuantDev w, const int32_t* tiles, const int32_t* ntiles,
                      float* Y) {
  using Tiles = ExpertTiles<F>;
  constexpr int RW = Tiles::kDownRW;
  extern __shared__ uint4 ring[];
  __shared__ uint32_t lut[256];
  if (int(blockIdx.y) >= *ntiles) {
    // Blocks with a tile wait for gate/up in the ring; with no tile at all
    // (expert parallelism: every pair on another rank) one block waits, so
    // that our completion still implies gate/up's (the combine waits on us).
    if (*ntiles == 0 && blockIdx.x == 0 && blockIdx.y == 0) pdl_wait();
    return;
  }
  const int e = tiles[3 * blockIdx.y], g0 = tiles[3 * blockIdx.y + 1], nr = tiles[3 * blockIdx.y + 2];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int64_t Hm = w.N, I = w.K, n0 = int64_t(blockIdx.x) * Tiles::kRows;
  if constexpr (fp4_format(F)) fp4_fill_lut<F == QFmt::Mxfp4>(lut);
  float acc[RW][1][4];
  const int64_t base[1] = {n0};
  expert_rows<F, ALIGNED, BLOCK, RW, Tiles::kDownStages, 1>(ring, lut, w, e, base, Hm,
                                                            A + int64_t(g0 + min(g, nr - 1)) * I, g < nr, warp, lane,
                                                            acc);
  ring_reduce<RW, 1>(ring, warp, lane, acc, [&](int r, int, int i, float v) {
    const int64_t n = F == QFmt::Int4 ? n0 + 4 * g + 2 * r + (i >> 1) : n0 + g + 8 * (i >> 1);
    const int t = 2 * tq + (i & 1);
    if (n < Hm && t < nr) Y[int64_t(g0 + t) * Hm + n] = v * quant_row_factor<F>(w, e, n);
  });
}

// ---------------------------------------------------------------------------
// The streaming FP4 down product (aligned layouts: K % 512 == 0). A launch
// has as many blocks as the GPU holds at once; block b takes the items
// b·n/B .. (b + 1)·n/B − 1 of the step's n = tiles × row blocks (row block
// fastest, so a block's items mostly share a grouping tile: its expert's
// codes run on and its activation rows stay in L1) and streams them through
// fp4_stream. The sums, the row factors and the stores are the per-tile
// kernel's (the same bits).
//
// Where it wins (H100, ncu, NVFP4 Spark slice): at batch 1 the per-tile
// down product spends its blocks' short lives starting, waiting for their
// first granules and reducing (52 µs a layer for 75.6 MB, 44% of DRAM);
// streamed, 43-44 µs. Whole 7-layer slice (H100, 2026-12-05, be4fead):
// streaming is 1.7% faster a step at batch 2, 4 and 16 for NVFP4 and 0.2-1%
// for MXFP4; at batch 64 it is 1.3% faster for NVFP4 and 1.1% slower for
// MXFP4 (the per-tile kernel's ~250 waves of independent blocks overlap
// their reductions; the streaming block's four warps meet at every item),
// so the rule streams launches of up to kStreamMaxWaves waves.
// Streaming gate/up (two stages, three blocks an SM) lost at every batch
// (batch 1 70-72 µs against 67-69; bench/NOTES.md, 2026-12-05 evening).
// ---------------------------------------------------------------------------

// The cross-warp sum of a streaming item (ordinal n of the block): warps
// 1..3 leave their slice sums in the ring slot each has just read, warp 0
// adds them to its own in slice order, 0 + 1 + 2 + 3 as ring_reduce does,
// and stores them once the slots are the ring's again.
template <int RW, int STAGES, class MineOf, class Store>
__device__ __forceinline__ void stream_reduce(uint4* ring, int warp, int lane, int n, MineOf&& mine_of,
                                              const float (&acc)[RW][1][4], Store&& store) {
  if (warp) {
    float* part = reinterpret_cast<float*>(fp4_stream_done_slot<RW, STAGES>(ring, warp, n, mine_of(warp)));
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int i = 0; i < 4; ++i) part[(r * 4 + i) * 32 + lane] = acc[r][0][i];
  }
  __syncthreads();
  float sums[RW][4];
  if (warp == 0) {
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int i = 0; i < 4; ++i) sums[r][i] = acc[r][0][i];
#pragma unroll
    for (int w = 1; w < kSplit; ++w) {
      const float* part = reinterpret_cast<const float*>(fp4_stream_done_slot<RW, STAGES>(ring, w, n, mine_of(w)));
#pragma unroll
      for (int r = 0; r < RW; ++r)
#pragma unroll
        for (int i = 0; i < 4; ++i) sums[r][i] += part[(r * 4 + i) * 32 + lane];
    }
  }
  __syncthreads();  // the slots are the ring's again
  if (warp == 0) store(sums);
}

// A grouping tile as a streaming block's items see it: its expert, its
// first pair and its pair count; y caches which tile it is.
struct StreamTile {
  int y = -1, e = 0, g0 = 0, nr = 1;
  __device__ __forceinline__ void load(const int32_t* tiles, int ty) {
    if (ty == y) return;
    y = ty, e = tiles[3 * ty], g0 = tiles[3 * ty + 1], nr = tiles[3 * ty + 2];
  }
};

// down: item it is rows 16·(it % nbx).. of tile it / nbx's expert.
template <QFmt F, int STAGES>
struct Fp4DownItems {
  static constexpr int RW = 1;
  const __nv_bfloat16* A;
  QuantDev w;
  int nbx, first, warp, lane;
  const int32_t* tiles;
  float* Y;
  uint4* ring;
  StreamTile wt, xt;  // the copies' tile, the mma side's
  float f[2];         // warp 0: the row factors of its rows g, g + 8, loaded at the item's start

  __device__ __forceinline__ void weights(int it, QTile (&tile)[RW]) {
    const int ty = it / nbx;
    wt.load(tiles, ty);
    tile[0] = quant_tile(w.codes + wt.e * w.codes_stride, w.scales + wt.e * w.scales_stride,
                         16 * int64_t(it - ty * nbx), w.N, w.K / 2, w.scale_ld);
  }
  __device__ __forceinline__ const __nv_bfloat16* x(int it) {
    const int ty = it / nbx;
    xt.load(tiles, ty);
    if (warp == 0) {  // for the finish: loaded now, their latency hidden behind the item's granules
#pragma unroll
      for (int h = 0; h < 2; ++h)
        f[h] = quant_row_factor<F>(w, xt.e, min(16 * int64_t(it - ty * nbx) + (lane >> 2) + 8 * h, w.N - 1));
    }
    return A + int64_t(xt.g0 + min(lane >> 2, xt.nr - 1)) * w.K + 128 * (lane & 3);
  }
  template <class MineOf>
  __device__ __forceinline__ void finish(int it, const float (&acc)[RW][1][4], MineOf&& mine_of) {
    const int g = lane >> 2, tq = lane & 3;
    const int64_t n0 = 16 * int64_t(it - xt.y * nbx);
    stream_reduce<RW, STAGES>(ring, warp, lane, it - first, mine_of, acc, [&](const float (&sums)[RW][4]) {
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t n = n0 + g + 8 * (i >> 1);
        const int t = 2 * tq + (i & 1);
        if (n < w.N && t < xt.nr) Y[int64_t(xt.g0 + t) * w.N + n] = sums[0][i] * f[i >> 1];
      }
    });
  }
};

template <QFmt F, int STAGES>
__global__ void __launch_bounds__(32 * kSplit, 4)  // four blocks an SM by their 55 KB of ring: 128 registers allowed
    fp4_down_stream_kernel(const __nv_bfloat16* __restrict__ A, QuantDev w, const int32_t* tiles,
                           const int32_t* ntiles, float* Y) {
  extern __shared__ uint4 ring[];
  __shared__ uint32_t lut[256];
  const int nbx = int((w.N + 15) / 16), n = *ntiles * nbx;
  Fp4DownItems<F, STAGES> items{A, w, nbx, 0, int(threadIdx.x >> 5), int(threadIdx.x & 31), tiles, Y, ring};
  // This block's items (balanced: counts differ by one at most).
  items.first = int(int64_t(blockIdx.x) * n / gridDim.x);
  const int last = int(int64_t(blockIdx.x + 1) * n / gridDim.x);
  fp4_fill_lut<F == QFmt::Mxfp4>(lut);
  // Every block waits for gate/up in fp4_stream, items or not, so that our
  // completion implies gate/up's (the combine waits on us).
  fp4_stream<F == QFmt::Mxfp4, 1, STAGES>(ring, lut, w.K, items.warp, items.lane, items.first, last, items);
}

// Ring stages of the streaming down product (55 KB a block, four blocks an
// SM), and the most items, in waves of its resident blocks, the rule
// streams (batch 1 on the Spark slice: 10 tiles × 256 row blocks, 4.8
// waves of an H100's 528 blocks; batch 16: 70, streamed; batch 64: not).
constexpr int kStreamDownStages = 3, kStreamMaxWaves = 96;

// Launches the streaming down product and returns true (*err: the launch's
// result), or returns false (nothing launched) where the rule keeps the
// per-tile kernel: more than kStreamMaxWaves waves of items, or the kernel
// cannot run. With `force` (expert_kernel 2) it never falls back: a launch
// it cannot make is an error, so a test of its bits cannot pass on the
// per-tile kernel's.
template <QFmt F>
bool launch_down_stream(cudaStream_t s, const QuantDev& dn, const int32_t* tiles, const int32_t* ntiles,
                        int max_tiles, const __nv_bfloat16* A, float* Y, bool force, cudaError_t* err) {
  constexpr size_t smem = fp4_ring_bytes<1, 1, kStreamDownStages>();
  constexpr auto kernel = fp4_down_stream_kernel<F, kStreamDownStages>;
  const int64_t items = int64_t(max_tiles) * ((dn.N + 15) / 16);
  const int held = resident_blocks<kernel>(32 * kSplit, smem);
  if (held <= 0 || items >= (int64_t(1) << 31)) {
    if (force) *err = cudaErrorInvalidConfiguration;
    return force;
  }
  if (!force && items > int64_t(kStreamMaxWaves) * held) return false;
  *err = launch_pdl<kernel>(s, dim3(unsigned(std::min<int64_t>(items, held))), dim3(32 * kSplit), smem, A, dn, tiles,
                            ntiles, Y);
  return true;
}

template <QFmt F, bool ALIGNED, bool BLOCK, int MINB = 0>
cudaError_t launch_gate_up(cudaStream_t s, const __nv_bfloat16* u, int64_t I, const QuantDev& gu, int K,
                           const int32_t* order, const int32_t* tiles, const int32_t* ntiles, int max_tiles,
                           __nv_bfloat16* A) {
  using Tiles = ExpertTiles<F>;
  constexpr size_t smem = quant_ring_bytes<F, Tiles::kGateUpRW, 1, Tiles::kGateUpStages>();
  constexpr auto kernel = quant_gate_up_kernel<F, ALIGNED, BLOCK, MINB>;
  if (cudaError_t e = allow_dynamic_smem<kernel>(int(smem)); e != cudaSuccess) return e;
  return launch_pdl<kernel>(s, dim3(blocks_for(I, Tiles::kRows), unsigned(max_tiles)), dim3(32 * kSplit), smem, u, K,
                            gu, I, order, tiles, ntiles, A);
}

template <QFmt F, bool ALIGNED, bool BLOCK>
cudaError_t launch_down(cudaStream_t s, const QuantDev& dn, const int32_t* tiles, const int32_t* ntiles,
                        int max_tiles, const __nv_bfloat16* A, float* Y) {
  using Tiles = ExpertTiles<F>;
  // Programmatic dependent launch: down's blocks may start while gate/up's
  // last ones finish and stream their expert's codes (the grouping tiles they
  // read first were complete before we launched: every gate/up block
  // triggers us only past its own wait for the grouping); they read A only
  // after griddepcontrol.wait (in the ring).
  return launch_pdl<quant_down_kernel<F, ALIGNED, BLOCK>>(
      s, dim3(blocks_for(dn.N, Tiles::kRows), unsigned(max_tiles)), dim3(32 * kSplit),
      quant_ring_bytes<F, Tiles::kDownRW, 1, Tiles::kDownStages>(), A, dn, tiles, ntiles, Y);
}

// The kernel variants by layout: the aligned path where the layout allows
// it (FP4: 16-byte copies, K % 512; FP8 and INT4: K % 128, whole granules,
// unguarded activation loads); FP8 with or without per-granule block scales.
template <QFmt F>
cudaError_t launch_experts_fmt(cudaStream_t s, const __nv_bfloat16* u, int64_t I, const QuantDev& gu,
                               const QuantDev& dn, int K, const int32_t* order, const int32_t* tiles,
                               const int32_t* ntiles, int max_tiles, __nv_bfloat16* A, float* Y, int mode) {
  cudaError_t e;
  if constexpr (F == QFmt::Int4) {  // aligned: K % 128 == 0
    e = gu.aligned ? launch_gate_up<F, true, false>(s, u, I, gu, K, order, tiles, ntiles, max_tiles, A)
                   : launch_gate_up<F, false, false>(s, u, I, gu, K, order, tiles, ntiles, max_tiles, A);
    if (e == cudaSuccess)
      e = dn.aligned ? launch_down<F, true, false>(s, dn, tiles, ntiles, max_tiles, A, Y)
                     : launch_down<F, false, false>(s, dn, tiles, ntiles, max_tiles, A, Y);
  } else if constexpr (F == QFmt::Fp8) {
    const bool gb = gu.block_cols < gu.K, db = dn.block_cols < dn.K;
    e = gu.aligned ? (gb ? launch_gate_up<F, true, true>(s, u, I, gu, K, order, tiles, ntiles, max_tiles, A)
                         : launch_gate_up<F, true, false>(s, u, I, gu, K, order, tiles, ntiles, max_tiles, A))
                   : (gb ? launch_gate_up<F, false, true>(s, u, I, gu, K, order, tiles, ntiles, max_tiles, A)
                         : launch_gate_up<F, false, false>(s, u, I, gu, K, order, tiles, ntiles, max_tiles, A));
    if (e == cudaSuccess)
      e = dn.aligned ? (db ? launch_down<F, true, true>(s, dn, tiles, ntiles, max_tiles, A, Y)
                           : launch_down<F, true, false>(s, dn, tiles, ntiles, max_tiles, A, Y))
                     : (db ? launch_down<F, false, true>(s, dn, tiles, ntiles, max_tiles, A, Y)
                           : launch_down<F, false, false>(s, dn, tiles, ntiles, max_tiles, A, Y));
  } else {  // FP4: down streams where the layout is aligned and the rule (or expert_kernel 2) says so
    e = gu.aligned ? (mode == 3 ? launch_gate_up<F, true, false, 5>(s, u, I, gu, K, order, tiles, ntiles, max_tiles, A)
                                : launch_gate_up<F, true, false>(s, u, I, gu, K, order, tiles, ntiles, max_tiles, A))
                   : launch_gate_up<F, false, false>(s, u, I, gu, K, order, tiles, ntiles, max_tiles, A);
    if (e == cudaSuccess &&
        !(dn.aligned && mode != 1 && launch_down_stream<F>(s, dn, tiles, ntiles, max_tiles, A, Y, mode == 2, &e)))
      e = dn.aligned ? launch_down<F, true, false>(s, dn, tiles, ntiles, max_tiles, A, Y)
                     : launch_down<F, false, false>(s, dn, tiles, ntiles, max_tiles, A, Y);
  }
  return e;
}

}  // namespace

cudaError_t launch_quant_experts(cudaStream_t s, const Tensor& u, const Tensor& gate_up, const Tensor& down, int K,
                                 const int32_t* order, const int32_t* tiles, const int32_t* ntiles, int max_tiles,
                                 __nv_bfloat16* A, float* Y, int mode) {
  const QuantDev gu = quant_dev(gate_up), dn = quant_dev(down);
  auto* up = static_cast<const __nv_bfloat16*>(u.data);
  const int64_t I = down.dim(2);
  switch (gate_up.quant->format.kind) {
    case QuantKind::Nvfp4:
      return launch_experts_fmt<QFmt::Nvfp4>(s, up, I, gu, dn, K, order, tiles, ntiles, max_tiles, A, Y, mode);
    case QuantKind::Mxfp4:
      return launch_experts_fmt<QFmt::Mxfp4>(s, up, I, gu, dn, K, order, tiles, ntiles, max_tiles, A, Y, mode);
    case QuantKind::Fp8:
      return launch_experts_fmt<QFmt::Fp8>(s, up, I, gu, dn, K, order, tiles, ntiles, max_tiles, A, Y, mode);
    case QuantKind::Int4:
      return launch_experts_fmt<QFmt::Int4>(s, up, I, gu, dn, K, order, tiles, ntiles, max_tiles, A, Y, mode);
    default: return cudaErrorNotSupported;
  }
}

}  // namespace muse::cuda
