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
// The activations' transposed order: for the prefill (variant 11) and
// decode from 5 rows (variant 14, the rule's; 13 above 16 rows) the op
// that produced x, or a small kernel, first writes x in that
// order to scratch (rows padded with zeros to whole granules); then the
// copy engine stages both operands (wgmma_tma_kernel). Without scratch, and
// for variant 12, each thread copies 4-byte pairs of x into place and
// 16-byte pieces of the weights with cp.async (wgmma_kernel).
//
// The pipeline: units of 64 k (one staged row is 128 bytes), a stage holding
// the tile's NX activation rows and its 128 weight rows, both in the 128-byte
// swizzle (chunk c of row r at c ^ (r % 8): the copy engine's layout, and a
// warp's fragment loads touch 8 different chunks). Two warpgroups, 64 weight
// rows each. wgmma_kernel keeps STAGES - 1 units in flight behind one
// block-wide barrier a unit; wgmma_tma_kernel keeps STAGES in flight behind
// one barrier a stage (mbarriers: the copy engine's bytes in, the eight
// warps out), so a warp waits only for its own next unit. On the H200 that
// took the 4096-row prefill products from 50-56% of the bf16 rate to 53-74%
// (bench/NOTES.md, 2026-12-04).
#include <cooperative_groups.h>

#include <cuda.h>
#include <cudaTypedefs.h>

#include <algorithm>
#include <mutex>
#include <unordered_map>

#include "muse/backends/cuda/cuda_mma.cuh"
#include "muse/backends/cuda/cuda_wgmma_tile.cuh"
#include "muse/core/log.h"

namespace muse::cuda {
namespace {


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
  wg_store_permuted32(in, reinterpret_cast<uint4*>(xp + row * Kp + k0));
}

template <int NX>
__device__ __forceinline__ WgTile wg_tile(const ClusterGroup& grp, int64_t T, int64_t t_group) {
  const int64_t tile = blockIdx.x / kSplit;
  const int64_t tiles_t = (T + NX - 1) / NX, per_group = t_group * grp.tiles_n;
  const int64_t first_t = (tile / per_group) * t_group;
  const int64_t group_size = tiles_t - first_t < t_group ? tiles_t - first_t : t_group;
  const int64_t nt = (tile % per_group) / group_size;
  WgTile tl;
  tl.t0 = (first_t + (tile % per_group) % group_size) * NX;
  tl.j = group_product(grp, nt);
  tl.N = grp.n[tl.j];
  tl.n0 = (nt - (tl.j ? grp.tile_end[tl.j - 1] : 0)) * kWgW;
  return tl;
}


// One tile, K-slice s = this block's rank in its cluster, staged with
// cp.async: the weights in 16-byte pieces, x (as it is, row stride ldx) in
// 4-byte pairs put into the mma's order. Where x is permuted into scratch,
// wgmma_tma_kernel below stages both with the copy engine instead.
template <int NX, int STAGES>
__global__ void __launch_bounds__(kWgThreads, NX >= 256 ? 1 : NX >= 32 ? 2 : 3)  // what the shared memory allows
    wgmma_kernel(const __nv_bfloat16* __restrict__ x, int64_t ldx, int64_t T, int64_t K, const ClusterGroup grp,
                 int64_t t_group, int chain) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(NX % 8 == 0 && (NX <= 64 || NX == 256) && STAGES >= 3, "wgmma shapes");
  constexpr size_t kStage = wg_stage_bytes<NX>();
  extern __shared__ uint8_t wg_raw[];
  const uint32_t raw = smem_addr(wg_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // the swizzle is on address bits
  const int s = int(cg::this_cluster().block_rank());  // this block's K-slice
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const WgTile tl = wg_tile<NX>(grp, T, t_group);
  const int64_t t0 = tl.t0, n0 = tl.n0, N = tl.N;
  const __nv_bfloat16* __restrict__ w = grp.w[tl.j];
  const int units = wg_units(K, s);

  // Weight copies: piece wp of rows wr + 32i, to chunk wp ^ (row % 8).
  const int wp = threadIdx.x & 7, wr = threadIdx.x >> 3;
  unsigned w_rows = 0;
#pragma unroll
  for (int i = 0; i < kWgW / 32; ++i)
    if (n0 + wr + 32 * i < N) w_rows |= 1u << i;
  const __nv_bfloat16* wsrc = w + (n0 + wr) * K + 8 * wp;  // formed, read only where ok
  const uint32_t wdst = uint32_t(NX * kWgRowBytes + wr * kWgRowBytes + ((wp ^ (wr & 7)) << 4));
  // Activation copies: word `lane` of rows warp + 8i: word l is pair p = l % 4 of
  // piece (l / 4) % 4 of 32-k block l / 16; it goes to chunk 4·(l / 16) + p
  // (XOR row % 8 = warp), word (l / 4) % 4.
  const uint32_t xdst = uint32_t(warp * kWgRowBytes) | (uint32_t(((4 * (lane >> 4) + (lane & 3)) ^ warp) << 4) |
                                                        uint32_t(((lane >> 2) & 3) << 2));
  const __nv_bfloat16* xsrc = x + (t0 + warp) * ldx + 2 * lane;
  auto issue = [&](int u, int part) {  // part 0: the weight rows, 1: the activation rows
    const uint32_t stage = base + uint32_t(u % STAGES) * uint32_t(kStage);
    const int64_t k = wg_unit_k(s, u);
    if (part == 0) {
      const bool k_ok = k + 8 * wp < K;
#pragma unroll
      for (int i = 0; i < kWgW / 32; ++i) {
        const bool ok = k_ok && (w_rows >> i & 1u);
        cp_async16s(stage + wdst + uint32_t(32 * i * kWgRowBytes), ok ? wsrc + i * 32 * K + k : w, ok ? 16 : 0);
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
  uint32_t a_off[2];
  wg_a_offsets<NX>(a_off);

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
    wg_unit_start<NX>(d, a, stage, a_off);
    cp_async_wait<STAGES - 3>();
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (u + STAGES - 1 < units) issue(u + STAGES - 1, 0), issue(u + STAGES - 1, 1);
    cp_async_commit();
    wg_unit_end<NX>(d, a);
  }
  pdl_streaming_done();
  cp_async_wait<0>();
  wg_finish<NX>(d, wg_raw + (base - raw), s, tl, grp, T, chain);
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched: wgmma_gemm_usable() is false unless this file's sm_90a code runs
#endif
}

// The tensor maps of a wgmma_tma_kernel launch: each product's weights
// (boxes of 64 k × 128 rows) and the permuted x (64 k × NX rows), both in
// the 128-byte swizzle, which is the stages' layout above.
struct WgMaps {
  CUtensorMap w[kClusterGroupMax];
  CUtensorMap x;
};


// The same tile with x permuted into scratch, staged by the copy engine
// (TMA): thread 0 keeps STAGES units in flight, each stage's `full`
// barrier counting its bytes in and its `empty` barrier the eight warps
// out, so no block-wide barrier sits in the loop and the next units load
// while the warps wait on their own. Thread 0 refills the stage of unit
// u - 1 while unit u's k16 steps run (all warps are past unit u - 1 by
// then, but for a straggler). The stages hold the same bytes at the same
// places as wgmma_kernel's (rows past N or T and k past K zero-filled) and
// the warps run the same k16 steps in the same order: the same bits.
template <int NX, int STAGES>
__global__ void __launch_bounds__(kWgThreads, NX >= 256 ? 1 : STAGES <= 3 ? 3 : 2)
    wgmma_tma_kernel(const __grid_constant__ WgMaps maps, int64_t T, int64_t K, const ClusterGroup grp,
                     int64_t t_group, int chain) {
#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
  static_assert(NX % 8 == 0 && NX <= 256 && STAGES >= 2, "wgmma shapes");
  constexpr uint32_t kStage = uint32_t(wg_stage_bytes<NX>()), kXBytes = uint32_t(NX * kWgRowBytes);
  extern __shared__ uint8_t wg_raw[];
  __shared__ alignas(8) uint64_t bars[2 * STAGES];  // full[STAGES], then empty[STAGES]
  const uint32_t raw = smem_addr(wg_raw);
  const uint32_t base = (raw + 1023u) & ~1023u;  // the 128-byte swizzle wants 1024-byte stages
  const uint32_t full = smem_addr(bars), empty = full + 8 * STAGES;
  const int s = int(cg::this_cluster().block_rank());  // this block's K-slice
  const WgTile tl = wg_tile<NX>(grp, T, t_group);
  const int units = wg_units(K, s);
  const CUtensorMap* wm = &maps.w[tl.j];
  const CUtensorMap* xm = &maps.x;
  const int n0 = int(tl.n0), t0 = int(tl.t0);
  auto load = [&](int u, bool weights, bool acts) {  // unit u into its stage (thread 0)
    const uint32_t stage = base + uint32_t(u % STAGES) * kStage, bar = full + 8 * (u % STAGES);
    const int k = int(wg_unit_k(s, u));
    if (weights) mbar_expect_tx(bar, kStage), tma_load(stage + kXBytes, wm, k, n0, bar);
    if (acts) tma_load(stage, xm, k, t0, bar);
  };
  if (threadIdx.x == 0) {
    wg_init_barriers<STAGES>(full, empty);
    for (int u = 0; u < STAGES && u < units; ++u) load(u, true, false);  // the weights do not come from the kernel before
  }
  chain_start(chain);  // x may
  if (threadIdx.x == 0)
    for (int u = 0; u < STAGES && u < units; ++u) load(u, false, true);
  __syncthreads();  // the barriers are initialized

  float d[NX / 2];
  wg_tma_units<NX, STAGES>(d, base, full, empty, units, [&](int u) { load(u, true, true); });
  pdl_streaming_done();
  wg_finish<NX>(d, wg_raw + (base - raw), s, tl, grp, T, chain);
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched: wgmma_gemm_usable() is false unless this file's sm_90a code runs
#endif
}

// Activation tiles a group: about 24 MB of x (2 to 7 tiles of 256 rows at
// Glimmer's widths), so a group's x and the weight tiles in flight fit
// the 50 MB L2; with all 16 tiles of a 4096-row prefill in one group x
// was refetched from HBM for every weight tile (ncu: DRAM 48% busy, L2
// 80%, 2026-12-04).
int64_t wg_t_group(int NX, int64_t K) { return std::clamp<int64_t>((int64_t(24) << 20) / (int64_t(NX) * K * 2), 1, 16); }

template <int NX, int STAGES>
cudaError_t launch_tiles(cudaStream_t s, const __nv_bfloat16* x, int64_t ldx, int64_t T, int64_t K,
                         const ClusterGroup& grp, int chain) {
  const int64_t tiles = grp.tiles_n * ((T + NX - 1) / NX);
  return launch_slice_clusters<wgmma_kernel<NX, STAGES>>(s, tiles * kSplit, kWgThreads, wg_smem_bytes<NX, STAGES>(),
                                                         x, ldx, T, K, grp, wg_t_group(NX, K), chain);
}

// The permuted-x kernel through the copy engine; false where a tensor map
// cannot be had (the caller then stages x as it is: the same bits, slower,
// said once in the log).
template <int NX, int STAGES>
bool launch_tma_tiles(cudaStream_t s, const __nv_bfloat16* xp, int64_t ldp, int64_t T, int64_t K,
                      const ClusterGroup& grp, int chain, cudaError_t* err) {
  WgMaps maps{};
  bool ok = encode_rows(&maps.x, xp, T, ldp, ldp, NX);
  for (int j = 0; ok && j < grp.count; ++j) ok = weight_map(&maps.w[j], grp.w[j], grp.n[j], K, kWgW);
  if (!ok) {
    static std::once_flag said;
    std::call_once(said, [] { LOG_WARN("cuda: no tensor maps for the wgmma products; staging x with cp.async"); });
    return false;
  }
  constexpr size_t smem = size_t(STAGES) * wg_stage_bytes<NX>() + 1024;
  static_assert(size_t(NX) * kWgPartStride * sizeof(float) <= size_t(STAGES) * wg_stage_bytes<NX>(),
                "the partials fit in the stages");
  const int64_t tiles = grp.tiles_n * ((T + NX - 1) / NX);
  *err = launch_slice_clusters<wgmma_tma_kernel<NX, STAGES>>(s, tiles * kSplit, kWgThreads, smem, maps, T, K,
                                                             grp, wg_t_group(NX, K), chain);
  return true;
}

// Decode at 17..32 rows (one activation tile): the TMA kernel with five
// stages and two blocks an SM, or three and three, whichever leaves less of
// its last wave empty (the stream is bandwidth-bound, so a launch costs
// about its waves times the blocks a wave holds): Glimmer's q/k/v/gate
// launch (272 blocks) fits one wave of three an SM instead of 1.03 of two.
// Batch 32: 17.52-17.57 ms a step against 17.89-17.92 with two everywhere
// (H200, 2026-12-04). At 33..64 rows three an SM everywhere did better
// still (19.72 ms at batch 64 against 19.80 with this rule, against 20.5
// with two everywhere: the q/k/v/gate launch had its SMs idle 40% of the
// time at two an SM, ncu).
bool two_per_sm(const ClusterGroup& grp) {
  const int64_t blocks = grp.tiles_n * kSplit, sms = sm_count();
  auto cost = [&](int64_t per_sm) { return (blocks + per_sm * sms - 1) / (per_sm * sms) * per_sm; };
  return sms <= 0 || cost(2) <= cost(3);
}

// Activation rows a tile: 256 for the prefill GEMM (variant 11), else the
// fewest of 8, 16, 32, 64 that hold T.
int wgmma_tile_rows(int variant, int64_t T) {
  if (variant == 11) return 256;
  if (variant == 14) return T <= 32 ? 32 : 64;       // the TMA tiles of x permuted, from one row
  return T <= 8 ? 8 : T <= 16 ? 16 : T <= 32 ? 32 : 64;  // 12, 13
}

}  // namespace

// cuTensorMapEncodeTiled from the driver (no link against libcuda), or null.
PFN_cuTensorMapEncodeTiled_v12000 tensor_map_encoder() {
  static const PFN_cuTensorMapEncodeTiled_v12000 fn = [] {
    void* p = nullptr;
    cudaDriverEntryPointQueryResult q{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &p, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess) {
      cudaGetLastError();
      return PFN_cuTensorMapEncodeTiled_v12000(nullptr);
    }
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(p);
  }();
  return fn;
}

// A map of `rows` bf16 rows of `cols` (row stride ld elements) in boxes of
// 64 columns × box_rows rows, 128-byte swizzle, zeros outside.
bool encode_rows(CUtensorMap* m, const void* p, int64_t rows, int64_t cols, int64_t ld, int box_rows) {
  const auto encode = tensor_map_encoder();
  if (!encode || reinterpret_cast<uintptr_t>(p) % 16 != 0 || (ld * 2) % 16 != 0 || rows <= 0 || cols <= 0 ||
      rows >= (int64_t(1) << 31) || cols >= (int64_t(1) << 31))
    return false;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(ld * 2)};
  const cuuint32_t box[2] = {64, cuuint32_t(box_rows)};
  const cuuint32_t estr[2] = {1, 1};
  return encode(m, CU_TENSOR_MAP_DATA_TYPE_BFLOAT16, 2, const_cast<void*>(p), dims, strides, box, estr,
                CU_TENSOR_MAP_INTERLEAVE_NONE, CU_TENSOR_MAP_SWIZZLE_128B, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
                CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

// The weights' maps, encoded once per (address, shape): a decode step would
// otherwise encode four or five a launch, ~200 a step.
bool weight_map(CUtensorMap* m, const void* p, int64_t rows, int64_t cols, int box_rows) {
  struct Key {
    const void* p;
    int64_t rows, cols;
    int box;
    bool operator==(const Key&) const = default;
  };
  struct Hash {
    size_t operator()(const Key& k) const {
      return std::hash<const void*>()(k.p) ^ (size_t(k.rows) * 0x9E3779B97F4A7C15ull) ^ size_t(k.cols) ^ (size_t(k.box) << 48);
    }
  };
  static std::mutex mu;
  static std::unordered_map<Key, CUtensorMap, Hash> cache;
  const Key key{p, rows, cols, box_rows};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) {
    *m = it->second;
    return true;
  }
  if (!encode_rows(m, p, rows, cols, cols, box_rows)) return false;
  if (cache.size() >= 4096) cache.clear();  // bounded; a model's weights number in the hundreds
  cache.emplace(key, *m);
  return true;
}

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
                    cudaFuncGetAttributes(&attr, wgmma_kernel<64, 4>) == cudaSuccess;
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
  cudaError_t e = cudaSuccess;
  switch (wgmma_tile_rows(variant, T)) {
    case 8: return launch_tiles<8, 4>(s, xb, K, T, K, grp, chain);
    case 16: return launch_tiles<16, 4>(s, xb, K, T, K, grp, chain);
    case 32:
      if (xp && (two_per_sm(grp) ? launch_tma_tiles<32, 5>(s, xp, ldp, T, K, grp, chain, &e)
                                 : launch_tma_tiles<32, 3>(s, xp, ldp, T, K, grp, chain, &e)))
        return e;
      return launch_tiles<32, 5>(s, xb, K, T, K, grp, chain);
    case 64:
      if (xp && launch_tma_tiles<64, 3>(s, xp, ldp, T, K, grp, chain, &e)) return e;
      return launch_tiles<64, 4>(s, xb, K, T, K, grp, chain);
    default: break;
  }
  if (xp && launch_tma_tiles<256, 4>(s, xp, ldp, T, K, grp, chain, &e)) return e;
  return launch_tiles<256, 4>(s, xb, K, T, K, grp, chain);
}

}  // namespace muse::cuda
