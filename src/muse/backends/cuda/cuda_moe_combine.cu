// The latent experts' combine: out_t = Σ_k w_k · rms(y_k ⊙ c), the top-k
// expert outputs of each token (the down products' rows Y, in the grouping's
// slots) normed, weighted and added in the order of the token's ids.
// moe_experts (cuda_moe.cu) launches it after its products
// (launch_moe_combine).
//
// Two kernels, the same bits (Moe.ClusterCombineGivesTheBlockCombineBits):
// - moe_combine_kernel: a block of 256 threads a token. Thread i sums the
//   squares of elements i, i + 256, ... of each slot in order, then the warp
//   butterfly and the eight warps in order; each output element folds the
//   slots in order.
// - moe_combine_cluster_kernel (the rule; CudaBackendOptions::moe_combine
//   2 forces it, 1 the block): the same block spread over a cluster
//   of eight blocks a token. Block b does what warp b did, with its eight
//   warps on eight slots side by side; the blocks trade their warp sums
//   through distributed shared memory and fold them in warp order.
//   Why: at one token the block kernel ran on one SM, ~14 µs (ncu, H100,
//   Spark's 4096-wide rows of top-8) on the critical path of every MoE layer,
//   between the down products and the post-expert product; a cluster's
//   blocks each read an eighth of the rows. Measured (H100, 2026-12-07,
//   five alternated runs): Spark 2 layers batch 1 2.181 against 2.200 ms,
//   batch 4 and 16 −11 µs, batch 64 and a 2,048-token prefill equal; NVFP4
//   7 layers batch 1 3.575 against 3.596 ms.
#include <cooperative_groups.h>

#include "muse/backends/cuda/cuda_impl.cuh"
#include "muse/backends/cuda/cuda_mma.cuh"
#include "muse/backends/cuda/cuda_moe_combine.h"

namespace muse::cuda {
namespace {

namespace cg = cooperative_groups;

constexpr int kCombineBatch = 8;    // slots summed in one pass (the block kernel)
constexpr int kCombineWarps = 8;    // the block kernel's warps = a cluster's blocks
constexpr int kCombineThreads = 32 * kCombineWarps;

// A slot's norm factor from its sum of squares over the row (both kernels).
__device__ __forceinline__ float inv_rms(float sum, int64_t Hm, float eps) {
  return 1.0f / sqrtf(sum / float(Hm) + eps);
}

// Output element i of a token: its slots' values y_k[i] (row(k), slot k's
// row) normed by rk, weighted by wk and added in id order, absent slots
// (gk < 0: another rank's) left out; the K values of a batch are loaded
// before they are folded (one memory latency a batch). Both kernels'.
template <class Row>
__device__ __forceinline__ float fold_slots(Row row, int K, int64_t i, float c, const int* gk, const float* rk,
                                            const float* wk) {
  float o = 0.0f;
  for (int kb = 0; kb < K; kb += kCombineBatch) {
    float yv[kCombineBatch];
#pragma unroll
    for (int q = 0; q < kCombineBatch; ++q) yv[q] = row(kb + q < K ? kb + q : 0)[i];
#pragma unroll
    for (int q = 0; q < kCombineBatch; ++q) {
      const int k = kb + q;
      if (k < K && gk[k] >= 0) {
        const float yn = (yv[q] * c) * rk[k];
        o = o + wk[k] * yn;
      }
    }
  }
  return o;
}

// out_t = Σ_k w_k · rms(y_k ⊙ c), k in the order of ids.
//
// STAGED: the row's K expert outputs and the gain are first copied into
// shared memory in one batch of 16-byte copies (one memory latency), then
// both passes read them there. Read from global memory, the passes waited
// on one L2 latency per group of loads, ~12 in a row (ncu, one 4096-wide
// row of top-8 on one SM: 28.1 µs, staged 14.2 µs; on the critical path of
// every MoE layer). Each thread adds the same elements in the same order
// either way, so the bits are the same.
template <bool STAGED>
__global__ void moe_combine_kernel(void* out, int odt, const float* Y, const int32_t* slot_of, const float* weights,
                                   const float* gain, int K, int64_t Hm, float eps) {
  // The K sums of squares, kCombineBatch at a time in one pass over the row
  // (one pass and one reduction for top-8, not eight: 63 µs a token for
  // Spark's 4096-wide rows, one block each). Per k, each thread still adds
  // its elements i = tid, tid + blockDim, ... in order, then the warp
  // butterfly and the warps in order: block_sum's sequence.
  pdl_launch_dependents();  // light: the next kernel may launch; it waits for us
  pdl_wait();
  extern __shared__ float4 staged4[];  // STAGED: [K][Hm] outputs, then [Hm] gain
  __shared__ float red[kCombineBatch][32];
  __shared__ float rk[kMoeMaxTopK], wk[kMoeMaxTopK];
  __shared__ int gk[kMoeMaxTopK];
  const int64_t t = blockIdx.x;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  // The row's slots and weights, once (loaded inside the loops below, each
  // slot's load waited before the next was issued).
  for (int k = threadIdx.x; k < K; k += blockDim.x) gk[k] = slot_of[t * K + k], wk[k] = weights[t * K + k];
  __syncthreads();
  // Slot k's row: absent slots (another rank's) read grouped row 0 (R >= 1,
  // so it exists) and are skipped in the fold: unguarded loads, all in
  // flight at once (a guarded load compiled to a branch around each one).
  auto global_row = [&](int k) { return Y + int64_t(max(gk[k], 0)) * Hm; };
  float* staged = reinterpret_cast<float*>(staged4);
  if constexpr (STAGED) {
    const int64_t n4 = Hm / 4;
    for (int k = 0; k < K; ++k) {
      const float* src = global_row(k);
      for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) cp_async16(staged + k * Hm + 4 * i, src + 4 * i, 16);
    }
    for (int64_t i = threadIdx.x; i < n4; i += blockDim.x) cp_async16(staged + K * Hm + 4 * i, gain + 4 * i, 16);
    cp_async_commit();
    cp_async_wait<0>();
    __syncthreads();
  }
  auto row = [&](int k) -> const float* { return STAGED ? staged + k * Hm : global_row(k); };
  const float* gn = STAGED ? staged + K * Hm : gain;
  for (int kb = 0; kb < K; kb += kCombineBatch) {
    float ss[kCombineBatch];
    const float* yr[kCombineBatch];
#pragma unroll
    for (int q = 0; q < kCombineBatch; ++q) yr[q] = row(kb + q < K ? kb + q : 0), ss[q] = 0.0f;
#pragma unroll 4
    for (int64_t i = threadIdx.x; i < Hm; i += blockDim.x) {
      const float c = gn[i];
#pragma unroll
      for (int q = 0; q < kCombineBatch; ++q) {
        const float y = yr[q][i] * c;
        ss[q] += y * y;
      }
    }
#pragma unroll
    for (int q = 0; q < kCombineBatch; ++q) ss[q] = warp_sum(ss[q]);
    __syncthreads();  // red may still be read for the batch before
    if (lane == 0)
#pragma unroll
      for (int q = 0; q < kCombineBatch; ++q) red[q][warp] = ss[q];
    __syncthreads();
    if (threadIdx.x < kCombineBatch && kb + int(threadIdx.x) < K) {
      float sum = 0.0f;
      for (int w = 0; w < nw; ++w) sum += red[threadIdx.x][w];
      rk[kb + int(threadIdx.x)] = inv_rms(sum, Hm, eps);
    }
  }
  __syncthreads();
#pragma unroll 2
  for (int64_t i = threadIdx.x; i < Hm; i += blockDim.x)
    st(out, odt, t * Hm + i, fold_slots(row, K, i, gn[i], gk, rk, wk));
}

// Shared memory the staged combine needs for K rows of Hm, or 0 where it
// does not apply (rows not whole 16-byte pieces, or more than fits beside
// the kernel's own arrays).
size_t combine_staged_bytes(int64_t K, int64_t Hm, const void* Y, const void* gain) {
  const size_t bytes = size_t(K + 1) * size_t(Hm) * sizeof(float);
  const bool pieces = Hm % 4 == 0 && (reinterpret_cast<uintptr_t>(Y) & 15u) == 0 &&
                      (reinterpret_cast<uintptr_t>(gain) & 15u) == 0;
  return pieces && bytes <= size_t(200) << 10 ? bytes : 0;
}

// The block kernel's work for one token spread over a cluster of
// kCombineWarps blocks (file comment). Lane l of block b stands for thread
// 32·b + l of the block kernel: the same elements in the same order for
// every sum, and every output element the same fold.
__global__ void __launch_bounds__(kCombineThreads)
    moe_combine_cluster_kernel(void* out, int odt, const float* Y, const int32_t* slot_of, const float* weights,
                               const float* gain, int K, int64_t Hm, float eps) {
  pdl_launch_dependents();  // light: the next kernel may launch; it waits for us
  pdl_wait();
  cg::cluster_group cluster = cg::this_cluster();
  const int b = int(cluster.block_rank());
  const int64_t t = blockIdx.x / kCombineWarps;
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  __shared__ float sums[kMoeMaxTopK];  // warp b's sum of squares of each slot
  __shared__ float rk[kMoeMaxTopK], wk[kMoeMaxTopK];
  __shared__ int gk[kMoeMaxTopK];
  for (int k = threadIdx.x; k < K; k += blockDim.x) gk[k] = slot_of[t * K + k], wk[k] = weights[t * K + k];
  __syncthreads();
  const int64_t first = int64_t(32) * b + lane;  // the block kernel's thread
  auto row = [&](int k) { return Y + int64_t(max(gk[k], 0)) * Hm; };
  // Warp w sums slots w, w + 8, ...: the block kernel's thread sums them
  // one batch of eight at a time, each slot its own chain.
  for (int k = warp; k < K; k += kCombineWarps) {
    const float* yr = row(k);  // absent slots (another rank's) read row 0, unused
    float ss = 0.0f;
#pragma unroll 4
    for (int64_t i = first; i < Hm; i += kCombineThreads) {
      const float c = gain[i];
      const float y = yr[i] * c;
      ss += y * y;
    }
    ss = warp_sum(ss);
    if (lane == 0) sums[k] = ss;
  }
  cluster.sync();  // every block's warp sums are in its shared memory
  if (int(threadIdx.x) < K) {
    float sum = 0.0f;
    for (int w = 0; w < kCombineWarps; ++w) sum += cluster.map_shared_rank(sums, w)[threadIdx.x];
    rk[threadIdx.x] = inv_rms(sum, Hm, eps);
  }
  cluster.barrier_arrive();  // this block has read the others' sums; they may leave once all have
  __syncthreads();
  // The elements of the block kernel's threads 32·b .. 32·b + 31, a warp
  // each in turn.
  for (int64_t i = first + int64_t(warp) * kCombineThreads; i < Hm; i += int64_t(kCombineWarps) * kCombineThreads) {
    st(out, odt, t * Hm + i, fold_slots(row, K, i, gain[i], gk, rk, wk));
  }
  cluster.barrier_wait();  // no block leaves while another may still read its sums
}

}  // namespace

cudaError_t launch_moe_combine(cudaStream_t s, int mode, void* out, DType out_dtype, const float* Y,
                               const int32_t* slot_of, const float* weights, const float* gain, int64_t T, int K,
                               int64_t Hm, float eps) {
  const int odt = dt_code(out_dtype);
  if (mode != 1) {  // the rule: the cluster at every T (equal to the block above 16 tokens)
    return launch_pdl_clusters<moe_combine_cluster_kernel>(s, T * kCombineWarps, kCombineThreads, 0,
                                                          unsigned(kCombineWarps), out, odt, Y, slot_of, weights,
                                                          gain, K, Hm, eps);
  }
  const size_t staged = combine_staged_bytes(K, Hm, Y, gain);
  if (staged > 0)
    return launch_pdl<moe_combine_kernel<true>>(s, dim3(unsigned(T)), dim3(kCombineThreads), staged, out, odt, Y,
                                                slot_of, weights, gain, K, Hm, eps);
  return launch_pdl<moe_combine_kernel<false>>(s, dim3(unsigned(T)), dim3(kCombineThreads), 0, out, odt, Y, slot_of,
                                               weights, gain, K, Hm, eps);
}

}  // namespace muse::cuda
