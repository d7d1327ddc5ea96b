// The pieces the attention kernels share (cuda_attention.cu: the ops and
// the per-head kernel; cuda_attention_split.cu: split-context attention and
// its merge; cuda_attention_prefill.cu: the prefill kernel).
//
// Why shared: the prefill kernel must give every row the same bits as the
// split kernels (attention_mma_kernel + attention_merge_kernel), so the
// arithmetic both run (the tile's scores, the online softmax, P·V, the warp
// merge, the chunk merge) lives here once, with explicit roundings
// (__fmul_rn, __fadd_rn, __fmaf_rn): the compiler may not contract a
// multiply and an add into an fma in one kernel and not in the other.
#pragma once

#include <cstdint>
#include <functional>

#include "muse/backends/cuda/cuda_impl.cuh"

namespace muse::cuda::attn {

constexpr int kMaxHeadDim = 256;

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

// The row's sequence, validated; false (and an error recorded by the thread
// with `reporter`) when the plan is bad.
struct RowSeq {
  int s;
  int64_t row_begin, num_rows, pos_begin;
};
// `rows`: the step's row count as launched; the plan's may be smaller (a
// recorded step run at a padded row count, Backend::graph_rows): rows from
// the plan's count on are padding, false without an error.
__device__ __forceinline__ bool row_sequence(const PlanDev& P, int64_t t, int64_t rows, RowSeq& rs, DeviceError* err,
                                             int op, bool reporter) {
  const int plan_rows = P.p[StepPlanLayout::kRows];
  if (t >= plan_rows && plan_rows >= 0 && plan_rows <= rows && t < rows) return false;  // a padding row
  const int seqs = P.p[StepPlanLayout::kSeqs];
  const int s = t < P.max_rows ? P.p[P.row_seq + t] : -1;
  bool ok = t < P.max_rows && plan_rows <= rows && seqs >= 0 && seqs <= P.max_seqs && s >= 0 && s < seqs;
  if (ok) {
    rs.s = s;
    rs.row_begin = P.p[P.seq_row_begin + s];
    rs.num_rows = P.p[P.seq_row_begin + s + 1] - rs.row_begin;
    rs.pos_begin = P.p[P.seq_pos_begin + s];
    ok = t >= rs.row_begin && t < rs.row_begin + rs.num_rows && rs.pos_begin >= 0;
  }
  if (!ok && reporter) report_error(err, op, kErrPlanSeq, int(t), s);
  return ok;
}
__device__ __forceinline__ bool row_sequence(const PlanDev& P, int64_t t, int64_t rows, RowSeq& rs, DeviceError* err,
                                             int op) {
  return row_sequence(P, t, rows, rs, err, op, threadIdx.x == 0);
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

// Element index of key j's K/V row for kv head offset kv_off: k_new/v_new
// inside the step, the cache before it; -1 (error recorded) without a page.
// `fresh`: the row is in k_new/v_new.
__device__ __forceinline__ int64_t key_row(const KvArgs& a, const PlanDev& P, const RowSeq& rs, int64_t j,
                                           int64_t kv_off, bool& fresh, DeviceError* err, int op) {
  if (j >= rs.pos_begin) {
    fresh = true;
    return (rs.row_begin + (j - rs.pos_begin)) * a.kv_dim + kv_off;
  }
  fresh = false;
  const int64_t r = cache_row(a, P, rs, j, err, op);
  return r < 0 ? -1 : r + kv_off;
}

// ---------------------------------------------------------------------------
// Chunks of split-context attention. A row's keys [lo, p] (lo = p - window
// + 1 on sliding layers, else 0) are cut into chunks of chunk_keys(nkeys)
// keys from lo: positions, not rows, define them, so a row's chunks are the
// same however its prompt was chunked. Chunks are at least 128 keys (four
// 32-key tiles: every warp of a tensor-core chunk block has one): with 64,
// a batch-64 decode at 1K context ran 2176 blocks of two warps, each paying
// its page lookups and one tile's copy latency for 64 keys (63 µs a Glimmer
// layer for 64 MB of KV, 2026-12-04).
// ---------------------------------------------------------------------------
constexpr int kMaxChunks = 256;
constexpr int64_t kMinChunkKeys = 128;

// A chunk partial of one (row, q head), as the chunk kernels store it and
// the merge reads it: m, l, two unused floats (so acc starts 16 bytes in
// and the tensor-core kernel stores it in float4s), then acc[d].
constexpr int kPartHead = 4;
__host__ __device__ constexpr int part_stride(int d) { return d + kPartHead; }

__host__ __device__ __forceinline__ int64_t chunk_keys(int64_t nkeys) {
  int64_t c = (nkeys + kMaxChunks - 1) / kMaxChunks;
  c = (c + 31) / 32 * 32;
  return c < kMinChunkKeys ? kMinChunkKeys : c;
}
__device__ __forceinline__ int64_t window_lo(int64_t p, int64_t window) {
  return window > 0 && p - window + 1 > 0 ? p - window + 1 : 0;
}

// e^x for the softmax and its merges: ex2.approx of x·log2(e), three
// instructions where expf is about eight (its range reduction); relative
// error about 2^-21 plus x·2^-24 from the product's rounding, far inside
// the bf16 rounding of P. Every kernel whose bits must agree (the chunk
// kernel, its merge, the prefill kernel) calls this one.
__device__ __forceinline__ float attn_exp(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(__fmul_rn(x, 1.4426950408889634f)));
  return y;
}

// The two-state merge: state (M0, L0, acc) absorbs (m, l, o) with these
// weights, then acc' = merge_value(acc, o), L' = merge_value(L0, l),
// M' = M. It merges the warps of a chunk (in warp order) and then a row's
// chunks (in chunk order, from the empty state: attention_merge_kernel, and
// the prefill kernel as each chunk is done, so neither needs the row's max
// before it weighs a chunk).
__device__ __forceinline__ void merge_weights(float M0, float m, float& M, float& c0, float& c1) {
  M = fmaxf(M0, m);
  c0 = M0 == -INFINITY ? 0.0f : attn_exp(__fsub_rn(M0, M));
  c1 = m == -INFINITY ? 0.0f : attn_exp(__fsub_rn(m, M));
}
__device__ __forceinline__ float merge_value(float acc, float o, float c0, float c1) {
  return __fmaf_rn(o, c1, __fmul_rn(acc, c0));
}
__device__ __forceinline__ float chunk_out(float o, float L) { return __fdiv_rn(o, L); }

// ---------------------------------------------------------------------------
// Tensor-core tiles (all BF16, heads of 64 or 128, at most 16 q heads per kv
// head). A warp's group of q heads are the 16 rows of an mma.m16n8k16 tile;
// a tile is 32 keys whose K and V rows (bf16, `RB` bytes apart, padded by
// 16 bytes so fragment reads hit distinct banks) are in shared memory.
// ---------------------------------------------------------------------------
constexpr int kMmaAttnWarps = 4;  // attention_mma_kernel's warps: warp w takes a chunk's tiles w, w + 4, ...
template <int D>
constexpr int mma_row_bytes() {
  return D * 2 + 16;
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
// Two 8 x 8 b16 matrices: lane L < 16 addresses row L % 8 of matrix L / 8;
// lane l gets row l / 4, elements 2·(l % 4) and + 1 of each: an m16n8k16 B
// fragment, the words two 32-bit loads would give.
__device__ __forceinline__ void ldmatrix_x2(uint32_t& r0, uint32_t& r1, const void* smem_row) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(s));
}
__device__ __forceinline__ void ldmatrix_x2_trans(uint32_t& r0, uint32_t& r1, const void* smem_row) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem_row));
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.trans.shared.b16 {%0,%1}, [%2];" : "=r"(r0), "=r"(r1) : "r"(s));
}
__device__ __forceinline__ void cp_async16_att(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
}

// A warp's online-softmax state over its tiles, for head rows gr and gr + 8
// (gr = lane / 4): o in the C-fragment layout of the output (n-tile n, dims
// n·8 + 2·(lane % 4) + {0, 1}, rows gr then gr + 8), m and l per head row
// (the same in the row's 4 lanes).
template <int D>
struct MmaState {
  float o[D / 8][4];
  float m[2], l[2];
};
template <int D>
__device__ __forceinline__ void mma_state_init(MmaState<D>& st) {
#pragma unroll
  for (int n = 0; n < D / 8; ++n)
#pragma unroll
    for (int i = 0; i < 4; ++i) st.o[n][i] = 0.0f;
  st.m[0] = st.m[1] = -INFINITY;
  st.l[0] = st.l[1] = 0.0f;
}
// acc absorbs w (the split kernels' warp merge, in registers).
template <int D>
__device__ __forceinline__ void mma_state_merge(MmaState<D>& acc, const MmaState<D>& w) {
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float M, c0, c1;
    merge_weights(acc.m[h], w.m[h], M, c0, c1);
#pragma unroll
    for (int n = 0; n < D / 8; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) acc.o[n][2 * h + c] = merge_value(acc.o[n][2 * h + c], w.o[n][2 * h + c], c0, c1);
    acc.l[h] = merge_value(acc.l[h], w.l[h], c0, c1);
    acc.m[h] = M;
  }
}

// Q fragments (A of m16n8k16) of row t's heads g·G ...: rows gr and gr + 8
// are heads; heads >= G are zeros.
template <int D>
__device__ __forceinline__ void load_q_frags(uint32_t (&qa)[D / 16][4], const __nv_bfloat16* q, int64_t t,
                                             int64_t ldq, int g, int G, int lane) {
  const int gr = lane >> 2, tq = lane & 3;
  const __nv_bfloat16* q0 = q + t * ldq + int64_t(g * G) * D;
  auto qpair = [&](int head, int dim) -> uint32_t {
    return head < G ? *reinterpret_cast<const uint32_t*>(q0 + int64_t(head) * D + dim) : 0u;
  };
#pragma unroll
  for (int ks = 0; ks < D / 16; ++ks) {
    qa[ks][0] = qpair(gr, ks * 16 + 2 * tq);
    qa[ks][1] = qpair(gr + 8, ks * 16 + 2 * tq);
    qa[ks][2] = qpair(gr, ks * 16 + 2 * tq + 8);
    qa[ks][3] = qpair(gr + 8, ks * 16 + 2 * tq + 8);
  }
}

// S = Q·Kᵀ of a tile, scaled, keys without okmask's bit -INFINITY. krow[n]:
// the K row of key n·8 + (lane % 8), 16 bytes on for lanes 8..15 (the
// rows this lane addresses for ldmatrix; tile_rows): one ldmatrix.x2 a k16
// step fetches key n·8 + gr's B fragment, half the instructions of two
// 32-bit loads (an x4 for two steps made the 255-register prefill kernel
// spill, and so does adding the lanes' 16 bytes here instead of in krow:
// 72 bytes). s[n][2h + c]: head row gr + 8h, key n·8 + 2·tq + c.
template <int D>
__device__ __forceinline__ void mma_tile_scores(float (&s)[4][4], const uint32_t (&qa)[D / 16][4],
                                                const unsigned char* const (&krow)[4], unsigned okmask, float scale,
                                                int lane) {
  const int tq = lane & 3;
#pragma unroll
  for (int n = 0; n < 4; ++n) {
#pragma unroll
    for (int i = 0; i < 4; ++i) s[n][i] = 0.0f;
#pragma unroll
    for (int ks = 0; ks < D / 16; ++ks) {
      uint32_t b0, b1;
      ldmatrix_x2(b0, b1, krow[n] + ks * 32);
      mma_bf16_16816(s[n], qa[ks][0], qa[ks][1], qa[ks][2], qa[ks][3], b0, b1);
    }
  }
  if (okmask == 0xffffffffu) {  // every key has a row (most tiles): no mask to apply
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int i = 0; i < 4; ++i) s[n][i] = __fmul_rn(s[n][i], scale);
    return;
  }
#pragma unroll
  for (int n = 0; n < 4; ++n)
#pragma unroll
    for (int h = 0; h < 2; ++h)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const int key = n * 8 + 2 * tq + c;
        s[n][2 * h + c] = (okmask >> key) & 1u ? __fmul_rn(s[n][2 * h + c], scale) : -INFINITY;
      }
}

// The online softmax over the tile's scores, then O += P·V (P rounded to
// bf16 for its product, as flash-attention does; the sums stay in fp32).
// vrow[kk]: the V row of key kk·16 + (lane % 16), for ldmatrix.trans.
// FRESH: st is mma_state_init's (m = -inf, l = 0, o = +0), so the
// correction is 0 and the rescale would give o = +0 · 0 = +0 and
// l = fma(0, 0, sum) = sum exactly: skipped, the same bits, 64 fewer
// multiplies a tile (every tile of a chunk of at most 4 starts a state).
template <int D, bool FRESH = false>
__device__ __forceinline__ void mma_tile_accumulate(MmaState<D>& st, float (&s)[4][4],
                                                    const unsigned char* const (&vrow)[2]) {
  float pr[4][4];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float mx = -INFINITY;
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) mx = fmaxf(mx, s[n][2 * h + c]);
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
    mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
    const float m_new = fmaxf(st.m[h], mx);
    // A masked score is -inf, and e^(-inf - m) = +0 from attn_exp itself;
    // only a row with no key at all (m_new = -inf, so -inf - -inf = NaN)
    // needs the guard, once.
    const float mref = m_new == -INFINITY ? 0.0f : m_new;
    float sum = 0.0f;
#pragma unroll
    for (int n = 0; n < 4; ++n)
#pragma unroll
      for (int c = 0; c < 2; ++c) {
        const float v = s[n][2 * h + c];
        const float e = attn_exp(__fsub_rn(v, mref));
        pr[n][2 * h + c] = e;
        sum = __fadd_rn(sum, e);
      }
    sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 1));
    sum = __fadd_rn(sum, __shfl_xor_sync(0xffffffffu, sum, 2));
    if constexpr (FRESH) {
      st.l[h] = sum;
    } else {
      const float corr = m_new == -INFINITY ? 0.0f : attn_exp(__fsub_rn(st.m[h], m_new));
      st.l[h] = __fmaf_rn(st.l[h], corr, sum);
#pragma unroll
      for (int n = 0; n < D / 8; ++n) st.o[n][2 * h] = __fmul_rn(st.o[n][2 * h], corr),
                                      st.o[n][2 * h + 1] = __fmul_rn(st.o[n][2 * h + 1], corr);
    }
    st.m[h] = m_new;
  }
  // O += P·V: two k-steps of 16 keys; P's C fragments are its A fragments.
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) {
    const uint32_t a0 = pack_bf16x2(pr[2 * kk][0], pr[2 * kk][1]), a1 = pack_bf16x2(pr[2 * kk][2], pr[2 * kk][3]);
    const uint32_t a2 = pack_bf16x2(pr[2 * kk + 1][0], pr[2 * kk + 1][1]),
                   a3 = pack_bf16x2(pr[2 * kk + 1][2], pr[2 * kk + 1][3]);
#pragma unroll
    for (int n = 0; n < D / 8; ++n) {
      uint32_t b0, b1;
      ldmatrix_x2_trans(b0, b1, vrow[kk] + n * 16);
      mma_bf16_16816(st.o[n], a0, a1, a2, a3, b0, b1);
    }
  }
}

// Key j0 + lane of a tile (lane < nv): its element index (-1: no row, an
// error recorded when the table has no page) and whether it is in
// k_new/v_new (`fresh`). Reads the plan and the block table only.
__device__ __forceinline__ int64_t tile_key(const KvArgs& a, const PlanDev& P, const RowSeq& rs, int64_t j0, int nv,
                                            int64_t kv_off, bool& fresh, DeviceError* err, int op, int lane) {
  fresh = false;
  return lane < nv ? key_row(a, P, rs, j0 + lane, kv_off, fresh, err, op) : -1;
}

// Which rows copy_tile_rows copies: the cache's (and the zeros of keys
// without a row), this step's k/v, or both.
constexpr int kCopyCached = 1, kCopyFresh = 2, kCopyAll = 3;

// Issues (does not commit) the cp.async copies of a tile's K and V rows
// into a warp's buffers (32 rows of RB bytes each), lane i's (idx, fresh)
// being key i's (tile_key); keys without a row are zeros.
// The cache holds only earlier steps' rows, so the split kernel copies them
// before it waits for the kernel before it and this step's rows after.
// Each row is copied by D / 8 consecutive lanes (one 16-byte piece each,
// coalesced); the owning lane's row addresses and byte count reach them by
// shuffle, once a row. A pass with nothing to copy costs one vote.
template <int D>
__device__ __forceinline__ void copy_tile_rows(unsigned char* ks, unsigned char* vs, const KvArgs& a, int64_t idx,
                                               bool fresh, int which) {
  constexpr int RB = mma_row_bytes<D>();
  constexpr int kPieces = D / 8;       // 16-byte pieces a row
  constexpr int kRows = 32 / kPieces;  // rows a pass of the warp covers
  static_assert(32 % kPieces == 0, "a row's pieces within a warp");
  const int lane = threadIdx.x & 31, sub = lane / kPieces, piece = lane % kPieces;
  // This lane's key: 16 bytes a piece (a row), 0 (no row: zeros), or -1
  // (the other pass copies it).
  const int bytes = !(which & (fresh ? kCopyFresh : kCopyCached)) ? -1 : idx < 0 ? 0 : 16;
  if (!__any_sync(0xffffffffu, bytes >= 0)) return;
  const int64_t at = idx < 0 ? 0 : idx;
  const uint64_t kr = reinterpret_cast<uint64_t>(static_cast<const __nv_bfloat16*>(fresh ? a.k_new : a.ck) + at);
  const uint64_t vr = reinterpret_cast<uint64_t>(static_cast<const __nv_bfloat16*>(fresh ? a.v_new : a.cv) + at);
#pragma unroll
  for (int i = 0; i < 32 / kRows; ++i) {
    const int key = i * kRows + sub;
    const int n = __shfl_sync(0xffffffffu, bytes, key);
    const uint64_t k = __shfl_sync(0xffffffffu, kr, key) + 16u * piece;
    const uint64_t v = __shfl_sync(0xffffffffu, vr, key) + 16u * piece;
    if (n < 0) continue;
    cp_async16_att(ks + key * RB + piece * 16, reinterpret_cast<const void*>(k), n);
    cp_async16_att(vs + key * RB + piece * 16, reinterpret_cast<const void*>(v), n);
  }
}
__device__ __forceinline__ void copy_tile_wait() {
  asm volatile("cp.async.commit_group;");
  asm volatile("cp.async.wait_group 0;" ::: "memory");
  __syncwarp();
}

// Copies the K and V rows of keys j0 .. j0 + nv - 1 into a
// warp's tile buffers (32 rows of RB bytes each); rows without a page and
// rows nv.. are zeros. Returns the keys that have a row (bit per key).
// Waits for the copies. (The prefill kernel's form: its registers are at
// the limit, and this loop needs fewer live than copy_tile_rows.)
template <int D>
__device__ __forceinline__ unsigned stage_tile_warp(unsigned char* ks, unsigned char* vs, const KvArgs& a,
                                                    const PlanDev& P, const RowSeq& rs, int64_t j0, int nv,
                                                    int64_t kv_off, DeviceError* err, int op, int lane) {
  constexpr int RB = mma_row_bytes<D>();
  bool fresh = false;
  const int64_t idx = tile_key(a, P, rs, j0, nv, kv_off, fresh, err, op, lane);
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
    cp_async16_att(ks + key * RB + piece * 16, kb + off, ok ? 16 : 0);
    cp_async16_att(vs + key * RB + piece * 16, vb + off, ok ? 16 : 0);
  }
  copy_tile_wait();
  return okmask;
}

// The rows of a tile in a warp's own buffers: key i at base + i·RB.
template <int D>
__device__ __forceinline__ void tile_rows(const unsigned char* ks, const unsigned char* vs, int lane,
                                          const unsigned char* (&krow)[4], const unsigned char* (&vrow)[2]) {
  constexpr int RB = mma_row_bytes<D>();
#pragma unroll
  for (int n = 0; n < 4; ++n) krow[n] = ks + (n * 8 + (lane & 7)) * RB + (lane >> 3) * 16;  // mma_tile_scores' ldmatrix rows
#pragma unroll
  for (int kk = 0; kk < 2; ++kk) vrow[kk] = vs + (kk * 16 + (lane & 15)) * RB;
}

}  // namespace muse::cuda::attn

namespace muse::cuda {

// One attention call as the kernels see it.
struct AttnCall {
  void* out;
  int odt;
  int64_t ldo;
  const void* q;
  int qdt;
  int64_t ldq;
  attn::KvArgs a;
  PlanDev P;
  int64_t T;
  int d, G, hq;
  int64_t window;
  float scale;
  DeviceError* err;
  int op;
  int chunks;  // split path: chunk blocks per row (kMaxChunks, fewer when the plan says no row has more)
  // The merge (split path) also does output_gate on its output (gate
  // non-null; g laid out as out) and kv_store of the step's k/v (store_kv),
  // with their bits (CudaBackend::attention_store_gate); the prefill kernel
  // the gate without head_norm only, never store_kv.
  const void* gate = nullptr;
  int gdt = 0;
  bool head_norm = false;
  float gate_eps = 0.0f;
  bool store_kv = false;
  // With `gate` (the fused merge, or the prefill kernel): the outputs are
  // also written in the wgmma products' order xperm_offset bytes into the
  // scratch (split path: after the chunk partials; offer_xperm).
  bool xperm = false;
  size_t xperm_offset = 0;
  // Split path: CudaBackendOptions::attention_merge (0 the rule, 1 a block
  // a (row, q head), 2 a warp; the same bits).
  int merge_kernel = 0;
};

// cuda_attention_split.cu. The split path: chunk partials in `part`
// (split_scratch_bytes), then the merge, slab after slab of rows. `vec`:
// vector loads allowed; `mma`: the tensor-core kernel (BF16 everywhere, heads of 64
// or 128: CudaBackend::attention decides).
size_t split_scratch_bytes(int64_t T, int hq, int d, int chunks);
// Whether the split path runs T rows in one chunk launch and one merge (so
// the merge comes after every row's cache reads and may write the cache).
bool split_attention_one_slab(int64_t T, int hq, int d, int chunks);
bool split_attention_covers(int G, int d);
// between: if set, launched after the (one slab's) chunk kernel and before
// its merge (the output gate's product: CudaBackend::launch_gate_product).
cudaError_t run_split_attention(cudaStream_t s, const AttnCall& c, float* part, bool vec, bool mma,
                                const std::function<cudaError_t(cudaStream_t)>& between = {});

// cuda_attention_merge.cu. The merge of one slab's chunk partials (rows r0
// .. r0 + rows - 1 of the call, `launched` chunks a (row, head) apart in
// `part`) with the call's tail (gate, store_kv; xp: the outputs also in the
// products' order, rows of Kp), by c.merge_kernel (the same bits).
cudaError_t launch_attention_merge(cudaStream_t s, const AttnCall& c, const float* part, int64_t r0, int64_t rows,
                                   __nv_bfloat16* xp, int64_t Kp);

// cuda_attention_prefill.cu: the same bits as run_split_attention(mma) for
// every row, for steps of at least kPrefillMinRows rows with a sequence of
// that many (CudaBackend::attention; cuda_attention_prefill.cu says why).
// `scratch`: where c.xperm's copy goes.
constexpr int64_t kPrefillMinRows = 64;
cudaError_t run_prefill_attention(cudaStream_t s, const AttnCall& c, void* scratch);

}  // namespace muse::cuda
