// The ceilings muse bench compares against, measured in the same run: HBM
// read bandwidth (a streaming read of a buffer many times the L2) and the
// bf16 tensor-core rate (cuBLASLt GEMM). And the device-side random fill that
// gives the benchmark weights of real shapes without generating 60 GB on the
// host.
#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <string>
#include <vector>

#include "muse/backends/cuda/cuda_bench.h"

namespace muse {
namespace {

std::string cuda_error(const char* what, cudaError_t e) {
  return std::string(what) + ": " + cudaGetErrorString(e);
}

// SplitMix64 finaliser of (seed, index): a counter-based generator, so every
// element's value is independent of the launch shape.
__device__ __forceinline__ uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

__global__ void fill_uniform_kernel(void* dst, int bf16, int64_t n, uint64_t seed, float scale, float offset) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed + 0x9e3779b97f4a7c15ull * uint64_t(i + 1));
    const float u = float(r >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
    const float v = offset + scale * u;
    if (bf16)
      static_cast<__nv_bfloat16*>(dst)[i] = __float2bfloat16_rn(v);
    else
      static_cast<float*>(dst)[i] = v;
  }
}

__global__ void fill_bytes_kernel(uint8_t* dst, int64_t n, uint64_t seed, uint32_t lo, uint32_t span, uint32_t sign) {
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint64_t r = mix64(seed + 0x9e3779b97f4a7c15ull * uint64_t(i + 1));
    dst[i] = uint8_t((lo + uint32_t(r % span)) | ((r >> 63) ? sign : 0u));
  }
}

// Each thread reads 16-byte vectors with a grid stride; the xor of what it
// read goes to one word per block so the loads cannot be elided.
__global__ void stream_read_kernel(const uint4* __restrict__ src, int64_t n, unsigned* sink) {
  unsigned acc = 0;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const uint4 v = __ldcs(src + i);  // streaming: do not keep in L2
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[blockIdx.x] = acc;  // practically never taken
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0 : v[v.size() / 2];
}

}  // namespace

Status cuda_fill_uniform(void* device_ptr, DType dtype, int64_t n, uint64_t seed, float scale, float offset) {
  if (dtype != DType::F32 && dtype != DType::BF16) return make_error("cuda_fill_uniform: F32 or BF16 only");
  if (n <= 0) return Status::Ok();
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 132 * 32);
  fill_uniform_kernel<<<unsigned(blocks), 256>>>(device_ptr, dtype == DType::BF16, n, seed, scale, offset);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return make_error(cuda_error("random fill", e));
  return Status::Ok();
}

Status cuda_fill_bytes(void* device_ptr, int64_t n, uint64_t seed, uint8_t lo, uint8_t hi, uint8_t sign_mask) {
  if (hi < lo) return make_error("cuda_fill_bytes: empty range");
  if (n <= 0) return Status::Ok();
  const int64_t blocks = std::min<int64_t>((n + 255) / 256, 132 * 32);
  fill_bytes_kernel<<<unsigned(blocks), 256>>>(static_cast<uint8_t*>(device_ptr), n, seed, lo, uint32_t(hi - lo) + 1,
                                               sign_mask);
  if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return make_error(cuda_error("random bytes", e));
  return Status::Ok();
}

Status cuda_synchronize() {
  if (cudaError_t e = cudaDeviceSynchronize(); e != cudaSuccess) return make_error(cuda_error("synchronize", e));
  return Status::Ok();
}

Result<GpuCeilings> measure_gpu_ceilings(uint64_t read_bytes, int64_t gemm_n, int runs) {
  GpuCeilings c;
  c.read_bytes = read_bytes;
  c.gemm_n = gemm_n;
  cudaDeviceProp prop{};
  int dev = 0;
  cudaGetDevice(&dev);
  if (cudaError_t e = cudaGetDeviceProperties(&prop, dev); e != cudaSuccess)
    return make_error(cuda_error("no CUDA device", e));
  c.device = prop.name;
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  auto elapsed = [&] {
    float ms = 0;
    cudaEventElapsedTime(&ms, a, b);
    return double(ms) * 1e-3;
  };

  // HBM read.
  {
    void* buf = nullptr;
    unsigned* sink = nullptr;
    if (cudaError_t e = cudaMalloc(&buf, read_bytes); e != cudaSuccess)
      return make_error(cuda_error("bandwidth buffer", e));
    cudaMalloc(reinterpret_cast<void**>(&sink), 132 * 8 * sizeof(unsigned));
    cudaMemset(buf, 0x5a, read_bytes);
    const int64_t n = int64_t(read_bytes / 16);
    const unsigned blocks = unsigned(prop.multiProcessorCount) * 8;
    stream_read_kernel<<<blocks, 512>>>(static_cast<const uint4*>(buf), n, sink);  // warm-up
    std::vector<double> t;
    for (int r = 0; r < runs; ++r) {
      cudaEventRecord(a);
      stream_read_kernel<<<blocks, 512>>>(static_cast<const uint4*>(buf), n, sink);
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      t.push_back(elapsed());
    }
    cudaError_t e = cudaGetLastError();
    cudaFree(buf);
    cudaFree(sink);
    if (e != cudaSuccess) return make_error(cuda_error("bandwidth kernel", e));
    c.hbm_read_gbps = double(read_bytes) / median(t) / 1e9;
  }

  // bf16 GEMM, fp32 accumulation (the prefill products' rate).
  {
    const uint64_t N = uint64_t(gemm_n);
    void *A = nullptr, *B = nullptr, *C = nullptr, *ws = nullptr;
    const size_t ws_bytes = size_t(64) << 20;
    if (cudaMalloc(&A, N * N * 2) != cudaSuccess || cudaMalloc(&B, N * N * 2) != cudaSuccess ||
        cudaMalloc(&C, N * N * 2) != cudaSuccess || cudaMalloc(&ws, ws_bytes) != cudaSuccess)
      return make_error("GEMM buffers: out of GPU memory");
    if (!cuda_fill_uniform(A, DType::BF16, int64_t(N * N), 1, 1.0f, 0.0f).ok() ||
        !cuda_fill_uniform(B, DType::BF16, int64_t(N * N), 2, 1.0f, 0.0f).ok())
      return make_error("GEMM operands: random fill failed");
    cublasLtHandle_t lt = nullptr;
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t la = nullptr, lb = nullptr, lc = nullptr;
    cublasLtMatmulPreference_t pref = nullptr;
    cublasLtMatmulHeuristicResult_t res{};
    int found = 0;
    bool ok = cublasLtCreate(&lt) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, N, N, int64_t(N)) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, N, N, int64_t(N)) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatrixLayoutCreate(&lc, CUDA_R_16BF, N, N, int64_t(N)) == CUBLAS_STATUS_SUCCESS &&
              cublasLtMatmulPreferenceCreate(&pref) == CUBLAS_STATUS_SUCCESS;
    if (ok) {
      uint64_t w = ws_bytes;
      cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &w, sizeof(w));
      ok = cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 1, &res, &found) == CUBLAS_STATUS_SUCCESS &&
           found > 0;
    }
    const float alpha = 1.0f, beta = 0.0f;
    std::vector<double> t;
    for (int r = 0; ok && r <= runs; ++r) {
      cudaEventRecord(a);
      ok = cublasLtMatmul(lt, op, &alpha, A, la, B, lb, &beta, C, lc, C, lc, &res.algo, ws, ws_bytes, 0) ==
           CUBLAS_STATUS_SUCCESS;
      cudaEventRecord(b);
      cudaEventSynchronize(b);
      if (r > 0) t.push_back(elapsed());  // the first is a warm-up
    }
    if (pref) cublasLtMatmulPreferenceDestroy(pref);
    if (la) cublasLtMatrixLayoutDestroy(la);
    if (lb) cublasLtMatrixLayoutDestroy(lb);
    if (lc) cublasLtMatrixLayoutDestroy(lc);
    if (op) cublasLtMatmulDescDestroy(op);
    if (lt) cublasLtDestroy(lt);
    cudaFree(A), cudaFree(B), cudaFree(C), cudaFree(ws);
    if (!ok) return make_error("cuBLASLt bf16 GEMM failed");
    c.bf16_tflops = 2.0 * double(N) * double(N) * double(N) / median(t) / 1e12;
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  return c;
}

}  // namespace muse
