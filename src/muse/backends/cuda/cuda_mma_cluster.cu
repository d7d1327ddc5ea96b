// The decode product for 9..64 rows (variants 8 and 9): a cluster of four
// blocks per 128 weight rows, block s running K-slice s, so the weights are
// read from HBM once and each weight tile meets all of x's rows in shared
// memory.
//
// Why: the register and ring kernels give each warp 16 weight rows and load
// x's rows from L1/L2 for every granule, so at 64 rows they move 4 bytes of
// x per byte of weight and reach 23-33% of HBM (bench/NOTES.md). Here a
// block stages 128 weight rows and 64 activation rows of half a granule
// (64 k, 24 KB; rows unpadded, pieces swizzled) at a time: x costs half a
// byte per weight byte, from L2. Three stages (72 KB: three blocks per SM,
// variant 8) or four (96 KB: two blocks, variant 9).
//
// The bits are the decode kernels' (cuda_mma.cuh): block s of the cluster
// computes slice s's partial P_s over granules s, s + 4, ... with the same
// fragments (a lane's 16-byte pieces at k = 32j + 8·(lane % 4)) and the same
// mma calls in the same order from 0.0f; the blocks then leave their
// partials in shared memory, and after a cluster barrier block q adds
// P0 + P1 + P2 + P3, in that order, for a quarter of the tile (its 32 weight
// rows), reading the others through distributed shared memory. No
// workspace, no atomics.
#include <cooperative_groups.h>

#include "muse/backends/cuda/cuda_mma.cuh"

namespace muse::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kCW = 128, kCT = 64;  // weight rows, activation rows per cluster tile
constexpr int kCThreads = 256;      // 8 warps: 4 along the weights (32 rows) × 2 along x (32 rows)
constexpr int kCPieces = 8;         // 16-byte pieces per staged row (64 k)
constexpr int kCRows = kCW + kCT;   // staged rows per stage
constexpr size_t kCStageUnits = size_t(kCRows) * kCPieces;
constexpr int kCCopies = kCRows * kCPieces / kCThreads;  // 16-byte copies per thread per stage (6)
static_assert(kCRows * kCPieces % kCThreads == 0 && kCW % (kCThreads / kCPieces) == 0, "copy layout");
constexpr size_t kCPartFloats = size_t(kCThreads) * 32;  // the block's partial: 32 floats a lane

template <int STAGES>
constexpr size_t cluster_smem_bytes() {
  constexpr size_t stages = size_t(STAGES) * kCStageUnits * sizeof(uint4);
  constexpr size_t part = kCPartFloats * sizeof(float);
  return stages > part ? stages : part;
}

// Where piece p of a staged 128-byte row sits: the two rows a load phase
// reads (g even and odd, the same 4 pieces) land in different halves of the
// bank window.
__device__ __forceinline__ int cswizzle(int row, int piece) { return piece ^ ((row & 1) << 2); }

template <int STAGES>
__global__ void __launch_bounds__(kCThreads, STAGES == 3 ? 3 : 2)  // the blocks per SM its shared memory allows
    mma_cluster_kernel(const __nv_bfloat16* __restrict__ x, int64_t T, int64_t K, const ClusterGroup grp, int chain) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  extern __shared__ uint4 smem[];
  cg::cluster_group cluster = cg::this_cluster();
  const int s = int(cluster.block_rank());  // this block's K-slice
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int wm = warp & 3, wn = warp >> 2;  // weight rows 32·wm.., activation rows 32·wn..
  const int64_t tile = blockIdx.x / kSplit;
  const int64_t nt = tile % grp.tiles_n, t0 = (tile / grp.tiles_n) * kCT;
  const int j = group_product(grp, nt);  // the product this tile of weight rows belongs to
  const __nv_bfloat16* __restrict__ w = grp.w[j];
  const int64_t N = grp.n[j], n0 = (nt - (j ? grp.tile_end[j - 1] : 0)) * kCW;
  const int64_t ngran = (K + kGranule - 1) / kGranule;
  const int mine = s < ngran ? int((ngran - s + kSplit - 1) / kSplit) : 0;  // granules s, s + 4, ...
  const int units = 2 * mine;                                               // halves of them

  // This thread's copies: piece `cp` of staged rows cr + 32·i (i < 4: weight
  // rows, else activation rows); rows past N or T are staged as zeros.
  const int cp = threadIdx.x & 7, cr = threadIdx.x >> 3;
  unsigned ok_rows = 0;
#pragma unroll
  for (int i = 0; i < kCCopies; ++i) {
    const int row = cr + 32 * i;
    if (row < kCW ? n0 + row < N : t0 + (row - kCW) < T) ok_rows |= 1u << i;
  }
  const __nv_bfloat16* wsrc = w + (n0 + cr) * K + 8 * cp;  // formed, read only where ok
  const __nv_bfloat16* xsrc = x + (t0 + cr) * K + 8 * cp;
  const int64_t step32 = 32 * K;
  auto unit_k = [&](int u) { return (int64_t(s) + int64_t(u >> 1) * kSplit) * kGranule + (u & 1) * 64; };
  // part 0: the weight rows, part 1: the activation rows (x may still be
  // being written by the kernel before until chain_start).
  const int cpos = cr * kCPieces + cswizzle(cr, cp);  // rows cr + 32·i share cr's parity
  auto issue = [&](int u, int part) {
    uint4* dst = smem + size_t(u % STAGES) * kCStageUnits + cpos;
    const int64_t k = unit_k(u);
    const bool k_ok = k + 8 * cp < K;
#pragma unroll
    for (int i = 0; i < kCCopies; ++i) {
      if ((i < kCW / 32) != (part == 0)) continue;
      const bool ok = k_ok && (ok_rows >> i & 1u);
      const __nv_bfloat16* p = i < kCW / 32 ? wsrc + i * step32 + k : xsrc + (i - kCW / 32) * step32 + k;
      cp_async16(dst + 32 * i * kCPieces, ok ? p : w, ok ? 16 : 0);
    }
  };

  float acc[2][4][4];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][c][i] = 0.0f;
  // Activation column tiles of this warp that hold rows (warp-uniform).
  const int64_t t_warp = t0 + 32 * wn;
  const int live_c = t_warp >= T ? 0 : T - t_warp >= 32 ? 4 : int((T - t_warp + 7) / 8);

#pragma unroll
  for (int u = 0; u < STAGES - 1; ++u)
    if (u < units) issue(u, 0);
  chain_start(chain);
#pragma unroll
  for (int u = 0; u < STAGES - 1; ++u) {
    if (u < units) issue(u, 1);
    cp_async_commit();
  }
  for (int u = 0; u < units; ++u) {
    cp_async_wait<STAGES - 2>();
    __syncthreads();  // unit u has landed for every thread; the stage of unit u - 1 is free
    if (u + STAGES - 1 < units) issue(u + STAGES - 1, 0), issue(u + STAGES - 1, 1);
    cp_async_commit();
    const uint4* sw = smem + size_t(u % STAGES) * kCStageUnits;
    const uint4* sx = sw + kCW * kCPieces;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint4 a[2][2];
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = 32 * wm + 16 * r + g + 8 * h;
          a[r][h] = sw[row * kCPieces + cswizzle(row, 4 * j + tq)];
        }
#pragma unroll
      for (int c = 0; c < 4; ++c) {
        if (c >= live_c) break;
        const int row = 32 * wn + 8 * c + g;
        const uint4 bv = sx[row * kCPieces + cswizzle(row, 4 * j + tq)];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mma16816(acc[r][c], a[r][0].x, a[r][1].x, a[r][0].y, a[r][1].y, bv.x, bv.y);
          mma16816(acc[r][c], a[r][0].z, a[r][1].z, a[r][0].w, a[r][1].w, bv.z, bv.w);
        }
      }
    }
  }
  pdl_streaming_done();
  cp_async_wait<0>();
  __syncthreads();  // the stages become this block's partial
  float* part = reinterpret_cast<float*>(smem);
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int c = 0; c < 4; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) part[((r * 4 + c) * 4 + i) * kCThreads + threadIdx.x] = acc[r][c][i];
  cluster.sync();  // every block's partial is in its shared memory
  // Block q adds the four partials of the warps with wm == q (weight rows
  // 32q..32q+31 of the tile): 2 warps × 32 values × 32 lanes = 2048 sums.
  const float* parts[kSplit];
#pragma unroll
  for (int q = 0; q < kSplit; ++q) parts[q] = cluster.map_shared_rank(part, q);
  for (int e = threadIdx.x; e < 2 * 32 * 32; e += kCThreads) {
    const int src_lane = e & 31, v = (e >> 5) & 31, src_wn = e >> 10;
    const int src_thread = (s + 4 * src_wn) * 32 + src_lane;  // warp wm = s, wn = src_wn
    const int r = v >> 4, c = (v >> 2) & 3, i = v & 3;
    const int sg = src_lane >> 2, stq = src_lane & 3;
    const int64_t n = n0 + 32 * s + 16 * r + sg + 8 * (i >> 1), t = t0 + 32 * src_wn + 8 * c + 2 * stq + (i & 1);
    if (n >= N || t >= T) continue;
    const int at = v * kCThreads + src_thread;
    float sum = parts[0][at];
#pragma unroll
    for (int q = 1; q < kSplit; ++q) sum = __fadd_rn(sum, parts[q][at]);
    st(grp.out[j], grp.odt[j], t * grp.ldo[j] + n, sum);
  }
  cluster.sync();  // no block leaves while another reads its partial
  chain_end(chain);
#elif defined(__CUDA_ARCH__)
  __trap();  // never launched: mma_cluster_built() is false when any code is built below sm_90
#endif
}

template <int STAGES>
cudaError_t launch_cluster(cudaStream_t s, const __nv_bfloat16* x, int64_t T, int64_t K, const ClusterGroup& grp,
                           int chain) {
  const int64_t tiles = grp.tiles_n * ((T + kCT - 1) / kCT);
  return launch_slice_clusters<mma_cluster_kernel<STAGES>>(s, tiles * kSplit, kCThreads, cluster_smem_bytes<STAGES>(),
                                                           x, T, K, grp, chain);
}

}  // namespace

cudaError_t launch_mma_cluster(cudaStream_t s, const Tensor& x, std::span<const Tensor> ws,
                               std::span<const Tensor> outs, int stages, int chain) {
  const ClusterGroup grp = make_cluster_group(ws, outs, kCW);
  if (grp.count == 0) return cudaErrorInvalidValue;
  auto* xp = static_cast<const __nv_bfloat16*>(x.data);
  if (stages == 4) return launch_cluster<4>(s, xp, x.rows(), x.cols(), grp, chain);
  return launch_cluster<3>(s, xp, x.rows(), x.cols(), grp, chain);
}

}  // namespace muse::cuda
