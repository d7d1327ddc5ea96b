// The prefill product (T > 64 rows): a tiled tensor-core GEMM that gives
// every output element exactly the bits the decode kernels give it
// (cuda_mma.cuh, mma_gemv in cuda_matmul.cu), so a row's result does not
// depend on how its prompt was chunked, and prefix caching and chunked
// prefill stay bitwise equal to one whole prefill.
//
// What makes the bits equal: the decode kernels add, per output, the four
// K-slices' partials in the order 0 + 1 + 2 + 3, slice s being the mma chain
// over granules s, s + 4, s + 8, ... (128 k each) from 0.0f, each granule as
// 4 × 2 mma.m16n8k16 steps whose fragments are a lane's 16-byte pieces at
// k = 32j + 8·(lane % 4). Here a block stages one granule of 128 weight rows
// and 128 activation rows in shared memory (cp.async, two stages), each warp
// reads exactly those pieces from it and runs the same mma calls, and the
// granules come slice by slice: slice 0's granules in order into `acc`,
// which becomes `total`; then slice 1's into a fresh `acc`, added to
// `total`; and so on. Only where the operands come from changes (shared
// memory instead of registers loaded from global), not one operation.
//
// Unlike the decode kernels each weight and activation byte is loaded from
// global memory once per 128 × 128 tile, so the tile is compute-bound;
// blocks go in groups of 16 activation tiles per weight tile (the weight
// tile is read from HBM once per group, the group's activations stay in L2).
#include "muse/backends/cuda/cuda_mma.cuh"

namespace muse::cuda {
namespace {

constexpr int kTileW = 128, kTileT = 128;   // weight rows, activation rows per block
constexpr int kRowPieces = 16;              // 16-byte pieces per staged row (one granule)
constexpr int kRowStride = kRowPieces + 4;  // padded: the 8 lanes of a load phase hit distinct banks
constexpr int kStageRows = kTileW + kTileT;
constexpr int kGroup = 16;                  // activation tiles per weight tile, consecutive blocks
constexpr int kThreads = 256;               // 8 warps: 4 along the weights × 2 along the activations
constexpr size_t kStagesBytes = size_t(2) * kStageRows * kRowStride * sizeof(uint4);
// Each warp's running total of the finished slices lives in shared memory
// (64 floats a lane; registers hold only the slice being accumulated).
constexpr size_t kSmemBytes = kStagesBytes + size_t(kThreads / 32) * 64 * 32 * sizeof(float);

__global__ void __launch_bounds__(kThreads) mma_gemm_kernel(const __nv_bfloat16* __restrict__ x, int64_t T,
                                                            const __nv_bfloat16* __restrict__ w, int64_t N, int64_t K,
                                                            void* out, int odt, int64_t ldo) {
  extern __shared__ uint4 smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int wm = warp & 3, wn = warp >> 2;  // this warp: weight rows 32·wm.., activation rows 64·wn..
  // Grouped tile order.
  const int64_t tiles_t = (T + kTileT - 1) / kTileT, tiles_n = (N + kTileW - 1) / kTileW;
  const int64_t b = blockIdx.x, per_group = int64_t(kGroup) * tiles_n;
  const int64_t first_t = (b / per_group) * kGroup;
  const int64_t group_size = tiles_t - first_t < kGroup ? tiles_t - first_t : kGroup;
  const int64_t t_tile = first_t + (b % per_group) % group_size, n_tile = (b % per_group) / group_size;
  const int64_t n0 = n_tile * kTileW, t0 = t_tile * kTileT;
  const int64_t ngran = (K + kGranule - 1) / kGranule;

  // Granule `gran` into stage `st`: rows beyond N or T and pieces beyond K as zeros (K % 8 == 0).
  auto issue = [&](int64_t gran, int into) {
    uint4* dst = smem + size_t(into) * kStageRows * kRowStride;
    const int64_t k0 = gran * kGranule;
    for (int p = threadIdx.x; p < kStageRows * kRowPieces; p += kThreads) {
      const int row = p / kRowPieces, piece = p % kRowPieces;
      const int64_t k = k0 + 8 * piece;
      const bool is_w = row < kTileW;
      const int64_t r = is_w ? n0 + row : t0 + (row - kTileW);
      const bool ok = r < (is_w ? N : T) && k < K;
      const __nv_bfloat16* src = is_w ? w : x;
      cp_async16(dst + row * kRowStride + piece, ok ? src + r * K + k : src, ok ? 16 : 0);
    }
  };

  float acc[2][8][4];
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][c][i] = 0.0f;
  float* total = reinterpret_cast<float*>(reinterpret_cast<char*>(smem) + kStagesBytes) + warp * 64 * 32 + lane;
  auto tot = [&](int r, int c, int i) -> float& { return total[((r * 8 + c) * 4 + i) * 32]; };

  pdl_wait();
  int slice = 0, stage = 0;
  int64_t gran = 0;  // slice 0 starts at granule 0
  issue(gran, stage);
  cp_async_commit();
  for (;;) {
    // The next granule in the decode kernels' order: this slice's next, else the next slice's first.
    int next_slice = slice;
    int64_t next = gran + kSplit;
    if (next >= ngran) next_slice = slice + 1, next = slice + 1;
    const bool more = next_slice < kSplit && next < ngran;
    if (more) issue(next, stage ^ 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint4* sw = smem + size_t(stage) * kStageRows * kRowStride;
    const uint4* sx = sw + kTileW * kRowStride;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint4 a[2][2];
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) a[r][h] = sw[(32 * wm + 16 * r + g + 8 * h) * kRowStride + 4 * j + tq];
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const uint4 bv = sx[(64 * wn + 8 * c + g) * kRowStride + 4 * j + tq];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mma16816(acc[r][c], a[r][0].x, a[r][1].x, a[r][0].y, a[r][1].y, bv.x, bv.y);
          mma16816(acc[r][c], a[r][0].z, a[r][1].z, a[r][0].w, a[r][1].w, bv.z, bv.w);
        }
      }
    }
    __syncthreads();  // the stage is refilled by the next iteration's issue
    if (!(more && next_slice == slice)) {  // slice done: total = ((P0 + P1) + P2) + P3
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < 8; ++c)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            tot(r, c, i) = slice == 0 ? acc[r][c][i] : tot(r, c, i) + acc[r][c][i];
            acc[r][c][i] = 0.0f;
          }
    }
    if (!more) break;
    slice = next_slice;
    gran = next;
    stage ^= 1;
  }
  cp_async_wait<0>();
  // Slices without a granule (K <= 384) still add their zero partial, as in the decode kernels.
  for (int s = slice + 1; s < kSplit; ++s)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) tot(r, c, i) += 0.0f;
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) {
        const int64_t n = n0 + 32 * wm + 16 * r + g + 8 * (i >> 1), t = t0 + 64 * wn + 8 * c + 2 * tq + (i & 1);
        if (n < N && t < T) st(out, odt, t * ldo + n, tot(r, c, i));
      }
}

}  // namespace

cudaError_t launch_mma_gemm(cudaStream_t s, const Tensor& x, const Tensor& w, const Tensor& out) {
  const int64_t T = x.rows(), K = x.cols(), N = w.rows();
  if (cudaError_t e = allow_dynamic_smem<mma_gemm_kernel>(int(kSmemBytes)); e != cudaSuccess) return e;
  const int64_t blocks = ((T + kTileT - 1) / kTileT) * ((N + kTileW - 1) / kTileW);
  if (blocks >= (int64_t(1) << 31)) return cudaErrorInvalidConfiguration;
  mma_gemm_kernel<<<unsigned(blocks), kThreads, kSmemBytes, s>>>(
      static_cast<const __nv_bfloat16*>(x.data), T, static_cast<const __nv_bfloat16*>(w.data), N, K, out.data,
      dt_code(out.dtype), out.cols());
  return cudaGetLastError();
}

}  // namespace muse::cuda
