// project's warp-dot path (T <= 64 products that the tensor-core kernels
// do not take: F32 activations or weights, odd K, unaligned rows; Spark's
// F32 router and head): one warp a weight row, the fixed-order dot of
// cuda_dot.cuh, so a row's bits do not depend on T. Moved from
// cuda_matmul.cu unchanged (launch_dot_gemv is its former launch_gemv).
#include <cuda_bf16.h>

#include "muse/backends/cuda/cuda_dot.cuh"
#include "muse/backends/cuda/cuda_mma.cuh"

namespace muse::cuda {
namespace {

constexpr int kWarps = 8;  // warps per block

// Each warp computes `rows` weight rows (4, or 1 for short matrices such as
// a 256-expert router, so that they still spread over the SMs: 8 blocks of 4
// rows a warp left it at 72 µs for 8 MB). A row's bits depend only on its
// own dot product, never on which warp or block holds it.
//
// Ring path (RING: one activation row, BF16 weights, the vector layout;
// sm_80+): the warp's weight pieces (lane l: elements 8l..8l+7
// of each 256) stream through a per-warp cp.async ring of kGemvStages
// 16-byte slots a lane, so a warp keeps that many 512-byte reads in flight without holding
// them in registers (the fp32-activation head of Spark, 202,048 × 8192: 42%
// of HBM with one read a warp in flight, 58% with four in registers). Each
// lane reads back only the slots it filled (no barrier), and folds the
// pieces in warp_dot's order (pieces ascending, activation rows, then the 8
// elements; the butterfly last): the same bits as warp_dot. Only for one
// row: its 32 KB of ring a block leave too little L1 for 8 fp32 activation
// rows (Spark slice at batch 16 went from 86% to 69% of HBM with it).
constexpr int kGemvStages = 8;  // 8 warps × 8 slots × 512 bytes: 32 KB of ring a block
// One activation row without the ring (4-byte weights): warp_dot_row's
// pieces of both operands in flight at once (cuda_dot.cuh).
constexpr int kRowAhead = 8;
constexpr int kRowWarps = 2;  // its warps a block

// WARPS: warps a block (the one-row warp dot spreads its rows over more SMs).
template <typename XT, typename WT, bool VEC, bool RING, int AHEAD = 0, int WARPS = kWarps>
__global__ void __launch_bounds__(256) gemv_kernel(const XT* __restrict__ x, int64_t ldx, int64_t T,
                                                   const WT* __restrict__ w, int64_t N, int64_t K, void* out, int odt,
                                                   int64_t ldo, int rows) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t n_first = (int64_t(blockIdx.x) * WARPS + warp) * rows;
  if constexpr (VEC && !RING && AHEAD > 0) {
    // The one-row warp dot reads its rows in batches of AHEAD pieces a lane,
    // a memory latency each (Spark's router: 32 KB rows, four batches,
    // 16 µs for 8.4 MB). Its weights depend on no kernel: ask L2 for the
    // whole rows before the wait, so that one HBM latency covers them and
    // the batches meet L2. Loads and folds unchanged: the same bits.
    const int64_t bytes = K * int64_t(sizeof(WT));
    for (int j = 0; j < rows; ++j) {
      const int64_t n = n_first + j;
      if (n >= N) break;
      const char* row = reinterpret_cast<const char*>(w + n * K);
      for (int64_t b = int64_t(lane) * 128; b < bytes; b += 32 * 128) asm volatile("prefetch.global.L2 [%0];" ::"l"(row + b));
    }
  }
  pdl_wait();  // launched with PDL: x from the kernel before us; no early trigger (a heavy product)
  const int64_t t0 = int64_t(blockIdx.y) * kRT;
  const int nr = int(T - t0 < kRT ? T - t0 : kRT);
  const XT* xr[kRT];
#pragma unroll
  for (int r = 0; r < kRT; ++r) xr[r] = x + (t0 + min(r, nr - 1)) * ldx;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  constexpr bool ring_path = VEC && RING;  // cp.async needs sm_80
#else
  constexpr bool ring_path = false;
#endif
  if constexpr (ring_path) {
    static_assert(sizeof(WT) == 2, "the ring holds one 16-byte piece of 8 weights a lane");
    constexpr int S = kGemvStages;
    __shared__ uint4 ring[kWarps][S][32];
    const int64_t my_rows = N - n_first < rows ? (N - n_first > 0 ? N - n_first : 0) : rows;
    const int64_t P = (K + 255) / 256, units = my_rows * P;
    int64_t ij = 0, ip = 0, issued = 0;  // the next piece to copy: row ij, piece ip
    auto issue_next = [&]() {
      if (ij < my_rows) {
        const int64_t k0 = int64_t(lane) * 8 + 256 * ip;
        const bool ok = k0 < K;
        const WT* src = w + (n_first + ij) * K + (ok ? k0 : 0);
        cp_async16(&ring[warp][issued % S][lane], src, ok ? 16 : 0);
        if (++ip == P) ip = 0, ++ij;
      }
      cp_async_commit();  // empty groups too: the wait below counts groups
      ++issued;
    };
#pragma unroll
    for (int i = 0; i < S - 1; ++i) issue_next();
    float acc[kRT];
#pragma unroll
    for (int r = 0; r < kRT; ++r) acc[r] = 0.0f;
    int64_t p = 0, j = 0;
    for (int64_t u = 0; u < units; ++u) {
      cp_async_wait<S - 2>();  // this lane's copies of unit u have landed
      issue_next();            // into the slot of unit u - 1, which this lane has read
      const int64_t k0 = int64_t(lane) * 8 + 256 * p;
      if (k0 < K) {
        float wv[8];
        load8(reinterpret_cast<const WT*>(&ring[warp][u % S][lane]), wv);
        fold_piece(wv, xr, nr, k0, acc);
      }
      if (++p == P) {  // row n_first + j is complete
#pragma unroll
        for (int r = 0; r < kRT; ++r)
          if (r < nr) acc[r] = warp_sum(acc[r]);
        const int64_t n = n_first + j;
#pragma unroll
        for (int r = 0; r < kRT; ++r) {
          if (r < nr && lane == r) st(out, odt, (t0 + r) * ldo + n, acc[r]);
          acc[r] = 0.0f;
        }
        p = 0, ++j;
      }
    }
    cp_async_wait<0>();
  } else if constexpr (VEC && AHEAD > 0) {  // one activation row (launch_gemv)
    for (int j = 0; j < rows; ++j) {
      const int64_t n = n_first + j;
      if (n >= N) break;
      const float v = warp_dot_row<AHEAD>(w + n * K, x, K, lane);
      if (lane == 0) st(out, odt, n, v);
    }
  } else {
    for (int j = 0; j < rows; ++j) {
      const int64_t n = n_first + j;
      if (n >= N) break;
      float acc[kRT];
      warp_dot<XT, WT, VEC>(w + n * K, xr, nr, K, lane, acc);
#pragma unroll
      for (int r = 0; r < kRT; ++r)
        if (r < nr && lane == r) st(out, odt, (t0 + r) * ldo + n, acc[r]);
    }
  }
}

template <typename XT, typename WT>
void launch_gemv(cudaStream_t s, const Tensor& x, const Tensor& w, const Tensor& out) {
  const int64_t T = x.rows(), K = x.cols(), N = w.rows();
  const int rows = N >= 8192 ? 4 : 1;
  const dim3 grid(blocks_for(N, kWarps * rows), blocks_for(T, kRT));
  const bool vec = K % 8 == 0 && aligned16(x.data) && aligned16(w.data);
  auto* xp = static_cast<const XT*>(x.data);
  auto* wp = static_cast<const WT*>(w.data);
  const int odt = dt_code(out.dtype);
  if constexpr (sizeof(WT) == 2) {
    if (vec && T == 1) {
      launch_pdl<gemv_kernel<XT, WT, true, true>>(s, grid, dim3(256), 0, xp, int64_t(K), T, wp, N, K, out.data, odt,
                                                  out.cols(), rows);
      return;
    }
  }
  // One row (F32 weights: Spark's router): the deep-prefetch warp dot, its
  // rows over two-warp blocks (Spark's 256 router rows on 128 SMs, not 32:
  // an SM's own requests are the limit when one latency covers all of them).
  if (vec && T == 1)
    launch_pdl<gemv_kernel<XT, WT, true, false, kRowAhead, kRowWarps>>(
        s, dim3(blocks_for(N, kRowWarps * rows)), dim3(32 * kRowWarps), 0, xp, int64_t(K), T, wp, N, K, out.data, odt,
        out.cols(), rows);
  else if (vec)
    launch_pdl<gemv_kernel<XT, WT, true, false>>(s, grid, dim3(256), 0, xp, int64_t(K), T, wp, N, K, out.data, odt,
                                                 out.cols(), rows);
  else
    launch_pdl<gemv_kernel<XT, WT, false, false>>(s, grid, dim3(256), 0, xp, int64_t(K), T, wp, N, K, out.data, odt,
                                                  out.cols(), rows);
}

}  // namespace

void launch_dot_gemv(cudaStream_t s, const Tensor& x, const Tensor& w, const Tensor& out) {
  const bool xb = x.dtype == DType::BF16, wb = w.dtype == DType::BF16;
  if (xb && wb) launch_gemv<__nv_bfloat16, __nv_bfloat16>(s, x, w, out);
  else if (xb) launch_gemv<__nv_bfloat16, float>(s, x, w, out);
  else if (wb) launch_gemv<float, __nv_bfloat16>(s, x, w, out);
  else launch_gemv<float, float>(s, x, w, out);
}

}  // namespace muse::cuda
