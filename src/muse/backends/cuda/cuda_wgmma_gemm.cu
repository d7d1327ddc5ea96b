// The bf16 products through Hopper's warpgroup MMA (wgmma, sm_90a), with
// the decode kernels' bits: variant 11 (the prefill GEMM, 256 activation
// rows a tile) and variant 12 (decode, 8..64 activation rows a tile).
//
// Why: the mma.sync kernels issue every mma and every fragment load from
// eight warps and stay latency-bound: the prefill GEMM at 31-33% of the
// bf16 tensor rate, the cluster decode kernel at 42-68% of HBM at 64 rows
// (bench/NOTES.md). wgmma runs 64 x N x 16 per instruction asynchronously.
//
// The bits. The decode kernels (cuda_mma.cuh) give each output the sum
// ((P0 + P1) + P2) + P3 of four K-slices, slice s being the chain of
// mma.m16n8k16 steps over granules s, s + 4, ... (128 k each) from 0.0f;
// each 32 k is two steps whose A operand (16 weight rows) is a lane's
// 16-byte pieces at k = 32j + 8·(lane % 4), words .x/.y (step A) and .z/.w
// (step B), and whose B operand (8 activation rows) is the same pieces of
// x. Here the weights are wgmma's A operand from registers, loaded as those
// very pieces (wgmma's register fragment is mma.sync's, per warp of the
// warpgroup); the activations are the B operand from shared memory, where
// each 32-k block of a row is stored in the order the mma sees it: in units
// of 4-byte pairs, pair m = 4·tq + p of memory sits at slot 4·p + tq (a 4 x 4
// transpose), so wgmma's k16 steps in address order are the decode kernels'
// steps A and B with the same operands at the same positions, in the same
// order. A cluster of four blocks computes one tile, block s slice s; the
// partials meet in distributed shared memory and block q adds
// P0 + P1 + P2 + P3 for a quarter of the tile's activation rows, as the
// cluster kernel does. The mma.sync and wgmma k16 steps rounding alike is
// what ProjectVariants.EveryGemvVariantGivesTheSameBits checks (it holds on
// the H200: bench/NOTES.md, 2026-12-04).
//
// The activations' transposed order: for the prefill (variant 11) a small
// kernel first writes x in that order to scratch (rows padded with zeros to
// whole granules), so the GEMM stages it with 16-byte copies; without
// scratch, and for decode, each thread copies 4-byte pairs into place.
//
// The pipeline: units of 64 k (one staged row is 128 bytes), a stage holding
// the tile's NX activation rows (1024-byte aligned, 128-byte swizzle) and its
// 128 weight rows (16-byte pieces, swizzled by row so a warp's fragment loads
// are conflict-free); STAGES - 1 units in flight or ready while one is used.
// Two warpgroups, 64 weight rows each; a unit's barrier and next copies
// happen while its wgmma runs.
#include <cooperative_groups.h>

#include <algorithm>

#include "muse/backends/cuda/cuda_mma.cuh"
#include "muse/backends/cuda/cuda_wgmma.cuh"

namespace muse::cuda {
namespace {

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

// x (T x K) -> xp (T x Kp, Kp a multiple of 128): each 32-k block of a row
// in the mma's order (chunk p of the block holds word p of its pieces 0..3),
// k >= K as zeros. One thread a block.
__global__ void wgmma_permute_x_kernel(const __nv_bfloat16* __restrict__ x, int64_t T, int64_t K,
                                       __nv_bfloat16* __restrict__ xp, int64_t Kp) {
  pdl_wait();  // x comes from the kernel before
  const int64_t blocks_row = Kp / 32, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * blocks_row) return;
  const int64_t row = i / blocks_row, k0 = (i % blocks_row) * 32;
  uint4 in[4];
#pragma unroll
  for (int tq = 0; tq < 4; ++tq)
    in[tq] = k0 + 8 * tq < K ? *reinterpret_cast<const uint4*>(x + row * K + k0 + 8 * tq) : make_uint4(0, 0, 0, 0);
  uint4* dst = reinterpret_cast<uint4*>(xp + row * Kp + k0);
  dst[0] = make_uint4(in[0].x, in[1].x, in[2].x, in[3].x);
  dst[1] = make_uint4(in[0].y, in[1].y, in[2].y, in[3].y);
  dst[2] = make_uint4(in[0].z, in[1].z, in[2].z, in[3].z);
  dst[3] = make_uint4(in[0].w, in[1].w, in[2].w, in[3].w);
}

// One tile: weight rows n0 .. n0 + 127 of product j × activation rows
// t0 .. t0 + NX - 1, K-slice s = this block's rank in its cluster. XPERM: x
// is the permuted copy (row stride ldx, zero-padded to whole granules).
template <int NX, int STAGES, bool XPERM>
__global__ void __launch_bounds__(kWgThreads, NX >= 256 ? 1 : NX >= 32 ? 2 : 3)  // what the shared memory allows
    wgmma_kernel(const __nv_bfloat16* __restrict__ x, int64_t ldx, int64_t T, int64_t K, const ClusterGroup grp,
                 int64_t t_group, int chain) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(NX % 8 == 0 && (NX <= 64 || NX == 256) && STAGES >= 3, "wgmma shapes");
  constexpr size_t kStage = wg_stage_bytes<NX>();
  extern __shared__ uint8_t wg_raw[];
  const uint32_t raw = smem_addr(wg_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // the swizzle is on address bits
  cg::cluster_group cluster = cg::this_cluster();
  const int s = int(cluster.block_rank());  // this block's K-slice
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, wg = threadIdx.x >> 7;
  const int g = lane >> 2, tq = lane & 3;

  // The tile: groups of t_group activation tiles, every weight tile over
  // each group in turn (the group's rows of x stay in L2 while the weights
  // stream past them).
  const int64_t tile = blockIdx.x / kSplit;
  const int64_t tiles_t = (T + NX - 1) / NX, per_group = t_group * grp.tiles_n;
  const int64_t first_t = (tile / per_group) * t_group;
  const int64_t group_size = tiles_t - first_t < t_group ? tiles_t - first_t : t_group;
  const int64_t t0 = (first_t + (tile % per_group) % group_size) * NX, nt = (tile % per_group) / group_size;
  const int j = group_product(grp, nt);
  const __nv_bfloat16* __restrict__ w = grp.w[j];
  const int64_t N = grp.n[j], n0 = (nt - (j ? grp.tile_end[j - 1] : 0)) * kWgW;
  const int64_t ngran = (K + kGranule - 1) / kGranule;
  const int mine = s < ngran ? int((ngran - s + kSplit - 1) / kSplit) : 0;  // granules s, s + 4, ...
  const int units = 2 * mine;                                               // halves of them (64 k)
  auto unit_k = [&](int u) { return (int64_t(s) + int64_t(u >> 1) * kSplit) * kGranule + (u & 1) * 64; };

  // Weight copies: piece wp of rows wr + 32i, to chunk wp ^ (row % 8).
  const int wp = threadIdx.x & 7, wr = threadIdx.x >> 3;
  unsigned w_rows = 0;
#pragma unroll
  for (int i = 0; i < kWgW / 32; ++i)
    if (n0 + wr + 32 * i < N) w_rows |= 1u << i;
  const __nv_bfloat16* wsrc = w + (n0 + wr) * K + 8 * wp;  // formed, read only where ok
  const uint32_t wdst = uint32_t(NX * kWgRowBytes + wr * kWgRowBytes + ((wp ^ (wr & 7)) << 4));
  // Activation copies. XPERM: piece xq of rows xr + 32i, to chunk xq ^ (row % 8).
  // Otherwise word `lane` of rows warp + 8i: word l is pair p = l % 4 of
  // piece (l / 4) % 4 of 32-k block l / 16; it goes to chunk 4·(l / 16) + p
  // (XOR row % 8 = warp), word (l / 4) % 4.
  const uint32_t xdst = XPERM ? uint32_t(wr * kWgRowBytes + ((wp ^ (wr & 7)) << 4))
                              : uint32_t(warp * kWgRowBytes) |
                                    (uint32_t(((4 * (lane >> 4) + (lane & 3)) ^ warp) << 4) |
                                     uint32_t(((lane >> 2) & 3) << 2));
  const __nv_bfloat16* xsrc = XPERM ? x + (t0 + wr) * ldx + 8 * wp : x + (t0 + warp) * ldx + 2 * lane;
  auto issue = [&](int u, int part) {  // part 0: the weight rows, 1: the activation rows
    const uint32_t stage = base + uint32_t(u % STAGES) * uint32_t(kStage);
    const int64_t k = unit_k(u);
    if (part == 0) {
      const bool k_ok = k + 8 * wp < K;
#pragma unroll
      for (int i = 0; i < kWgW / 32; ++i) {
        const bool ok = k_ok && (w_rows >> i & 1u);
        cp_async16s(stage + wdst + uint32_t(32 * i * kWgRowBytes), ok ? wsrc + i * 32 * K + k : w, ok ? 16 : 0);
      }
    } else if (XPERM) {
#pragma unroll
      for (int i = 0; i < (NX + 31) / 32; ++i) {
        const int row = wr + 32 * i;
        if (NX % 32 != 0 && row >= NX) break;
        const bool ok = t0 + row < T;
        cp_async16s(stage + xdst + uint32_t(32 * i * kWgRowBytes), ok ? xsrc + i * 32 * ldx + k : x, ok ? 16 : 0);
      }
    } else {
      const bool k_ok = k + 2 * lane < K;
#pragma unroll
      for (int i = 0; i < NX / kWgWarps; ++i) {
        const bool ok = k_ok && t0 + warp + kWgWarps * i < T;
        cp_async4(stage + xdst + uint32_t(kWgWarps * i * kWgRowBytes), ok ? xsrc + i * kWgWarps * ldx + k : x,
                  ok ? 4 : 0);
      }
    }
  };

  float d[NX / 2];
#pragma unroll
  for (int i = 0; i < NX / 2; ++i) d[i] = 0.0f;
  // This warp's fragment rows (weight rows of the tile) and where its
  // pieces 4jj + tq sit in a stage's weight rows.
  const int ra = 64 * wg + 16 * (warp & 3) + g;
  uint32_t a_off[2];
#pragma unroll
  for (int jj = 0; jj < 2; ++jj)
    a_off[jj] = uint32_t(NX * kWgRowBytes + ra * kWgRowBytes + (((4 * jj + tq) ^ (ra & 7)) << 4));
  constexpr uint32_t kRow8 = 8 * kWgRowBytes;  // row ra + 8: the same swizzle (ra + 8 ≡ ra mod 8)

  // Units 0 .. STAGES - 2 in flight, then unit 0 waited for.
#pragma unroll
  for (int u = 0; u < STAGES - 1; ++u)
    if (u < units) issue(u, 0);
  chain_start(chain);  // x may come from the kernel before; the weights do not
#pragma unroll
  for (int u = 0; u < STAGES - 1; ++u) {
    if (u < units) issue(u, 1);
    cp_async_commit();
  }
  cp_async_wait<STAGES - 2>();
  asm volatile("fence.proxy.async.shared::cta;" ::: "memory");  // cp.async's writes, seen by wgmma
  __syncthreads();
  // Unit u is in shared memory for every thread at the top of iteration u.
  // Its four k16 steps are issued first; while they run, unit u + 1 is
  // waited for and unit u + STAGES - 1 started in the stage of unit u - 1
  // (whose wgmma every warpgroup waited for at the end of iteration u - 1,
  // before the barrier). The A fragments are loaded only once the group
  // before is complete: a register a wgmma in flight reads must not be
  // written (ptxas would serialize the steps).
  for (int u = 0; u < units; ++u) {
    const uint32_t stage = base + uint32_t(u % STAGES) * uint32_t(kStage);
    uint32_t a[4][4];
#pragma unroll
    for (int jj = 0; jj < 2; ++jj) {
      const uint4 lo = lds128(stage + a_off[jj]), hi = lds128(stage + a_off[jj] + kRow8);
      // Step A (words .x, .y) then step B (.z, .w), as mma16816 takes them.
      a[2 * jj][0] = lo.x, a[2 * jj][1] = hi.x, a[2 * jj][2] = lo.y, a[2 * jj][3] = hi.y;
      a[2 * jj + 1][0] = lo.z, a[2 * jj + 1][1] = hi.z, a[2 * jj + 1][2] = lo.w, a[2 * jj + 1][3] = hi.w;
    }
    const uint64_t db = wg_desc(stage);
    wg_hold(d);
    wg_fence();
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wgmma_rs<NX>(d, a[kk], db + 2 * kk);  // +32 bytes a k16 step
    wg_commit();
    cp_async_wait<STAGES - 3>();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (u + STAGES - 1 < units) issue(u + STAGES - 1, 0), issue(u + STAGES - 1, 1);
    cp_async_commit();
    wg_wait<0>();
    wg_hold(d);
#pragma unroll
    for (int kk = 0; kk < 4; ++kk) wg_hold(a[kk]);
  }
  cp_async_wait<0>();
  __syncthreads();  // the stages become this block's partial

  // d[i]: weight row ra + 8·((i >> 1) & 1), activation row 8·(i >> 2) + 2·tq + (i & 1) of the tile.
  float* part = reinterpret_cast<float*>(wg_raw + (base - raw));  // [NX][kWgPartStride]
#pragma unroll
  for (int i = 0; i < NX / 2; ++i)
    part[(8 * (i >> 2) + 2 * tq + (i & 1)) * kWgPartStride + ra + 8 * ((i >> 1) & 1)] = d[i];
  cluster.sync();  // every block's partial is in its shared memory
  const float* parts[kSplit];
#pragma unroll
  for (int q = 0; q < kSplit; ++q) parts[q] = cluster.map_shared_rank(part, q);
  // Block s adds activation rows s·NX/4 .. of every weight row, four weight rows a thread.
  constexpr int kRowsEach = NX / kSplit, kQuads = kWgW / 4;
  void* out = grp.out[j];
  const int odt = grp.odt[j];
  const int64_t ldo = grp.ldo[j];
  for (int e = threadIdx.x; e < kRowsEach * kQuads; e += kWgThreads) {
    const int c = s * kRowsEach + e / kQuads, r = 4 * (e % kQuads);
    const int64_t t = t0 + c, n = n0 + r;
    if (t >= T || n >= N) continue;
    const int at = c * kWgPartStride + r;
    float4 v = *reinterpret_cast<const float4*>(parts[0] + at);
#pragma unroll
    for (int q = 1; q < kSplit; ++q) {
      const float4 p = *reinterpret_cast<const float4*>(parts[q] + at);
      v.x = __fadd_rn(v.x, p.x), v.y = __fadd_rn(v.y, p.y), v.z = __fadd_rn(v.z, p.z), v.w = __fadd_rn(v.w, p.w);
    }
    const float vs[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
    for (int i = 0; i < 4; ++i)
      if (n + i < N) st(out, odt, t * ldo + n + i, vs[i]);
  }
  cluster.sync();  // no block leaves while another reads its partial
  chain_end(chain);
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched: wgmma_gemm_usable() is false unless this file's sm_90a code runs
#endif
}

template <int NX, int STAGES, bool XPERM>
cudaError_t launch_tiles(cudaStream_t s, const __nv_bfloat16* x, int64_t ldx, int64_t T, int64_t K,
                         const ClusterGroup& grp, int chain) {
  const int64_t tiles = grp.tiles_n * ((T + NX - 1) / NX);
  // Activation tiles a group: about 24 MB of x (2 to 7 tiles of 256 rows at
  // Glimmer's widths), so a group's x and the weight tiles in flight fit
  // the 50 MB L2; with all 16 tiles of a 4096-row prefill in one group x
  // was refetched from HBM for every weight tile (ncu: DRAM 48% busy, L2
  // 80%, 2026-12-04).
  const int64_t t_group = std::clamp<int64_t>((int64_t(24) << 20) / (int64_t(NX) * K * 2), 1, 16);
  return launch_slice_clusters<wgmma_kernel<NX, STAGES, XPERM>>(s, tiles * kSplit, kWgThreads,
                                                                wg_smem_bytes<NX, STAGES>(), x, ldx, T, K, grp,
                                                                t_group, chain);
}

// Activation rows a tile: 256 for the prefill GEMM (variant 11), else the
// fewest of 8, 16, 32, 64 that hold T.
int wgmma_tile_rows(int variant, int64_t T) {
  if (variant == 11) return 256;
  return T <= 8 ? 8 : T <= 16 ? 16 : T <= 32 ? 32 : 64;  // 12, 13
}

}  // namespace

bool wgmma_gemm_usable() {
  static std::atomic<int> usable[64] = {};  // per device: 0 unknown, 1 yes, 2 no
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return false;
  int known = usable[dev].load(std::memory_order_acquire);
  if (known == 0) {
    int major = 0, minor = 0;
    cudaFuncAttributes attr{};
    // sm_90a code runs on compute capability 9.0 only; the attribute query
    // fails where this build carries no code for the device.
    const bool ok = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
                    cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
                    major == 9 && minor == 0 &&
                    cudaFuncGetAttributes(&attr, wgmma_kernel<64, 4, false>) == cudaSuccess;
    if (!ok) cudaGetLastError();
    known = ok ? 1 : 2;
    usable[dev].store(known, std::memory_order_release);
  }
  return known == 1;
}

int64_t wgmma_xperm_elements(int64_t T, int64_t K) { return T * ((K + kGranule - 1) / kGranule * kGranule); }

cudaError_t wgmma_permute_x(cudaStream_t s, const Tensor& x, void* xperm) {
  const int64_t T = x.rows(), K = x.cols(), Kp = wgmma_xperm_elements(1, K), blocks = T * (Kp / 32);
  return launch_pdl<wgmma_permute_x_kernel>(s, dim3(blocks_for(blocks, 256)), dim3(256), 0,
                                            static_cast<const __nv_bfloat16*>(x.data), T, K,
                                            static_cast<__nv_bfloat16*>(xperm), Kp);
}

cudaError_t launch_wgmma_gemm(cudaStream_t s, const Tensor& x, std::span<const Tensor> ws,
                              std::span<const Tensor> outs, int variant, const void* xperm, int chain) {
  const ClusterGroup grp = make_cluster_group(ws, outs, kWgW);
  if (grp.count == 0) return cudaErrorInvalidValue;
  const int64_t T = x.rows(), K = x.cols();
  auto* xb = static_cast<const __nv_bfloat16*>(x.data);
  auto* xp = static_cast<const __nv_bfloat16*>(xperm);
  const int64_t ldp = wgmma_xperm_elements(1, K);
  switch (wgmma_tile_rows(variant, T)) {
    case 8: return launch_tiles<8, 4, false>(s, xb, K, T, K, grp, chain);
    case 16: return launch_tiles<16, 4, false>(s, xb, K, T, K, grp, chain);
    case 32:
      if (xp) return launch_tiles<32, 5, true>(s, xp, ldp, T, K, grp, chain);
      return launch_tiles<32, 5, false>(s, xb, K, T, K, grp, chain);
    case 64:
      if (xp) return launch_tiles<64, 4, true>(s, xp, ldp, T, K, grp, chain);
      return launch_tiles<64, 4, false>(s, xb, K, T, K, grp, chain);
    default: break;
  }
  if (!xperm) return launch_tiles<256, 4, false>(s, xb, K, T, K, grp, chain);
  return launch_tiles<256, 4, true>(s, xp, ldp, T, K, grp, chain);
}

}  // namespace muse::cuda
