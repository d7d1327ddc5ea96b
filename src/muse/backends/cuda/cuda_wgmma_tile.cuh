// The tile machinery the wgmma products share (cuda_wgmma_gemm.cu: the
// dense products; cuda_moe_wgmma.cu: the experts' grouped GEMM): the
// staged-unit pipeline, the A fragments in the decode kernels' order, the
// K-slices' partials added across a cluster, the copy engine's barriers
// and the tensor maps. Only for code built for sm_90a; see
// cuda_wgmma_gemm.cu for the layout and why it gives the decode bits.
#pragma once

#include <cooperative_groups.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include "muse/backends/cuda/cuda_mma.cuh"
#include "muse/backends/cuda/cuda_wgmma.cuh"

namespace muse::cuda {

namespace cg = cooperative_groups;

constexpr int kWgThreads = 256;  // two warpgroups
constexpr int kWgWarps = kWgThreads / 32;
constexpr int kWgW = 128;               // weight rows per tile: 64 a warpgroup (wgmma's M)
constexpr int kWgRowBytes = 128;        // 64 k of bf16 per staged row
constexpr int kWgPartStride = kWgW + 4; // floats per partial row (+4: conflict-free stores)
constexpr size_t kWgWBytes = size_t(kWgW) * kWgRowBytes;

template <int NX>
constexpr size_t wg_stage_bytes() {  // the activation rows first (1024-byte aligned), then the weights
  return size_t(NX) * kWgRowBytes + kWgWBytes;
}
template <int NX, int STAGES>
constexpr size_t wg_smem_bytes() {
  constexpr size_t pipe = STAGES * wg_stage_bytes<NX>();
  constexpr size_t part = size_t(NX) * kWgPartStride * sizeof(float);
  return (pipe > part ? pipe : part) + 1024;  // + alignment of the base
}

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}
__device__ __forceinline__ void cp_async4(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async16s(uint32_t dst, const void* src, int src_bytes) {
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(dst), "l"(src), "r"(src_bytes));
}
__device__ __forceinline__ uint4 lds128(uint32_t addr) {
  uint4 v;
  asm volatile("ld.shared.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "r"(addr));
  return v;
}

// One 32-k block of an activation row into the mma's order: in[tq] holds
// k 8·tq .. 8·tq + 7 (four 4-byte pairs); dst[p] gets pair p of each piece,
// so pair m = 4·tq + p of memory sits at slot 4·p + tq (wgmma_permute_x's
// and the experts' gather's layout).
__device__ __forceinline__ void wg_store_permuted32(const uint4 (&in)[4], uint4* dst) {
  dst[0] = make_uint4(in[0].x, in[1].x, in[2].x, in[3].x);
  dst[1] = make_uint4(in[0].y, in[1].y, in[2].y, in[3].y);
  dst[2] = make_uint4(in[0].z, in[1].z, in[2].z, in[3].z);
  dst[3] = make_uint4(in[0].w, in[1].w, in[2].w, in[3].w);
}

// The tile a cluster computes: weight rows n0 .. n0 + 127 of product j ×
// activation rows t0 .. t0 + NX - 1. Groups of t_group activation tiles,
// every weight tile over each group in turn (the group's rows of x stay in
// L2 while the weights stream past them).
struct WgTile {
  int64_t t0, n0, N;
  int j;
};

// K-slice s's units (64 k, one staged row of 128 bytes): the halves of
// granules s, s + 4, ... in ascending order.
__device__ __forceinline__ int wg_units(int64_t K, int s) {
  const int64_t ngran = (K + kGranule - 1) / kGranule;
  return s < ngran ? 2 * int((ngran - s + kSplit - 1) / kSplit) : 0;
}
__device__ __forceinline__ int64_t wg_unit_k(int s, int u) {
  return (int64_t(s) + int64_t(u >> 1) * kSplit) * kGranule + (u & 1) * 64;
}

// Where this warp's pieces 4·jj + tq of its fragment rows ra and ra + 8
// (weight rows of the tile: 16 a warp, 64 a warpgroup) sit in a stage.
template <int NX>
__device__ __forceinline__ void wg_a_offsets(uint32_t (&a_off)[2]) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = threadIdx.x >> 7;
  const int ra = 64 * wg + 16 * (warp & 3) + (lane >> 2), tq = lane & 3;
#pragma unroll
  for (int jj = 0; jj < 2; ++jj)
    a_off[jj] = uint32_t(NX * kWgRowBytes + ra * kWgRowBytes + (((4 * jj + tq) ^ (ra & 7)) << 4));
}

// This warp's A fragments of one unit (weight rows ra and ra + 8 of the
// stage, pieces 4·jj + tq): step A (words .x, .y) then step B (.z, .w), as
// mma16816 takes them.
__device__ __forceinline__ void wg_load_a(uint32_t (&a)[4][4], uint32_t stage, const uint32_t (&a_off)[2]) {
  constexpr uint32_t kRow8 = 8 * kWgRowBytes;  // row ra + 8: the same swizzle (ra + 8 ≡ ra mod 8)
#pragma unroll
  for (int jj = 0; jj < 2; ++jj) {
    const uint4 lo = lds128(stage + a_off[jj]), hi = lds128(stage + a_off[jj] + kRow8);
    a[2 * jj][0] = lo.x, a[2 * jj][1] = hi.x, a[2 * jj][2] = lo.y, a[2 * jj][3] = hi.y;
    a[2 * jj + 1][0] = lo.z, a[2 * jj + 1][1] = hi.z, a[2 * jj + 1][2] = lo.w, a[2 * jj + 1][3] = hi.w;
  }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
// A unit's four k16 steps into d as one wgmma group: this warp's A
// fragments loaded from the stage, the steps issued and committed. `a`
// stays the group's until wg_unit_end (a wgmma in flight reads it).
template <int NX>
__device__ __forceinline__ void wg_unit_start(float (&d)[NX / 2], uint32_t (&a)[4][4], uint32_t stage,
                                              const uint32_t (&a_off)[2]) {
  wg_load_a(a, stage, a_off);
  const uint64_t db = wg_desc(stage);
  wg_hold(d);
  wg_fence();
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wgmma_rs<NX>(d, a[kk], db + 2 * kk);  // +32 bytes a k16 step
  wg_commit();
}
// The group is complete: d and a are the compiler's again.
template <int NX>
__device__ __forceinline__ void wg_unit_end(float (&d)[NX / 2], uint32_t (&a)[4][4]) {
  wg_wait<0>();
  wg_hold(d);
#pragma unroll
  for (int kk = 0; kk < 4; ++kk) wg_hold(a[kk]);
}

// The four K-slices' partials meet: each block's accumulators go to its
// shared memory (the stages, no longer used: every thread is past a barrier
// first), and block s adds activation rows s·NX/4 .. of every weight row,
// P0 + P1 + P2 + P3, four weight rows a thread. Every thread of the block
// (kWgThreads) holds accumulators and runs both halves (wg_finish).
// PAIRED: the warps' A rows g and g + 8 are weight rows r and r + 1 of the
// INT4 word groups (cuda_quant_wgmma.cu, int4_row), not ra and ra + 8.
template <int NX, bool PAIRED = false>
__device__ __forceinline__ void wg_store_partial(const float (&d)[NX / 2], uint8_t* part_base) {
  const int lane = threadIdx.x & 31, wg = (threadIdx.x >> 7) & 1, warp = threadIdx.x >> 5;
  const int g = lane >> 2, tq = lane & 3;
  const int ra = PAIRED ? 64 * wg + 32 * ((warp & 3) >> 1) + 4 * g + 2 * (warp & 1) : 64 * wg + 16 * (warp & 3) + g;
  constexpr int kSecond = PAIRED ? 1 : 8;
  // d[i]: weight row ra + kSecond·((i >> 1) & 1), activation row 8·(i >> 2) + 2·tq + (i & 1) of the tile.
  float* part = reinterpret_cast<float*>(part_base);  // [NX][kWgPartStride]
#pragma unroll
  for (int i = 0; i < NX / 2; ++i)
    part[(8 * (i >> 2) + 2 * tq + (i & 1)) * kWgPartStride + ra + kSecond * ((i >> 1) & 1)] = d[i];
}
// Four sums to out[i .. i + 3] (of them the first `left`): one 8- or
// 16-byte store where they are all there and aligned, so a warp writes 256
// or 512 contiguous bytes (four 2-byte stores a thread wrote each 32-byte
// sector four times: ncu counted 75% of the kernel's global sectors
// excessive).
__device__ __forceinline__ void st4(void* out, int odt, int64_t i, const float4& v, int64_t left) {
  if (left >= 4) {
    const uintptr_t at = reinterpret_cast<uintptr_t>(out) + uintptr_t(i) * (odt == kBF16 ? 2 : 4);
    if (odt == kBF16 && at % 8 == 0) {
      const __nv_bfloat162 lo = __floats2bfloat162_rn(v.x, v.y), hi = __floats2bfloat162_rn(v.z, v.w);
      uint2 w;
      memcpy(&w.x, &lo, 4), memcpy(&w.y, &hi, 4);
      *reinterpret_cast<uint2*>(at) = w;
      return;
    }
    if (odt != kBF16 && at % 16 == 0) {
      *reinterpret_cast<float4*>(at) = v;
      return;
    }
  }
  const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
  for (int k = 0; k < 4; ++k)
    if (k < left) st(out, odt, i + k, vs[k]);
}
// The cluster barrier in halves: a block arrives once it has read what it
// needs of the others' shared memory, stores its sums, and only then waits
// for the others to have read its own (it may not exit before).
__device__ __forceinline__ void cluster_arrive() { asm volatile("barrier.cluster.arrive.release;" ::: "memory"); }
__device__ __forceinline__ void cluster_wait() { asm volatile("barrier.cluster.wait.acquire;" ::: "memory"); }
template <int NX>
__device__ __forceinline__ void wg_add_partials(uint8_t* part_base, int s, const WgTile& tl, const ClusterGroup& grp,
                                                int64_t T, int chain) {
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();  // every block's partial is in its shared memory
  constexpr int kRowsEach = NX / kSplit, kQuads = kWgW / 4, kTotal = kRowsEach * kQuads;
  constexpr int kEach = (kTotal + kWgThreads - 1) / kWgThreads;  // quads a thread
  const int tid = int(threadIdx.x);
  const float* parts[kSplit];
  const float* part = reinterpret_cast<const float*>(part_base);
#pragma unroll
  for (int q = 0; q < kSplit; ++q) parts[q] = cluster.map_shared_rank(part, q);
  // Every quad's four partials are loaded before any sum is stored: a
  // load cannot pass a store to `out` (the compiler cannot tell they do
  // not alias), and the other blocks' shared memory answers in hundreds
  // of cycles, so a quad at a time paid that kEach times. The sums are
  // P0 + P1 + P2 + P3 in that order, as before.
  int at[kEach];
  float4 v[kEach];
#pragma unroll
  for (int j = 0; j < kEach; ++j) {
    const int e = min(tid + j * kWgThreads, kTotal - 1);  // past the end: a quad that is there, not stored
    at[j] = (s * kRowsEach + e / kQuads) * kWgPartStride + 4 * (e % kQuads);
    v[j] = *reinterpret_cast<const float4*>(parts[0] + at[j]);
  }
#pragma unroll
  for (int q = 1; q < kSplit; ++q)
#pragma unroll
    for (int j = 0; j < kEach; ++j) {
      const float4 p = *reinterpret_cast<const float4*>(parts[q] + at[j]);
      v[j].x = __fadd_rn(v[j].x, p.x), v[j].y = __fadd_rn(v[j].y, p.y);
      v[j].z = __fadd_rn(v[j].z, p.z), v[j].w = __fadd_rn(v[j].w, p.w);
    }
  cluster_arrive();  // every partial this block adds is in its registers
  void* out = grp.out[tl.j];
  const int odt = grp.odt[tl.j];
  const int64_t ldo = grp.ldo[tl.j];
#pragma unroll
  for (int j = 0; j < kEach; ++j) {
    const int e = tid + j * kWgThreads;
    const int64_t t = tl.t0 + s * kRowsEach + e / kQuads, n = tl.n0 + 4 * (e % kQuads);
    if (e < kTotal && t < T && n < tl.N) st4(out, odt, t * ldo + n, v[j], tl.N - n);
  }
  cluster_wait();  // no block leaves while another reads its partial
  chain_end(chain);
}
template <int NX>
__device__ __forceinline__ void wg_finish(const float (&d)[NX / 2], uint8_t* part_base, int s, const WgTile& tl,
                                          const ClusterGroup& grp, int64_t T, int chain) {
  __syncthreads();  // the stages become this block's partial
  wg_store_partial<NX>(d, part_base);
  wg_add_partials<NX>(part_base, s, tl, grp, T, chain);
}
#endif

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ void mbar_init(uint32_t bar, uint32_t count) {
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;" ::"r"(bar), "r"(count) : "memory");
}
__device__ __forceinline__ void mbar_expect_tx(uint32_t bar, uint32_t bytes) {
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(bar), "r"(bytes) : "memory");
}
__device__ __forceinline__ void mbar_arrive(uint32_t bar) {
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];" ::"r"(bar) : "memory");
}
__device__ __forceinline__ void mbar_wait(uint32_t bar, uint32_t parity) {
  asm volatile(
      "{\n.reg .pred p;\nMUSE_WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 p, [%0], %1;\n"
      "@!p bra MUSE_WAIT_%=;\n}\n" ::"r"(bar),
      "r"(parity)
      : "memory");
}
// Box (c0 = k, c1 = row) of `map` into this block's shared memory at dst;
// its bytes complete the transaction count of barrier `bar`.
__device__ __forceinline__ void tma_load(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3}], "
      "[%4];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar)
      : "memory");
}
// The same for 3-, 4- and 5-dimensional maps (the quantized experts' codes
// and scales, cuda_quant_wgmma.cu).
__device__ __forceinline__ void tma_load3(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.3d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4}], "
      "[%5];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load4(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                          uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5}], [%6];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(bar)
      : "memory");
}
__device__ __forceinline__ void tma_load5(uint32_t dst, const CUtensorMap* map, int c0, int c1, int c2, int c3,
                                          int c4, uint32_t bar) {
  asm volatile(
      "cp.async.bulk.tensor.5d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, "
      "%5, %6}], [%7];" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(c4), "r"(bar)
      : "memory");
}
// Thread 0, before the first copy: each stage's `full` barrier (one
// arrival, with the copy engine's bytes) and `empty` barrier (the eight
// warps handing the stage back).
template <int STAGES>
__device__ __forceinline__ void wg_init_barriers(uint32_t full, uint32_t empty) {
#pragma unroll
  for (int i = 0; i < STAGES; ++i) mbar_init(full + 8 * i, 1), mbar_init(empty + 8 * i, kWgWarps);
  asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
}

// A K-slice's units through the copy engine's stages (both TMA kernels),
// into d from 0.0f. Unit u: wait for its bytes (`full`), run its four k16
// steps, hand its stage back (`empty`). The group is waited for before the
// next unit's A fragments are loaded (a wgmma in flight reads its A
// registers: ptxas would serialize the steps, C7513); the copies of the
// units after it are in flight meanwhile, which is what keeps HBM busy.
// refill(v): thread 0 copies unit v into its stage; it is called for unit
// u − 1 + STAGES while unit u's steps run, once every warp is past unit
// u − 1 (the first STAGES units are the caller's).
template <int NX, int STAGES, class Refill>
__device__ __forceinline__ void wg_tma_units(float (&d)[NX / 2], uint32_t base, uint32_t full, uint32_t empty,
                                             int units, Refill&& refill) {
  constexpr uint32_t kStage = uint32_t(wg_stage_bytes<NX>());
  const int lane = threadIdx.x & 31;
#pragma unroll
  for (int i = 0; i < NX / 2; ++i) d[i] = 0.0f;
  uint32_t a_off[2];
  wg_a_offsets<NX>(a_off);
  for (int u = 0; u < units; ++u) {
    const int st = u % STAGES;
    const uint32_t stage = base + uint32_t(st) * kStage;
    mbar_wait(full + 8 * st, uint32_t((u / STAGES) & 1));
    uint32_t a[4][4];
    wg_unit_start<NX>(d, a, stage, a_off);
    if (threadIdx.x == 0 && u >= 1 && u - 1 + STAGES < units) {
      mbar_wait(empty + 8 * ((u - 1) % STAGES), uint32_t(((u - 1) / STAGES) & 1));  // every warp is past unit u - 1
      refill(u - 1 + STAGES);
    }
    wg_unit_end<NX>(d, a);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * st);
  }
}
#endif

// cuTensorMapEncodeTiled from the driver, or null (cuda_wgmma_gemm.cu).
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder();
// A map of `rows` bf16 rows of `cols` (row stride ld elements) in boxes of
// 64 columns × box_rows rows, 128-byte swizzle, zeros outside.
bool encode_rows(CUtensorMap* m, const void* p, int64_t rows, int64_t cols, int64_t ld, int box_rows);
// A weight's map (rows × cols, dense), encoded once per (address, shape, box).
bool weight_map(CUtensorMap* m, const void* p, int64_t rows, int64_t cols, int box_rows);

}  // namespace muse::cuda
