// The latent experts' grouped GEMM for steps with many pairs (prefill):
// cuda_moe_wgmma.cu (BF16 weights) and cuda_quant_wgmma.cu (NVFP4 / MXFP4 /
// FP8, declared in cuda_quant_wgmma.h), sm_90a. moe_experts (cuda_moe.cu)
// groups the pairs, then calls launch_moe_gemm in place of the per-tile
// kernels; the bits are theirs.
#pragma once

#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "muse/backends/tensor.h"

namespace muse::cuda {

struct MoeGemmArgs {
  const __nv_bfloat16* u = nullptr;        // [T, Hm] the tokens' latent rows
  const __nv_bfloat16* gate_up = nullptr;  // [E, 2I, Hm] (BF16 weights)
  const __nv_bfloat16* down = nullptr;     // [E, Hm, I] (BF16 weights)
  const int32_t* order = nullptr;          // pair of each grouped row (the grouping's)
  const int32_t* starts = nullptr;         // [E + 1] each expert's first grouped row
  const int32_t* tile_starts = nullptr;    // [E + 1] each expert's first tile of nx rows
  int64_t Hm = 0, I = 0, R = 0;            // R: pairs (T · topk)
  int E = 0, topk = 0, nx = 256;           // nx: pairs a tile (128 or 256)
  __nv_bfloat16* xg = nullptr;             // scratch [R, Hm]: u gathered, in the mma's k order
  __nv_bfloat16* ap = nullptr;             // scratch [R, I]: a, in the mma's k order
  float* Y = nullptr;                      // [R, Hm] the down product's sums (grouped rows)
};

// The GPU runs the sm_90a code, the widths are multiples of 32 and the
// operands 16-byte aligned.
bool moe_gemm_applies(int64_t Hm, int64_t I, const void* u, const void* gate_up, const void* down);
// gather → gate/up (a) → down (Y), three launches on `s`.
cudaError_t launch_moe_gemm(cudaStream_t s, const MoeGemmArgs& a);

}  // namespace muse::cuda
