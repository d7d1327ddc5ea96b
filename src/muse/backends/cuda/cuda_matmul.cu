// project: out[T, N] = x[T, K] · W[N, K]ᵀ, fp32 accumulation.
//  - T <= 64 (decode, small batches): our own kernel (cuda_dot.cuh), whose
//    reduction order does not depend on T, so a row's result is bitwise the
//    same alone or in a batch of 64.
//  - T > 64 with x and W of one dtype: cuBLASLt (fp32 compute, no TF32;
//    split-K only with out-of-place reductions, so results are
//    deterministic run to run; they may differ from the T <= 64 kernel in
//    the last bits).
//  - otherwise (mixed x/W dtypes, or no cuBLASLt algorithm): our kernel.
#include <algorithm>

#include "muse/backends/cuda/cuda_dot.cuh"

namespace muse::cuda {
namespace {

constexpr int kWarps = 8;        // warps per block
constexpr int kRowsPerWarp = 4;  // weight rows per warp
constexpr int kRowsPerBlock = kWarps * kRowsPerWarp;

template <typename XT, typename WT, bool VEC>
__global__ void __launch_bounds__(256) gemv_kernel(const XT* __restrict__ x, int64_t ldx, int64_t T,
                                                   const WT* __restrict__ w, int64_t N, int64_t K, void* out, int odt,
                                                   int64_t ldo) {
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t t0 = int64_t(blockIdx.y) * kRT;
  const int nr = int(T - t0 < kRT ? T - t0 : kRT);
  const XT* xr[kRT];
#pragma unroll
  for (int r = 0; r < kRT; ++r) xr[r] = x + (t0 + min(r, nr - 1)) * ldx;
  for (int j = 0; j < kRowsPerWarp; ++j) {
    const int64_t n = int64_t(blockIdx.x) * kRowsPerBlock + warp * kRowsPerWarp + j;
    if (n >= N) break;
    float acc[kRT];
    warp_dot<XT, WT, VEC>(w + n * K, xr, nr, K, lane, acc);
#pragma unroll
    for (int r = 0; r < kRT; ++r)
      if (r < nr && lane == r) st(out, odt, (t0 + r) * ldo + n, acc[r]);
  }
}

template <typename XT, typename WT>
void launch_gemv(cudaStream_t s, const Tensor& x, const Tensor& w, const Tensor& out) {
  const int64_t T = x.rows(), K = x.cols(), N = w.rows();
  const dim3 grid(blocks_for(N, kRowsPerBlock), blocks_for(T, kRT));
  const bool vec = K % 8 == 0 && aligned16(x.data) && aligned16(w.data);
  auto* xp = static_cast<const XT*>(x.data);
  auto* wp = static_cast<const WT*>(w.data);
  if (vec)
    gemv_kernel<XT, WT, true><<<grid, 256, 0, s>>>(xp, K, T, wp, N, K, out.data, dt_code(out.dtype), out.cols());
  else
    gemv_kernel<XT, WT, false><<<grid, 256, 0, s>>>(xp, K, T, wp, N, K, out.data, dt_code(out.dtype), out.cols());
}

int pointer_alignment(const void* p) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p);
  int al = 256;
  while (al > 1 && (a % uintptr_t(al))) al >>= 1;
  return al;
}

cudaDataType_t lt_type(DType t) { return t == DType::BF16 ? CUDA_R_16BF : CUDA_R_32F; }

}  // namespace

cudaError_t CudaBackend::launch_project(cudaStream_t s, const Tensor& x, const Projection& p) {
  const bool xb = x.dtype == DType::BF16, wb = p.weight.dtype == DType::BF16;
  if (xb && wb) launch_gemv<__nv_bfloat16, __nv_bfloat16>(s, x, p.weight, p.out);
  else if (xb) launch_gemv<__nv_bfloat16, float>(s, x, p.weight, p.out);
  else if (wb) launch_gemv<float, __nv_bfloat16>(s, x, p.weight, p.out);
  else launch_gemv<float, float>(s, x, p.weight, p.out);
  return cudaGetLastError();
}

const CudaBackend::LtPlan* CudaBackend::lt_plan(const LtKey& key) {
  auto it = lt_plans_.find(key);
  if (it != lt_plans_.end()) return it->second.ok ? &it->second : nullptr;
  LtPlan plan;
  const cudaDataType_t at = cudaDataType_t(key.adt), ct = cudaDataType_t(key.cdt);
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  cublasLtMatmulPreference_t pref = nullptr;
  bool ok = cublasLtMatmulDescCreate(&plan.op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)) ==
                CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulDescSetAttribute(plan.op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)) ==
                CUBLAS_STATUS_SUCCESS &&
            // Column-major view: C[N, T] = W[K, N]ᵀ · x[K, T].
            cublasLtMatrixLayoutCreate(&plan.a, at, uint64_t(key.k), uint64_t(key.m), key.k) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&plan.b, at, uint64_t(key.k), uint64_t(key.n), key.k) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatrixLayoutCreate(&plan.c, ct, uint64_t(key.m), uint64_t(key.n), key.m) == CUBLAS_STATUS_SUCCESS &&
            cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
  if (ok) {
    const uint64_t ws = kLtWorkspace;
    const uint32_t aa = uint32_t(key.align_a), ab = uint32_t(key.align_b), ac = uint32_t(key.align_c);
    // Deterministic reductions only (no in-place split-K accumulation).
    const uint32_t schemes = CUBLASLT_REDUCTION_SCHEME_NONE | CUBLASLT_REDUCTION_SCHEME_OUTPUT_TYPE |
                             CUBLASLT_REDUCTION_SCHEME_COMPUTE_TYPE;
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws, sizeof(ws));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_A_BYTES, &aa, sizeof(aa));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_B_BYTES, &ab, sizeof(ab));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_C_BYTES, &ac, sizeof(ac));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MIN_ALIGNMENT_D_BYTES, &ac, sizeof(ac));
    cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_REDUCTION_SCHEME_MASK, &schemes, sizeof(schemes));
    cublasLtMatmulHeuristicResult_t result{};
    int found = 0;
    ok = cublasLtMatmulAlgoGetHeuristic(lt_, plan.op, plan.a, plan.b, plan.c, plan.c, pref, 1, &result, &found) ==
             CUBLAS_STATUS_SUCCESS &&
         found > 0;
    if (ok) plan.algo = result.algo;
  }
  if (pref) cublasLtMatmulPreferenceDestroy(pref);
  plan.ok = ok;
  auto& stored = lt_plans_[key] = plan;
  return ok ? &stored : nullptr;
}

cudaError_t CudaBackend::launch_cublaslt(cudaStream_t s, const Tensor& x, const Projection& p) {
  LtKey key{p.weight.rows(), x.rows(), x.cols(), int(lt_type(x.dtype)), int(lt_type(p.out.dtype)),
            pointer_alignment(p.weight.data), pointer_alignment(x.data), pointer_alignment(p.out.data)};
  const LtPlan* plan = lt_plan(key);
  if (!plan) return launch_project(s, x, p);  // no algorithm for this combination: our kernel
  const float alpha = 1.0f, beta = 0.0f;
  cublasStatus_t st = cublasLtMatmul(lt_, plan->op, &alpha, p.weight.data, plan->a, x.data, plan->b, &beta, p.out.data,
                                     plan->c, p.out.data, plan->c, &plan->algo, lt_workspace_, kLtWorkspace, s);
  if (st != CUBLAS_STATUS_SUCCESS) return cudaErrorLaunchFailure;  // reported as this op's failure
  return cudaGetLastError();
}

void CudaBackend::project(const Tensor& x, std::span<const Projection> outputs) {
  std::vector<Projection> outs(outputs.begin(), outputs.end());
  for (const auto& p : outs) {
    if (!check(is_float_dtype(x.dtype) && is_float_dtype(p.out.dtype) && is_float_dtype(p.weight.dtype) &&
                   p.weight.rank == 2 && p.weight.cols() == x.cols() && p.out.rows() == x.rows() &&
                   p.out.cols() == p.weight.rows() && x.cols() > 0,
               "project", describe(x) + " · " + describe(p.weight) + "ᵀ -> " + describe(p.out)))
      return;
  }
  if (x.rows() == 0) return;
  const bool lt = x.rows() > 64;
  enqueue("project", [this, x, outs, lt](cudaStream_t s) {
    for (const auto& p : outs) {
      cudaError_t e = lt && x.dtype == p.weight.dtype ? launch_cublaslt(s, x, p) : launch_project(s, x, p);
      if (e != cudaSuccess) return e;
    }
    return cudaSuccess;
  });
}

}  // namespace muse::cuda
