// CudaBackend's declaration and the device helpers shared by the files that
// implement its operations. Not a public header (it includes CUDA headers):
//   cuda_backend.cu    memory, the op queue, execute, errors, profile
//   cuda_rowwise.cu    embedding, norms, RoPE, gates, SwiGLU, gathers, softcap
//   cuda_matmul.cu     project: own fixed-order kernel (T <= 64), cuBLASLt above
//   cuda_attention.cu  attention over ring/paged KV, kv_store
//   cuda_moe.cu        sigmoid router, latent experts
//   cuda_sampling.cu   sample_rows: the token drawn where the logits are
//   cuda_quant_*.cu    the same products with quantized weights (cuda_quant.cuh)
//
// Numerics: every activation tensor is F32 or BF16 (its own dtype), loaded
// as fp32, computed in fp32, and stored once in the output's dtype (bf16 by
// round-to-nearest-even). Reductions have one fixed order (per-lane
// sequential sums, then a butterfly over the warp, then warps in index
// order): no atomics, so results are bitwise reproducible and a row's result
// never depends on the other rows of the batch.
#pragma once

#include <cublasLt.h>
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <functional>
#include <map>
#include <set>
#include <string>
#include <type_traits>
#include <tuple>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "muse/backends/cuda/cuda_backend.h"

namespace muse::cuda {

// ---------------------------------------------------------------------------
// Device-side errors: a kernel that finds bad data (a token id outside the
// vocabulary, a block id outside the pool) records the first one here and
// skips the bad element; execute() turns it into a Status naming the op.
// ---------------------------------------------------------------------------
struct DeviceError {
  int op;    // index of the op in the step, +1 (0: no error)
  int code;  // ErrCode
  int a, b;  // values for the message
};
enum ErrCode : int {
  kErrTokenId = 1,  // a: id, b: vocabulary size
  kErrRow,          // a: row, b: rows
  kErrExpert,       // a: id, b: experts
  kErrPlanSeq,      // a: row, b: sequence index
  kErrRingSlot,     // a: slot, b: slots
  kErrBlock,        // a: block id, b: blocks in the pool
  kErrBlockTable,   // a: position, b: blocks in the sequence's table
  kErrRingWindow,   // a: keys, b: ring rows
  kErrChunkHint,    // a: row, b: key chunks it needs (more than the plan's max_seq_end hint launched)
};

__device__ inline void report_error(DeviceError* e, int op, int code, int a, int b) {
  if (atomicCAS(&e->op, 0, op + 1) == 0) {  // first error wins; not a reduction
    e->code = code;
    e->a = a;
    e->b = b;
  }
}

// Element types of activations and weights.
enum : int { kF32 = 0, kBF16 = 1 };

__device__ __forceinline__ float ld(const void* p, int dt, int64_t i) {
  return dt == kBF16 ? __bfloat162float(static_cast<const __nv_bfloat16*>(p)[i]) : static_cast<const float*>(p)[i];
}
__device__ __forceinline__ void st(void* p, int dt, int64_t i, float v) {
  if (dt == kBF16)
    static_cast<__nv_bfloat16*>(p)[i] = __float2bfloat16_rn(v);
  else
    static_cast<float*>(p)[i] = v;
}
__device__ __forceinline__ float to_f(float v) { return v; }
__device__ __forceinline__ float to_f(__nv_bfloat16 v) { return __bfloat162float(v); }

// Sum over a warp (butterfly: every lane ends with the same bits, since
// each step adds the same two values in either order).
__device__ __forceinline__ float warp_sum(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}
__device__ __forceinline__ float warp_max(float v) {
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v = fmaxf(v, __shfl_xor_sync(0xffffffffu, v, o));
  return v;
}
// Sum over the block (blockDim.x a multiple of 32, at most 1024): warps in
// index order. `red` is shared scratch of 33 floats. Every thread returns the
// sum: each adds the warps' sums itself, in the same order (the same bits
// everywhere; one barrier fewer than thread 0 adding and broadcasting, on
// the critical path of every batch-1 norm).
__device__ __forceinline__ float block_sum(float v, float* red) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, nw = blockDim.x >> 5;
  v = warp_sum(v);
  __syncthreads();  // red may still be read from a previous call
  if (lane == 0) red[warp] = v;
  __syncthreads();
  float s = 0.0f;
  for (int w = 0; w < nw; ++w) s += red[w];
  return s;
}

// Programmatic dependent launch (sm_90). A kernel launched with the
// programmatic-serialization attribute may start before the one before it
// ends; pdl_wait() returns once that one has finished and its writes are
// visible (a no-op for a normal launch). pdl_launch_dependents() lets the
// next such kernel start early; it changes nothing about what it may read.
__device__ __forceinline__ void pdl_wait() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}
__device__ __forceinline__ void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  asm volatile("griddepcontrol.launch_dependents;");
#endif
}
// A product's blocks call this once their weight loop is done (every copy
// issued and consumed; what is left is the reduction and the stores): the
// kernel after it may then launch (it fires once every block has called it
// or exited, so all of this grid's blocks are resident by then) and take
// the SM slots our finishing blocks free, streaming its own weights during
// our tail. It still waits (pdl_wait) for our completion before reading
// what we write. (At the product's start instead it was slower: the
// dependents' blocks held slots the product's own blocks needed.)
__device__ __forceinline__ void pdl_streaming_done() { pdl_launch_dependents(); }

__device__ __forceinline__ float sigmoidf_(float x) { return 1.0f / (1.0f + expf(-x)); }
// A value as the dtype dt stores it (what a later read of it gives).
__device__ __forceinline__ float as_stored(int dt, float v) {
  return dt == kBF16 ? __bfloat162float(__float2bfloat16_rn(v)) : v;
}

// The step plan as kernels read it (StepPlanLayout offsets, capacities).
struct PlanDev {
  const int32_t* p = nullptr;
  int tokens = 0, positions = 0, row_seq = 0, seq_row_begin = 0, seq_pos_begin = 0, seq_full_begin = 0,
      seq_full_count = 0, seq_slide_begin = 0, seq_slide_count = 0, seq_slide_first = 0, block_table = 0;
  int max_rows = 0, max_seqs = 0, max_blocks = 0;
};

// The streamed ring product's boundaries (cuda_stream_product.cu): each
// warp-lane's accumulators of a tile cut between two blocks, and the flag
// that says they are there; one set per backend, created on its device.
struct StreamSync {
  float* handoff = nullptr;   // [slots][4 warps x 32 lanes x 4 accumulators]
  unsigned* flags = nullptr;  // [slots]
  int slots = 0;
  int stages = 0;             // the launch's ring depth (CudaBackendOptions::stream_stages, or the rule's)
  int64_t launch_blocks = 0;  // the blocks the GPU holds at that depth: a launch's grid at most
  // The blocks the GPU holds at the rule's depth. Which calls stream (and
  // where the output gate runs) is decided by this count, whatever depth
  // an A/B launches with.
  int64_t rule_blocks = 0;
  int64_t blocks() const { return rule_blocks; }  // 0 until created
};

// ---------------------------------------------------------------------------
// The backend.
// ---------------------------------------------------------------------------
class CudaBackend final : public Backend {
 public:
  explicit CudaBackend(const CudaBackendOptions& options);
  ~CudaBackend() override;
  Status init();

  std::string name() const override { return name_; }
  std::string profile_report() const override;
  void profile_reset() override { profile_times_.clear(); }
  void set_profiling(bool on) override { profile_ = on; }
  DType activation_dtype() const override { return DType::BF16; }
  DType kv_dtype() const override { return DType::BF16; }
  // Weight matrices are held in BF16 (an F32 checkpoint is rounded once, at load).
  DType matrix_dtype(DType stored) const override { return stored == DType::F32 ? DType::BF16 : stored; }
  // Quantized weights stay quantized and are decoded in the products'
  // registers (cuda_quant.cuh): the kinds quant_kind_runs() names.
  bool supports_quant(QuantKind kind) const override;
  Memory memory() const override;

  Result<Tensor> alloc(DType dtype, std::initializer_list<int64_t> shape) override;
  Result<Tensor> import_weight(DType dtype, std::initializer_list<int64_t> shape, const void* host,
                               bool host_outlives) override;
  void release(Tensor& t) override;
  // In place, now (not enqueued): cuda_fill_uniform (cuda_bench.cu), then a
  // device synchronisation, so later steps on the stream see the values.
  Status fill_uniform(const Tensor& t, uint64_t seed, float scale, float offset) override;
  Status download(const Tensor& t, void* host) override;

  void set_input(const Tensor& dst, const void* host, size_t bytes) override;
  Status execute() override;
  void flush() override;
  // A side branch runs on side_ (cuda_backend.cu, "Side branches").
  void begin_side() override;
  void end_side() override;
  void join_side() override;
  // Recorded regions as CUDA graphs (cuda_graphs.cu).
  void begin_graph(uint64_t key) override;
  void end_graph() override;
  GraphStats graph_stats() const override;
  // Every count to 16, then multiples of 8; `rows` with graphs off (cuda_graphs.cu).
  int64_t graph_rows(int64_t rows) const override;

  void embed(const Tensor& out, const Tensor& table, const Tensor& ids) override;
  void rms_norm(const Tensor& out, const Tensor& in, const Tensor& gain, NormGain mode, float eps, int64_t group,
                float scale) override;
  void residual_norm(const Tensor& stream, const Tensor& update, const Tensor& gain, NormGain mode,
                     const Tensor& alpha, const Tensor& beta, float eps) override;
  void residual_norm_then_norm(const Tensor& stream, const Tensor& update, const Tensor& gain, NormGain mode,
                               const Tensor& alpha, const Tensor& beta, float eps, const NextNorm& next) override;
  void project(const Tensor& x, std::span<const Projection> outputs) override;
  void rope_tables(const Tensor& cos, const Tensor& sin, const Tensor& positions, double theta,
                   int64_t head_dim) override;
  void qk_norm_rope(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin, int64_t head_dim,
                    float eps, float q_scale) override;
  void attention(const Tensor& out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                 const KvLayerStorage& cache, const StepPlanView& plan, int64_t head_dim, int64_t window,
                 float scale) override;
  void kv_store(const KvLayerStorage& cache, const Tensor& k_new, const Tensor& v_new,
                const StepPlanView& plan) override;
  bool gate_in_attention(const Tensor& x, const Tensor& weight) const override;
  void attention_store_gate(const Tensor& out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                            const KvLayerStorage& cache, const StepPlanView& plan, int64_t head_dim, int64_t window,
                            float scale, const OutputGate& gate) override;
  void output_gate(const Tensor& o, const Tensor& g, int64_t head_dim, bool head_norm, float eps) override;
  void swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) override;
  void project_swiglu(const Tensor& x, const Projection& gate, const Projection& up, const Tensor& act) override;
  void moe_route(const Tensor& ids, const Tensor& weights, const Tensor& logits, const Tensor& bias, float multiplier,
                 float scaling) override;
  void moe_experts(const Tensor& out, const Tensor& u, const Tensor& gate_up, const Tensor& down,
                   const Tensor& post_gain, const Tensor& ids, const Tensor& weights, float eps,
                   int64_t expert_base) override;
  void gather_rows(const Tensor& out, const Tensor& in, const Tensor& rows) override;
  void softcap(const Tensor& x, float multiplier, float cap) override;
  void sample_rows(const Tensor& out, const Tensor& logits, const Tensor& specs, int64_t rows,
                   int64_t edits) override;  // cuda_sampling.cu
  // cuda_collectives.cu: the communicator's calls on this backend's stream.
  void all_reduce_sum(const Tensor& t, Communicator& comm) override;
  void all_gather(const Tensor& out, const Tensor& in, Communicator& comm) override;
  void all_to_all(const Tensor& out, const Tensor& in, Communicator& comm) override;

 private:
  // An enqueued op: launches its kernels on the stream; returns the launch
  // status (cudaGetLastError() after the last launch).
  using Launch = std::function<cudaError_t(cudaStream_t)>;
  // Records a shape/dtype error found at enqueue; execute() reports the first
  // one and runs nothing more (what a flush() launched before it has run).
  // These are engine bugs, not user input.
  bool check(bool ok, const char* op, const std::string& what);
  // The same, with the message built only when the check fails: the ops
  // check every call, and building their messages (shapes, dtypes) cost
  // ~0.3 µs each on the host for every op of every step, while the GPU
  // waits for the step to be enqueued.
  template <class Message, class = std::enable_if_t<std::is_invocable_v<Message&>>>
  bool check(bool ok, const char* op, Message&& what) {
    return ok || check(false, op, std::string(what()));
  }
  void enqueue(const char* name, Launch run);
  int op_index() const { return int(ops_.size()); }  // the index the next enqueued op gets
  DeviceError* dev_error() const { return dev_error_; }
  // Device scratch of at least `bytes`, valid while the step runs: ops read
  // scratch_ when they run, so growing it at a later enqueue is safe.
  void reserve_scratch(size_t bytes);
  // The same, for scratch an op can do without (it takes a slower path):
  // false, and no error, where the memory is not there.
  bool try_reserve_scratch(size_t bytes);
  void* scratch() const { return scratch_; }
  // The producers of a product's x (the residual norm, SwiGLU) may write it
  // in the wgmma products' order into scratch as well, where the products
  // read x so (above 16 rows): project() then skips its permute kernel, one
  // launch and one pass less a product (cuda_matmul.cu). offer_xperm(x), at
  // the producer's enqueue: whether to write that copy (scratch reserved);
  // it stands for x only for the op enqueued right after the producer (or
  // `after` ops on: the prefill attention's kv_store comes between), in
  // this step (xperm_ready), and only if the scratch the producer wrote is
  // still the scratch when the product launches: a flush may launch the
  // producer before a later op grows the scratch (xperm_written, checked at
  // launch; else the product permutes x itself). Side-branch ops that need
  // no scratch do not count (in_order_ops_): Spark's router branch sits
  // between its norm and the pre-expert product.
  // `after`: the consumer is the op that many in-order enqueues after the producer.
  bool offer_xperm(const Tensor& x, size_t offset = 0, int after = 1);  // the copy `offset` bytes into the scratch
  bool xperm_ready(const Tensor& x) const;
  void xperm_written() { xperm_generation_ = scratch_generation_; }  // the producer's launch
  bool xperm_valid() const { return xperm_generation_ == scratch_generation_; }
  struct XpermCopy {
    const void* x = nullptr;
    int64_t rows = 0, cols = 0;
    int op = -1;  // the op index that may use it
    size_t offset = 0;
  };
  XpermCopy xperm_copy_;
  uint64_t scratch_generation_ = 0;  // +1 at every reallocation of scratch_
  uint64_t xperm_generation_ = ~uint64_t(0);
  // inv_freq for (theta, head_dim), on the device (uploaded once).
  const float* inv_freq(double theta, int64_t head_dim);
  static PlanDev plan_dev(const StepPlanView& v);
  // The projection kernels (cuda_matmul.cu); also used by moe for nothing
  // else: moe has its own grouped kernels.
  cudaError_t launch_project(cudaStream_t s, const Tensor& x, const Projection& p);
  // The output gate's product inside the attention op, between its chunk
  // kernel and its merge (gate_in_attention): x is complete before the
  // chunks start, so the product reads it without waiting and waits for
  // the chunk kernel only before it exits (kChainXReady).
  cudaError_t launch_gate_product(cudaStream_t s, const Tensor& x, const Projection& p);
  cudaError_t launch_cublaslt(cudaStream_t s, const Tensor& x, const Projection& p);
  std::string cuda_failure(const char* what, cudaError_t e);
  // attention's checks and choice of kernels (cuda_attention.cu); false
  // where a check failed (the error is recorded).
  struct AttentionLaunch;
  bool plan_attention(const Tensor& out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                      const KvLayerStorage& cache, const StepPlanView& plan, int64_t head_dim, int64_t window,
                      float scale, AttentionLaunch& launch);
  void enqueue_attention(const AttentionLaunch& launch);
  void use_device() const;

  int device_ = 0;
  bool profile_ = false;
  int gemv_variant_ = 0;  // CudaBackendOptions::gemv_variant
  int expert_kernel_ = 0;  // CudaBackendOptions::expert_kernel
  int expert_gemm_ = 0;    // CudaBackendOptions::expert_gemm
  int attention_merge_ = 0;  // CudaBackendOptions::attention_merge
  int moe_combine_ = 0;      // CudaBackendOptions::moe_combine
  int stream_stages_ = 0;    // CudaBackendOptions::stream_stages
  std::vector<std::string> skip_ops_;  // not launched (CudaBackendOptions::skip_ops)
  std::string name_;
  cudaStream_t stream_ = nullptr;
  DeviceError* dev_error_ = nullptr;      // device
  DeviceError* host_error_ = nullptr;     // pinned
  struct Op {
    const char* name;
    Launch run;
    bool side = false;  // an op of a side branch (begin_side .. end_side)
    bool fork = false;  // the first op of its branch: side_ first waits for stream_
    bool join = false;  // stream_ first waits for side_ (join_side before this op)
  };
  std::vector<Op> ops_;
  size_t launched_ = 0;                     // ops_[0 .. launched_) launched (flush(), execute())
  // Side branches (Backend::begin_side). At enqueue: whether ops go to the
  // branch, whether its next op forks, whether the next main op joins.
  // side_degraded_: an op of the branch needed the scratch (which the main
  // ops use too), so it and the rest of the branch run in order on stream_,
  // after a join. At launch: side_open_, side_ has work stream_ has not
  // waited for.
  bool side_on_ = true;  // CudaBackendOptions::side_stream
  bool side_enqueue_ = false, side_fork_next_ = false, side_degraded_ = false, join_next_ = false;
  bool side_any_ = false;  // side ops enqueued since the last join (a later branch's first op may need one)
  // Ops enqueued this step that may touch the scratch or x: all but the
  // branch ops that need no scratch (offer_xperm counts its consumer here).
  int in_order_ops_ = 0;
  bool side_open_ = false;
  cudaStream_t side_ = nullptr;
  cudaEvent_t fork_event_ = nullptr, join_event_ = nullptr;
  // ops_[i] on its stream, forking / joining first (skip: the fork and join only)
  cudaError_t run_op(size_t i, cudaStream_t main, bool skip = false);
  bool skipped(size_t i) const;  // CudaBackendOptions::skip_ops names ops_[i]
  cudaError_t join_side_stream(cudaStream_t main);  // main waits for side_'s work (if any)
  bool step_started_ = false;               // the device error flag is reset for this step
  cudaError_t flush_error_ = cudaSuccess;   // a launch that failed, in flush_error_name_
  const char* flush_error_name_ = "";
  void launch_queued(bool timed);
  // Before freeing a buffer a flushed op may still use (the scratch, the
  // arena, when they grow within a step): wait for the stream.
  void quiesce_flushed();
  std::string enqueue_error_;
  std::unordered_set<void*> owned_;
  // set_input bytes, captured at enqueue, uploaded in stream order at execute.
  char* arena_ = nullptr;  // pinned
  size_t arena_cap_ = 0, arena_used_ = 0;
  // import_weight staging (pinned, double-buffered).
  static constexpr size_t kStageBytes = size_t(16) << 20;
  char* stage_[2] = {nullptr, nullptr};
  cudaEvent_t stage_done_[2] = {nullptr, nullptr};
  void* scratch_ = nullptr;
  size_t scratch_bytes_ = 0;
  // The grouping of the last moe_route's ids (cuda_moe.cu): moe_group_kernel
  // runs in the route's op, so that where the route is on a side branch the
  // grouping too runs beside the pre-expert product, off the experts'
  // critical path. For the moe_experts of those ids that takes the per-tile
  // kernels on every expert (decode). Its own buffer: a side-branch op may
  // not touch the scratch. Grows as the scratch does (reserve_plan).
  struct RoutePlan {
    const void* ids = nullptr;  // none this step
    int64_t rows = 0, cols = 0, experts = 0;  // the grouping's layout follows (group_layout)
    uint64_t generation = 0;  // plan_generation_ when the route was enqueued
  };
  RoutePlan route_plan_;
  void* plan_buf_ = nullptr;
  StreamSync stream_sync_;  // the streamed ring's boundaries (cuda_stream_product.cu)
  size_t plan_bytes_ = 0;
  // +1 at every reallocation of plan_buf_: experts that launch after a later
  // route grew it (its grouping went to the old buffer) group for themselves.
  uint64_t plan_generation_ = 0;
  bool reserve_plan(size_t bytes);
  std::map<std::pair<double, int64_t>, float*> inv_freq_;
  // cuBLASLt.
  cublasLtHandle_t lt_ = nullptr;
  void* lt_workspace_ = nullptr;
  static constexpr size_t kLtWorkspace = size_t(32) << 20;
  struct LtKey {
    int64_t m, n, k;
    int adt, cdt;
    int align_a, align_b, align_c;
    bool operator<(const LtKey& o) const {
      return std::tie(m, n, k, adt, cdt, align_a, align_b, align_c) <
             std::tie(o.m, o.n, o.k, o.adt, o.cdt, o.align_a, o.align_b, o.align_c);
    }
  };
  struct LtPlan {
    cublasLtMatmulDesc_t op = nullptr;
    cublasLtMatrixLayout_t a = nullptr, b = nullptr, c = nullptr;
    cublasLtMatmulAlgo_t algo{};
    bool ok = false;
  };
  std::map<LtKey, LtPlan> lt_plans_;
  const LtPlan* lt_plan(const LtKey& key);
  // Profile: device events around each op.
  struct OpTime {
    int64_t count = 0;
    double seconds = 0;
  };
  std::vector<std::pair<std::string, OpTime>> profile_times_;
  std::vector<cudaEvent_t> events_;

  // Recorded regions (cuda_graphs.cu). A region's ops are captured into a
  // graph the second time its key is seen (a key seen once may never come
  // back: a prefill's shape), and replayed from the third: begin_graph then
  // launches the graph at once, and the ops the model enqueues after it are
  // only checked against the recorded names (launched_ moves past them).
  // A recording bakes in the scratch buffer's address, so a reallocation of
  // the scratch drops them all.
  enum class GraphMode { Off, Capture, Replay };
  struct StepGraph {
    cudaGraphExec_t exec = nullptr;
    std::vector<const char*> names;  // the region's op names, in order
    uint64_t scratch_generation = 0;
    uint64_t last_use = 0;
  };
  bool graphs_apply() const;             // whether steps may be recorded at all
  void graph_enqueued(const char* name);  // an op enqueued inside a region
  void capture_region();                  // end_graph() of a Capture region
  void graph_mismatch(const std::string& what);
  void drop_graphs();
  bool graphs_on_ = true;
  size_t max_graphs_ = 256;
  GraphMode graph_mode_ = GraphMode::Off;
  uint64_t graph_key_ = 0;
  size_t region_begin_ = 0;  // the region's first op index
  StepGraph* replaying_ = nullptr;
  std::unordered_map<uint64_t, StepGraph> graphs_;
  std::unordered_map<uint64_t, int> graph_sightings_;
  std::unordered_set<uint64_t> graph_failed_;  // keys whose capture or launch failed: op by op
  uint64_t graph_clock_ = 0;
  GraphStats graph_stats_;
};

// Host helpers.
inline bool is_float_dtype(DType t) { return t == DType::F32 || t == DType::BF16; }
inline int dt_code(DType t) { return t == DType::BF16 ? kBF16 : kF32; }
inline unsigned blocks_for(int64_t n, int64_t per) { return unsigned((n + per - 1) / per); }

}  // namespace muse::cuda
