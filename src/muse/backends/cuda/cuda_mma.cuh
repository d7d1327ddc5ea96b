// The tensor-core pieces of the fixed-order decode products, shared by
// project (cuda_matmul.cu) and the latent experts (cuda_moe.cu).
//
// The arithmetic (cuda_matmul.cu has the full description): a warp owns 16-row
// weight tiles and one of kSplit K-slices; K is cut into granules of
// kGranule, warp s taking granules s, s + kSplit, ... in ascending order;
// each lane's 16-byte pieces of W and x *are* its fragments of
// mma.m16n8k16.bf16 (the k of each 16-wide step permuted the same way in A
// and B); the K-slices' partials are added in the order 0 + 1 + 2 + 3. The
// order depends on K only: a row's result is the same bits whatever the
// other rows of the batch, the tile shape or the kernel variant.
//
// ring_accumulate streams the weights through a per-warp shared-memory ring
// with cp.async (L2 only), STAGES - 1 granules ahead of the mma: a warp
// keeps (STAGES - 1) · RW · 4 KB of weights in flight instead of waiting on
// each 4 KB it loads. A lane reads back only the pieces it copied itself,
// so the ring needs cp.async.wait_group and no barrier.
#pragma once

#include <atomic>
#include <mutex>
#include <span>

#include "muse/backends/cuda/cuda_impl.cuh"

namespace muse::cuda {

// Whether every architecture this file's device code is built for is
// sm_<min_arch / 10> or newer. __CUDA_ARCH_LIST__ (nvcc >= 11.5) names every
// architecture built, on the host pass too.
constexpr bool built_for_at_least(int min_arch) {
#ifdef __CUDA_ARCH_LIST__
  constexpr int archs[] = {__CUDA_ARCH_LIST__};
  for (int a : archs)
    if (a < min_arch) return false;
  return true;
#else
  (void)min_arch;
  return false;
#endif
}

// The bf16 mma needs device code built for sm_80 or newer (a build for the
// nvcc default, sm_75, runs on the H200 from PTX): otherwise the warp dot.
constexpr bool mma_gemv_built() { return built_for_at_least(800); }

// Thread-block clusters (the cluster product, cuda_mma_cluster.cu) need
// device code built for sm_90 or newer only; otherwise the rule uses the
// register kernel, which gives the same bits.
constexpr bool mma_cluster_built() { return built_for_at_least(900); }

constexpr int kSplit = 4;      // warps along K per row group
constexpr int kGranule = 128;  // k per granule

__device__ __forceinline__ uint4 ld_stream(const __nv_bfloat16* p) {  // weights: read once
  uint4 v;
  asm("ld.global.nc.L1::no_allocate.v4.u32 {%0,%1,%2,%3}, [%4];"
      : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
      : "l"(p));
  return v;
}
__device__ __forceinline__ void mma16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                         uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();  // never launched: mma_gemv_built() is false when any code is built below sm_80
#endif
}

__device__ __forceinline__ void cp_async16(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global.L2::128B [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;"); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;" ::"n"(N));
}

// One weight tile's granule at k0 into a ring slot (4 KB: rows g and g + 8
// a lane, 16-byte pieces at k0 + 32j + 8·(lane % 4), wr already offset by
// the latter); pieces past kmine, or of rows that are not there, as zeros.
__device__ __forceinline__ void copy_granule(uint4* slot, const __nv_bfloat16* const (&wr)[2], const bool (&wok)[2],
                                             int64_t k0, int64_t kmine, int lane) {
#pragma unroll
  for (int j = 0; j < 4; ++j)
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      const bool ok = wok[h] && k0 + 32 * j < kmine;
      cp_async16(slot + (j * 2 + h) * 32 + lane, ok ? wr[h] + k0 + 32 * j : wr[h], ok ? 16 : 0);
    }
}

// Lets `Kernel` use `bytes` of dynamic shared memory (above the 48 KB
// default) on the current device: once per kernel and device (the attribute
// belongs to the device's context; tensor-parallel ranks drive several GPUs
// from one process).
// The allowance only grows: a kernel whose size varies with the call (the
// router's, the grouping's) may first ask for a few bytes, then for more.
template <auto Kernel>
cudaError_t allow_dynamic_smem(int bytes) {
  static std::atomic<int> allowed[64] = {};  // bytes allowed so far, per device
  static std::mutex raise;
  int dev = 0;
  cudaError_t e = cudaGetDevice(&dev);
  if (e != cudaSuccess) return e;
  if (dev < 64 && allowed[dev].load(std::memory_order_acquire) >= bytes) return cudaSuccess;
  std::lock_guard<std::mutex> lock(raise);
  if (dev < 64 && allowed[dev].load(std::memory_order_acquire) >= bytes) return cudaSuccess;
  e = cudaFuncSetAttribute(Kernel, cudaFuncAttributeMaxDynamicSharedMemorySize, bytes);
  if (e == cudaSuccess && dev < 64) allowed[dev].store(bytes, std::memory_order_release);
  return e;
}

// An attribute of the current device (0 if unknown), per device, asked once.
template <cudaDeviceAttr Attr>
inline int device_attribute() {
  static std::atomic<int> values[64] = {};
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64) return 0;
  int n = values[dev].load(std::memory_order_acquire);
  if (n == 0 && cudaDeviceGetAttribute(&n, Attr, dev) == cudaSuccess) values[dev].store(n, std::memory_order_release);
  return n;
}
// Multiprocessors of the current device.
inline int sm_count() { return device_attribute<cudaDevAttrMultiProcessorCount>(); }
// Shared memory an SM holds for its blocks.
inline int smem_per_sm() { return device_attribute<cudaDevAttrMaxSharedMemoryPerMultiprocessor>(); }

// Blocks of `Kernel` the GPU holds at once (`threads` a block, `smem` bytes
// of dynamic shared memory); 0 if unknown. Remembered per device with the
// block shape it was asked for (most kernels always launch with one shape;
// the row norms' threads follow the row width), asked again for another.
// The kernel is allowed its shared memory first: above the 48 KB default
// the occupancy query counts 0 blocks until it is.
template <auto Kernel>
int resident_blocks(int threads, size_t smem) {
  static std::atomic<uint64_t> held[64] = {};  // (threads << 44 | smem << 20 | blocks), 0: not asked
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= 64 || threads <= 0 || threads >= (1 << 20) ||
      smem >= (size_t(1) << 24))
    return 0;
  const uint64_t shape = uint64_t(threads) << 44 | uint64_t(smem) << 20;
  const uint64_t h = held[dev].load(std::memory_order_acquire);
  if (h != 0 && (h & ~uint64_t(0xfffff)) == shape) return int(h & 0xfffff);
  int per_sm = 0;
  if (allow_dynamic_smem<Kernel>(int(smem)) != cudaSuccess ||
      cudaOccupancyMaxActiveBlocksPerMultiprocessor(&per_sm, Kernel, threads, smem) != cudaSuccess) {
    cudaGetLastError();  // not sticky: a later launch's cudaGetLastError must not report it
    return 0;
  }
  const int n = per_sm * sm_count();
  if (n > 0 && n < (1 << 20)) held[dev].store(shape | uint64_t(n), std::memory_order_release);
  return n;
}

// Launches `Kernel` with programmatic dependent launch (sm_90): its blocks
// may start while the kernel before it finishes, stream what no kernel
// writes (weights, codes, scales) and wait (pdl_wait, griddepcontrol.wait)
// before reading that kernel's output. `smem` bytes of dynamic shared memory
// are allowed on the device first.
template <auto Kernel, class... Args>
cudaError_t launch_pdl(cudaStream_t s, dim3 grid, dim3 block, size_t smem, Args... args) {
  if (smem > 0) {
    if (cudaError_t e = allow_dynamic_smem<Kernel>(int(smem)); e != cudaSuccess) return e;
  }
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attrs[1];
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attrs;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, Kernel, args...);
}

// Launches `Kernel` as clusters of `cluster` consecutive blocks with
// programmatic dependent launch; `smem` bytes of dynamic shared memory
// allowed first.
template <auto Kernel, class... Args>
cudaError_t launch_pdl_clusters(cudaStream_t s, int64_t blocks, int threads, size_t smem, unsigned cluster,
                                Args... args) {
  if (blocks >= (int64_t(1) << 31) || blocks % cluster != 0) return cudaErrorInvalidConfiguration;
  if (smem > 0)
    if (cudaError_t e = allow_dynamic_smem<Kernel>(int(smem)); e != cudaSuccess) return e;
  cudaLaunchConfig_t cfg{};
  cfg.gridDim = dim3(unsigned(blocks));
  cfg.blockDim = dim3(unsigned(threads));
  cfg.dynamicSmemBytes = smem;
  cfg.stream = s;
  cudaLaunchAttribute attrs[2];
  attrs[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attrs[0].val.programmaticStreamSerializationAllowed = 1;
  attrs[1].id = cudaLaunchAttributeClusterDimension;
  attrs[1].val.clusterDim.x = cluster;
  attrs[1].val.clusterDim.y = 1;
  attrs[1].val.clusterDim.z = 1;
  cfg.attrs = attrs;
  cfg.numAttrs = 2;
  return cudaLaunchKernelEx(&cfg, Kernel, args...);
}

// Launches `Kernel` as clusters of kSplit blocks (block s of a cluster runs
// K-slice s: the cluster kernel, the wgmma products).
template <auto Kernel, class... Args>
cudaError_t launch_slice_clusters(cudaStream_t s, int64_t blocks, int threads, size_t smem, Args... args) {
  return launch_pdl_clusters<Kernel>(s, blocks, threads, smem, unsigned(kSplit), args...);
}

// Dynamic shared memory of a block of kSplit warps (one row group): the
// rings, reused afterwards for the K-slices' partials.
template <int RW, int NT, int STAGES>
constexpr size_t ring_bytes() {
  constexpr size_t ring = size_t(kSplit) * STAGES * RW * 256 * sizeof(uint4);
  constexpr size_t part = size_t(kSplit - 1) * RW * NT * 4 * 32 * sizeof(float);
  return ring > part ? ring : part;
}

// The products of one project() call (Q/K/V/gate, gate/up) share x and run
// as a chain of programmatic dependent launches that overlap: launched alone,
// Glimmer's 256-row K and V products took 15.7 µs each on 16 SMs for 3.4 MB
// (ncu, 2026-12-01). The first product waits for the kernel before (x) as
// usual; with kChainNext it then lets the next product launch, which
// starts with x already complete (kChainXReady: no wait before reading it)
// and waits for the product before it only before exiting, so that each
// product's completion still implies all earlier kernels' (the kernel
// after the chain waits for its last product only).
enum : int { kChainNext = 1, kChainXReady = 2 };

// Before reading x: wait for the kernel before, unless x is known complete;
// then let the next product of the chain launch.
__device__ __forceinline__ void chain_start(int chain) {
  if (!(chain & kChainXReady)) pdl_wait();  // x may come from the kernel before (the weights do not)
  if (chain & kChainNext) pdl_launch_dependents();
}
// Before exiting: a chained product completes after the one before it.
__device__ __forceinline__ void chain_end(int chain) {
  if (chain & kChainXReady) pdl_wait();
}

// acc[r][c] += W rows (tile r) · x rows (tile c) over this warp's K-slice s.
// wr[r][h]: row g + 8h of weight tile r, already offset by 8·(lane % 4);
// xr[c]: activation row 8c + g, offset the same way; rows that are not
// there (!wok / !xok) read as zeros (their pointers stay valid).
template <int RW, int NT, int STAGES>
__device__ __forceinline__ void ring_accumulate(uint4* ring, const __nv_bfloat16* const (&wr)[RW][2],
                                                const bool (&wok)[RW][2], const __nv_bfloat16* const (&xr)[NT],
                                                const bool (&xok)[NT], int64_t K, int s, int lane,
                                                float (&acc)[RW][NT][4], int chain = 0) {
#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int c = 0; c < NT; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][c][i] = 0.0f;
  const uint4 zero = make_uint4(0, 0, 0, 0);
  const int64_t kmine = K - 8 * (lane & 3);  // this lane's k offset is 8·(lane % 4)
  const int64_t ngran = (K + kGranule - 1) / kGranule;
  const int mine = s < ngran ? int((ngran - s + kSplit - 1) / kSplit) : 0;  // granules s, s + kSplit, ...
  uint4* my = ring + size_t(s) * STAGES * RW * 256;
  auto issue = [&](int i) {
    const int64_t k0 = (int64_t(s) + int64_t(i) * kSplit) * kGranule;
    uint4* slot = my + (i % STAGES) * RW * 256;
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int j = 0; j < 4; ++j)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const bool ok = wok[r][h] && k0 + 32 * j < kmine;
          cp_async16(slot + ((r * 4 + j) * 2 + h) * 32 + lane, ok ? wr[r][h] + k0 + 32 * j : wr[r][h], ok ? 16 : 0);
        }
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < mine) issue(i);
    cp_async_commit();
  }
  chain_start(chain);
  for (int i = 0; i < mine; ++i) {
    cp_async_wait<STAGES - 2>();
    if (i + STAGES - 1 < mine) issue(i + STAGES - 1);
    cp_async_commit();
    const int64_t k0 = (int64_t(s) + int64_t(i) * kSplit) * kGranule;
    const uint4* slot = my + (i % STAGES) * RW * 256;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint4 bv[NT];
#pragma unroll
      for (int c = 0; c < NT; ++c)
        bv[c] = xok[c] && k0 + 32 * j < kmine ? __ldg(reinterpret_cast<const uint4*>(xr[c] + k0 + 32 * j)) : zero;
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        const uint4 a0 = slot[((r * 4 + j) * 2) * 32 + lane], a1 = slot[((r * 4 + j) * 2 + 1) * 32 + lane];
#pragma unroll
        for (int c = 0; c < NT; ++c) {
          mma16816(acc[r][c], a0.x, a1.x, a0.y, a1.y, bv[c].x, bv[c].y);
          mma16816(acc[r][c], a0.z, a1.z, a0.w, a1.w, bv[c].z, bv[c].w);
        }
      }
    }
  }
  pdl_streaming_done();
  cp_async_wait<0>();
}

// A warp's two weight tiles of a gate/up pair (the dense MLP's fused kernel
// and the experts'): rows n0 + g and n0 + g + 8 of gate (tile 0) and of up
// (tile 1), row stride ld, offset by 8·(lane % 4); rows at or past I point
// at row I − 1 and are masked.
__device__ __forceinline__ void gate_up_tiles(const __nv_bfloat16* gate, const __nv_bfloat16* up, int64_t n0,
                                              int64_t I, int64_t ld, int lane, const __nv_bfloat16* (&wr)[2][2],
                                              bool (&wok)[2][2]) {
  const int g = lane >> 2, tq = lane & 3;
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = n0 + g + 8 * h, nc = n < I ? n : I - 1;
    wok[0][h] = wok[1][h] = n < I;
    wr[0][h] = gate + nc * ld + 8 * tq;
    wr[1][h] = up + nc * ld + 8 * tq;
  }
}

// The K-slices' partials added in the order s = 0 + 1 + 2 + 3 (through
// `ring`, which must be idle: every warp has left ring_accumulate); warp 0
// calls store(r, c, i, value) for fragment element i of tile (r, c): weight
// row 16-row-tile r, row g + 8·(i / 2); activation row 8c + 2·(lane % 4) + i % 2.
template <int RW, int NT, class Store>
__device__ __forceinline__ void ring_reduce(uint4* ring, int s, int lane, const float (&acc)[RW][NT][4],
                                            Store&& store) {
  __syncthreads();  // the ring becomes the partials
  float* part = reinterpret_cast<float*>(ring);  // [kSplit - 1][RW][NT * 4][32]
  if (s) {
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int c = 0; c < NT; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) part[(((s - 1) * RW + r) * NT * 4 + c * 4 + i) * 32 + lane] = acc[r][c][i];
  }
  __syncthreads();
  if (s == 0) {
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int c = 0; c < NT; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) {
          float v = acc[r][c][i];
#pragma unroll
          for (int q = 0; q < kSplit - 1; ++q) v += part[((q * RW + r) * NT * 4 + c * 4 + i) * 32 + lane];
          store(r, c, i, v);
        }
  }
}

// The products one launch computes: up to four weights of the same x, each
// with its own output (Q, K, V and the gate; gate and up). Every tile of
// `tile_rows` weight rows belongs to one of them (tiles tile_end[j-1] ..
// tile_end[j] - 1 to product j), so each row's sum is the one its own
// launch computes; one launch fills the GPU where the small products (K and
// V: 2 tiles each) alone would leave it idle. Used by the cluster kernel
// and the wgmma products (both in tiles of 128 weight rows).
constexpr int kClusterGroupMax = 4;
struct ClusterGroup {
  const __nv_bfloat16* w[kClusterGroupMax];
  void* out[kClusterGroupMax];
  int64_t n[kClusterGroupMax], ldo[kClusterGroupMax], tile_end[kClusterGroupMax];
  int odt[kClusterGroupMax];
  int count;
  int64_t tiles_n;  // weight-row tiles of all the products
};

// Host: the group of ws[j] -> outs[j] in tiles of `tile_rows` weight rows
// (count 0 when the spans are empty, unequal or longer than four).
inline ClusterGroup make_cluster_group(std::span<const Tensor> ws, std::span<const Tensor> outs, int64_t tile_rows) {
  ClusterGroup grp{};
  if (ws.empty() || ws.size() != outs.size() || ws.size() > size_t(kClusterGroupMax)) return grp;
  grp.count = int(ws.size());
  for (size_t j = 0; j < ws.size(); ++j) {
    grp.w[j] = static_cast<const __nv_bfloat16*>(ws[j].data);
    grp.out[j] = outs[j].data;
    grp.n[j] = ws[j].rows();
    grp.ldo[j] = outs[j].cols();
    grp.odt[j] = dt_code(outs[j].dtype);
    grp.tiles_n += (grp.n[j] + tile_rows - 1) / tile_rows;
    grp.tile_end[j] = grp.tiles_n;
  }
  return grp;
}

// Device: which product weight-row tile nt belongs to (block-uniform).
__device__ __forceinline__ int group_product(const ClusterGroup& grp, int64_t nt) {
  int j = 0;
#pragma unroll
  for (int q = 0; q + 1 < kClusterGroupMax; ++q)
    if (q + 1 < grp.count && nt >= grp.tile_end[q]) j = q + 1;
  return j;
}

// The streamed ring product (cuda_stream_product.cu, variant 15), T <= 8:
// up to four products of the same x in one launch, in equal shares of
// granule rounds for the blocks the GPU holds at once, a tile cut between
// two blocks handing its accumulators on; the ring's bits. A backend owns
// one StreamSync (the boundaries' accumulators and flags, created at its
// start on its device): its launches run one at a time, in stream order,
// never on a side branch. blocks(): the blocks the GPU holds at the rule's
// depth (0: none, the rule keeps the ring); `stages` (0: the rule's four)
// picks the launch's ring depth, for A/B. StreamSync: cuda_impl.cuh.
Status stream_sync_create(StreamSync& sync, int stages);
void stream_sync_free(StreamSync& sync);
cudaError_t launch_stream_product(cudaStream_t s, const StreamSync& sync, const Tensor& x,
                                  std::span<const Tensor> ws, std::span<const Tensor> outs);

// project's warp-dot path (cuda_dot_gemv.cu), T <= 64: the products the
// tensor-core kernels do not take (F32 x or W, odd K, unaligned rows).
void launch_dot_gemv(cudaStream_t s, const Tensor& x, const Tensor& w, const Tensor& out);

// The block-shared-x decode product (cuda_wide_gemv.cu, variant 5), T <= 64.
cudaError_t launch_wide_gemv(cudaStream_t s, const __nv_bfloat16* x, int64_t T, const __nv_bfloat16* w, int64_t N,
                             int64_t K, void* out, int odt, int64_t ldo, int chain);

// The prefill product for T > 64 rows (cuda_mma_gemm.cu, variant 7): the
// decode kernels' bits, from 128 × 128 tiles staged in shared memory.
cudaError_t launch_mma_gemm(cudaStream_t s, const Tensor& x, const Tensor& w, const Tensor& out);

// The decode product for 9..64 rows (cuda_mma_cluster.cu): four blocks per
// 128 weight rows, one K-slice each, the partials added across the cluster;
// `stages` 3 (three blocks per SM, variant 8) or 4 (two, variant 9). Up to
// four products of the same x (ws[j] -> outs[j]) in one launch, each with
// the bits of its own.
cudaError_t launch_mma_cluster(cudaStream_t s, const Tensor& x, std::span<const Tensor> ws,
                               std::span<const Tensor> outs, int stages, int chain);

// The products through Hopper's wgmma (cuda_wgmma_gemm.cu, sm_90a): the
// decode kernels' bits, 128 weight rows × (variant 11: 256, 12: 8..64)
// activation rows a cluster tile, up to four products of the same x in one
// launch. Variant 11: 256 activation rows a tile (the prefill GEMM); xperm,
// where not null, holds x in the mma's order, as wgmma_permute_x wrote it
// (wgmma_xperm_elements(T, K) bf16 values), so the GEMM stages it with
// 16-byte copies instead of 4-byte ones. Variants 12 and 13: 8, 16, 32 or 64
// activation rows a tile by T (decode); 13 reads xperm above 16 rows, 12
// never.
// wgmma_gemm_usable(): the current device runs its sm_90a code (compute
// capability 9.0 exactly; otherwise the rule takes the mma.sync kernels).
bool wgmma_gemm_usable();
int64_t wgmma_xperm_elements(int64_t T, int64_t K);
cudaError_t wgmma_permute_x(cudaStream_t s, const Tensor& x, void* xperm);
cudaError_t launch_wgmma_gemm(cudaStream_t s, const Tensor& x, std::span<const Tensor> ws,
                              std::span<const Tensor> outs, int variant, const void* xperm, int chain);

// fp32 activations × BF16 weights through the bf16 products
// (cuda_split_product.cu): x split exactly into three bf16 rows a row
// (launch_split3, into split_product_xs_bytes of scratch), each product on
// 3T rows into fp32 partials, then out = (hi + mid) + lo (launch_combine3).
size_t split_product_xs_bytes(int64_t T, int64_t K);
size_t split_product_scratch_bytes(int64_t T, int64_t K, int64_t N);
cudaError_t launch_split3(cudaStream_t s, const Tensor& x, void* xs);
cudaError_t launch_combine3(cudaStream_t s, const void* o3, const Tensor& out);

}  // namespace muse::cuda
