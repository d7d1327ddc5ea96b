// CpuBackend's declaration, shared by the files that implement its
// operations (cpu_backend.cc: memory, queue, elementwise and norm ops;
// cpu_matmul.cc; cpu_attention.cc; cpu_moe.cc). Not a public header.
#pragma once

#include <array>
#include <cstring>
#include <memory>
#include <new>
#include <type_traits>
#include <set>
#include <string>
#include <unordered_set>
#include <vector>

#include "muse/backends/cpu/cpu_backend.h"
#include "muse/backends/cpu/kernels.h"
#include "muse/backends/cpu/thread_pool.h"

// Shape/dtype checks at enqueue time: the message is built only on failure
// (building it for every op would allocate on every step).
#define MUSE_CPU_CHECK(ok, op, what) ((ok) ? true : check(false, op, (what)))

namespace muse::cpu {

// A queued operation: a closure stored inline (no heap), so queueing a step
// allocates nothing once the queue's capacity has grown to a step's length.
class InlineOp {
 public:
  static constexpr size_t kCapacity = 768;  // the attention op (eight tensors) is the largest
  InlineOp() = default;
  template <class F>
  InlineOp(const char* name, F&& f) : name_(name) {
    using Fn = std::decay_t<F>;
    static_assert(sizeof(Fn) <= kCapacity, "operation closure too large for InlineOp");
    static_assert(alignof(Fn) <= alignof(std::max_align_t));
    // Closures hold only tensors, pointers and numbers, so a queued op is
    // moved as bytes and never destroyed.
    static_assert(std::is_trivially_copyable_v<Fn> && std::is_trivially_destructible_v<Fn>,
                  "operation closures must capture plain values only");
    new (storage_) Fn(std::forward<F>(f));
    run_ = [](void* p) { (*static_cast<Fn*>(p))(); };
  }
  InlineOp(const InlineOp&) = delete;
  InlineOp& operator=(const InlineOp&) = delete;
  InlineOp(InlineOp&& o) noexcept { *this = std::move(o); }
  InlineOp& operator=(InlineOp&& o) noexcept {
    std::memcpy(storage_, o.storage_, kCapacity);
    name_ = o.name_, run_ = o.run_;
    return *this;
  }
  const char* name() const { return name_; }
  void run() { run_(storage_); }

 private:
  alignas(std::max_align_t) unsigned char storage_[kCapacity];
  const char* name_ = nullptr;
  void (*run_)(void*) = nullptr;
};

class CpuBackend final : public Backend {
 public:
  CpuBackend(const KernelTable& kernels, int threads, bool profile);
  ~CpuBackend() override;

  std::string name() const override;
  // F32 by default; BF16 and F8_E4M3 (--kv-cache-dtype) are decoded in attention.
  bool supports_kv_dtype(DType t) const override {
    return t == DType::F32 || t == DType::BF16 || t == DType::F8_E4M3;
  }
  std::string profile_report() const override;
  bool supports_quant(QuantKind kind) const override { return true; }  // all four kinds (cpu_matmul.cc)
  void profile_reset() override { profile_times_.clear(); }
  void set_profiling(bool on) override { profile_ = on; }

  Result<Tensor> alloc(DType dtype, std::initializer_list<int64_t> shape) override;
  Result<Tensor> import_weight(DType dtype, std::initializer_list<int64_t> shape, const void* host,
                               bool host_outlives) override;
  void release(Tensor& t) override;
  Status fill_uniform(const Tensor& t, uint64_t seed, float scale, float offset) override;
  Status download(const Tensor& t, void* host) override;

  void set_input(const Tensor& dst, const void* host, size_t bytes) override;
  Status execute() override;

  void embed(const Tensor& out, const Tensor& table, const Tensor& ids) override;
  void rms_norm(const Tensor& out, const Tensor& in, const Tensor& gain, NormGain mode, float eps, int64_t group,
                float scale) override;
  void residual_norm(const Tensor& stream, const Tensor& update, const Tensor& gain, NormGain mode,
                     const Tensor& alpha, const Tensor& beta, float eps) override;
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
  void output_gate(const Tensor& o, const Tensor& g, int64_t head_dim, bool head_norm, float eps) override;
  void swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) override;
  void moe_route(const Tensor& ids, const Tensor& weights, const Tensor& logits, const Tensor& bias, float multiplier,
                 float scaling) override;
  void moe_experts(const Tensor& out, const Tensor& u, const Tensor& gate_up, const Tensor& down,
                   const Tensor& post_gain, const Tensor& ids, const Tensor& weights, float eps,
                   int64_t expert_base) override;
  void gather_rows(const Tensor& out, const Tensor& in, const Tensor& rows) override;
  void softcap(const Tensor& x, float multiplier, float cap) override;
  void sample_rows(const Tensor& out, const Tensor& logits, const Tensor& specs, int64_t rows,
                   int64_t edits) override;
  void all_reduce_sum(const Tensor& t, Communicator& comm) override;
  void all_gather(const Tensor& out, const Tensor& in, Communicator& comm) override;
  void all_to_all(const Tensor& out, const Tensor& in, Communicator& comm) override;

  const KernelTable& kernels() const { return k_; }
  ThreadPool& pool() { return pool_; }

 private:
  // Records a shape/dtype error found at enqueue time; execute() reports the
  // first one and runs nothing. These are engine bugs, not user input.
  bool check(bool ok, const char* op, const std::string& what);
  template <class F>
  void enqueue(const char* name, F&& op) {
    ops_.emplace_back(name, std::forward<F>(op));
  }
  // Execution-time failure (e.g. a token id out of range).
  void fail(std::string message);
  // Per-thread scratch of at least `bytes`, grown in the calling thread
  // before a dispatch (never inside tasks).
  void reserve_scratch(size_t bytes);
  char* scratch(int thread) { return scratch_[size_t(thread)].data(); }
  // Row-wise norm of `n` values into y (y may alias x), scratch-free.
  void norm_row(float* y, const float* x, int64_t n, const float* gain, NormGain mode, float eps, float scale) const;
  // A matmul of rows [t0, t0+T) of x against weight rows [n0, n0+N) of
  // `w` (2-D), or of expert `expert` of a fused-expert `w` (3-D); dense or
  // quantized.
  void matmul_block(const float* x, int64_t ldx, int64_t T, const Tensor& w, int64_t expert, int64_t n0, int64_t N,
                    float* out, int64_t ldo) const;
  // Splits T×N outputs into tasks and runs them (used by project and moe).
  struct MatmulJob {
    const float* x;
    int64_t ldx, T;
    const Tensor* w;  // full weight; rows [w_row0, w_row0 + N) (of expert `expert` when 3-D)
    int64_t expert, w_row0, N;
    float* out;
    int64_t ldo;
  };
  void run_matmuls(const std::vector<MatmulJob>& jobs);
  // Output rows per task for weight w, from the load-balancing target `rows`.
  int64_t task_rows(const Tensor& w, int64_t rows) const;
  struct MatmulTask {
    int job;
    int64_t n0, N, t0, T;
  };
  static constexpr size_t kMaxProjections = 4;  // q, k, v, gate
  struct ProjectionSet {
    std::array<Projection, kMaxProjections> p;
    size_t n = 0;
  };
  struct AttentionTask {
    int64_t seq, row0, rows, head;
  };
  // Per-op index and task vectors, members so that they keep their capacity
  // from step to step.
  struct MoeScratch {
    std::vector<int64_t> count, order, start, fill, slot_of;
    struct GuTask {
      int64_t e, t0, tn, i0, in;
    };
    std::vector<GuTask> gu_tasks;
    std::vector<MatmulJob> jobs;
  };

  const KernelTable& k_;
  ThreadPool pool_;
  std::vector<InlineOp> ops_;
  // set_input bytes, captured at enqueue; reset when a step has run.
  std::vector<char> staging_;
  std::vector<MatmulTask> matmul_tasks_;
  std::vector<MatmulJob> project_jobs_;
  std::vector<AttentionTask> attention_tasks_;
  MoeScratch moe_index_;
  std::vector<float> rope_inv_;
  // Per-op-name wall time when profiling (CpuBackendOptions::profile).
  bool profile_ = false;
  struct OpTime {
    int64_t count = 0;
    double seconds = 0;
  };
  std::vector<std::pair<const char*, OpTime>> profile_times_;
  std::set<std::string> profile_names_;  // interned names of shaped ops ("project 2048x2048 BF16")
  const char* intern(std::string name) { return profile_names_.insert(std::move(name)).first->c_str(); }
  std::string enqueue_error_;
  std::string exec_error_;
  std::unordered_set<void*> owned_;
  std::vector<std::vector<char>> scratch_;
  std::vector<float> moe_scratch_;
};

}  // namespace muse::cpu
