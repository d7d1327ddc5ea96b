// Attention over the hybrid KV cache, and the cache writes. Both read the
// step plan from device memory when they run: a row's sequence (row_seq),
// the sequence's first row and position, its full or sliding page table.
//
// A query at position p sees positions [lo, p], lo = p - window + 1 on
// sliding layers (0 on full ones). Positions before the sequence's first
// row in this step come from the paged pool (kv_cache.h: the page of
// logical block p / block_size in the layer's table, slot `slot` of the
// page); positions inside the step from k_new / v_new. kv_store runs after
// attention and skips rows whose sliding page is -1 (not kept).
//
// Three kernels (the first that applies): for steps of many rows with
// BF16 everywhere, the prefill kernel (cuda_attention_prefill.cu); for
// groups of at most 16 q heads of at most 256 dims, split-context attention
// (cuda_attention_split.cu; tensor cores when BF16); else the per-head
// kernel below.
//
// Per-head kernel: one block per (row, q head), 8 warps. Warp w takes key tiles w, w+8, ...
// of 32 keys; each lane scores one key (q in shared memory, a sequential
// fp32 dot over the head), the warp keeps an online softmax (running max,
// sum, and each lane d/32 output dims, adding the tile's keys in lane
// order), and the 8 warps are merged in warp order. The sequence of
// operations depends only on the row's own keys: batch-invariant and
// deterministic.
#include <algorithm>
#include <functional>
#include <optional>

#include "muse/backends/cuda/cuda_attention.cuh"
#include "muse/backends/cuda/cuda_mma.cuh"

namespace muse::cuda {
namespace {

using namespace attn;

constexpr int kAttnWarps = 8;
constexpr int kDimsPerLane = kMaxHeadDim / 32;

template <bool VEC_BF16>
__device__ __forceinline__ float dot_q(const float* qs, const void* base, int dt, int64_t idx, int d) {
  float s = 0.0f;
  if (dt == kBF16) {
    const __nv_bfloat16* k = static_cast<const __nv_bfloat16*>(base) + idx;
    if (VEC_BF16 && (d % 8) == 0 && ((reinterpret_cast<uintptr_t>(k) & 15u) == 0)) {
      for (int i = 0; i < d; i += 8) {
        const uint4 u = *reinterpret_cast<const uint4*>(k + i);
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          s = fmaf(qs[i + 2 * e], __uint_as_float(w[e] << 16), s);
          s = fmaf(qs[i + 2 * e + 1], __uint_as_float(w[e] & 0xffff0000u), s);
        }
      }
    } else {
      for (int i = 0; i < d; ++i) s = fmaf(qs[i], __bfloat162float(k[i]), s);
    }
  } else {
    const float* k = static_cast<const float*>(base) + idx;
    for (int i = 0; i < d; ++i) s = fmaf(qs[i], k[i], s);
  }
  return s;
}

__global__ void __launch_bounds__(kAttnWarps * 32) attention_kernel(void* out, int odt, const void* q, int qdt,
                                                                    int64_t ldq, KvArgs a, PlanDev P, int d, int group,
                                                                    int64_t window, float scale, DeviceError* err,
                                                                    int op) {
  __shared__ float qs[kMaxHeadDim];
  __shared__ float ms[kAttnWarps], ls[kAttnWarps];
  __shared__ float accs[kAttnWarps][kMaxHeadDim];
  const int64_t t = blockIdx.x;
  const int h = blockIdx.y;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  RowSeq rs;
  if (!row_sequence(P, t, gridDim.x, rs, err, op)) return;
  const int64_t p = rs.pos_begin + (t - rs.row_begin);
  const int64_t lo = window_lo(p, window);
  for (int i = threadIdx.x; i < d; i += blockDim.x) qs[i] = ld(q, qdt, t * ldq + int64_t(h) * d + i);
  __syncthreads();
  const int64_t kv_off = int64_t(h / group) * d;
  const int64_t nkeys = p - lo + 1, ntiles = (nkeys + 31) / 32;
  float m = -INFINITY, l = 0.0f, acc[kDimsPerLane];
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) acc[i] = 0.0f;
  for (int64_t tile = warp; tile < ntiles; tile += kAttnWarps) {
    const int64_t j = lo + tile * 32 + lane;
    bool valid = j <= p;
    bool fresh = false;
    int64_t idx = 0;
    if (valid) {
      idx = key_row(a, P, rs, j, kv_off, fresh, err, op);
      if (idx < 0) valid = false;
    }
    float score = -INFINITY;
    if (valid) score = dot_q<true>(qs, fresh ? a.k_new : a.ck, fresh ? a.ndt : a.cdt, idx, d) * scale;
    const float m_new = fmaxf(m, warp_max(score));
    const float corr = m_new == -INFINITY ? 0.0f : expf(m - m_new);
    const float pj = valid ? expf(score - m_new) : 0.0f;
    l = l * corr + warp_sum(pj);
#pragma unroll
    for (int i = 0; i < kDimsPerLane; ++i) acc[i] *= corr;
    for (int src = 0; src < 32; ++src) {
      const bool v_ok = __shfl_sync(0xffffffffu, valid, src);
      if (!v_ok) continue;
      const float ps = __shfl_sync(0xffffffffu, pj, src);
      const bool v_fresh = __shfl_sync(0xffffffffu, fresh, src);
      const int64_t v_idx = __shfl_sync(0xffffffffu, idx, src);
      const void* vb = v_fresh ? a.v_new : a.cv;
      const int vdt = v_fresh ? a.ndt : a.cdt;
#pragma unroll
      for (int i = 0; i < kDimsPerLane; ++i) {
        const int dim = lane + 32 * i;
        if (dim < d) acc[i] = fmaf(ps, ld(vb, vdt, v_idx + dim), acc[i]);
      }
    }
    m = m_new;
  }
  if (lane == 0) ms[warp] = m, ls[warp] = l;
#pragma unroll
  for (int i = 0; i < kDimsPerLane; ++i) {
    const int dim = lane + 32 * i;
    if (dim < d) accs[warp][dim] = acc[i];
  }
  __syncthreads();
  float M = -INFINITY;
  for (int w = 0; w < kAttnWarps; ++w) M = fmaxf(M, ms[w]);
  float L = 0.0f;
  for (int w = 0; w < kAttnWarps; ++w) L += ms[w] == -INFINITY ? 0.0f : ls[w] * expf(ms[w] - M);
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float o = 0.0f;
    for (int w = 0; w < kAttnWarps; ++w)
      if (ms[w] != -INFINITY) o = fmaf(accs[w][i], expf(ms[w] - M), o);
    st(out, odt, t * ldq + int64_t(h) * d + i, o / L);
  }
}

__global__ void kv_store_kernel(KvArgs a, PlanDev P, DeviceError* err, int op) {
  pdl_launch_dependents();  // light: the next kernel may launch; it waits for us
  pdl_wait();               // launched with PDL
  const int64_t t = blockIdx.x;
  RowSeq rs;
  if (!row_sequence(P, t, gridDim.x, rs, err, op)) return;
  const int64_t r = t - rs.row_begin, p = rs.pos_begin + r;
  __shared__ int64_t dst;
  if (threadIdx.x == 0) dst = cache_row(a, P, rs, p, err, op, true);
  __syncthreads();
  if (dst < 0) return;  // -2: a sliding block the sequence does not keep
  for (int64_t i = threadIdx.x; i < a.kv_dim; i += blockDim.x) {
    st(a.ck, a.cdt, dst + i, ld(a.k_new, a.ndt, t * a.kv_dim + i));
    st(a.cv, a.cdt, dst + i, ld(a.v_new, a.ndt, t * a.kv_dim + i));
  }
}

std::string check_cache(const KvLayerStorage& c, const Tensor& k_new, const Tensor& v_new, const StepPlanView& plan) {
  if (c.k.rank != 4 || c.v.rank != 4 || c.k.shape != c.v.shape || c.k.dtype != c.v.dtype || !is_float_dtype(c.k.dtype))
    return "cache tensors must be F32 or BF16 [pages, page_layers, block_size, kv_dim], K and V alike";
  if (c.slot < 0 || c.slot >= c.k.dim(1) || c.pages_per_block < 1 || c.group < 0 || c.group >= c.pages_per_block)
    return "the layer's slot/group do not fit the pool";
  if (c.k.dim(3) != k_new.cols() || k_new.numel() != v_new.numel() || k_new.dtype != v_new.dtype ||
      !is_float_dtype(k_new.dtype))
    return "k/v rows do not match the cache";
  if (plan.buffer.dtype != DType::I32 || plan.buffer.empty() || plan.buffer.numel() < plan.layout.total)
    return "the step plan buffer is not an I32 tensor of the layout's size";
  if (k_new.rows() > plan.layout.positions - plan.layout.tokens) return "more rows than the step plan holds";
  if (c.k.dim(0) >= (int64_t(1) << 31)) return "too many cache pages";
  return {};
}

KvArgs kv_args(const KvLayerStorage& c, const Tensor& k_new, const Tensor& v_new) {
  return KvArgs{k_new.data,
                v_new.data,
                dt_code(k_new.dtype),
                k_new.cols(),
                c.k.data,
                c.v.data,
                dt_code(c.k.dtype),
                c.layout == KvLayout::Sliding,
                c.k.dim(2),
                c.k.dim(0),
                c.k.dim(1),
                c.slot,
                c.group,
                c.pages_per_block};
}

}  // namespace

// What attention() launches: the kernel path and its arguments.
struct CudaBackend::AttentionLaunch {
  enum class Path { Prefill, PerHead, Split } path = Path::Split;
  AttnCall call{};
  bool vec = false, mma = false;
  // Split path with the gate in the merge: the gate's product, launched
  // between the chunks and the merge (attention_store_gate's gate.x, weight).
  std::optional<Projection> gate_product;
  Tensor gate_x;
};

bool CudaBackend::plan_attention(const Tensor& out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                                 const KvLayerStorage& cache, const StepPlanView& plan, int64_t head_dim,
                                 int64_t window, float scale, AttentionLaunch& launch) {
  const int64_t d = head_dim;
  if (!check(d > 0 && d <= kMaxHeadDim && is_float_dtype(q.dtype) && is_float_dtype(out.dtype) &&
                 out.numel() == q.numel() && out.cols() == q.cols() && q.cols() % d == 0 && k_new.cols() % d == 0 &&
                 k_new.rows() == q.rows() && k_new.cols() > 0 && (q.cols() / d) % (k_new.cols() / d) == 0 &&
                 q.cols() / d < 65536,
             "attention",
             [&] {
               return describe(q) + " k " + describe(k_new) + " cache " + describe(cache.k) + " head_dim " +
                      std::to_string(d);
             }))
    return false;
  std::string bad = check_cache(cache, k_new, v_new, plan);
  if (bad.empty() && cache.layout == KvLayout::Sliding && window <= 0) bad = "a sliding layer needs window > 0";
  if (!check(bad.empty(), "attention", bad)) return false;
  const int64_t T = q.rows();
  const int hq = int(q.cols() / d), group = int(hq / (k_new.cols() / d));
  const KvArgs a = kv_args(cache, k_new, v_new);
  const PlanDev P = plan_dev(plan);
  const int op = op_index();
  // Vector loads: 8-dim pieces of 16-byte aligned rows.
  auto al16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  const bool vec = d % 8 == 0 && k_new.cols() % 8 == 0 && al16(k_new.data) && al16(v_new.data) && al16(cache.k.data) &&
                   al16(cache.v.data);
  // The tensor-core kernel: BF16 everywhere, 64- or 128-wide heads, 4-byte
  // aligned q rows (its fragments are bf16 pairs).
  const bool all_bf16 = q.dtype == DType::BF16 && k_new.dtype == DType::BF16 && cache.k.dtype == DType::BF16;
  const bool use_mma = mma_gemv_built() && vec && all_bf16 && (d == 64 || d == 128) && group <= 16 &&
                       (reinterpret_cast<uintptr_t>(q.data) & 3u) == 0 && q.cols() % 2 == 0;
  // Split path: chunk blocks only for chunks some row has. A row sees at
  // most min(max_seq_end, window) keys, in chunks of at least kMinChunkKeys
  // (a decode at 1K context: 8 chunk blocks per kv head, not 256). The
  // merge reports a row that needs more (a wrong hint).
  int chunks = kMaxChunks;
  if (plan.max_seq_end > 0) {
    const int64_t max_keys = window > 0 ? std::min(plan.max_seq_end, window) : plan.max_seq_end;
    chunks = int(std::clamp<int64_t>((max_keys + kMinChunkKeys - 1) / kMinChunkKeys, 1, kMaxChunks));
  }
  launch.call = AttnCall{out.data, dt_code(out.dtype), out.cols(), q.data, dt_code(q.dtype), q.cols(), a, P, T, int(d),
                         group, hq, window, scale, dev_error(), op, chunks};
  launch.call.merge_kernel = attention_merge_;
  launch.vec = vec;
  launch.mma = use_mma;
  // Many rows of one sequence (a prefill): the same bits as the split path
  // below, without its chunk partials and per-row K/V reads
  // (cuda_attention_prefill.cu). Choosing by the step's shape is allowed
  // only because the bits are the same. Steps of many short runs (batched
  // decode, verification) keep the split path: there the prefill kernel
  // would walk each row's keys in one warp, without the split path's
  // spread over chunks.
  const bool long_runs = plan.max_seq_rows == 0 || plan.max_seq_rows >= kPrefillMinRows;
  if (use_mma && T >= kPrefillMinRows && long_runs)
    launch.path = AttentionLaunch::Path::Prefill;
  else if (!use_mma && !split_attention_covers(group, int(d)))
    launch.path = AttentionLaunch::Path::PerHead;
  else
    launch.path = AttentionLaunch::Path::Split;
  return true;
}

void CudaBackend::enqueue_attention(const AttentionLaunch& launch) {
  const AttnCall call = launch.call;
  if (call.T == 0) return;
  switch (launch.path) {
    case AttentionLaunch::Path::Prefill:
      enqueue("attention", [call, this](cudaStream_t s) {
        if (call.xperm) xperm_written();
        return run_prefill_attention(s, call, scratch());
      });
      return;
    case AttentionLaunch::Path::PerHead:
      enqueue("attention", [=, this](cudaStream_t s) {
        attention_kernel<<<dim3(unsigned(call.T), unsigned(call.hq)), kAttnWarps * 32, 0, s>>>(
            call.out, call.odt, call.q, call.qdt, call.ldq, call.a, call.P, call.d, call.G, call.window, call.scale,
            call.err, call.op);
        return cudaGetLastError();
      });
      return;
    case AttentionLaunch::Path::Split: {
      reserve_scratch(split_scratch_bytes(call.T, call.hq, call.d, call.chunks));
      const bool vec = launch.vec, mma = launch.mma;
      const std::optional<Projection> gp = launch.gate_product;
      const Tensor gx = launch.gate_x;
      enqueue("attention", [=, this](cudaStream_t s) {
        if (call.xperm) xperm_written();
        std::function<cudaError_t(cudaStream_t)> between;
        if (gp) between = [&](cudaStream_t st) { return launch_gate_product(st, gx, *gp); };
        return run_split_attention(s, call, static_cast<float*>(scratch()), vec, mma, between);
      });
      return;
    }
  }
}

void CudaBackend::attention(const Tensor& out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                            const KvLayerStorage& cache, const StepPlanView& plan, int64_t head_dim, int64_t window,
                            float scale) {
  AttentionLaunch launch;
  if (plan_attention(out, q, k_new, v_new, cache, plan, head_dim, window, scale, launch)) enqueue_attention(launch);
}

// The split path's merge also gates its outputs and stores the step's k/v
// (attention_merge_kernel), where all rows run in one chunk launch and the
// output is contiguous rows of heads, as output_gate reads it; the prefill
// kernel gates its outputs (no head norm: Glimmer's gate) and kv_store runs
// after it (a sliding page it writes may hold keys other rows still read);
// otherwise the three ops. Both fused forms also write the o projection's
// x in the products' order. The same bits either way (tests/backend_cuda:
// Attention.StoreGateFusedGivesTheSameBits, StoreGateWritesTheProductsX).
void CudaBackend::attention_store_gate(const Tensor& out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                                       const KvLayerStorage& cache, const StepPlanView& plan, int64_t head_dim,
                                       int64_t window, float scale, const OutputGate& gate) {
  AttentionLaunch launch;
  const Tensor& g = gate.gate;
  // The gate's own product (gate.x, gate.weight): between the chunk kernel
  // and the merge where the merge gates and gate_in_attention holds, else
  // first, as its own op (which checks it).
  const bool product = gate.x && gate.weight;
  const bool product_ok = product && gate_in_attention(*gate.x, *gate.weight) && is_float_dtype(g.dtype) &&
                          g.rank == 2 && g.rows() == gate.x->rows() && g.cols() == gate.weight->rows();
  if (!plan_attention(out, q, k_new, v_new, cache, plan, head_dim, window, scale, launch)) return;
  const AttnCall& c = launch.call;
  const bool gate_ok = c.T > 0 && is_float_dtype(g.dtype) && g.rows() == out.rows() && g.cols() == out.cols() &&
                       out.cols() == int64_t(c.hq) * c.d;
  const bool fuse = gate_ok && launch.path == AttentionLaunch::Path::Split &&
                    split_attention_one_slab(c.T, c.hq, c.d, c.chunks);
  if (product && !(fuse && product_ok)) matmul(g, *gate.x, *gate.weight);
  const bool prefill_gates = gate_ok && launch.path == AttentionLaunch::Path::Prefill && !gate.head_norm;
  if (!fuse) {
    if (prefill_gates) {
      launch.call.gate = g.data;
      launch.call.gdt = dt_code(g.dtype);
      // The o projection comes after kv_store: the copy is for the op after next.
      if (c.d % 32 == 0 && offer_xperm(out, 0, 2)) launch.call.xperm = true;
    }
    enqueue_attention(launch);
    kv_store(cache, k_new, v_new, plan);
    if (!prefill_gates) output_gate(out, g, head_dim, gate.head_norm, gate.eps);
    return;
  }
  launch.call.gate = g.data;
  launch.call.gdt = dt_code(g.dtype);
  launch.call.head_norm = gate.head_norm;
  launch.call.gate_eps = gate.eps;
  launch.call.store_kv = true;
  // The o projection reads out permuted (above 16 rows): the merge writes
  // that too, after the chunk partials in the scratch.
  if (c.d % 32 == 0) {  // whole 32-k blocks a head (rows of hq·d: `fuse`); offer_xperm: BF16 out only
    const size_t off = (split_scratch_bytes(c.T, c.hq, c.d, c.chunks) + 255) / 256 * 256;
    if (offer_xperm(out, off)) launch.call.xperm = true, launch.call.xperm_offset = off;
  }
  if (product_ok) launch.gate_product = Projection{*gate.weight, g}, launch.gate_x = *gate.x;
  enqueue_attention(launch);
}

void CudaBackend::kv_store(const KvLayerStorage& cache, const Tensor& k_new, const Tensor& v_new,
                           const StepPlanView& plan) {
  std::string bad = check_cache(cache, k_new, v_new, plan);
  if (!check(bad.empty(), "kv_store",
             [&] { return bad + " (" + describe(k_new) + " into " + describe(cache.k) + ")"; }))
    return;
  const int64_t T = k_new.rows();
  if (T == 0) return;
  const KvArgs a = kv_args(cache, k_new, v_new);
  const PlanDev P = plan_dev(plan);
  const int op = op_index();
  enqueue("kv_store", [=, this](cudaStream_t s) {
    return launch_pdl<kv_store_kernel>(s, dim3(unsigned(T)), dim3(unsigned(std::min<int64_t>(256, (a.kv_dim + 31) / 32 * 32))),
                                       0, a, P, dev_error(), op);
  });
}

}  // namespace muse::cuda