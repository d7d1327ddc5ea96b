// Quantized products on Hopper's warpgroup MMA (cuda_quant_wgmma.cu,
// sm_90a), NVFP4 / MXFP4 / FP8 codes decoded in registers, for steps with
// many rows: the latent experts' grouped GEMM (moe_experts, cuda_moe.cu) and
// the dense projections' prefill GEMM (project, cuda_matmul.cu). The bits
// are the per-tile kernels' (cuda_quant_moe.cu, cuda_quant_matmul.cu), so
// the rules may choose by shape.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "muse/backends/cuda/cuda_moe_wgmma.h"
#include "muse/backends/tensor.h"

namespace muse::cuda {

struct QuantDev;

// The experts: their aligned layouts (QuantDev::aligned), Hm and I
// multiples of the format's granule (FP4 512, FP8 128), FP8 with per-tensor
// or per-channel scales. MoeGemmArgs' gate_up and down are not read.
bool moe_q_gemm_applies(QuantKind kind, const QuantDev& gu, const QuantDev& dn, int64_t Hm, int64_t I,
                        const void* u);
cudaError_t launch_moe_q_gemm(cudaStream_t s, const MoeGemmArgs& a, const QuantDev& gu, const QuantDev& dn,
                              QuantKind kind);

// A dense product out[T, N] = x[T, K] · Wᵀ (W [N, K] quantized, x BF16 in
// 16-byte-aligned rows of stride K): the same conditions on W and K.
bool quant_gemm_applies(QuantKind kind, const QuantDev& w, const void* x);
// x in the format's k order, T × K bf16 into xq (scratch, 16-byte aligned);
// one pass serves every product of the same x and format order
// (quant_gemm_order: NVFP4 and MXFP4 share theirs).
int quant_gemm_order(QuantKind kind);
cudaError_t launch_quant_gemm_permute(cudaStream_t s, QuantKind kind, const __nv_bfloat16* x, int64_t T, int64_t K,
                                      __nv_bfloat16* xq);
// The product from xq, stored as odt (kBF16 / kF32) with row stride ldo.
cudaError_t launch_quant_gemm(cudaStream_t s, QuantKind kind, const __nv_bfloat16* xq, int64_t T, const QuantDev& w,
                              void* out, int odt, int64_t ldo);

}  // namespace muse::cuda
