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
#include "muse/backends/cuda/cuda_mma.cuh"

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
// `rows`: the step's row count as launched; the plan's must be the same.
__device__ __forceinline__ bool row_sequence(const PlanDev& P, int64_t t, int64_t rows, RowSeq& rs, DeviceError* err,
                                             int op) {
  const int seqs = P.p[StepPlanLayout::kSeqs];
  const int s = t < P.max_rows ? P.p[P.row_seq + t] : -1;
  bool ok = t < P.max_rows && P.p[StepPlanLayout::kRows] == int(rows) && seqs >= 0 && seqs <= P.max_seqs &&
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
  if (!row_sequence(P, t, gridDim.x, rs, err, op)) return;
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

// ---------------------------------------------------------------------------
// Split-context attention (every row whose q-head group is at most 16 heads
// and whose head is at most 256 wide: all the Muse shapes).
//
// Why: one block per (row, q head) gives a batch-1 decode 32 blocks for 132
// SMs and reads each K/V row once per q head. Here a block owns (row, kv
// head, chunk of keys) and its 4 warps split the group's q heads, so they
// share every K/V load (through L1), and the row's keys are cut into up to
// kMaxChunks chunks so a long context spreads over the GPU
// (flash-decoding). A second kernel merges the chunks.
//
// The order of operations depends only on the row's own key count: chunk
// size = chunk_keys(nkeys); a warp walks its chunk's 32-key tiles in order;
// each lane scores one key (a sequential fp32 dot over the head), the warp
// keeps an online softmax per head and adds each tile's values in key order;
// the chunks merge in chunk order. So a row's bits are the same alone or in
// any batch, and however its prompt was chunked (positions, not rows, define
// the chunks).
// ---------------------------------------------------------------------------
constexpr int kSplitWarps = 4;
constexpr int kMaxChunks = 256;
constexpr int64_t kMinChunkKeys = 64;
constexpr int kSplitMaxGroup = 16;

__device__ __forceinline__ int64_t chunk_keys(int64_t nkeys) {
  int64_t c = (nkeys + kMaxChunks - 1) / kMaxChunks;
  c = (c + 31) / 32 * 32;
  return c < kMinChunkKeys ? kMinChunkKeys : c;
}

// n consecutive values at element idx (n in {1, 2, 4, 8}; VEC: idx is a
// multiple of n and the base 16-byte aligned).
template <int N, bool VEC>
__device__ __forceinline__ void load_n(const void* base, int dt, int64_t idx, float (&v)[N]) {
  if constexpr (VEC && N >= 2) {
    if (dt == kBF16) {
      const __nv_bfloat16* p = static_cast<const __nv_bfloat16*>(base) + idx;
      uint32_t w[N / 2];
      if constexpr (N == 8) {
        const uint4 u = *reinterpret_cast<const uint4*>(p);
        w[0] = u.x, w[1] = u.y, w[2] = u.z, w[3] = u.w;
      } else if constexpr (N == 4) {
        const uint2 u = *reinterpret_cast<const uint2*>(p);
        w[0] = u.x, w[1] = u.y;
      } else {
        w[0] = *reinterpret_cast<const uint32_t*>(p);
      }
#pragma unroll
      for (int i = 0; i < N / 2; ++i) {
        v[2 * i] = __uint_as_float(w[i] << 16);
        v[2 * i + 1] = __uint_as_float(w[i] & 0xffff0000u);
      }
      return;
    }
    const float* p = static_cast<const float*>(base) + idx;
    if constexpr (N >= 4) {
#pragma unroll
      for (int i = 0; i < N; i += 4) {
        const float4 f = *reinterpret_cast<const float4*>(p + i);
        v[i] = f.x, v[i + 1] = f.y, v[i + 2] = f.z, v[i + 3] = f.w;
      }
    } else {
      const float2 f = *reinterpret_cast<const float2*>(p);
      v[0] = f.x, v[1] = f.y;
    }
  } else {
#pragma unroll
    for (int i = 0; i < N; ++i) v[i] = ld(base, dt, idx + i);
  }
}

// part: per (slab row, q head, chunk) [m, l, acc[d]] in fp32. Warp w of the
// block owns the group's heads w·HPW .. w·HPW + HPW - 1 over every tile of
// the chunk, so a warp's result needs no merge with the others.
template <int HPW, int DPL, bool VEC>
__global__ void __launch_bounds__(kSplitWarps * 32)
    attention_split_kernel(float* __restrict__ part, const void* q, int qdt, int64_t ldq, KvArgs a, PlanDev P,
                           int64_t T, int64_t r0, int d, int G, int hq, int64_t window, float scale, DeviceError* err,
                           int op) {
  constexpr int DW = 32 * DPL;         // head dims a warp covers
  constexpr int GB = kSplitWarps * HPW;  // heads a block covers
  __shared__ __align__(16) float qs[GB][DW];
  __shared__ float ps[kSplitWarps][32][HPW];
  __shared__ int64_t vidx[kSplitWarps][32];
  __shared__ unsigned char vfresh[kSplitWarps][32];
  const int64_t t = r0 + blockIdx.x;
  const int g = blockIdx.y, z = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  RowSeq rs;
  if (!row_sequence(P, t, T, rs, err, op)) return;
  const int64_t p = rs.pos_begin + (t - rs.row_begin);
  const int64_t lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
  const int64_t nkeys = p - lo + 1, C = chunk_keys(nkeys);
  if (int64_t(z) * C >= nkeys) return;  // this row has fewer chunks
  const int64_t k_begin = lo + int64_t(z) * C, k_end = p + 1 < k_begin + C ? p + 1 : k_begin + C;
  {  // all of this thread's q loads first, then the stores (one latency, not one per value)
    constexpr int kPer = (GB * DW + kSplitWarps * 32 - 1) / (kSplitWarps * 32);
    float qv[kPer];
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = threadIdx.x + k * kSplitWarps * 32, hh = i / DW, dim = i % DW;
      qv[k] = i < GB * DW && hh < G && dim < d ? ld(q, qdt, t * ldq + int64_t(g * G + hh) * d + dim) : 0.0f;
    }
#pragma unroll
    for (int k = 0; k < kPer; ++k) {
      const int i = threadIdx.x + k * kSplitWarps * 32;
      if (i < GB * DW) qs[i / DW][i % DW] = qv[k];
    }
  }
  __syncthreads();
  const int h0 = warp * HPW;
  if (h0 >= G) return;  // a group smaller than the block's heads: this warp has none
  const int64_t kv_off = int64_t(g) * d;
  float m[HPW], l[HPW], acc[HPW][DPL];
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    m[hh] = -INFINITY, l[hh] = 0.0f;
#pragma unroll
    for (int i = 0; i < DPL; ++i) acc[hh][i] = 0.0f;
  }
  const int64_t ntiles = (k_end - k_begin + 31) / 32;
  for (int64_t tile = 0; tile < ntiles; ++tile) {
    const int64_t j0 = k_begin + tile * 32, j = j0 + lane;
    bool valid = j < k_end, fresh = false;
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
    float sc[HPW];
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh) sc[hh] = 0.0f;
    if (valid) {
      const void* kb = fresh ? a.k_new : a.ck;
      const int kdt = fresh ? a.ndt : a.cdt;
      if constexpr (VEC) {
        // The key's 16-byte pieces requested 4 at a time before they are used.
        constexpr int kPieces = DW / 8 < 4 ? DW / 8 : 4;
#pragma unroll
        for (int c0 = 0; c0 < DW / 8; c0 += kPieces) {
          if (8 * c0 >= d) break;
          float kv[kPieces][8];
#pragma unroll
          for (int c = 0; c < kPieces; ++c)
            if (8 * (c0 + c) < d) load_n<8, true>(kb, kdt, idx + 8 * (c0 + c), kv[c]);
#pragma unroll
          for (int c = 0; c < kPieces; ++c) {
            const int i = 8 * (c0 + c);
            if (i >= d) break;
#pragma unroll
            for (int hh = 0; hh < HPW; ++hh) {
              const float4 q0 = *reinterpret_cast<const float4*>(&qs[h0 + hh][i]);
              const float4 q1 = *reinterpret_cast<const float4*>(&qs[h0 + hh][i + 4]);
              float s = sc[hh];
              s = fmaf(q0.x, kv[c][0], s), s = fmaf(q0.y, kv[c][1], s), s = fmaf(q0.z, kv[c][2], s);
              s = fmaf(q0.w, kv[c][3], s), s = fmaf(q1.x, kv[c][4], s), s = fmaf(q1.y, kv[c][5], s);
              s = fmaf(q1.z, kv[c][6], s), s = fmaf(q1.w, kv[c][7], s);
              sc[hh] = s;
            }
          }
        }
      } else {
        for (int i = 0; i < d; ++i) {
          const float kv = ld(kb, kdt, idx + i);
#pragma unroll
          for (int hh = 0; hh < HPW; ++hh) sc[hh] = fmaf(qs[h0 + hh][i], kv, sc[hh]);
        }
      }
    }
#pragma unroll
    for (int hh = 0; hh < HPW; ++hh) {
      const float score = valid ? sc[hh] * scale : -INFINITY;
      const float m_new = fmaxf(m[hh], warp_max(score));
      const float corr = m_new == -INFINITY ? 0.0f : expf(m[hh] - m_new);
      const float pj = valid ? expf(score - m_new) : 0.0f;
      l[hh] = l[hh] * corr + warp_sum(pj);
#pragma unroll
      for (int i = 0; i < DPL; ++i) acc[hh][i] *= corr;
      m[hh] = m_new;
      ps[warp][lane][hh] = pj;
    }
    vidx[warp][lane] = valid ? idx : -1;
    vfresh[warp][lane] = fresh;
    __syncwarp();
    const int nv = int(k_end - j0 < 32 ? k_end - j0 : 32);
    const int dim0 = lane * DPL;
    if (dim0 < d) {
      // Values in groups of keys (32 registers of them): the group's loads
      // first, then its keys' products in key order.
      constexpr int kGroup = 32 / DPL < 16 ? 32 / DPL : 16;
      for (int src0 = 0; src0 < nv; src0 += kGroup) {
        float vv[kGroup][DPL];
#pragma unroll
        for (int u = 0; u < kGroup; ++u) {
          const int src = src0 + u;
          const int64_t vi = src < nv ? vidx[warp][src] : -1;
          if (vi < 0) {
#pragma unroll
            for (int i = 0; i < DPL; ++i) vv[u][i] = 0.0f;
            continue;
          }
          const bool vf = vfresh[warp][src];
          const void* vb = vf ? a.v_new : a.cv;
          const int vdt = vf ? a.ndt : a.cdt;
          if (VEC || dim0 + DPL <= d) {
            load_n<DPL, VEC>(vb, vdt, vi + dim0, vv[u]);
          } else {
#pragma unroll
            for (int i = 0; i < DPL; ++i) vv[u][i] = dim0 + i < d ? ld(vb, vdt, vi + dim0 + i) : 0.0f;
          }
        }
#pragma unroll
        for (int u = 0; u < kGroup; ++u) {
          const int src = src0 + u;
          if (src >= nv) break;
#pragma unroll
          for (int hh = 0; hh < HPW; ++hh) {
            const float pw = ps[warp][src][hh];
#pragma unroll
            for (int i = 0; i < DPL; ++i) acc[hh][i] = fmaf(pw, vv[u][i], acc[hh][i]);
          }
        }
      }
    }
    __syncwarp();  // ps / vidx are rewritten by the next tile
  }
  const int stride = d + 2;
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    if (h0 + hh >= G) break;
    float* dst = part + ((int64_t(blockIdx.x) * hq + g * G + h0 + hh) * kMaxChunks + z) * stride;
    if (lane == 0) dst[0] = m[hh], dst[1] = l[hh];
#pragma unroll
    for (int i = 0; i < DPL; ++i)
      if (lane * DPL + i < d) dst[2 + lane * DPL + i] = acc[hh][i];
  }
}

// out row t, q head h: the chunks of attention_split_kernel merged in chunk
// order: M and L by warp 0 (lane z, z + 32, ... then the butterfly), then
// every output dim Σ_z acc_z · e^(m_z - M) in chunk order, / L.
__global__ void __launch_bounds__(128) attention_merge_kernel(void* out, int odt, int64_t ldo,
                                                              const float* __restrict__ part, PlanDev P, int64_t T,
                                                              int64_t r0, int d, int hq, int64_t window,
                                                              DeviceError* err, int op) {
  pdl_launch_dependents();  // the o projection waits for us
  __shared__ float wz[kMaxChunks];
  __shared__ float Ls;
  const int64_t t = r0 + blockIdx.x;
  const int h = blockIdx.y;
  RowSeq rs;
  if (!row_sequence(P, t, T, rs, err, op)) return;
  const int64_t p = rs.pos_begin + (t - rs.row_begin);
  const int64_t lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
  const int64_t nkeys = p - lo + 1, C = chunk_keys(nkeys);
  const int nch = int((nkeys + C - 1) / C);
  const int stride = d + 2;
  const float* base = part + (int64_t(blockIdx.x) * hq + h) * kMaxChunks * stride;
  if (threadIdx.x < 32) {
    const int lane = threadIdx.x;
    float mv[kMaxChunks / 32], lv[kMaxChunks / 32];
    float M = -INFINITY;
#pragma unroll
    for (int k = 0; k < kMaxChunks / 32; ++k) {
      const int zz = lane + 32 * k;
      mv[k] = zz < nch ? base[zz * stride] : -INFINITY;
      lv[k] = zz < nch ? base[zz * stride + 1] : 0.0f;
      M = fmaxf(M, mv[k]);
    }
    M = warp_max(M);
    float L = 0.0f;
#pragma unroll
    for (int k = 0; k < kMaxChunks / 32; ++k) {
      const int zz = lane + 32 * k;
      const float w = mv[k] == -INFINITY ? 0.0f : expf(mv[k] - M);
      if (zz < nch) wz[zz] = w;
      L = fmaf(lv[k], w, L);
    }
    L = warp_sum(L);
    if (lane == 0) Ls = L;
  }
  __syncthreads();
  const float L = Ls;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    float o = 0.0f;
    int zz = 0;
    for (; zz + 8 <= nch; zz += 8) {  // 8 loads in flight, then the sums in chunk order
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = base[(zz + u) * stride + 2 + i];
#pragma unroll
      for (int u = 0; u < 8; ++u) o = fmaf(v[u], wz[zz + u], o);
    }
    for (; zz < nch; ++zz) o = fmaf(base[zz * stride + 2 + i], wz[zz], o);
    st(out, odt, t * ldo + int64_t(h) * d + i, o / L);
  }
}

using SplitKernel = void (*)(float*, const void*, int, int64_t, KvArgs, PlanDev, int64_t, int64_t, int, int, int,
                             int64_t, float, DeviceError*, int);
template <int HPW, int DPL>
SplitKernel split_kernel(bool vec) {
  return vec ? attention_split_kernel<HPW, DPL, true> : attention_split_kernel<HPW, DPL, false>;
}
// The instance for a group of G heads of d dims; nullptr: not covered
// (groups above 16, heads above 256).
SplitKernel pick_split_kernel(int G, int d, bool vec) {
  const int dpl = d <= 32 ? 1 : d <= 64 ? 2 : d <= 128 ? 4 : d <= 256 ? 8 : 0;
  if (G < 1 || G > kSplitMaxGroup || dpl == 0) return nullptr;
  const int hpw = G <= 4 ? 1 : G <= 8 ? 2 : 4;
  switch (hpw * 10 + dpl) {
    case 11: return split_kernel<1, 1>(vec);
    case 12: return split_kernel<1, 2>(vec);
    case 14: return split_kernel<1, 4>(vec);
    case 18: return split_kernel<1, 8>(vec);
    case 21: return split_kernel<2, 1>(vec);
    case 22: return split_kernel<2, 2>(vec);
    case 24: return split_kernel<2, 4>(vec);
    case 28: return split_kernel<2, 8>(vec);
    case 41: return split_kernel<4, 1>(vec);
    case 42: return split_kernel<4, 2>(vec);
    case 44: return split_kernel<4, 4>(vec);
    case 48: return split_kernel<4, 8>(vec);
  }
  return nullptr;
}

// ---------------------------------------------------------------------------
// Tensor-core attention (q, k, v and the cache all BF16, heads of 64 or 128,
// groups of at most 16 q heads: every Muse checkpoint on the GPU).
//
// The same blocks, chunks and merges as attention_split_kernel, but the
// group's q heads are the 16 rows of an mma.m16n8k16 tile: S = Q·Kᵀ and
// O += P·V run on the tensor cores with fp32 accumulation (P rounded to
// bf16 for its product, as flash-attention does; the softmax sums stay in
// fp32). Warp w takes 32-key tiles w, w + 4, ... of the chunk; a tile's K
// and V rows are copied into the warp's shared memory (cp.async; rows padded
// by 16 bytes so fragment reads hit distinct banks), K read as B fragments
// directly, V through ldmatrix.trans. Per head row the softmax max/sum run
// over the lane's keys in tile order and then across the 4 lanes of the row
// (butterfly); warps merge in warp order, chunks in chunk order. The order
// depends only on the row's own keys: batch- and chunk-invariant.
// ---------------------------------------------------------------------------
constexpr int kMmaAttnWarps = 4;
template <int D>
constexpr int mma_att_row_bytes() {
  return D * 2 + 16;
}
template <int D>
constexpr size_t mma_att_smem() {
  // per warp: K and V tiles of 32 rows; after the loop, the warp merge
  // (16 heads x D floats + m, l) reuses the same bytes.
  const size_t tiles = size_t(kMmaAttnWarps) * 2 * 32 * mma_att_row_bytes<D>();
  const size_t merge = (size_t(16) * D + 32) * sizeof(float);
  return tiles > merge ? tiles : merge;
}

__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}
__device__ __forceinline__ void mma_bf16_16816(float (&d)[4], uint32_t a0, uint32_t a1, uint32_t a2, uint32_t a3,
                                               uint32_t b0, uint32_t b1) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 800
  asm("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
#else
  __trap();
#endif
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t& r0, uint32_t& r1, const void* smem_row) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(s));
}
__device__ __forceinline__ void cp_async16_att(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
}

template <int D>
__global__ void __launch_bounds__(kMmaAttnWarps * 32)
    attention_mma_kernel(float* __restrict__ part, const __nv_bfloat16* __restrict__ q, int64_t ldq, KvArgs a,
                         PlanDev P, int64_t T, int64_t r0, int G, int hq, int64_t window, float scale,
                         DeviceError* err, int op) {
  constexpr int RB = mma_att_row_bytes<D>();
  constexpr int KS = D / 16;  // k-steps of the QK product
  constexpr int NT = D / 8;   // n-tiles of the output
  extern __shared__ __align__(16) unsigned char att_smem[];
  const int64_t t = r0 + blockIdx.x;
  const int g = blockIdx.y, z = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  RowSeq rs;
  if (!row_sequence(P, t, T, rs, err, op)) return;
  const int64_t p = rs.pos_begin + (t - rs.row_begin);
  const int64_t lo = window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
  const int64_t nkeys = p - lo + 1, C = chunk_keys(nkeys);
  if (int64_t(z) * C >= nkeys) return;
  const int64_t k_begin = lo + int64_t(z) * C, k_end = p + 1 < k_begin + C ? p + 1 : k_begin + C;
  const int64_t kv_off = int64_t(g) * D;
  // Q fragments (A of m16n8k16): rows gr and gr + 8 are heads; heads >= G are zeros.
  uint32_t qa[KS][4];
  {
    const __nv_bfloat16* q0 = q + t * ldq + int64_t(g * G) * D;
    auto qpair = [&](int head, int dim) -> uint32_t {
      return head < G ? *reinterpret_cast<const uint32_t*>(q0 + int64_t(head) * D + dim) : 0u;
    };
#pragma unroll
    for (int ks = 0; ks < KS; ++ks) {
      qa[ks][0] = qpair(gr, ks * 16 + 2 * tq);
      qa[ks][1] = qpair(gr + 8, ks * 16 + 2 * tq);
      qa[ks][2] = qpair(gr, ks * 16 + 2 * tq + 8);
      qa[ks][3] = qpair(gr + 8, ks * 16 + 2 * tq + 8);
    }
  }
  unsigned char* ks_base = att_smem + size_t(warp) * 2 * 32 * RB;  // this warp's K tile, then V tile
  unsigned char* vs_base = ks_base + 32 * RB;
  float o[NT][4];
#pragma unroll
  for (int n = 0; n < NT; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) o[n][i] = 0.0f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.0f, 0.0f};  // rows gr, gr + 8
  const int64_t ntiles = (k_end - k_begin + 31) / 32;
  for (int64_t tile = warp; tile < ntiles; tile += kMmaAttnWarps) {
    const int64_t j0 = k_begin + tile * 32;
    const int nv = int(k_end - j0 < 32 ? k_end - j0 : 32);
    // Lane j finds key j0 + j's row.
    int64_t idx = -1;
    bool fresh = false;
    if (lane < nv) {
      const int64_t j = j0 + lane;
      if (j >= rs.pos_begin) {
        fresh = true;
        idx = (rs.row_begin + (j - rs.pos_begin)) * a.kv_dim + kv_off;
      } else {
        const int64_t r = cache_row(a, P, rs, j, err, op);
        idx = r < 0 ? -1 : r + kv_off;
      }
    }
    const unsigned okmask = __ballot_sync(0xffffffffu, idx >= 0);  // keys with a row (bad pages: none)
    __syncwarp();  // the previous tile's fragment reads are done
    constexpr int kPieces = D / 8;  // 16-byte pieces per row
#pragma unroll 4
    for (int e = lane; e < 32 * kPieces; e += 32) {
      const int key = e / kPieces, piece = e % kPieces;
      const int64_t ki = __shfl_sync(0xffffffffu, idx, key);
      const bool kf = __shfl_sync(0xffffffffu, fresh, key);
      const bool ok = ki >= 0;
      const __nv_bfloat16* kb = static_cast<const __nv_bfloat16*>(kf ? a.k_new : a.ck);
      const __nv_bfloat16* vb = static_cast<const __nv_bfloat16*>(kf ? a.v_new : a.cv);
      const int64_t off = ok ? ki + piece * 8 : 0;
      cp_async16_att(ks_base + key * RB + piece * 16, kb + off, ok ? 16 : 0);
      cp_async16_att(vs_base + key * RB + piece * 16, vb + off, ok ? 16 : 0);
    }
    asm volatile("cp.async.commit_group;");
    asm volatile("cp.async.wait_group 0;" ::: "memory");
    __syncwarp();
    // S = Q·Kᵀ for 4 n-tiles of 8 keys.
    float s[4][4];
#pragma unroll
    for (int n = 0; n < 4; ++n) {
#pragma unroll
      for (int i = 0; i < 4; ++i) s[n][i] = 0.0f;
      const unsigned char* krow = ks_base + (n * 8 + gr) * RB;
#pragma unroll
      for (int ks = 0; ks < KS; ++ks) {
        const uint32_t b0 = *reinterpret_cast<const uint32_t*>(krow + (ks * 16 + 2 * tq) * 2);
        const uint32_t b1 = *reinterpret_cast<const uint32_t*>(krow + (ks * 16 + 2 * tq + 8) * 2);
        mma_bf16_16816(s[n], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b0, b1);
      }
    }
    // Online softmax per head row (h = 0: row gr, h = 1: row gr + 8).
    float pr[4][4];
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int key = n * 8 + 2 * tq + c;
          const float v = (okmask >> key) & 1u ? s[n][2 * h + c] * scale : -INFINITY;
          s[n][2 * h + c] = v;
          mx = fmaxf(mx, v);
        }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float m_new = fmaxf(m[h], mx);
      const float corr = m_new == -INFINITY ? 0.0f : expf(m[h] - m_new);
      float sum = 0.0f;
#pragma unroll
      for (int n = 0; n < 4; ++n)
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const float v = s[n][2 * h + c];
          const float e = v == -INFINITY ? 0.0f : expf(v - m_new);
          pr[n][2 * h + c] = e;
          sum += e;
        }
      sum += __shfl_xor_sync(0xffffffffu, sum, 1);
      sum += __shfl_xor_sync(0xffffffffu, sum, 2);
      l[h] = l[h] * corr + sum;
      m[h] = m_new;
#pragma unroll
      for (int n = 0; n < NT; ++n) o[n][2 * h] *= corr, o[n][2 * h + 1] *= corr;
    }
    // O += P·V: two k-steps of 16 keys; P's C fragments are its A fragments.
#pragma unroll
    for (int kk = 0; kk < 2; ++kk) {
      const uint32_t a0 = pack_bf16x2(pr[2 * kk][0], pr[2 * kk][1]), a1 = pack_bf16x2(pr[2 * kk][2], pr[2 * kk][3]);
      const uint32_t a2 = pack_bf16x2(pr[2 * kk + 1][0], pr[2 * kk + 1][1]),
                     a3 = pack_bf16x2(pr[2 * kk + 1][2], pr[2 * kk + 1][3]);
      // ldmatrix.x2.trans: lanes 0-7 give keys kk·16 + 0..7, lanes 8-15 keys + 8..15, of dims n·8.
      const unsigned char* vrow = vs_base + (kk * 16 + (lane & 15)) * RB;
#pragma unroll
      for (int n = 0; n < NT; ++n) {
        uint32_t b0, b1;
        ldmatrix_x2_trans(b0, b1, vrow + n * 16);
        mma_bf16_16816(o[n], a0, a1, a2, a3, b0, b1);
      }
    }
  }
  // Merge the warps in warp order through shared memory (the tiles are done).
  __syncthreads();
  float* macc = reinterpret_cast<float*>(att_smem);  // [16][D]
  float* mm = macc + 16 * D;                          // [16]
  float* ml = mm + 16;                                // [16]
  for (int w = 0; w < kMmaAttnWarps; ++w) {
    if (warp == w) {
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int row = gr + 8 * h;
        if (w == 0) {
#pragma unroll
          for (int n = 0; n < NT; ++n)
            macc[row * D + n * 8 + 2 * tq] = o[n][2 * h], macc[row * D + n * 8 + 2 * tq + 1] = o[n][2 * h + 1];
          if (tq == 0) mm[row] = m[h], ml[row] = l[h];
        } else {
          const float M0 = mm[row], L0 = ml[row], M = fmaxf(M0, m[h]);
          const float c0 = M0 == -INFINITY ? 0.0f : expf(M0 - M), c1 = m[h] == -INFINITY ? 0.0f : expf(m[h] - M);
#pragma unroll
          for (int n = 0; n < NT; ++n)
#pragma unroll
            for (int c = 0; c < 2; ++c) {
              float& sacc = macc[row * D + n * 8 + 2 * tq + c];
              sacc = fmaf(o[n][2 * h + c], c1, sacc * c0);
            }
          __syncwarp();
          if (tq == 0) mm[row] = M, ml[row] = fmaf(l[h], c1, L0 * c0);
        }
      }
    }
    __syncthreads();
  }
  const int stride = D + 2;
  for (int i = threadIdx.x; i < G * stride; i += blockDim.x) {
    const int hh = i / stride, e = i % stride;
    float* dst = part + ((int64_t(blockIdx.x) * hq + g * G + hh) * kMaxChunks + z) * stride;
    dst[e] = e == 0 ? mm[hh] : e == 1 ? ml[hh] : macc[hh * D + e - 2];
  }
}

template <int D>
cudaError_t launch_attention_mma(cudaStream_t s, dim3 grid, float* part, const void* q, int64_t ldq, const KvArgs& a,
                                 const PlanDev& P, int64_t T, int64_t r0, int G, int hq, int64_t window, float scale,
                                 DeviceError* err, int op) {
  constexpr size_t smem = mma_att_smem<D>();
  if (cudaError_t e = allow_dynamic_smem<attention_mma_kernel<D>>(int(smem)); e != cudaSuccess) return e;
  attention_mma_kernel<D><<<grid, kMmaAttnWarps * 32, smem, s>>>(
      part, static_cast<const __nv_bfloat16*>(q), ldq, a, P, T, r0, G, hq, window, scale, err, op);
  return cudaGetLastError();
}

// Rows per launch so the chunk partials stay within 256 MiB of scratch.
int64_t split_slab_rows(int64_t T, int hq, int d) {
  const int64_t per_row = int64_t(hq) * kMaxChunks * (d + 2) * 4;
  return std::max<int64_t>(1, std::min<int64_t>(T, (int64_t(256) << 20) / per_row));
}

__global__ void kv_store_kernel(KvArgs a, PlanDev P, DeviceError* err, int op) {
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
  // Vector loads: 8-dim pieces of 16-byte aligned rows.
  auto al16 = [](const void* p) { return (reinterpret_cast<uintptr_t>(p) & 15u) == 0; };
  const bool vec = d % 8 == 0 && k_new.cols() % 8 == 0 && al16(k_new.data) && al16(v_new.data) && al16(cache.k.data) &&
                   al16(cache.v.data);
  SplitKernel split = pick_split_kernel(group, int(d), vec);
  // The tensor-core kernel: BF16 everywhere, 64- or 128-wide heads, 4-byte
  // aligned q rows (its fragments are bf16 pairs).
  const bool all_bf16 = q.dtype == DType::BF16 && k_new.dtype == DType::BF16 && cache.k.dtype == DType::BF16;
  const bool use_mma = mma_gemv_built() && vec && all_bf16 && (d == 64 || d == 128) && group <= 16 &&
                       (reinterpret_cast<uintptr_t>(q.data) & 3u) == 0 && q.cols() % 2 == 0;
  if (!split && !use_mma) {
    enqueue("attention", [=, this](cudaStream_t s) {
      attention_kernel<<<dim3(unsigned(T), unsigned(hq)), kAttnWarps * 32, 0, s>>>(
          out.data, dt_code(out.dtype), q.data, dt_code(q.dtype), q.cols(), a, P, int(d), group, window, scale,
          dev_error(), op);
      return cudaGetLastError();
    });
    return;
  }
  const int64_t slab = split_slab_rows(T, hq, int(d));
  reserve_scratch(size_t(slab) * size_t(hq) * kMaxChunks * size_t(d + 2) * 4);
  const int hk = hq / group;
  enqueue("attention", [=, this](cudaStream_t s) {
    float* part = static_cast<float*>(scratch());
    for (int64_t r0 = 0; r0 < T; r0 += slab) {
      const unsigned rows = unsigned(std::min(slab, T - r0));
      const dim3 grid(rows, unsigned(hk), kMaxChunks);
      if (use_mma) {
        cudaError_t e = d == 64 ? launch_attention_mma<64>(s, grid, part, q.data, q.cols(), a, P, T, r0, group, hq,
                                                           window, scale, dev_error(), op)
                                : launch_attention_mma<128>(s, grid, part, q.data, q.cols(), a, P, T, r0, group, hq,
                                                            window, scale, dev_error(), op);
        if (e != cudaSuccess) return e;
      } else {
        split<<<grid, kSplitWarps * 32, 0, s>>>(part, q.data, dt_code(q.dtype), q.cols(), a, P, T, r0, int(d), group,
                                               hq, window, scale, dev_error(), op);
      }
      attention_merge_kernel<<<dim3(rows, unsigned(hq)), 128, 0, s>>>(  // 128: its launch bound; dims loop
          out.data, dt_code(out.dtype), out.cols(), part, P, T, r0, int(d), hq, window, dev_error(), op);
    }
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
