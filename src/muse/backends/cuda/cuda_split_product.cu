// fp32 activations × BF16 weights through the bf16 tensor-core products
// (Spark's head: its fp32 residual stream feeds the final norm and the
// 202,048-row head).
//
// Why: the fp32 warp-dot kernel does every multiply on the CUDA cores and
// reads the weights once per 8 activation rows, so at 64 rows Spark's head
// (3.3 GB) took ~33 ms of a 42 ms step (muse bench --profile, 2026-12-04).
// Here each fp32 row x is split exactly into three bf16 rows,
// x = hi + mid + lo (hi = bf16(x), mid = bf16(x − hi), lo = x − hi − mid:
// 8 + 8 + 8 significand bits hold fp32's 24), the three rows go through the
// bf16 products (cuda_matmul.cu; every product kernel gives the same bits,
// which depend on K only), and out = (P_hi + P_mid) + P_lo. Every
// bf16 × bf16 product is exact in fp32, so the only roundings are the fp32
// sums, as in the warp dot: the same accuracy, not the same bits. A row's
// result depends only on its own values and K: batch-invariant for any T.
// (A non-finite x keeps hi = x, mid = lo = 0; values below bf16's normal
// range may lose bits of lo, as fp32 denormals do.)
#include "muse/backends/cuda/cuda_mma.cuh"

namespace muse::cuda {
namespace {

// x (T x K, fp32) -> xs (3T x K, bf16): rows 3t, 3t + 1, 3t + 2 are hi, mid, lo of row t.
__global__ void split3_kernel(const float* __restrict__ x, int64_t T, int64_t K, __nv_bfloat16* __restrict__ xs) {
  pdl_wait();  // x comes from the kernel before
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * K) return;
  const int64_t t = i / K, k = i % K;
  const float v = x[i];
  __nv_bfloat16 hi = __float2bfloat16_rn(v), mid = __float2bfloat16_rn(0.0f), lo = mid;
  if (isfinite(v)) {
    const float r1 = __fsub_rn(v, __bfloat162float(hi));  // exact
    mid = __float2bfloat16_rn(r1);
    lo = __float2bfloat16_rn(__fsub_rn(r1, __bfloat162float(mid)));  // exact: at most 8 bits remain
  }
  __nv_bfloat16* row = xs + 3 * t * K + k;
  row[0] = hi;
  row[K] = mid;
  row[2 * K] = lo;
}

// out[t, n] = (o3[3t, n] + o3[3t + 1, n]) + o3[3t + 2, n], stored in out's dtype.
__global__ void combine3_kernel(const float* __restrict__ o3, int64_t T, int64_t N, void* out, int odt, int64_t ldo) {
  pdl_wait();  // o3 comes from the product before
  const int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= T * N) return;
  const int64_t t = i / N, n = i % N;
  const float* p = o3 + 3 * t * N + n;
  st(out, odt, t * ldo + n, __fadd_rn(__fadd_rn(p[0], p[N]), p[2 * N]));
}

}  // namespace

size_t split_product_scratch_bytes(int64_t T, int64_t K, int64_t N) {
  return split_product_xs_bytes(T, K) + size_t(3 * T * N) * sizeof(float);
}
size_t split_product_xs_bytes(int64_t T, int64_t K) { return (size_t(3 * T * K) * 2 + 255) / 256 * 256; }

cudaError_t launch_split3(cudaStream_t s, const Tensor& x, void* xs) {
  const int64_t n = x.rows() * x.cols();
  return launch_pdl<split3_kernel>(s, dim3(blocks_for(n, 256)), dim3(256), 0, static_cast<const float*>(x.data),
                                   x.rows(), x.cols(), static_cast<__nv_bfloat16*>(xs));
}

cudaError_t launch_combine3(cudaStream_t s, const void* o3, const Tensor& out) {
  const int64_t T = out.rows(), N = out.cols();
  return launch_pdl<combine3_kernel>(s, dim3(blocks_for(T * N, 256)), dim3(256), 0, static_cast<const float*>(o3), T,
                                     N, out.data, dt_code(out.dtype), N);
}

}  // namespace muse::cuda
