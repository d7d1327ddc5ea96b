// `muse bench` options, shared by the CPU benchmark (cmd_bench.cc) and the
// GPU one (bench_cuda.cc).
#pragma once

#include <algorithm>
#include <chrono>
#include <cstdint>
#include <string>
#include <vector>

#include "command.h"
#include "muse/core/json.h"
#include "muse/core/status.h"

namespace muse {
class Engine;
}

namespace muse::tool {

// Timing helpers of the benchmarks: a monotonic clock in seconds, and the
// median of a set of runs (the figure every benchmark reports).
inline double now_s() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
inline double median_of(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v.empty() ? 0.0 : v[v.size() / 2];
}

struct BenchOptions {
  std::string device = "cpu";
  int threads = 0;
  int runs = 5;
  int64_t tokens = 64;   // decode tokens per run
  int64_t prompt = 32;   // prefill tokens per run
  int64_t hidden = 2048, layers = 12, heads = 32, kv_heads = 4, head_dim = 64;
  int64_t experts = 64, top_k = 8, latent = 1024, expert_intermediate = 256, vocab = 32000, window = 2048;
  int64_t bandwidth_mib = 2048;  // streaming-read buffer
  std::string weights = "bf16";
  bool json = false;
  bool profile = false;
  // --device cuda (bench_cuda.cc): a real shape, batch sizes, contexts, prefill.
  std::string model = "glimmer-30b";
  bool layers_given = false;
  std::vector<int64_t> batches{1, 4, 16, 64};
  std::vector<int64_t> contexts{1024, 32768};
  int64_t prefill = 8192;
  int product_kernel = 0;  // --product-kernel: CudaBackendOptions::gemv_variant (0: the shape rule)
  int expert_kernel = 0;   // --expert-kernel: CudaBackendOptions::expert_kernel (0: the rule)
  int expert_gemm = 0;     // --expert-gemm: CudaBackendOptions::expert_gemm (0: the rule)
  int attention_merge = 0; // --attention-merge: CudaBackendOptions::attention_merge (0: the rule)
  int moe_combine = 0;     // --moe-combine: CudaBackendOptions::moe_combine (0: the rule)
  int stream_stages = 0;   // --stream-stages: CudaBackendOptions::stream_stages (0: the rule)
  std::vector<std::string> skip_ops;  // --skip-ops: CudaBackendOptions::skip_ops (timing probes)
  bool enforce_eager = false;  // --enforce-eager: no CUDA graphs (CudaBackendOptions::graphs off)
  bool one_stream = false;     // --one-stream: no side branches (CudaBackendOptions::side_stream off)
  // --speculative DIR (bench_spec.cc): a real checkpoint and its drafter,
  // tokens/s with and without speculative decoding on the gate prompts.
  std::string spec_target;
  std::string spec_drafter;  // default: DIR/drafter
  std::string spec_prompts = "bench/data/muse_tiny_gate_prompts.json";
  bool batches_given = false;
  // --device cuda --verify-widths A: the verify-width benchmark at per-position acceptance A (0: off).
  double verify_acceptance = 0;
  // --write-random DIR: write the --model shape as a random checkpoint (boot timing).
  std::string write_random;
};

// The GPU benchmark (muse bench --device cuda).
int bench_cuda(const BenchOptions& o);
// muse bench --write-random DIR: the --model shape (glimmer-30b or
// spark-slice, --layers) as a random BF16 checkpoint in the Hugging Face
// layout, for timing a boot from disk against reading the files.
int bench_write_random(const BenchOptions& o);
// The verify-width part of the GPU benchmark (bench_verify_width.cc).
Result<Json> bench_verify_widths(Engine& e, const BenchOptions& o, double acceptance);
// The speculative-decoding benchmark (muse bench --speculative DIR).
int bench_spec(const BenchOptions& o);

}  // namespace muse::tool
