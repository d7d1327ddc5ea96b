// wide_gemv (variant 5, not the rule): the decode product reading each
// 64-row activation tile once per 64 weight rows. Kept for A/B timing
// (`muse bench --product-kernel 5`) and the same-bits tests.
#include "muse/backends/cuda/cuda_mma.cuh"

namespace muse::cuda {
namespace {

// ---------------------------------------------------------------------------
// wide_gemv: the T = 9..64 products, reading each 64-row activation tile
// once per 64 weight rows (the register kernel reads it once per 16: at
// T = 64 that L2 traffic, T·K·2 bytes per 16 rows, held it at 25-33% of HBM).
//
// Same arithmetic again: the 4 warps of a block own 16 weight rows each and
// all walk every granule of K in order, keeping one accumulator per K-slice
// (granule index mod 4), added 0 + 1 + 2 + 3 at the end: exactly the sums
// the K-split kernels form in their 4 warps, so the same bits. The x tile of
// a granule (8·NT rows × 128 k) is copied once into a block-shared ring
// (cp.async, laid out [j][tile][lane] so each fragment read is one
// conflict-free 512-byte row); each warp's weights go through its own ring
// as in ring_gemv. One barrier per granule orders the shared ring.
// ---------------------------------------------------------------------------
constexpr int kWideWarps = 4;
constexpr int kWideStages = 3;

template <int NT>
constexpr size_t wide_smem() {
  return size_t(kWideStages) * (size_t(kWideWarps) * 256 + size_t(4) * NT * 32) * sizeof(uint4);
}

template <int NT>
__global__ void __launch_bounds__(32 * kWideWarps)
    wide_gemv_kernel(const __nv_bfloat16* __restrict__ x, int64_t T, const __nv_bfloat16* __restrict__ w, int64_t N,
                     int64_t K, void* out, int odt, int64_t ldo, int chain) {
  extern __shared__ uint4 smem[];
  uint4* wring = smem;                                        // [warp][stage][4 j][2 h][32]
  uint4* xring = smem + size_t(kWideStages) * kWideWarps * 256;  // [stage][4 j][NT][32]
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int64_t t0 = int64_t(blockIdx.y) * 64;
  const int64_t nt = T - t0 < 64 ? T - t0 : 64;
  const int64_t n0 = (int64_t(blockIdx.x) * kWideWarps + warp) * 16;
  const __nv_bfloat16* wr[2];
  bool wok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int64_t n = n0 + g + 8 * h;
    wok[h] = n < N;
    wr[h] = w + (n < N ? n : N - 1) * K + 8 * tq;
  }
  const int64_t kmine = K - 8 * tq;
  const int ngran = int((K + kGranule - 1) / kGranule);
  uint4* my = wring + size_t(warp) * kWideStages * 256;
  auto issue_w = [&](int i) {
    const int64_t k0 = int64_t(i) * kGranule;
    copy_granule(my + (i % kWideStages) * 256, wr, wok, k0, kmine, lane);
  };
  // The x tile of granule i: element e = (j·NT + c)·32 + l holds row 8c + l/4,
  // k = 128i + 8(l%4) + 32j .. +8.
  auto issue_x = [&](int i) {
    const int64_t k0 = int64_t(i) * kGranule;
    uint4* slot = xring + size_t(i % kWideStages) * 4 * NT * 32;
    for (int e = threadIdx.x; e < 4 * NT * 32; e += 32 * kWideWarps) {
      const int l = e & 31, jc = e >> 5, c = jc % NT, j = jc / NT;
      const int64_t row = 8 * c + (l >> 2), k = k0 + 8 * (l & 3) + 32 * j;
      const bool ok = row < nt && k < K;
      const __nv_bfloat16* src = x + (t0 + (row < nt ? row : 0)) * K + (ok ? k : 0);
      cp_async16(slot + e, src, ok ? 16 : 0);
    }
  };
  float acc[kSplit][NT][4];
#pragma unroll
  for (int q = 0; q < kSplit; ++q)
#pragma unroll
    for (int c = 0; c < NT; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[q][c][i] = 0.0f;
  // Weights first (no kernel writes them), then wait for the kernel before.
#pragma unroll
  for (int i = 0; i < kWideStages - 1; ++i)
    if (i < ngran) issue_w(i);
  chain_start(chain);
#pragma unroll
  for (int i = 0; i < kWideStages - 1; ++i) {
    if (i < ngran) issue_x(i);
    cp_async_commit();
  }
  for (int i = 0; i < ngran; ++i) {
    cp_async_wait<kWideStages - 2>();
    __syncthreads();  // granule i's x is in; every warp is done with granule i - 1's slot
    if (i + kWideStages - 1 < ngran) {
      issue_w(i + kWideStages - 1);
      issue_x(i + kWideStages - 1);
    }
    cp_async_commit();
    const int64_t k0 = int64_t(i) * kGranule;
    const uint4* ws = my + (i % kWideStages) * 256;
    const uint4* xs = xring + size_t(i % kWideStages) * 4 * NT * 32;
    const int q = i % kSplit;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint4 a0 = ws[(j * 2) * 32 + lane], a1 = ws[(j * 2 + 1) * 32 + lane];
      (void)k0;
#pragma unroll
      for (int c = 0; c < NT; ++c) {
        const uint4 bv = xs[(j * NT + c) * 32 + lane];
        // q is not a compile-time index: pick the accumulator set by branch
        // so the arrays stay in registers.
#pragma unroll
        for (int qq = 0; qq < kSplit; ++qq)
          if (qq == q) {
            mma16816(acc[qq][c], a0.x, a1.x, a0.y, a1.y, bv.x, bv.y);
            mma16816(acc[qq][c], a0.z, a1.z, a0.w, a1.w, bv.z, bv.w);
          }
      }
    }
  }
  cp_async_wait<0>();
#pragma unroll
  for (int c = 0; c < NT; ++c)
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      float v = acc[0][c][i];
#pragma unroll
      for (int q = 1; q < kSplit; ++q) v += acc[q][c][i];
      const int64_t n = n0 + g + 8 * (i >> 1), t = 8 * c + 2 * tq + (i & 1);
      if (n < N && t < nt) st(out, odt, (t0 + t) * ldo + n, v);
    }
  chain_end(chain);
}

template <int NT>
cudaError_t launch_wide(cudaStream_t s, const __nv_bfloat16* x, int64_t T, const __nv_bfloat16* w, int64_t N,
                        int64_t K, void* out, int odt, int64_t ldo, int chain) {
  return launch_pdl<wide_gemv_kernel<NT>>(
      s, dim3(unsigned((N + 16 * kWideWarps - 1) / (16 * kWideWarps)), unsigned((T + 63) / 64)),
      dim3(32 * kWideWarps), wide_smem<NT>(), x, T, w, N, K, out, odt, ldo, chain);
}

}  // namespace

cudaError_t launch_wide_gemv(cudaStream_t s, const __nv_bfloat16* x, int64_t T, const __nv_bfloat16* w, int64_t N,
                             int64_t K, void* out, int odt, int64_t ldo, int chain) {
  if (T <= 8) return launch_wide<1>(s, x, T, w, N, K, out, odt, ldo, chain);
  if (T <= 16) return launch_wide<2>(s, x, T, w, N, K, out, odt, ldo, chain);
  if (T <= 32) return launch_wide<4>(s, x, T, w, N, K, out, odt, ldo, chain);
  return launch_wide<8>(s, x, T, w, N, K, out, odt, ldo, chain);
}

}  // namespace muse::cuda
