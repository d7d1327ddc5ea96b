// CudaBackend: creation, memory, the op queue, execute and its errors, and
// the profile. The operations live in cuda_rowwise.cu, cuda_matmul.cu,
// cuda_attention.cu and cuda_moe.cu.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>

#include "muse/backends/profile_table.h"
#include "muse/backends/cuda/cuda_bench.h"
#include "muse/backends/cuda/cuda_impl.cuh"
#include "muse/backends/cuda/cuda_mma.cuh"

namespace muse {

int cuda_device_count() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    cudaGetLastError();  // clear: no driver is not an error of later calls
    return 0;
  }
  return n;
}

Result<std::unique_ptr<Backend>> create_cuda_backend(const CudaBackendOptions& options) {
  int n = 0;
  cudaError_t e = cudaGetDeviceCount(&n);
  if (e != cudaSuccess) {
    cudaGetLastError();
    return make_error(std::string("the CUDA backend needs a CUDA driver and GPU: ") + cudaGetErrorString(e));
  }
  if (n == 0) return make_error("the CUDA backend found no CUDA GPU");
  if (options.device < 0 || options.device >= n)
    return make_error("CUDA device " + std::to_string(options.device) + " does not exist (" + std::to_string(n) +
                      " found)");
  cudaDeviceProp prop{};
  if ((e = cudaGetDeviceProperties(&prop, options.device)) != cudaSuccess)
    return make_error(std::string("CUDA device properties: ") + cudaGetErrorString(e));
  if (prop.major < 9)
    return make_error(std::string("the CUDA backend is built for sm_90 (Hopper); ") + prop.name + " is sm_" +
                      std::to_string(prop.major) + std::to_string(prop.minor));
  auto b = std::make_unique<cuda::CudaBackend>(options);
  Status s = b->init();
  if (!s.ok()) return s.error();
  return std::unique_ptr<Backend>(std::move(b));
}

namespace cuda {

CudaBackend::CudaBackend(const CudaBackendOptions& o)
    : device_(o.device),
      profile_(o.profile),
      gemv_variant_(o.gemv_variant),
      expert_kernel_(o.expert_kernel),
      expert_gemm_(o.expert_gemm),
      attention_merge_(o.attention_merge),
      moe_combine_(o.moe_combine),
      stream_stages_(o.stream_stages),
      skip_ops_(o.skip_ops),
      side_on_(o.side_stream),
      graphs_on_(o.graphs),
      max_graphs_(size_t(std::max(1, o.max_graphs))) {}

// The CUDA device is per host thread: the engine may create the backend on
// one thread and run steps on another, so every entry point that talks to
// the driver makes ours current first (cheap when it already is).
void CudaBackend::use_device() const { cudaSetDevice(device_); }

std::string CudaBackend::cuda_failure(const char* what, cudaError_t e) {
  return std::string("cuda backend: ") + what + ": " + cudaGetErrorName(e) + " (" + cudaGetErrorString(e) + ")";
}

Status CudaBackend::init() {
  cudaError_t e;
#define MUSE_CUDA_INIT(call)                                        \
  if ((e = (call)) != cudaSuccess) return make_error(cuda_failure(#call, e))
  MUSE_CUDA_INIT(cudaSetDevice(device_));
  cudaDeviceProp prop{};
  MUSE_CUDA_INIT(cudaGetDeviceProperties(&prop, device_));
  name_ = std::string("cuda (") + prop.name + ", sm_" + std::to_string(prop.major) + std::to_string(prop.minor) +
          ", " + std::to_string(prop.multiProcessorCount) + " SMs)";
  MUSE_CUDA_INIT(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking));
  MUSE_CUDA_INIT(cudaStreamCreateWithFlags(&side_, cudaStreamNonBlocking));
  MUSE_CUDA_INIT(cudaEventCreateWithFlags(&fork_event_, cudaEventDisableTiming));
  MUSE_CUDA_INIT(cudaEventCreateWithFlags(&join_event_, cudaEventDisableTiming));
  MUSE_CUDA_INIT(cudaMalloc(&dev_error_, sizeof(DeviceError)));
  MUSE_CUDA_INIT(cudaMemset(dev_error_, 0, sizeof(DeviceError)));
  MUSE_CUDA_INIT(cudaHostAlloc(reinterpret_cast<void**>(&host_error_), sizeof(DeviceError), cudaHostAllocDefault));
  for (int i = 0; i < 2; ++i) {
    MUSE_CUDA_INIT(cudaHostAlloc(reinterpret_cast<void**>(&stage_[i]), kStageBytes, cudaHostAllocDefault));
    MUSE_CUDA_INIT(cudaEventCreateWithFlags(&stage_done_[i], cudaEventDisableTiming));
  }
  MUSE_CUDA_INIT(cudaMalloc(&lt_workspace_, kLtWorkspace));
#undef MUSE_CUDA_INIT
  if (Status st = stream_sync_create(stream_sync_, stream_stages_); !st.ok()) return st;
  if (cublasLtCreate(&lt_) != CUBLAS_STATUS_SUCCESS) return make_error("cuda backend: cublasLtCreate failed");
  return Status::Ok();
}

CudaBackend::~CudaBackend() {
  use_device();
  if (stream_) cudaStreamSynchronize(stream_);
  if (side_) cudaStreamSynchronize(side_);
  drop_graphs();
  for (auto& [key, plan] : lt_plans_) {
    if (plan.op) cublasLtMatmulDescDestroy(plan.op);
    if (plan.a) cublasLtMatrixLayoutDestroy(plan.a);
    if (plan.b) cublasLtMatrixLayoutDestroy(plan.b);
    if (plan.c) cublasLtMatrixLayoutDestroy(plan.c);
  }
  if (lt_) cublasLtDestroy(lt_);
  for (void* p : owned_) cudaFree(p);
  for (auto& [key, p] : inv_freq_) cudaFree(p);
  for (cudaEvent_t ev : events_) cudaEventDestroy(ev);
  for (int i = 0; i < 2; ++i) {
    if (stage_[i]) cudaFreeHost(stage_[i]);
    if (stage_done_[i]) cudaEventDestroy(stage_done_[i]);
  }
  if (arena_) cudaFreeHost(arena_);
  if (host_error_) cudaFreeHost(host_error_);
  if (dev_error_) cudaFree(dev_error_);
  if (scratch_) cudaFree(scratch_);
  if (plan_buf_) cudaFree(plan_buf_);
  stream_sync_free(stream_sync_);
  if (lt_workspace_) cudaFree(lt_workspace_);
  if (fork_event_) cudaEventDestroy(fork_event_);
  if (join_event_) cudaEventDestroy(join_event_);
  if (side_) cudaStreamDestroy(side_);
  if (stream_) cudaStreamDestroy(stream_);
}

Backend::Memory CudaBackend::memory() const {
  use_device();
  size_t free = 0, total = 0;
  if (cudaMemGetInfo(&free, &total) != cudaSuccess) {
    cudaGetLastError();
    return {};
  }
  return {uint64_t(total), uint64_t(free)};
}

std::string CudaBackend::profile_report() const {
  return profile_times_.empty() ? std::string() : profile_table(profile_times_);
}

// ---------------------------------------------------------------------------
// Memory.
// ---------------------------------------------------------------------------

Result<Tensor> CudaBackend::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  use_device();
  Tensor t;
  t.dtype = dtype;
  if (shape.size() < 1 || shape.size() > 4) return make_error("tensor rank must be 1..4");
  for (int64_t d : shape) {
    if (d < 0) return make_error("negative tensor dimension");
    t.shape[size_t(t.rank++)] = d;
  }
  if (dtype_bits(dtype) % 8 != 0) return make_error("cuda backend: cannot allocate sub-byte dtype " + describe(t));
  const size_t bytes = std::max<size_t>(256, (t.bytes() + 255) / 256 * 256);
  void* p = nullptr;
  cudaError_t e = cudaMalloc(&p, bytes);
  if (e != cudaSuccess) {
    cudaGetLastError();
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    cudaGetLastError();
    return make_error("out of GPU memory allocating " + describe(t) + " (" + std::to_string(bytes >> 20) +
                      " MiB; " + std::to_string(free >> 20) + " MiB free of " + std::to_string(total >> 20) +
                      "): " + cudaGetErrorString(e));
  }
  if ((e = cudaMemsetAsync(p, 0, bytes, stream_)) != cudaSuccess || (e = cudaStreamSynchronize(stream_)) != cudaSuccess) {
    cudaFree(p);
    return make_error(cuda_failure("alloc (zero fill)", e));
  }
  owned_.insert(p);
  t.data = p;
  return t;
}

Result<Tensor> CudaBackend::import_weight(DType dtype, std::initializer_list<int64_t> shape, const void* host,
                                          bool /*host_outlives: the GPU always copies*/) {
  MUSE_ASSIGN_OR_RETURN(Tensor t, alloc(dtype, shape));
  const char* src = static_cast<const char*>(host);
  char* dst = static_cast<char*>(t.data);
  const size_t total = t.bytes();
  cudaError_t e = cudaSuccess;
  int buf = 0;
  for (size_t off = 0; off < total && e == cudaSuccess; off += kStageBytes, buf ^= 1) {
    const size_t n = std::min(kStageBytes, total - off);
    // The staging buffer is free once its previous copy has finished.
    if ((e = cudaEventSynchronize(stage_done_[buf])) != cudaSuccess) break;
    std::memcpy(stage_[buf], src + off, n);
    if ((e = cudaMemcpyAsync(dst + off, stage_[buf], n, cudaMemcpyHostToDevice, stream_)) != cudaSuccess) break;
    e = cudaEventRecord(stage_done_[buf], stream_);
  }
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) {
    release(t);
    return make_error(cuda_failure("import_weight", e));
  }
  return t;
}

Status CudaBackend::fill_uniform(const Tensor& t, uint64_t seed, float scale, float offset) {
  use_device();
  if (!is_float_dtype(t.dtype)) return make_error("cuda backend: fill_uniform: F32 or BF16 only, not " + describe(t));
  cudaError_t e = cudaStreamSynchronize(stream_);  // nothing of ours may still use t
  if (e != cudaSuccess) return make_error(cuda_failure("fill_uniform", e));
  MUSE_RETURN_IF_ERROR(cuda_fill_uniform(t.data, t.dtype, t.numel(), seed, scale, offset));
  // cuda_fill_uniform launches on the legacy default stream, which our
  // non-blocking stream does not wait for: finish it here.
  if ((e = cudaDeviceSynchronize()) != cudaSuccess) return make_error(cuda_failure("fill_uniform", e));
  return Status::Ok();
}

void CudaBackend::release(Tensor& t) {
  use_device();
  auto it = owned_.find(t.data);
  if (it != owned_.end()) {
    cudaStreamSynchronize(stream_);
    cudaFree(*it);
    owned_.erase(it);
  }
  t = Tensor{};
}

Status CudaBackend::download(const Tensor& t, void* host) {
  use_device();
  if (!ops_.empty()) return make_error("download() with operations still queued: call execute() first");
  cudaError_t e = cudaMemcpyAsync(host, t.data, t.bytes(), cudaMemcpyDeviceToHost, stream_);
  if (e == cudaSuccess) e = cudaStreamSynchronize(stream_);
  if (e != cudaSuccess) return make_error(cuda_failure(("download " + describe(t)).c_str(), e));
  return Status::Ok();
}

void CudaBackend::reserve_scratch(size_t bytes) {
  if (!try_reserve_scratch(bytes))
    check(false, "scratch", "out of GPU memory for " + std::to_string(bytes >> 20) + " MiB of op scratch");
}

bool CudaBackend::try_reserve_scratch(size_t bytes) {
  if (side_enqueue_) side_degraded_ = true;  // the main ops use the scratch too: this op runs in order
  if (bytes <= scratch_bytes_) return true;
  use_device();
  // Nothing runs between steps (execute() ends synchronized), so the old
  // buffer is idle; queued ops read scratch_ when they run, and those
  // enqueued earlier in this step asked for no more than scratch_bytes_.
  // Twice the old size where that fits (fewer regrowths), else just what is
  // asked; first beside the old buffer, then in its place.
  quiesce_flushed();
  auto take = [&](size_t size) {
    void* grown = nullptr;
    if (cudaMalloc(&grown, size) != cudaSuccess) {
      cudaGetLastError();
      return false;
    }
    if (scratch_) cudaFree(scratch_);
    scratch_ = grown;
    scratch_bytes_ = size;
    ++scratch_generation_;
    return true;
  };
  const size_t had = scratch_bytes_;
  if (take(std::max(bytes, had * 2)) || take(bytes)) return true;
  if (!scratch_) return false;
  cudaFree(scratch_);
  scratch_ = nullptr;
  scratch_bytes_ = 0;
  ++scratch_generation_;
  if (take(bytes)) return true;
  // Not even `bytes`: put back what the ops already queued may need.
  if (!take(had))
    check(false, "scratch", "lost " + std::to_string(had >> 20) + " MiB of op scratch while growing it (GPU memory)");
  return false;
}

// route_plan_'s buffer: as the scratch grows (the queued ops read plan_buf_
// when they run; a recording points at the old one: scratch_generation_),
// but not the scratch, so a side-branch op may take it.
bool CudaBackend::reserve_plan(size_t bytes) {
  if (bytes <= plan_bytes_) return true;
  use_device();
  quiesce_flushed();
  void* grown = nullptr;
  const size_t size = std::max(bytes, plan_bytes_ * 2);
  if (cudaMalloc(&grown, size) != cudaSuccess) {
    cudaGetLastError();
    return false;  // moe_experts groups in its own op
  }
  // Zeros (no tiles): what a moe_experts would read of a route a timing
  // probe skipped (--skip-ops moe_route) is then no work, not stray ids.
  // On stream_ (not capturing at an enqueue), before the ops that write it;
  // the side stream forks from stream_.
  if (cudaMemsetAsync(grown, 0, size, stream_) != cudaSuccess) {
    cudaGetLastError();
    cudaFree(grown);
    return false;
  }
  if (plan_buf_) cudaFree(plan_buf_);
  plan_buf_ = grown, plan_bytes_ = size;
  ++scratch_generation_, ++plan_generation_;
  return true;
}

const float* CudaBackend::inv_freq(double theta, int64_t head_dim) {
  auto key = std::make_pair(theta, head_dim);
  auto it = inv_freq_.find(key);
  if (it != inv_freq_.end()) return it->second;
  use_device();
  // As transformers computes it: fp32 exponent, power, fp32 reciprocal (the CPU backend's formula).
  const int64_t half = head_dim / 2;
  std::vector<float> inv(static_cast<size_t>(half));
  for (int64_t i = 0; i < half; ++i) {
    float e = float(2 * i) / float(head_dim);
    inv[size_t(i)] = 1.0f / float(std::pow(theta, double(e)));
  }
  float* d = nullptr;
  if (cudaMalloc(&d, std::max<size_t>(4, inv.size() * 4)) != cudaSuccess ||
      cudaMemcpy(d, inv.data(), inv.size() * 4, cudaMemcpyHostToDevice) != cudaSuccess) {
    cudaGetLastError();
    check(false, "rope_tables", "could not upload inv_freq");
    if (d) cudaFree(d);
    return nullptr;
  }
  inv_freq_[key] = d;
  return d;
}

PlanDev CudaBackend::plan_dev(const StepPlanView& v) {
  PlanDev p;
  const StepPlanLayout& l = v.layout;
  p.p = static_cast<const int32_t*>(v.buffer.data);
  p.tokens = int(l.tokens), p.positions = int(l.positions), p.row_seq = int(l.row_seq);
  p.seq_row_begin = int(l.seq_row_begin), p.seq_pos_begin = int(l.seq_pos_begin);
  p.seq_full_begin = int(l.seq_full_begin), p.seq_full_count = int(l.seq_full_count);
  p.seq_slide_begin = int(l.seq_slide_begin), p.seq_slide_count = int(l.seq_slide_count);
  p.seq_slide_first = int(l.seq_slide_first);
  p.block_table = int(l.block_table);
  p.max_rows = int(l.positions - l.tokens);
  p.max_seqs = int(l.seq_pos_begin - l.seq_row_begin - 1);
  p.max_blocks = int(l.total - l.block_table);
  return p;
}

// ---------------------------------------------------------------------------
// The queue.
// ---------------------------------------------------------------------------

bool CudaBackend::check(bool ok, const char* op, const std::string& what) {
  if (!ok && enqueue_error_.empty()) enqueue_error_ = std::string("cuda backend: ") + op + ": " + what;
  return ok;
}

void CudaBackend::set_input(const Tensor& dst, const void* host, size_t bytes) {
  if (!check(bytes <= dst.bytes(), "set_input", [&] { return describe(dst) + " is smaller than the input"; })) return;
  if (bytes == 0) return;
  const size_t off = (arena_used_ + 15) / 16 * 16;
  if (off + bytes > arena_cap_) {
    // Grow: nothing is in flight between steps, so the old arena is idle
    // (after a flush, once the stream has drained).
    quiesce_flushed();
    size_t cap = std::max<size_t>({off + bytes, arena_cap_ * 2, size_t(1) << 20});
    char* grown = nullptr;
    if (cudaHostAlloc(reinterpret_cast<void**>(&grown), cap, cudaHostAllocDefault) != cudaSuccess) {
      cudaGetLastError();
      check(false, "set_input", "could not allocate " + std::to_string(cap >> 20) + " MiB of pinned host memory");
      return;
    }
    if (arena_) {
      std::memcpy(grown, arena_, arena_used_);
      cudaFreeHost(arena_);
    }
    arena_ = grown;
    arena_cap_ = cap;
  }
  std::memcpy(arena_ + off, host, bytes);
  arena_used_ = off + bytes;
  void* d = dst.data;
  enqueue("set_input", [this, d, off, bytes](cudaStream_t s) {
    return cudaMemcpyAsync(d, arena_ + off, bytes, cudaMemcpyHostToDevice, s);
  });
}

namespace {
std::string describe_device_error(const DeviceError& e) {
  const std::string a = std::to_string(e.a), b = std::to_string(e.b);
  switch (e.code) {
    case kErrTokenId: return "token id " + a + " is outside the vocabulary [0, " + b + ")";
    case kErrRow: return "row " + a + " out of range (" + b + " rows)";
    case kErrExpert: return "expert id " + a + " out of range (" + b + " experts)";
    case kErrPlanSeq: return "the step plan does not match this step: row " + a + " (sequence " + b + ", or the plan's row count differs from the activations')";
    case kErrRingSlot: return "ring slot " + a + " out of range (" + b + " slots)";
    case kErrBlock: return "block id " + a + " out of range (" + b + " blocks in the pool)";
    case kErrBlockTable: return "block table shorter than the sequence (position " + a + ", " + b + " blocks)";
    case kErrRingWindow: return "attention sees " + a + " keys but the ring holds " + b;
    case kErrChunkHint: return "row " + a + " needs " + b + " key chunks, more than the plan's max_seq_end hint allows";
  }
  return "device error " + std::to_string(e.code);
}
}  // namespace

void CudaBackend::quiesce_flushed() {
  if (launched_ > 0 && (join_side_stream(stream_) != cudaSuccess || cudaStreamSynchronize(stream_) != cudaSuccess))
    cudaGetLastError();  // execute() reports it
}

// ---------------------------------------------------------------------------
// Side branches (Backend::begin_side). Why: a Spark sparse layer's router
// (256 fp32 rows, ~20 µs of latency-bound warp dots) and its top-k wait for
// nothing but the norm before them, and nothing but the experts wait for
// them, yet in one stream they sit on the critical path beside the
// pre-expert product and its norm. Their ops go to side_: the first waits
// for everything stream_ had at the fork (fork_event_), and the op after
// join_side() makes stream_ wait for side_ (join_event_). Stream capture
// follows the events, so a recorded step holds the two branches as graph
// branches. The kernels and their arguments are the same, so are the bits.
// Profiling (events between ops on stream_) runs every op in order.
// ---------------------------------------------------------------------------
void CudaBackend::enqueue(const char* name, Launch run) {
  Op op{name, std::move(run)};
  // A branch op that needs no scratch touches neither the scratch nor what
  // the main ops enqueued after it and before the join read (the branch's
  // contract), whichever stream runs it: a copy offered to the op `after`
  // enqueues on skips it.
  if (!side_enqueue_ || side_degraded_) ++in_order_ops_;
  if (side_on_ && side_enqueue_ && !side_degraded_) {
    op.side = true, op.fork = side_fork_next_;
    side_fork_next_ = false, side_any_ = true;
  } else if (join_next_ || (side_enqueue_ && side_any_)) {
    // the op after join_side(), or a branch op that needs the scratch:
    // stream_ waits for the branch so far first
    op.join = true, join_next_ = false, side_any_ = false;
  }
  ops_.push_back(std::move(op));
  if (graph_mode_ != GraphMode::Off) graph_enqueued(name);
}

void CudaBackend::begin_side() {
  side_enqueue_ = true, side_fork_next_ = true, side_degraded_ = false;
}

void CudaBackend::end_side() { side_enqueue_ = false; }

void CudaBackend::join_side() {
  side_enqueue_ = false;
  if (side_any_) join_next_ = true, side_any_ = false;
}

cudaError_t CudaBackend::join_side_stream(cudaStream_t main) {
  if (!side_open_) return cudaSuccess;
  side_open_ = false;
  cudaError_t e = cudaEventRecord(join_event_, side_);
  if (e == cudaSuccess) e = cudaStreamWaitEvent(main, join_event_, 0);
  return e;
}

// A timing probe (CudaBackendOptions::skip_ops): ops_[i]'s kernels are not launched.
bool CudaBackend::skipped(size_t i) const {
  return !skip_ops_.empty() && std::find(skip_ops_.begin(), skip_ops_.end(), ops_[i].name) != skip_ops_.end();
}

cudaError_t CudaBackend::run_op(size_t i, cudaStream_t main, bool skip) {
  const Op& op = ops_[i];
  const bool side = op.side && !profile_;
  if (op.join || (side && op.fork))
    if (cudaError_t e = join_side_stream(main); e != cudaSuccess) return e;  // a new branch joins an open one first
  if (side && !side_open_) {  // a fork: side_ waits for what main has so far
    cudaError_t e = cudaEventRecord(fork_event_, main);
    if (e == cudaSuccess) e = cudaStreamWaitEvent(side_, fork_event_, 0);
    if (e != cudaSuccess) return e;
    side_open_ = true;
  }
  return skip ? cudaSuccess : op.run(side ? side_ : main);
}

// Launches the ops queued so far, after resetting the device error flag
// once a step; `timed`: an event before the first op and after each one
// (execute() when profiling). Nothing once an enqueue or launch error is
// known: execute() reports it and launches nothing more.
void CudaBackend::launch_queued(bool timed) {
  if (!enqueue_error_.empty() || flush_error_ != cudaSuccess) return;
  use_device();
  if (!step_started_) {
    if (cudaError_t e = cudaMemsetAsync(dev_error_, 0, sizeof(DeviceError), stream_); e != cudaSuccess) {
      flush_error_ = e, flush_error_name_ = "execute (reset error flag)";
      return;
    }
    step_started_ = true;
  }
  if (timed && launched_ == 0) cudaEventRecord(events_[0], stream_);
  // A region being recorded is launched by its capture, at end_graph().
  const size_t end = graph_mode_ == GraphMode::Capture ? region_begin_ : ops_.size();
  for (; launched_ < end; ++launched_) {
    cudaError_t e = run_op(launched_, stream_, skipped(launched_));
    if (e == cudaSuccess) e = cudaGetLastError();
    if (e != cudaSuccess) {
      flush_error_ = e, flush_error_name_ = ops_[launched_].name;
      return;
    }
    if (timed) cudaEventRecord(events_[launched_ + 1], stream_);
  }
}

// The model flushes after its first layer: the GPU then works while the
// host enqueues the rest of the step, which took ~0.2 ms of GPU idle time a
// step. Not while profiling (execute() times each op between events).
void CudaBackend::flush() {
  if (!profile_) launch_queued(false);
}

Status CudaBackend::execute() {
  use_device();
  if (graph_mode_ != GraphMode::Off) end_graph();  // a region left open ends with the step
  // Profiling: flush() launched nothing, so every op runs here, timed.
  const bool profile = profile_ && launched_ == 0;
  bool events_ok = true;
  while (profile && events_ok && events_.size() < ops_.size() + 1) {
    cudaEvent_t ev;
    events_ok = cudaEventCreate(&ev) == cudaSuccess;
    if (events_ok) events_.push_back(ev);
  }
  if (events_ok) launch_queued(profile);
  if (cudaError_t e = join_side_stream(stream_); e != cudaSuccess && flush_error_ == cudaSuccess)
    flush_error_ = e, flush_error_name_ = "execute (join the side stream)";
  side_enqueue_ = side_fork_next_ = side_degraded_ = join_next_ = side_any_ = false;
  auto ops = std::move(ops_);
  ops_.clear();
  const bool started = step_started_;
  const cudaError_t flush_error = flush_error_;
  launched_ = 0, step_started_ = false, flush_error_ = cudaSuccess;
  xperm_copy_ = {}, in_order_ops_ = 0;  // the next step's op counts start again from 0
  route_plan_ = {};
  arena_used_ = 0;  // the next step writes from the start (this one is synchronized below)
  if (!enqueue_error_.empty() || flush_error != cudaSuccess || !events_ok) {
    std::string e = !enqueue_error_.empty()       ? enqueue_error_
                    : flush_error != cudaSuccess ? cuda_failure(flush_error_name_, flush_error)
                                                 : std::string("cuda backend: cudaEventCreate failed");
    enqueue_error_.clear();
    if (started) {  // launched ops may still run
      cudaStreamSynchronize(stream_);
      cudaGetLastError();
    }
    return make_error(e);
  }
  cudaError_t e = cudaMemcpyAsync(host_error_, dev_error_, sizeof(DeviceError), cudaMemcpyDeviceToHost, stream_);
  cudaError_t sync = cudaStreamSynchronize(stream_);
  if (e == cudaSuccess) e = sync;
  if (e != cudaSuccess) {
    // An asynchronous fault inside one of the step's kernels; the context
    // may be unusable after this (illegal address), so say so.
    std::string names;
    for (size_t i = 0; i < ops.size() && i < 8; ++i) names += std::string(i ? ", " : "") + ops[i].name;
    if (ops.size() > 8) names += ", ...";
    return make_error(cuda_failure("a kernel of this step failed", e) + "; the step ran: " + names);
  }
  if (host_error_->op > 0) {
    const int i = host_error_->op - 1;
    const char* name = i < int(ops.size()) ? ops[size_t(i)].name : "?";
    return make_error(std::string("cuda backend: ") + name + ": " + describe_device_error(*host_error_));
  }
  if (profile) {
    for (size_t i = 0; i < ops.size(); ++i) {
      float ms = 0;
      cudaEventElapsedTime(&ms, events_[i], events_[i + 1]);
      auto it = std::find_if(profile_times_.begin(), profile_times_.end(),
                             [&](const auto& p) { return p.first == ops[i].name; });
      if (it == profile_times_.end()) it = profile_times_.insert(profile_times_.end(), {ops[i].name, OpTime{}});
      it->second.count++;
      it->second.seconds += ms * 1e-3;
    }
  }
  return Status::Ok();
}

}  // namespace cuda
}  // namespace muse
