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
// k = 32j + 8·(lane % 4). Here a block stages 128 weight rows and 128
// activation rows of half a granule (64 k: steps j = 0, 1 or 2, 3) in shared
// memory, each warp reads exactly those pieces from it and runs the same mma
// calls, and the halves come in the decode order: slice 0's granules 0, 4,
// 8, ... into `acc`, which becomes the total; then slice 1's into a fresh
// `acc`, added to the total; and so on. Only where the operands come from
// changes (shared memory instead of registers loaded from global), not one
// operation.
//
// The pipeline (H200, 2026-12-01: 22% of the bf16 rate with one granule
// in flight and div/mod address math per copy; 31% with three padded stages,
// bench/NOTES.md; this form, not yet run on a GPU): four stages of half a
// granule, three in flight while one is used, one barrier a stage; each
// thread copies the same 8 rows at one piece position for the whole tile
// from row pointers computed once; rows are 128 bytes, unpadded, the piece
// index XOR-swizzled by the row's parity so that the two rows of a load
// phase hit distinct banks. The finished slices' total lives in shared
// memory (64 floats a lane; in registers it spilled: 255 registers, 20%).
//
// Each weight and activation byte is loaded from global memory once per
// 128 × 128 tile; blocks go in groups of 16 activation tiles per weight tile
// (the weight tile is read from HBM once per group, the group's activations
// stay in L2).
#include "muse/backends/cuda/cuda_mma.cuh"

namespace muse::cuda {
namespace {

constexpr int kTileW = 128, kTileT = 128;  // weight rows, activation rows per block
constexpr int kStageRows = kTileW + kTileT;
constexpr int kGroup = 16;     // activation tiles per weight tile, consecutive blocks
constexpr int kThreads = 256;  // 8 warps: 4 along the weights × 2 along the activations
constexpr int kStages = 4;
constexpr int kRowStride = 8;  // uint4 per staged row: 8 pieces (64 k), unpadded, swizzled
constexpr size_t kStageUnits = size_t(kStageRows) * kRowStride;
constexpr size_t kSmemBytes = size_t(kStages) * kStageUnits * sizeof(uint4) + size_t(kThreads) * 64 * sizeof(float);
static_assert(kThreads * 8 == kStageRows * 8, "each thread copies 8 pieces a stage");

// Where piece p (of 8) of a staged row sits: the two rows a load phase
// reads (g even and odd, the same 4 pieces) land in different halves of the
// 128-byte bank window.
__device__ __forceinline__ int swizzle(int row, int piece) { return piece ^ ((row & 1) << 2); }

// Position in the decode order: slice, granule, half (a unit is 64 k).
struct Unit {
  int slice, gran, half;
  __device__ bool valid(int ngran) const { return slice < kSplit && gran < ngran; }
  __device__ void advance(int ngran) {
    if (half == 0) {
      half = 1;
      return;
    }
    half = 0;
    gran += kSplit;
    if (gran >= ngran) ++slice, gran = slice;
  }
};

__global__ void __launch_bounds__(kThreads, 1)
    mma_gemm_kernel(const __nv_bfloat16* __restrict__ x, int64_t T, const __nv_bfloat16* __restrict__ w, int64_t N,
                    int64_t K, void* out, int odt, int64_t ldo) {
  extern __shared__ uint4 smem[];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, g = lane >> 2, tq = lane & 3;
  const int wm = warp & 3, wn = warp >> 2;
  const int64_t tiles_t = (T + kTileT - 1) / kTileT, tiles_n = (N + kTileW - 1) / kTileW;
  const int64_t b = blockIdx.x, per_group = int64_t(kGroup) * tiles_n;
  const int64_t first_t = (b / per_group) * kGroup;
  const int64_t group_size = tiles_t - first_t < kGroup ? tiles_t - first_t : kGroup;
  const int64_t t_tile = first_t + (b % per_group) % group_size, n_tile = (b % per_group) / group_size;
  const int64_t n0 = n_tile * kTileW, t0 = t_tile * kTileT;
  const int ngran = int((K + kGranule - 1) / kGranule);

  // This thread's copies: piece `cp` of staged rows cr, cr + 32, ..., cr + 224
  // (the first four weight rows, the last four activation rows); `ok` bit i:
  // row cr + 32·i exists (rows past N or T are staged as zeros).
  const int cp = threadIdx.x & 7, cr = threadIdx.x >> 3;
  unsigned ok_rows = 0;
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    if (n0 + cr + 32 * i < N) ok_rows |= 1u << i;
    if (t0 + cr + 32 * i < T) ok_rows |= 1u << (4 + i);
  }
  const __nv_bfloat16* wsrc = w + (n0 + cr) * K + 8 * cp;  // formed, read only where ok
  const __nv_bfloat16* xsrc = x + (t0 + cr) * K + 8 * cp;
  const int64_t step32 = 32 * K;
  const int cpos = cr * kRowStride + swizzle(cr, cp);  // rows cr + 32·i share cr's parity
  auto issue = [&](const Unit& u, int into) {
    uint4* dst = smem + size_t(into) * kStageUnits + cpos;
    const int64_t k = int64_t(u.gran) * kGranule + u.half * 64;  // this thread's piece starts at k + 8·cp
    const bool k_ok = k + 8 * cp < K;
#pragma unroll
    for (int i = 0; i < 8; ++i) {
      const bool ok = k_ok && (ok_rows >> i & 1u);
      const __nv_bfloat16* p = (i < 4 ? wsrc : xsrc) + (i & 3) * step32 + k;
      cp_async16(dst + 32 * i * kRowStride, ok ? p : w, ok ? 16 : 0);
    }
  };

  float acc[2][8][4];
  float* tot_smem = reinterpret_cast<float*>(smem + size_t(kStages) * kStageUnits) + threadIdx.x;
  auto tot = [&](int r, int c, int i) -> float& { return tot_smem[((r * 8 + c) * 4 + i) * kThreads]; };
#pragma unroll
  for (int r = 0; r < 2; ++r)
#pragma unroll
    for (int c = 0; c < 8; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][c][i] = 0.0f, tot(r, c, i) = 0.0f;

  pdl_wait();
  Unit load{0, 0, 0}, use{0, 0, 0};
#pragma unroll
  for (int st_i = 0; st_i < kStages - 1; ++st_i) {
    if (load.valid(ngran)) issue(load, st_i), load.advance(ngran);
    cp_async_commit();
  }
  int stage = 0, last_slice = -1;
  while (use.valid(ngran)) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // the unit in `stage` has landed for every thread; the stage before it is free
    if (load.valid(ngran)) issue(load, (stage + kStages - 1) % kStages), load.advance(ngran);
    cp_async_commit();
    const uint4* sw = smem + size_t(stage) * kStageUnits;
    const uint4* sx = sw + kTileW * kRowStride;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint4 a[2][2];
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int row = 32 * wm + 16 * r + g + 8 * h;
          a[r][h] = sw[row * kRowStride + swizzle(row, 4 * j + tq)];
        }
#pragma unroll
      for (int c = 0; c < 8; ++c) {
        const int row = 64 * wn + 8 * c + g;
        const uint4 bv = sx[row * kRowStride + swizzle(row, 4 * j + tq)];
#pragma unroll
        for (int r = 0; r < 2; ++r) {
          mma16816(acc[r][c], a[r][0].x, a[r][1].x, a[r][0].y, a[r][1].y, bv.x, bv.y);
          mma16816(acc[r][c], a[r][0].z, a[r][1].z, a[r][0].w, a[r][1].w, bv.z, bv.w);
        }
      }
    }
    Unit next = use;
    next.advance(ngran);
    if (!next.valid(ngran) || next.slice != use.slice) {  // slice done: total = ((P0 + P1) + P2) + P3
#pragma unroll
      for (int r = 0; r < 2; ++r)
#pragma unroll
        for (int c = 0; c < 8; ++c)
#pragma unroll
          for (int i = 0; i < 4; ++i) {
            tot(r, c, i) = use.slice == 0 ? acc[r][c][i] : tot(r, c, i) + acc[r][c][i];
            acc[r][c][i] = 0.0f;
          }
      last_slice = use.slice;
    }
    use = next;
    stage = (stage + 1) % kStages;
  }
  cp_async_wait<0>();
  // Slices without a granule (K <= 384) still add their zero partial, as in the decode kernels.
  for (int s = last_slice + 1; s < kSplit; ++s)
#pragma unroll
    for (int r = 0; r < 2; ++r)
#pragma unroll
      for (int c = 0; c < 8; ++c)
#pragma unroll
        for (int i = 0; i < 4; ++i) tot(r, c, i) = s == 0 ? 0.0f : tot(r, c, i) + 0.0f;
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
  const int64_t blocks = ((T + kTileT - 1) / kTileT) * ((N + kTileW - 1) / kTileW);
  if (blocks >= (int64_t(1) << 31)) return cudaErrorInvalidConfiguration;
  if (cudaError_t e = allow_dynamic_smem<mma_gemm_kernel>(int(kSmemBytes)); e != cudaSuccess) return e;
  mma_gemm_kernel<<<unsigned(blocks), kThreads, kSmemBytes, s>>>(static_cast<const __nv_bfloat16*>(x.data), T,
                                                                 static_cast<const __nv_bfloat16*>(w.data), N, K,
                                                                 out.data, dt_code(out.dtype), out.cols());
  return cudaGetLastError();
}

}  // namespace muse::cuda
