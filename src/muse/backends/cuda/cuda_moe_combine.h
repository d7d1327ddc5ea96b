// The latent experts' combine (cuda_moe_combine.cu), launched by
// moe_experts (cuda_moe.cu) after the expert products.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "muse/backends/tensor.h"

namespace muse::cuda {

constexpr int kMoeMaxTopK = 64;  // experts a token, at most

// out[t] = Σ_k weights[t, k] · rms(Y[slot_of[t, k]] ⊙ gain) for the T tokens
// (slots < 0: another rank's, left out). mode: 0 the rule (a cluster of
// eight blocks a token), 1 a block a token, 2 the cluster
// (CudaBackendOptions::moe_combine); the same bits.
cudaError_t launch_moe_combine(cudaStream_t s, int mode, void* out, DType out_dtype, const float* Y,
                               const int32_t* slot_of, const float* weights, const float* gain, int64_t T, int K,
                               int64_t Hm, float eps);

}  // namespace muse::cuda
