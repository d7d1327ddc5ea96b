// Split-context attention (every row whose q-head group is at most 16 heads
// and whose head is at most 256 wide: all the Muse shapes), and its merge.
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
#include <algorithm>

#include "muse/backends/cuda/cuda_attention.cuh"
#include "muse/backends/cuda/cuda_mma.cuh"

namespace muse::cuda {
namespace {

using namespace attn;

constexpr int kSplitWarps = 4;
constexpr int kSplitMaxGroup = 16;


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
  const int64_t lo = window_lo(p, window);
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
      idx = key_row(a, P, rs, j, kv_off, fresh, err, op);
      if (idx < 0) valid = false;
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
  const int stride = part_stride(d);
#pragma unroll
  for (int hh = 0; hh < HPW; ++hh) {
    if (h0 + hh >= G) break;
    float* dst = part + ((int64_t(blockIdx.x) * hq + g * G + h0 + hh) * gridDim.z + z) * stride;
    if (lane == 0) dst[0] = m[hh], dst[1] = l[hh];
#pragma unroll
    for (int i = 0; i < DPL; ++i)
      if (lane * DPL + i < d) dst[kPartHead + lane * DPL + i] = acc[hh][i];
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
// (A two-warp form of this kernel served the 64-key chunks of before; with
// chunks of at least 128 keys every warp has a tile: cuda_attention.cuh.)
// ---------------------------------------------------------------------------
// The warp merge's shared memory (after the tiles, in the same bytes): each
// warp's 16 x D outputs in rows of D + 8 floats (its float2 stores, rows gr
// and gr + 8 of a half warp, hit distinct banks), its m and l per head row,
// then per head row the three merge weight pairs and the merged M and L.
template <int D>
struct MmaMergeSmem {
  static constexpr int kStride = D + 8;
  static constexpr size_t o = 0;
  static constexpr size_t m = o + size_t(kMmaAttnWarps) * 16 * kStride;  // floats
  static constexpr size_t l = m + size_t(kMmaAttnWarps) * 16;
  static constexpr size_t c = l + size_t(kMmaAttnWarps) * 16;  // [16][warps - 1][2]
  static constexpr size_t fm = c + size_t(16) * (kMmaAttnWarps - 1) * 2;
  static constexpr size_t fl = fm + 16;
  static constexpr size_t bytes = (fl + 16) * sizeof(float);
};

template <int D>
constexpr size_t mma_att_smem() {
  // per warp: K and V tiles of 32 rows; after the loop, the warp merge
  // reuses the same bytes.
  const size_t tiles = size_t(kMmaAttnWarps) * 2 * 32 * mma_row_bytes<D>();
  return tiles > MmaMergeSmem<D>::bytes ? tiles : MmaMergeSmem<D>::bytes;
}

template <int D>
__global__ void __launch_bounds__(kMmaAttnWarps * 32)
    attention_mma_kernel(float* __restrict__ part, const __nv_bfloat16* __restrict__ q, int64_t ldq, KvArgs a,
                         PlanDev P, int64_t T, int64_t r0, int G, int hq, int64_t window, float scale,
                         DeviceError* err, int op) {
  constexpr int RB = mma_row_bytes<D>();
  constexpr int NT = D / 8;  // n-tiles of the output
  // The merge may launch now: it reads the plan, then waits for us.
  pdl_launch_dependents();
  extern __shared__ __align__(16) unsigned char att_smem[];
  const int64_t t = r0 + blockIdx.x;
  const int g = blockIdx.y, z = blockIdx.z;
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  // Launched with PDL: until pdl_wait the kernels before us may still run.
  // Before it we read only what no kernel of this step writes: the plan,
  // the block table and the cache rows of earlier steps (this step's k/v
  // reach the cache in the merge, after every chunk block). q and this
  // step's k_new/v_new come after it. Every block waits before it leaves,
  // so this grid ends after the one before it.
  RowSeq rs;
  int64_t k_begin = 0, k_end = 0;
  if (row_sequence(P, t, T, rs, err, op)) {
    const int64_t p = rs.pos_begin + (t - rs.row_begin);
    const int64_t lo = window_lo(p, window);
    const int64_t nkeys = p - lo + 1, C = chunk_keys(nkeys);
    if (int64_t(z) * C < nkeys)  // else this row has fewer chunks
      k_begin = lo + int64_t(z) * C, k_end = p + 1 < k_begin + C ? p + 1 : k_begin + C;
  }
  const int64_t ntiles = (k_end - k_begin + 31) / 32;
  if (ntiles == 0) {
    pdl_wait();
    return;
  }
  const int64_t kv_off = int64_t(g) * D;
  unsigned char* ks_base = att_smem + size_t(warp) * 2 * 32 * RB;  // this warp's K tile, then V tile
  unsigned char* vs_base = ks_base + 32 * RB;
  // The warp's first tile: its keys looked up and its cached rows on their way.
  bool fresh0 = false;
  int64_t idx0 = -1;
  if (warp < ntiles) {
    const int64_t j0 = k_begin + int64_t(warp) * 32;
    idx0 = tile_key(a, P, rs, j0, int(k_end - j0 < 32 ? k_end - j0 : 32), kv_off, fresh0, err, op, lane);
    copy_tile_rows<D>(ks_base, vs_base, a, idx0, fresh0, kCopyCached);
  }
  const unsigned okmask0 = __ballot_sync(0xffffffffu, idx0 >= 0);
  pdl_wait();
  uint32_t qa[D / 16][4];
  load_q_frags<D>(qa, q, t, ldq, g, G, lane);
  const unsigned char* krow[4];
  const unsigned char* vrow[2];
  tile_rows<D>(ks_base, vs_base, lane, krow, vrow);
  MmaState<D> st;
  mma_state_init(st);
  for (int64_t tile = warp; tile < ntiles; tile += kMmaAttnWarps) {
    const int64_t j0 = k_begin + tile * 32;
    const int nv = int(k_end - j0 < 32 ? k_end - j0 : 32);
    unsigned okmask = okmask0;
    if (tile == warp) {
      copy_tile_rows<D>(ks_base, vs_base, a, idx0, fresh0, kCopyFresh);
    } else {
      bool fresh = false;
      const int64_t idx = tile_key(a, P, rs, j0, nv, kv_off, fresh, err, op, lane);
      okmask = __ballot_sync(0xffffffffu, idx >= 0);
      __syncwarp();  // the previous tile's fragment reads are done
      copy_tile_rows<D>(ks_base, vs_base, a, idx, fresh, kCopyAll);
    }
    copy_tile_wait();
    float s[4][4];
    mma_tile_scores<D>(s, qa, krow, okmask, scale, lane);
    if (tile == warp) mma_tile_accumulate<D, true>(st, s, vrow);  // st is still mma_state_init's
    else mma_tile_accumulate<D>(st, s, vrow);
  }
  // Merge the warps in warp order (acc = warp 0's state, then absorb warps
  // 1, 2, 3 as mma_state_merge does), all at once: every warp leaves its
  // state in shared memory, 16 threads fold the per-row weights, then every
  // thread folds the outputs it writes.
  using MS = MmaMergeSmem<D>;
  __syncthreads();  // the tiles are done: their bytes become the merge's
  float* sm = reinterpret_cast<float*>(att_smem);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = gr + 8 * h;
    float* orow = sm + MS::o + size_t(warp * 16 + row) * MS::kStride;
#pragma unroll
    for (int n = 0; n < NT; ++n)
      *reinterpret_cast<float2*>(orow + n * 8 + 2 * tq) = make_float2(st.o[n][2 * h], st.o[n][2 * h + 1]);
    if (tq == 0) sm[MS::m + warp * 16 + row] = st.m[h], sm[MS::l + warp * 16 + row] = st.l[h];
  }
  __syncthreads();
  if (threadIdx.x < 16) {
    const int row = threadIdx.x;
    float M = sm[MS::m + row], L = sm[MS::l + row];
#pragma unroll
    for (int w = 1; w < kMmaAttnWarps; ++w) {
      float Mn, c0, c1;
      merge_weights(M, sm[MS::m + w * 16 + row], Mn, c0, c1);
      sm[MS::c + (row * (kMmaAttnWarps - 1) + w - 1) * 2] = c0;
      sm[MS::c + (row * (kMmaAttnWarps - 1) + w - 1) * 2 + 1] = c1;
      L = merge_value(L, sm[MS::l + w * 16 + row], c0, c1);
      M = Mn;
    }
    sm[MS::fm + row] = M, sm[MS::fl + row] = L;
  }
  __syncthreads();
  // m and l by 16 threads; acc in float4s (4 dims a thread a step), its
  // four warps' values folded in warp order.
  constexpr int stride = part_stride(D), Q = D / 4;
  float* out = part + ((int64_t(blockIdx.x) * hq + g * G) * gridDim.z + z) * stride;  // head hh: + hh·gridDim.z·stride
  const int64_t head_step = int64_t(gridDim.z) * stride;
  if (threadIdx.x < G) {
    out[threadIdx.x * head_step] = sm[MS::fm + threadIdx.x];
    out[threadIdx.x * head_step + 1] = sm[MS::fl + threadIdx.x];
  }
  for (int i = threadIdx.x; i < G * Q; i += blockDim.x) {
    const int hh = i / Q, e = 4 * (i % Q);
    const float* o = sm + MS::o + size_t(hh) * MS::kStride + e;
    const float* c = sm + MS::c + hh * (kMmaAttnWarps - 1) * 2;
    float4 v = *reinterpret_cast<const float4*>(o);
#pragma unroll
    for (int w = 1; w < kMmaAttnWarps; ++w) {
      const float4 ow = *reinterpret_cast<const float4*>(o + size_t(w) * 16 * MS::kStride);
      const float c0 = c[(w - 1) * 2], c1 = c[(w - 1) * 2 + 1];
      v.x = merge_value(v.x, ow.x, c0, c1), v.y = merge_value(v.y, ow.y, c0, c1);
      v.z = merge_value(v.z, ow.z, c0, c1), v.w = merge_value(v.w, ow.w, c0, c1);
    }
    *reinterpret_cast<float4*>(out + hh * head_step + kPartHead + e) = v;
  }
}

template <int D>
cudaError_t launch_attention_mma(cudaStream_t s, dim3 grid, float* part, const void* q, int64_t ldq, const KvArgs& a,
                                 const PlanDev& P, int64_t T, int64_t r0, int G, int hq, int64_t window, float scale,
                                 DeviceError* err, int op) {
  constexpr size_t smem = mma_att_smem<D>();
  if (cudaError_t e = allow_dynamic_smem<attention_mma_kernel<D>>(int(smem)); e != cudaSuccess) return e;
  return launch_pdl<attention_mma_kernel<D>>(s, grid, dim3(kMmaAttnWarps * 32), smem, part,
                                                    static_cast<const __nv_bfloat16*>(q), ldq, a, P, T, r0, G, hq,
                                                    window, scale, err, op);
}

// Rows per launch so the chunk partials stay within 256 MiB of scratch. The
// partials of a (row, head) are `chunks` apart, the chunks launched (64
// Glimmer rows at 1K: 9 chunks, one launch; sized for all 256 they took
// two, 63 rows then 1).
int64_t split_slab_rows(int64_t T, int hq, int d, int chunks) {
  const int64_t per_row = int64_t(hq) * chunks * part_stride(d) * 4;
  return std::max<int64_t>(1, std::min<int64_t>(T, (int64_t(256) << 20) / per_row));
}


}  // namespace

size_t split_scratch_bytes(int64_t T, int hq, int d, int chunks) {
  return size_t(split_slab_rows(T, hq, d, chunks)) * size_t(hq) * size_t(chunks) * size_t(part_stride(d)) * 4;
}

bool split_attention_one_slab(int64_t T, int hq, int d, int chunks) {
  return split_slab_rows(T, hq, d, chunks) >= T;
}

bool split_attention_covers(int G, int d) { return pick_split_kernel(G, d, false) != nullptr; }

cudaError_t run_split_attention(cudaStream_t s, const AttnCall& c, float* part, bool vec, bool mma,
                                const std::function<cudaError_t(cudaStream_t)>& between) {
  const int64_t T = c.T, slab = split_slab_rows(T, c.hq, c.d, c.chunks);
  const int hk = c.hq / c.G;
  const SplitKernel split = mma ? nullptr : pick_split_kernel(c.G, c.d, vec);
  // The merge's outputs in the products' order, after the partials (one slab).
  auto* xp = c.xperm ? reinterpret_cast<__nv_bfloat16*>(reinterpret_cast<char*>(part) + c.xperm_offset) : nullptr;
  const int64_t Kp = xp ? wgmma_xperm_elements(1, int64_t(c.hq) * c.d) : 0;
  for (int64_t r0 = 0; r0 < T; r0 += slab) {
    const unsigned rows = unsigned(std::min(slab, T - r0));
    const dim3 grid(rows, unsigned(hk), unsigned(c.chunks));
    if (mma) {
      auto* launch = c.d == 64 ? launch_attention_mma<64> : launch_attention_mma<128>;
      cudaError_t e = launch(s, grid, part, c.q, c.ldq, c.a, c.P, T, r0, c.G, c.hq, c.window, c.scale, c.err, c.op);
      if (e != cudaSuccess) return e;
    } else {
      split<<<grid, kSplitWarps * 32, 0, s>>>(part, c.q, c.qdt, c.ldq, c.a, c.P, T, r0, c.d, c.G, c.hq, c.window,
                                             c.scale, c.err, c.op);
    }
    if (between && r0 == 0)
      if (cudaError_t e = between(s); e != cudaSuccess) return e;
    if (cudaError_t e = launch_attention_merge(s, c, part, r0, rows, xp, Kp); e != cudaSuccess)
      return e;
  }
  return cudaGetLastError();
}

}  // namespace muse::cuda
