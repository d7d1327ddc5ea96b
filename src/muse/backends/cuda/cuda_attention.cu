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
// One block per (row, q head), 8 warps. Warp w takes key tiles w, w+8, ...
// of 32 keys; each lane scores one key (q in shared memory, a sequential
// fp32 dot over the head), the warp keeps an online softmax (running max,
// sum, and each lane d/32 output dims, adding the tile's keys in lane
// order), and the 8 warps are merged in warp order. The sequence of
// operations depends only on the row's own keys: batch-invariant and
// deterministic.
#include <algorithm>

#include "muse/backends/cuda/cuda_impl.cuh"

namespace muse::cuda {
namespace {

constexpr int kAttnWarps = 8;
constexpr int kMaxHeadDim = 256;
constexpr int kDimsPerLane = kMaxHeadDim / 32;

struct KvArgs {
  const void* k_new;
  const void* v_new;
  int ndt;
  int64_t kv_dim;
  void* ck;  // cache K, V
  void* cv;
  int cdt;
  bool sliding;      // the sliding table (else the full one)
  int64_t per;       // positions per block
  int64_t pages;     // pages in the pool
  int64_t page_layers, slot, group, n;  // layers per page, this layer's slot, its page of a block, pages per block
};

// The row's sequence, validated; false (and an error recorded) when the plan is bad.
struct RowSeq {
  int s;
  int64_t row_begin, num_rows, pos_begin;
};
__device__ __forceinline__ bool row_sequence(const PlanDev& P, int64_t t, RowSeq& rs, DeviceError* err, int op) {
  const int seqs = P.p[StepPlanLayout::kSeqs];
  const int s = P.p[P.row_seq + t];
  // One block per row: the plan's row count must be the launch's.
  bool ok = t < P.max_rows && P.p[StepPlanLayout::kRows] == int(gridDim.x) && seqs >= 0 && seqs <= P.max_seqs &&
            s >= 0 && s < seqs;
  if (ok) {
    rs.s = s;
    rs.row_begin = P.p[P.seq_row_begin + s];
    rs.num_rows = P.p[P.seq_row_begin + s + 1] - rs.row_begin;
    rs.pos_begin = P.p[P.seq_pos_begin + s];
    ok = t >= rs.row_begin && t < rs.row_begin + rs.num_rows && rs.pos_begin >= 0;
  }
  if (!ok && threadIdx.x == 0) report_error(err, op, kErrPlanSeq, int(t), s);
  return ok;
}

// Element index of position j's row (cache); -1 with an error recorded when
// the table has no page for it, or -2 (no error) for a sliding block that is
// not kept, when `skip_unkept` (kv_store).
__device__ __forceinline__ int64_t cache_row(const KvArgs& a, const PlanDev& P, const RowSeq& rs, int64_t j,
                                             DeviceError* err, int op, bool skip_unkept = false) {
  const int64_t bi = j / a.per;
  const int begin = P.p[(a.sliding ? P.seq_slide_begin : P.seq_full_begin) + rs.s];
  const int count = P.p[(a.sliding ? P.seq_slide_count : P.seq_full_count) + rs.s];
  const int64_t rel = a.sliding ? bi - P.p[P.seq_slide_first + rs.s] : bi;
  const int64_t i = rel * a.n + a.group;
  // A long chunk writes sliding rows below the first block the sequence
  // keeps (they leave the window within the chunk): no page, nothing to store.
  if (a.sliding && skip_unkept && rel < 0) return -2;
  if (begin < 0 || count < 0 || begin + count > P.max_blocks || rel < 0 || i >= count) {
    report_error(err, op, kErrBlockTable, int(j), count);
    return -1;
  }
  const int page = P.p[P.block_table + begin + i];
  if (page == -1 && a.sliding && skip_unkept) return -2;
  if (page < 0 || page >= a.pages) {
    report_error(err, op, kErrBlock, page, int(a.pages));
    return -1;
  }
  return ((int64_t(page) * a.page_layers + a.slot) * a.per + j % a.per) * a.kv_dim;
}

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
  if (!row_sequence(P, t, rs, err, op)) return;
  const int64_t p = rs.pos_begin + (t - rs.row_begin);
  const int64_t lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
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
      if (j >= rs.pos_begin) {
        fresh = true;
        idx = (rs.row_begin + (j - rs.pos_begin)) * a.kv_dim + kv_off;
      } else {
        idx = cache_row(a, P, rs, j, err, op);
        if (idx < 0) valid = false;
        idx += kv_off;
      }
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
  const int64_t t = blockIdx.x;
  RowSeq rs;
  if (!row_sequence(P, t, rs, err, op)) return;
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

void CudaBackend::attention(const Tensor& out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                            const KvLayerStorage& cache, const StepPlanView& plan, int64_t head_dim, int64_t window,
                            float scale) {
  const int64_t d = head_dim;
  if (!check(d > 0 && d <= kMaxHeadDim && is_float_dtype(q.dtype) && is_float_dtype(out.dtype) &&
                 out.numel() == q.numel() && out.cols() == q.cols() && q.cols() % d == 0 && k_new.cols() % d == 0 &&
                 k_new.rows() == q.rows() && k_new.cols() > 0 && (q.cols() / d) % (k_new.cols() / d) == 0 &&
                 q.cols() / d < 65536,
             "attention", describe(q) + " k " + describe(k_new) + " cache " + describe(cache.k) + " head_dim " +
                              std::to_string(d)))
    return;
  std::string bad = check_cache(cache, k_new, v_new, plan);
  if (bad.empty() && cache.layout == KvLayout::Sliding && window <= 0) bad = "a sliding layer needs window > 0";
  if (!check(bad.empty(), "attention", bad)) return;
  const int64_t T = q.rows();
  if (T == 0) return;
  const int hq = int(q.cols() / d), group = int(hq / (k_new.cols() / d));
  const KvArgs a = kv_args(cache, k_new, v_new);
  const PlanDev P = plan_dev(plan);
  const int op = op_index();
  enqueue("attention", [=, this](cudaStream_t s) {
    attention_kernel<<<dim3(unsigned(T), unsigned(hq)), kAttnWarps * 32, 0, s>>>(
        out.data, dt_code(out.dtype), q.data, dt_code(q.dtype), q.cols(), a, P, int(d), group, window, scale,
        dev_error(), op);
    return cudaGetLastError();
  });
}

void CudaBackend::kv_store(const KvLayerStorage& cache, const Tensor& k_new, const Tensor& v_new,
                           const StepPlanView& plan) {
  std::string bad = check_cache(cache, k_new, v_new, plan);
  if (!check(bad.empty(), "kv_store", bad + " (" + describe(k_new) + " into " + describe(cache.k) + ")")) return;
  const int64_t T = k_new.rows();
  if (T == 0) return;
  const KvArgs a = kv_args(cache, k_new, v_new);
  const PlanDev P = plan_dev(plan);
  const int op = op_index();
  enqueue("kv_store", [=, this](cudaStream_t s) {
    kv_store_kernel<<<unsigned(T), unsigned(std::min<int64_t>(256, (a.kv_dim + 31) / 32 * 32)), 0, s>>>(a, P, dev_error(),
                                                                                                        op);
    return cudaGetLastError();
  });
}

}  // namespace muse::cuda
