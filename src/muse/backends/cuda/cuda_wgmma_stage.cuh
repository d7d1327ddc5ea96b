// The staging shared by the wgmma products (cuda_wgmma_gemm.cu: the decode
// kernels and the 256-row prefill GEMM whose clusters add four K-slices;
// cuda_wgmma_fullk.cu: the prefill GEMM that runs all of K in one block):
// units of 64 k, a stage holding NX activation rows and 128 weight rows
// in the 128-byte swizzle, the weights' A fragments loaded from it as the
// decode kernels' mma.sync pieces, the copy engine's barriers and copies.
// Only for code built for sm_90a where it issues wgmma or TMA.
#pragma once

#include <cuda.h>
#include <cuda_bf16.h>

#include <cstdint>

#include "muse/backends/cuda/cuda_mma.cuh"
#include "muse/backends/cuda/cuda_wgmma.cuh"

namespace muse::cuda {

constexpr int kWgThreads = 256;  // two warpgroups
constexpr int kWgWarps = kWgThreads / 32;
constexpr int kWgW = 128;               // weight rows per tile: 64 a warpgroup (wgmma's M)
constexpr int kWgRowBytes = 128;        // 64 k of bf16 per staged row
constexpr size_t kWgWBytes = size_t(kWgW) * kWgRowBytes;

template <int NX>
constexpr size_t wg_stage_bytes() {  // the activation rows first (1024-byte aligned), then the weights
  return size_t(NX) * kWgRowBytes + kWgWBytes;
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
#endif

// The tensor maps of a TMA launch: each product's weights (boxes of 64 k ×
// 128 rows, or a part of them) and the permuted x (64 k × its rows), both in
// the 128-byte swizzle, which is the stages' layout above.
struct WgMaps {
  CUtensorMap w[kClusterGroupMax];
  CUtensorMap x;
};

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
// The same box into shared memory at dst of every block in `mask` (cluster
// ranks), completing each one's barrier at the same offset as `bar`.
__device__ __forceinline__ void tma_load_multicast(uint32_t dst, const CUtensorMap* map, int c0, int c1, uint32_t bar,
                                                   uint16_t mask) {
  asm volatile(
      "cp.async.bulk.tensor.2d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.multicast::cluster [%0], "
      "[%1, {%2, %3}], [%4], %5;" ::"r"(dst),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(bar), "h"(mask)
      : "memory");
}
// An arrival on the barrier at `bar` (this block's offset) of cluster rank `rank`.
__device__ __forceinline__ void mbar_arrive_remote(uint32_t bar, int rank) {
  asm volatile(
      "{\n.reg .b32 remote;\n"
      "mapa.shared::cluster.u32 remote, %0, %1;\n"
      "mbarrier.arrive.release.cluster.shared::cluster.b64 _, [remote];\n}\n" ::"r"(bar),
      "r"(rank)
      : "memory");
}
#endif


// Host: a tensor map of `rows` bf16 rows of `cols` (row stride ld elements)
// in boxes of 64 columns × box_rows rows, 128-byte swizzle, zeros outside;
// false where the driver cannot encode one.
bool encode_rows(CUtensorMap* m, const void* p, int64_t rows, int64_t cols, int64_t ld, int box_rows);
// The same for a weight (rows x cols, dense), encoded once per (address,
// shape, box).
bool weight_map(CUtensorMap* m, const void* p, int64_t rows, int64_t cols, int box_rows = kWgW);
// Activation tiles of NX rows a group, so a group's x stays in L2 while the
// weights stream past it.
int64_t wg_t_group(int NX, int64_t K);
// Host: the prefill GEMM with all of K in one block (cuda_wgmma_fullk.cu;
// variant 17: clusters of 2 × 2 tiles sharing both operands, 18: 4 × 2,
// 19: no sharing) over x permuted at xp (row stride ldp); false where a
// tensor map cannot be had.
bool launch_wgmma_fullk(cudaStream_t s, const __nv_bfloat16* xp, int64_t ldp, int64_t T, int64_t K,
                        const ClusterGroup& grp, int variant, cudaError_t* err);

}  // namespace muse::cuda
