// The CUDA implementation of backends/backend.h (sm_90). This header has no
// CUDA includes: plain C++ (the engine, the tools, tests) includes it.
//
// Targets that link muse_backend_cuda see MUSE_HAVE_CUDA=1 (a PUBLIC
// definition). Without it (a build without CUDA) the two functions below are
// inline fallbacks: create_cuda_backend() returns an error that says so and
// cuda_device_count() returns 0, so callers and tests compile either way.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "muse/backends/backend.h"

namespace muse {

struct CudaBackendOptions {
  int device = 0;        // CUDA device ordinal
  bool profile = false;  // time every operation with device events (Backend::profile_report)
  // The bf16 product kernel: 0 the default rule (cuda_matmul.cu, by shape);
  // 1 the register-load kernel; 2, 3, 4, 6 the cp.async ring with that many
  // stages; 5 the block-shared-x kernel; 7 the tiled prefill GEMM; 8, 9 the
  // cluster kernel with 3 or 4 stages; 10 the cluster kernel with the
  // products of one project() call in one launch; 11 and 12 the wgmma
  // kernels with 256 or 8..64 activation rows a tile (sm_90a; 7 elsewhere),
  // 13 the form of 12 that reads x permuted into scratch first (above 16
  // rows), 14 the same with its 32-row TMA tiles from one row on;
  // 15 the streamed ring (a call's products in equal shares of the blocks
  // the GPU holds, cuda_stream_product.cu) at 1..8 rows, the rule above;
  // each forced for every row count. All give the same bits; the timing
  // tests and `muse bench --product-kernel` compare their speed. Quantized
  // weights (NVFP4 / MXFP4 / FP8 / INT4 in the layouts it takes) go through
  // their wgmma GEMM (cuda_quant_wgmma.cu) at every row count under 11,
  // above 64 rows under the rule, else their per-tile kernels.
  int gemv_variant = 0;
  // The latent experts' FP4 down product (NVFP4, MXFP4): 0 the rule (the
  // streaming kernel where the layout is aligned, K % 512 == 0, and the
  // launch is a few waves: cuda_quant_moe.cu); 1 a block per grouping tile
  // and 16 rows, as unaligned layouts and large batches run; 2 streaming
  // wherever aligned; 3 the rule's down product with the aligned FP4
  // gate/up kernel compiled for five blocks an SM instead of four. The same
  // bits; `muse bench --expert-kernel` compares their speed.
  int expert_kernel = 0;
  // The latent experts' products, BF16 or NVFP4 / MXFP4 / FP8 / INT4 in
  // their aligned layouts: 0 the rule (the grouped wgmma GEMM,
  // cuda_moe_wgmma.cu and cuda_quant_wgmma.cu: BF16 from 8 pairs an expert
  // on average, in tiles of 128 pairs, 256 from 256 pairs an expert; the
  // quantized formats from 32 pairs an expert, in tiles of 128; else the
  // per-tile kernels); 1 the per-tile kernels always; 2 / 3 the grouped
  // GEMM wherever it applies, in tiles of 256 / 128 pairs (INT4 always
  // 128). The same bits; `muse bench --expert-gemm`
  // compares their speed.
  int expert_gemm = 0;
  // The split attention's merge (cuda_attention_merge.cu): 0 the rule (by
  // the step's rows × q heads), 1 a block of 128 threads a row and q head,
  // 2 a warp a row and q head. The same bits; `muse bench
  // --attention-merge` compares their speed.
  int attention_merge = 0;
  // The latent experts' combine (cuda_moe_combine.cu): 0 the rule (a
  // cluster of eight blocks a token), 1 a block a token, 2 the cluster. The
  // same bits; `muse bench --moe-combine` compares their speed.
  int moe_combine = 0;
  // The streamed ring's depth (cuda_stream_product.cu): 0 the rule (four
  // stages, three blocks an SM), 2, 3 or 5 stages (six, four or two blocks
  // an SM). Which calls stream stays the rule's choice (by the four-stage
  // block count); only the launch's ring and grid change. The same bits;
  // `muse bench --stream-stages` compares their speed.
  int stream_stages = 0;
  // Ops (by the names --profile prints) whose kernels are not launched: a
  // timing probe of what each costs a step once PDL overlaps the launches
  // (`muse bench --skip-ops`). The outputs are then not valid.
  std::vector<std::string> skip_ops;
  // Run the side branches a model marks (Backend::begin_side: Spark's
  // router and top-k beside the pre-expert product) on a second stream;
  // off: every op in order on one stream (`muse bench --one-stream`). The
  // same kernels either way, so the same bits.
  bool side_stream = true;
  // Replay recorded regions (Backend::begin_graph) as CUDA graphs; off:
  // every op is launched as enqueued (`--enforce-eager`).
  bool graphs = true;
  // Recordings held at once; the least recently replayed goes first.
  int max_graphs = 256;
};

// The names of the CUDA backend's ops (its enqueue() calls; what --profile
// prints), for checking skip_ops. set_input (the step's inputs and plan) is
// not among those that may be skipped.
inline const std::vector<std::string>& cuda_skippable_ops() {
  static const std::vector<std::string> names = {
      "all_gather", "all_reduce_sum", "all_to_all", "attention",    "embed",        "gather_rows", "kv_store",
      "moe_experts", "moe_route",     "output_gate", "project",     "qk_norm_rope", "residual_norm", "rms_norm",
      "rope_tables", "sample_rows",   "softcap",    "swiglu"};
  return names;
}

#if defined(MUSE_HAVE_CUDA) && MUSE_HAVE_CUDA
// The backend on `options.device`; an error (clear message) when there is no
// CUDA driver, no GPU, or the device is not sm_90-capable.
Result<std::unique_ptr<Backend>> create_cuda_backend(const CudaBackendOptions& options = {});
// CUDA devices this process can use; 0 when there is no driver or no GPU.
int cuda_device_count();
#else
inline Result<std::unique_ptr<Backend>> create_cuda_backend(const CudaBackendOptions& = {}) {
  return make_error("this muse was built without CUDA (configure with -DMUSE_CUDA=ON on a machine with nvcc)");
}
inline int cuda_device_count() { return 0; }
#endif

}  // namespace muse
