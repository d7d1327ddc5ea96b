// The GPU's ceilings, measured in the same run as the thing compared with
// them (muse bench --device cuda), and device-side random fills so the
// benchmark's weights of real shapes never cross PCIe. Plain C++ header:
// no CUDA includes; without the CUDA backend built in, every call is a
// clear error.
#pragma once

#include <cstdint>
#include <string>

#include "muse/core/dtype.h"
#include "muse/core/status.h"

namespace muse {

struct GpuCeilings {
  double hbm_read_gbps = 0;     // streaming read of a buffer far larger than L2, median of runs
  double bf16_tflops = 0;       // cuBLASLt bf16 GEMM n×n×n, fp32 accumulate, median of runs
  int64_t gemm_n = 0;
  uint64_t read_bytes = 0;
  std::string device;
};

#if MUSE_HAVE_CUDA
// `read_bytes` streamed `runs` times; an n³ GEMM `runs` times.
Result<GpuCeilings> measure_gpu_ceilings(uint64_t read_bytes = uint64_t(8) << 30, int64_t gemm_n = 8192,
                                         int runs = 5);

// dst[i] = offset + scale · u_i, u_i uniform in [-1, 1) from a counter-based
// hash of (seed, i): the same values on any launch shape. F32 or BF16.
Status cuda_fill_uniform(void* device_ptr, DType dtype, int64_t n, uint64_t seed, float scale, float offset);
// Random bytes: dst[i] = (lo + h_i mod (hi − lo + 1)) | (a random bit ? sign_mask : 0),
// h_i a counter-based hash of (seed, i): quantized codes and scales of the
// GPU benchmark's random quantized weights. Like cuda_fill_uniform it runs on
// the default stream; cuda_synchronize() waits for both.
Status cuda_fill_bytes(void* device_ptr, int64_t n, uint64_t seed, uint8_t lo, uint8_t hi, uint8_t sign_mask = 0);
Status cuda_synchronize();
#else
inline Result<GpuCeilings> measure_gpu_ceilings(uint64_t = 0, int64_t = 0, int = 0) {
  return make_error("this muse was built without CUDA");
}
inline Status cuda_fill_uniform(void*, DType, int64_t, uint64_t, float, float) {
  return make_error("this muse was built without CUDA");
}
inline Status cuda_fill_bytes(void*, int64_t, uint64_t, uint8_t, uint8_t, uint8_t = 0) {
  return make_error("this muse was built without CUDA");
}
inline Status cuda_synchronize() { return make_error("this muse was built without CUDA"); }
#endif

}  // namespace muse
