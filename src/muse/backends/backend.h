// The operation interface every compute backend implements (CPU today, CUDA
// next). Model code (model/*_forward.cc) is written only against this header:
// it never touches tensor memory, never includes a vendor header, and never
// branches on which backend runs it.
//
// The contract:
//  - Memory. Weights, activations and the KV cache live in buffers the backend
//    owns; the model holds `Tensor` handles (opaque data pointer + dtype +
//    shape). A handle's pointer may be a device address: only the backend
//    dereferences it. Row views (`Tensor::rows`) are plain pointer offsets, so
//    they are valid on every backend.
//  - Steps. Operations are *enqueued*; nothing runs until `execute()` (or a
//    `flush()` before it), which runs the whole step in order (CPU: one thread
//    pool dispatch per op; CUDA: one stream). What a step is (token ids, positions,
//    which sequence each row is, KV places, block tables, logit rows) lives
//    in the step plan (step_plan.h): one I32 buffer in backend memory that
//    the engine uploads with one set_input per step and ops read when they
//    run. Ops capture no host data, so a recorded step can be replayed.
//  - Batches. The unit of work is a batch of sequences, each a contiguous run
//    of rows in the step's activation tensors: a prefill chunk (many
//    positions) or one decode token.
//  - Numerics. Activations are fp32 (CPU) or stored in activation_dtype();
//    weights are fp32 or bf16, or quantized (tensor.h: NVFP4, MXFP4, FP8,
//    INT4) where supports_quant() says so: project and moe_experts then
//    decode codes and scales in registers, never to a dequantized copy;
//    everything is upcast and accumulated in fp32.
//    Every output element is produced by one fixed
//    sequence of operations, independent of thread count and of which other
//    sequences share the batch, so greedy decoding is reproducible.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "muse/backends/step_plan.h"
#include "muse/backends/tensor.h"
#include "muse/core/dtype.h"
#include "muse/core/status.h"

namespace muse {

class Communicator;  // parallel/communicator.h

// How a norm applies its gain `c` (already in effective form: the model
// folds offset gains `1 + w` at load, so backends see one convention).
enum class NormGain {
  None,    // y = rms(x)                   (weightless)
  After,   // y = rms(x) ⊙ c               (offset or absolute gains)
  Before,  // y = rms(x ⊙ c)               ("input-scale", Spark post-expert / post-ffn)
};

// ---------------------------------------------------------------------------
// KV cache layout. kv/ owns the bookkeeping (which pages a sequence holds);
// the storage is backend memory: one pool of pages for every layer, K and V
// tensors [pages, page_layers, block_size, kv_dim]. Page p, slot i holds
// block_size positions of one layer. K is stored after QK-norm and RoPE, V
// raw; one row per position of `kv_dim = num_kv_heads * head_dim` values,
// in the cache dtype (F32, BF16, or F8_E4M3 storing fp8(x / scale)).
// ---------------------------------------------------------------------------
enum class KvLayout {
  Paged,    // full layer: block b of a sequence is in its full table
  Sliding,  // sliding-window layer: its sliding table, from a first block on; -1 = not kept
};

struct KvLayerStorage {
  KvLayout layout = KvLayout::Paged;
  Tensor k, v;                  // the whole pool, shared by every layer
  int32_t slot = 0;             // this layer's slot within a page
  int32_t group = 0;            // which page of a logical block holds it
  int32_t pages_per_block = 1;  // table entries per logical block of this layer's kind
  float k_scale = 1.0f, v_scale = 1.0f;  // F8 caches: stored = fp8(x / scale), read = fp8 · scale
};

// One weight applied to a shared input: out[T, N] = x[T, K] · weight[N, K]ᵀ.
struct Projection {
  Tensor weight;
  Tensor out;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;  // e.g. "cpu (avx2, 16 threads)"
  // Time per operation, over the steps executed while profiling was on
  // (from creation when the backend was created with profiling on, or
  // from set_profiling(true)); empty when none was. Profiling costs time
  // (the CUDA backend records an event after every op, which also keeps
  // consecutive kernels from overlapping), so a benchmark times its runs
  // with it off and profiles one extra run.
  virtual std::string profile_report() const { return {}; }
  virtual void profile_reset() {}
  virtual void set_profiling(bool on) { (void)on; }

  // Storage dtype of activations that the model does not define as fp32
  // (normed inputs, q/k/v/gate, attention and MLP outputs, the latent): F32
  // on the CPU reference, BF16 on the GPU (stored rounded, accumulated in
  // fp32). Buffers the model defines as fp32 (Spark's residual stream,
  // router logits and weights, logits) are allocated F32 on every backend.
  virtual DType activation_dtype() const { return DType::F32; }
  // Storage dtype the backend wants for a weight matrix stored as `stored`
  // (F32 or BF16): the CPU reference keeps what the checkpoint has; the GPU
  // holds BF16 (an F32 checkpoint is rounded once, at load, as the bf16
  // reference run does).
  virtual DType matrix_dtype(DType stored) const { return stored; }
  // Default storage dtype of the KV cache, and whether another one works
  // (--kv-cache-dtype).
  virtual DType kv_dtype() const { return DType::F32; }
  virtual bool supports_kv_dtype(DType dtype) const { return dtype == kv_dtype(); }
  // Whether project() and moe_experts() take weights of this quantized kind
  // (Tensor::quant set; codes, scales and zeros imported with import_weight
  // as stored). The loader asks before importing and reports a backend that
  // says no by name; a backend adds a kind by overriding this and handling
  // `weight.quant` in those two operations.
  virtual bool supports_quant(QuantKind kind) const { return kind == QuantKind::None; }
  // Device memory, for sizing the KV cache (both 0 on host backends).
  struct Memory {
    uint64_t total = 0, free = 0;
  };
  virtual Memory memory() const { return {}; }
  // Buffers created by alloc/import_weight since the backend was made: a
  // step after warm-up creates none (tests check it).
  uint64_t buffers_created() const { return buffers_created_; }

  // ---- memory ------------------------------------------------------------
  // A new zero-filled buffer.
  virtual Result<Tensor> alloc(DType dtype, std::initializer_list<int64_t> shape) = 0;
  // Weights from host memory. With `host_outlives` the backend may keep
  // referencing `host` (the CPU backend then copies nothing: mmap'd
  // checkpoints stay mapped); otherwise it copies.
  virtual Result<Tensor> import_weight(DType dtype, std::initializer_list<int64_t> shape, const void* host,
                                       bool host_outlives) = 0;
  virtual void release(Tensor& t) = 0;
  // t[i] = offset + scale · u_i, u_i uniform in [-1, 1) from a counter-based
  // hash of (seed, i), written in place (F32 or BF16): random weights of real
  // shapes made where they live (the GPU benchmark), not on the host.
  virtual Status fill_uniform(const Tensor& t, uint64_t seed, float scale, float offset) {
    return make_error(name() + " cannot fill tensors in place");
  }
  // Copies a tensor (or view) to host memory. Call after execute().
  virtual Status download(const Tensor& t, void* host) = 0;

  // ---- steps ---------------------------------------------------------------
  // Enqueues a host-to-tensor copy; `bytes` are captured now.
  virtual void set_input(const Tensor& dst, const void* host, size_t bytes) = 0;
  // Runs everything enqueued since the last execute(), in order.
  virtual Status execute() = 0;
  // May start running what is enqueued so far, without waiting for it, so a
  // device works while the host enqueues the rest of the step (CUDA: the
  // ops are launched; the CPU backend runs nothing early). execute() still
  // runs the rest and reports the step's first error, an enqueue error
  // found after a flush included; what was flushed has run by then.
  virtual void flush() {}

  // ---- a side branch (concurrency the caller vouches for) --------------------
  // The ops enqueued between begin_side() and end_side() read only what ops
  // enqueued before begin_side() wrote, and write nothing that the ops
  // enqueued after end_side() read or write, up to join_side(); the ops
  // enqueued after join_side() may use their results. A backend may run the
  // branch beside those ops (CUDA: on a second stream, forked and joined by
  // events; Spark's router and its top-k beside the pre-expert product).
  // Default: everything in order, which keeps the promise trivially. A
  // branch left unjoined is joined by execute().
  virtual void begin_side() {}
  virtual void end_side() {}
  virtual void join_side() {}

  // ---- recorded regions (CUDA graphs) -----------------------------------------
  // begin_graph(key) ... end_graph() brackets ops of a step that every step
  // begun with the same nonzero `key` enqueues identically: the same ops in
  // the same order, with the same tensors, shapes and arguments, and no
  // set_input or collective among them (what they read that changes from
  // step to step is uploaded before, into the same buffers). The caller
  // makes the key from everything that decides those ops. A backend may
  // record such a region once and replay the recording for later steps
  // with the key, instead of launching the ops one by one; the CUDA backend
  // checks that a replayed step enqueues the recorded op names and fails
  // the step if not. Regions do not nest; execute() ends an open one. The
  // defaults do nothing: every op runs as enqueued.
  virtual void begin_graph(uint64_t key) { (void)key; }
  virtual void end_graph() {}
  // The row count a recorded step of `rows` rows may run at instead (the
  // padded batch sizes a backend records: fewer recordings). Rows from the
  // step plan's row count on are padding: attention and kv_store skip them,
  // every other op computes them like any row, and nothing reads their
  // results. Default: `rows` (no padding).
  virtual int64_t graph_rows(int64_t rows) const { return rows; }
  struct GraphStats {
    int64_t captured = 0;   // regions recorded
    int64_t replayed = 0;   // steps that ran a recording
    int64_t live = 0;       // recordings held now
    double capture_seconds = 0;  // host time spent recording them
  };
  virtual GraphStats graph_stats() const { return {}; }

  // ---- operations (enqueued) -------------------------------------------------
  // out[t] = table[ids[t]] (I32 ids; F32/BF16 table rows upcast to F32).
  virtual void embed(const Tensor& out, const Tensor& table, const Tensor& ids) = 0;

  // Row-wise RMSNorm in fp32 over groups of `group` values (0 = whole row):
  // y = norm(x) per NormGain, times `scale`. The gain (length `group`, or the
  // row) is F32. out may alias in.
  virtual void rms_norm(const Tensor& out, const Tensor& in, const Tensor& gain, NormGain mode, float eps,
                        int64_t group = 0, float scale = 1.0f) = 0;

  // Residual update: stream ← α ⊙ stream + β ⊙ norm(update), norm per
  // `mode` with `gain`. Empty α/β mean 1 (Glimmer: stream += rms(a) ⊙ c;
  // Spark: the gated residual with fp32 α, β).
  virtual void residual_norm(const Tensor& stream, const Tensor& update, const Tensor& gain, NormGain mode,
                             const Tensor& alpha, const Tensor& beta, float eps) = 0;

  // residual_norm, then next.out = rms_norm(stream) over whole rows with
  // next's gain, mode and eps: a layer's residual update and the norm that
  // follows it (the next sub-block's input), which every Muse layer runs back
  // to back. This default runs the two ops; the CUDA backend fuses them into
  // one kernel with the same bits (the row is already in registers).
  struct NextNorm {
    Tensor out, gain;
    NormGain mode = NormGain::None;
    float eps = 0.0f;
  };
  virtual void residual_norm_then_norm(const Tensor& stream, const Tensor& update, const Tensor& gain, NormGain mode,
                                       const Tensor& alpha, const Tensor& beta, float eps, const NextNorm& next) {
    residual_norm(stream, update, gain, mode, alpha, beta, eps);
    rms_norm(next.out, stream, next.gain, next.mode, next.eps);
  }

  // Several weights over one input in one pass (q/k/v/gate, gate/up):
  // outputs[i].out = x · outputs[i].weightᵀ, fp32 accumulation. A weight
  // may be quantized (see supports_quant).
  virtual void project(const Tensor& x, std::span<const Projection> outputs) = 0;
  void matmul(const Tensor& out, const Tensor& x, const Tensor& weight) {
    Projection p{weight, out};
    project(x, std::span<const Projection>(&p, 1));
  }

  // RoPE tables for this step: cos/sin [T, head_dim/2] (F32) for positions
  // (I32 [T]), inv_freq_i = theta^(-2i/head_dim) rounded to fp32 (as
  // transformers computes it).
  virtual void rope_tables(const Tensor& cos, const Tensor& sin, const Tensor& positions, double theta,
                           int64_t head_dim) = 0;

  // Weightless per-head RMSNorm of q [T, Hq·d] and k [T, Hk·d], q then
  // times `q_scale`; then, when cos/sin are given, rotate-half RoPE on the HF
  // layout (pairs j, j+d/2). In place.
  virtual void qk_norm_rope(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin, int64_t head_dim,
                            float eps, float q_scale) = 0;

  // Causal GQA attention over the step plan's sequences: each row attends
  // to the keys of its own sequence at positions ≤ its own (the last `window` only, when
  // window > 0). Keys before the sequence's pos_begin come from the cache,
  // keys in this step from k_new/v_new, rounded to the cache dtype first so
  // a key reads the same whether it was cached or computed in this step
  // (prefix caching and chunking stay exact). softmax in fp32, scores × `scale`.
  // q/out [T, Hq·d]; k_new/v_new [T, Hk·d].
  virtual void attention(const Tensor& out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                         const KvLayerStorage& cache, const StepPlanView& plan, int64_t head_dim,
                         int64_t window, float scale) = 0;
  // Writes this step's k/v rows into the cache (rows whose sliding page is -1 are not kept).
  virtual void kv_store(const KvLayerStorage& cache, const Tensor& k_new, const Tensor& v_new,
                        const StepPlanView& plan) = 0;

  // Whether attention_store_gate should compute the gate's product x ·
  // weightᵀ itself (OutputGate::x, weight) rather than the caller beside
  // Q/K/V: nothing before the output gate reads it, so a backend may stream
  // its weights while attention's latency-bound chain runs (CUDA, 1..4
  // rows and gates that fill the GPU: between the chunk kernel and the
  // merge). Default: no.
  virtual bool gate_in_attention(const Tensor& x, const Tensor& weight) const {
    (void)x, (void)weight;
    return false;
  }

  // Attention output gate, in place on o [T, H·d]: o ← o ⊙ σ(g) (Glimmer) or,
  // with `head_norm`, o ← rms_eps(o_h) ⊙ σ(g_h) per head (Spark).
  virtual void output_gate(const Tensor& o, const Tensor& g, int64_t head_dim, bool head_norm, float eps) = 0;

  // attention, kv_store of the step's k/v, then output_gate on out, in that
  // order and with their results: one call, so that a backend can do the last
  // two inside attention's final pass (CUDA: the split path's merge) instead
  // of two more passes on the critical path of every layer.
  // With `x` and `weight`, the gate is first computed here, gate = x ·
  // weightᵀ (the bits of project), where gate_in_attention says so.
  struct OutputGate {
    const Tensor& gate;
    bool head_norm;
    float eps;
    const Tensor* x = nullptr;
    const Tensor* weight = nullptr;
  };
  virtual void attention_store_gate(const Tensor& out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                                    const KvLayerStorage& cache, const StepPlanView& plan, int64_t head_dim,
                                    int64_t window, float scale, const OutputGate& gate) {
    if (gate.x && gate.weight) matmul(gate.gate, *gate.x, *gate.weight);
    attention(out, q, k_new, v_new, cache, plan, head_dim, window, scale);
    kv_store(cache, k_new, v_new, plan);
    output_gate(out, gate.gate, head_dim, gate.head_norm, gate.eps);
  }

  // out = silu(gate) ⊙ up (out may alias gate).
  virtual void swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) = 0;

  // A dense MLP's gate/up products and its SwiGLU: act = silu(γ) ⊙ υ with
  // γ = x · gate.weightᵀ and υ = x · up.weightᵀ, each rounded to its out's
  // dtype first (the bits of project then swiglu, which this default runs).
  // gate.out and up.out are scratch: a backend that fuses the two (the CUDA
  // backend at 1..8 rows on its ring kernel) leaves them unwritten. act may
  // alias gate.out.
  virtual void project_swiglu(const Tensor& x, const Projection& gate, const Projection& up, const Tensor& act) {
    const Projection gu[] = {gate, up};
    project(x, gu);
    swiglu(act, gate.out, up.out);
  }

  // Sigmoid router: p = σ(logits · multiplier); the top k by p + bias
  // (selection only; ties to the lower index), in descending order; weights
  // p_k / (Σ p_top + 1e-15) · scaling. ids I32 [T, k], weights F32 [T, k].
  virtual void moe_route(const Tensor& ids, const Tensor& weights, const Tensor& logits, const Tensor& bias,
                         float multiplier, float scaling) = 0;

  // Latent experts, dispatched per token: for each chosen expert e of row t,
  // [γ;υ] = u_t · gate_up[e]ᵀ, y = down[e] · (silu(γ) ⊙ υ),
  // ŷ = rms_eps(y ⊙ post_gain); out_t = Σ_k w_k ŷ_k (in the order of `ids`).
  // u/out [T, Hm]; gate_up [E, 2I, Hm]; down [E, Hm, I] (dense, or both
  // quantized: a fused-expert quantized weight holds E matrices).
  // Expert parallelism (expert_base >= 0): the weights hold experts
  // [expert_base, expert_base + E) of the router's ids; slots routed to
  // other experts are skipped, so out_t is this rank's part of the sum (the
  // ranks' parts are all-reduced). -1: every expert is here.
  virtual void moe_experts(const Tensor& out, const Tensor& u, const Tensor& gate_up, const Tensor& down,
                           const Tensor& post_gain, const Tensor& ids, const Tensor& weights, float eps,
                           int64_t expert_base = -1) = 0;

  // out[i] = in[rows[i]] (I32 rows).
  virtual void gather_rows(const Tensor& out, const Tensor& in, const Tensor& rows) = 0;

  // x ← cap · tanh(x · multiplier / cap) (cap 0: x ← x · multiplier).
  virtual void softcap(const Tensor& x, float multiplier, float cap) = 0;

  // Sampling where the logits are (sampling/row_sampling.h): draws `rows`
  // rows of `logits` [R, V] F32 (modified in place: it is the workspace, as
  // on the host) as `specs` describes them — a U8 buffer holding a
  // RowSampleHeader, `rows` RowSampleSpecs and `edits` RowEdits, uploaded
  // with set_input, then room for `edits` floats the op may overwrite —
  // into `out`, one RowSampleResult per spec. The same token as
  // sample_row_host on the same logits (the CPU backend runs it).
  virtual void sample_rows(const Tensor& out, const Tensor& logits, const Tensor& specs, int64_t rows,
                           int64_t edits) = 0;

  // ---- collectives (parallel/communicator.h), enqueued like any op ---------
  // They run when the step reaches them (CPU: on the executing thread;
  // CUDA: on the stream), so a step with collectives is still one execute().
  // Every rank of `comm` enqueues the same collectives in the same order.
  // t ← Σ_ranks t (the partial sums of row-split products; F32 on the CPU).
  virtual void all_reduce_sum(const Tensor& t, Communicator& comm) = 0;
  // out = every rank's `in`, rank-major (out.numel() = size · in.numel()).
  virtual void all_gather(const Tensor& out, const Tensor& in, Communicator& comm) = 0;
  // in and out hold size() equal blocks; block j of in goes to rank j.
  virtual void all_to_all(const Tensor& out, const Tensor& in, Communicator& comm) = 0;

 protected:
  uint64_t buffers_created_ = 0;  // backends count in alloc / import_weight
};

}  // namespace muse
