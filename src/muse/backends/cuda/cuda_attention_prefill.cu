// Prefill attention: for steps of many rows (T >= kPrefillMinRows, and a
// sequence with that many rows when the plan's max_seq_rows hint is set)
// with q, k, v and the cache all BF16, heads of 64 or 128 and at most 16 q
// heads per kv head, the same bits per row as the split path
// (attention_mma_kernel's chunk partials merged by attention_merge_kernel).
//
// Why: for a prefill the split path makes every query row stage its own K/V
// tiles (an 8K-token prompt: 8192 rows x 2 kv heads x ~4096 keys x 512 B,
// ~34 GB from L2 per layer) and write, then read back, up to 128 chunk
// partials of 16 x 130 floats per (row, kv head) (~17 GB per layer through
// HBM, in 256 MiB slabs). Here a block owns 8 consecutive rows of one
// sequence (one per warp) and one kv head; it stages each window of keys in
// shared memory once for its 8 rows and folds each chunk into the row's
// output as soon as the chunk is done, so no partial leaves the SM.
//
// Same bits. Each row walks exactly the split path's tiles (32 keys from
// lo, chunks of chunk_keys(nkeys)) with the shared tile arithmetic of
// cuda_attention.cuh: same Q and K fragments, same masks, same P·V
// fragments (keys past the row's last one read a zero row, as the split
// kernel's zero-filled copies), same ops in the same order. A chunk of the
// split kernel is 4 warps, warp w taking tiles w, w + 4, ..., merged in warp
// order; here one warp plays the 4 roles in turn (a role without tiles is
// merged as the empty state, as a warp without tiles is). The merge kernel
// merges a row's chunks in chunk order from the empty state (merge_weights,
// merge_value), so each chunk is merged into the row's output (in shared
// memory) and sum (in registers) as soon as it is done: one pass over the
// keys, and the end divides.
//
// Shared windows serve a block whose rows are all of one sequence and see
// at most kWindowMaxKeys keys (chunks of at most 4 tiles, so a chunk's
// roles are its tiles in key order). Any other block (rows of several
// sequences, longer contexts) runs each warp's row on its own, staging one
// tile at a time as the split kernel does: slower, the same bits.
#include <algorithm>

#include "muse/backends/cuda/cuda_attention.cuh"
#include "muse/backends/cuda/cuda_mma.cuh"

namespace muse::cuda {
namespace {

using namespace attn;

constexpr int kRowsPerBlock = 8;  // one row per warp
constexpr int kWinKeys = 128;     // keys per staged window (2 threads per key)
constexpr int kWinStep = 96;      // sliding rows: windows 96 keys apart, so a tile starting in one ends in it
constexpr int64_t kWindowMaxKeys = 32768;  // chunk_keys() <= 128: at most kMmaAttnWarps tiles per chunk
static_assert(kRowsPerBlock * 32 == 2 * kWinKeys, "the staging gives each thread half a key row");
static_assert(kWinStep + 32 <= kWinKeys, "a tile starting in a window's step must end inside it");

// Dynamic shared memory, in bytes: K and V windows, double buffered (the
// per-warp tiles of the unshared mode reuse them), then per warp the output
// being folded (fp32, the C-fragment layout, lane-major: conflict-free
// float4s) and each lane's (M, L) of its two head rows (in shared memory,
// not registers: the D = 128 kernel is at 255 registers and spilled them),
// a zero row, the windows' key flags.
template <int D>
struct PrefillSmem {
  static constexpr int RB = mma_row_bytes<D>();
  static constexpr size_t win = size_t(kWinKeys) * RB;  // one K or V window
  static constexpr size_t ofin = 4 * win;               // [buffer][K, V]
  static constexpr size_t ml = ofin + size_t(kRowsPerBlock) * 16 * D * 4;
  static constexpr size_t zero = ml + size_t(kRowsPerBlock) * 32 * 16;
  static constexpr size_t valid = zero + RB;
  static constexpr size_t bytes = valid + 2 * kWinKeys;
  static_assert(size_t(kRowsPerBlock) * 2 * 32 * RB <= 4 * win, "per-warp tiles fit in the windows");
};

template <int D>
__global__ void __launch_bounds__(kRowsPerBlock * 32, 1)
    attention_prefill_kernel(void* out, int odt, int64_t ldo, const __nv_bfloat16* __restrict__ q, int64_t ldq,
                             KvArgs a, PlanDev P, int64_t T, int G, int64_t window, float scale, DeviceError* err,
                             int op, const void* gate, int gdt, __nv_bfloat16* __restrict__ xp, int64_t Kp) {
  using L = PrefillSmem<D>;
  constexpr int RB = L::RB, NT = D / 8;
  extern __shared__ __align__(16) unsigned char sm[];
  __shared__ RowSeq s_rs;
  __shared__ int64_t s_p0, s_lo0;
  pdl_launch_dependents();  // the o projection waits for us
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31, gr = lane >> 2, tq = lane & 3;
  const int g = blockIdx.y;
  // The last rows (the most keys) first: the long blocks start early.
  const int64_t t0 = (int64_t(gridDim.x) - 1 - blockIdx.x) * kRowsPerBlock, t = t0 + warp;
  const bool has_row = t < T;
  RowSeq rs{};
  const bool ok = has_row && row_sequence(P, t, T, rs, err, op, lane == 0);
  const int64_t p = ok ? rs.pos_begin + (t - rs.row_begin) : 0;
  const int64_t lo = window_lo(p, window), nkeys = p - lo + 1;
  const int64_t tpc = chunk_keys(nkeys) / 32, ntiles = (nkeys + 31) / 32;  // tiles per chunk, per row
  if (threadIdx.x == 0) s_rs = rs, s_p0 = p, s_lo0 = lo;  // warp 0 has row t0 < T
  float4* ofin = reinterpret_cast<float4*>(sm + L::ofin) + size_t(warp) * NT * 32;
  const unsigned char* zero = sm + L::zero;
  unsigned char* valid = sm + L::valid;
#pragma unroll
  for (int n = 0; n < NT; ++n) ofin[n * 32 + lane] = make_float4(0.0f, 0.0f, 0.0f, 0.0f);
  for (int i = threadIdx.x; i < RB / 4; i += blockDim.x) reinterpret_cast<uint32_t*>(sm + L::zero)[i] = 0u;
  __syncthreads();
  const bool shared_keys =
      __syncthreads_and(!has_row || (ok && rs.s == s_rs.s && nkeys <= kWindowMaxKeys)) != 0;

  uint32_t qa[D / 16][4];
  if (ok) load_q_frags<D>(qa, q, t, ldq, g, G, lane);
  const int64_t kv_off = int64_t(g) * D;
  // The row's state over the chunks merged so far, per head row: output
  // ofin, max and sum (M0, M1, L0, L1) ml.
  float4* ml = reinterpret_cast<float4*>(sm + L::ml) + warp * 32 + lane;
  *ml = make_float4(-INFINITY, -INFINITY, 0.0f, 0.0f);
  MmaState<D> acc;  // the chunk being built (its warp 0 role, then the others merged)
  mma_state_init(acc);  // (left to the first tile, ptxas spilled 16 bytes at D = 128)
  // The chunk is done: merge it as the merge kernel does.
  auto fold = [&]() {
    float c0[2], c1[2];
    float4 r = *ml;
    merge_weights(r.x, acc.m[0], r.x, c0[0], c1[0]);
    merge_weights(r.y, acc.m[1], r.y, c0[1], c1[1]);
    r.z = merge_value(r.z, acc.l[0], c0[0], c1[0]);
    r.w = merge_value(r.w, acc.l[1], c0[1], c1[1]);
    *ml = r;
#pragma unroll
    for (int n = 0; n < NT; ++n) {
      float4 v = ofin[n * 32 + lane];
      v.x = merge_value(v.x, acc.o[n][0], c0[0], c1[0]), v.y = merge_value(v.y, acc.o[n][1], c0[0], c1[0]);
      v.z = merge_value(v.z, acc.o[n][2], c0[1], c1[1]), v.w = merge_value(v.w, acc.o[n][3], c0[1], c1[1]);
      ofin[n * 32 + lane] = v;
    }
  };

  if (shared_keys) {
    // Keys [kb0, p_last]: the block's rows' union (lo and p grow with the row).
    const RowSeq srs = s_rs;
    const int64_t kb0 = s_lo0, p_last = s_p0 + (std::min<int64_t>(T, t0 + kRowsPerBlock) - 1 - t0);
    // Rows with one lo (full layers) have their tiles on one 32-key grid, so
    // windows need not overlap; sliding rows' tiles start anywhere.
    const int64_t step = window_lo(p_last, window) == kb0 ? kWinKeys : kWinStep;
    const int64_t nwin = (p_last + 1 - kb0 + step - 1) / step;
    // Thread i copies half of key i / 2's K and V rows; keys without a page
    // are zeros and unflagged, as in the split kernel.
    auto stage = [&](int buf, int64_t kb) {
      const int key = threadIdx.x >> 1, half = threadIdx.x & 1;
      const int64_t j = kb + key;
      int64_t idx = -1;
      bool fresh = false;
      if (j <= p_last) idx = key_row(a, P, srs, j, kv_off, fresh, err, op);
      if (half == 0) valid[buf * kWinKeys + key] = idx >= 0;
      if (j > p_last) return;  // no row of the block sees it
      const bool okr = idx >= 0;
      const __nv_bfloat16* kb_ = static_cast<const __nv_bfloat16*>(fresh ? a.k_new : a.ck);
      const __nv_bfloat16* vb_ = static_cast<const __nv_bfloat16*>(fresh ? a.v_new : a.cv);
      unsigned char* kd = sm + size_t(2 * buf) * L::win + size_t(key) * RB;
      unsigned char* vd = kd + L::win;
      constexpr int kHalf = D / 16;  // 16-byte pieces per half row
#pragma unroll
      for (int pc = half * kHalf; pc < (half + 1) * kHalf; ++pc) {
        const int64_t off = okr ? idx + pc * 8 : 0;
        cp_async16_att(kd + pc * 16, kb_ + off, okr ? 16 : 0);
        cp_async16_att(vd + pc * 16, vb_ + off, okr ? 16 : 0);
      }
    };
    stage(0, kb0);
    asm volatile("cp.async.commit_group;");
    for (int64_t wi = 0; wi < nwin; ++wi) {
      const int buf = int(wi & 1);
      const int64_t kb = kb0 + wi * step;
      if (wi + 1 < nwin) {
        stage(buf ^ 1, kb + step);
        asm volatile("cp.async.commit_group;");
        asm volatile("cp.async.wait_group 1;" ::: "memory");
      } else {
        asm volatile("cp.async.wait_group 0;" ::: "memory");
      }
      __syncthreads();
      // This row's tiles that start in [kb, kb + step).
      for (int64_t k = has_row ? (kb <= lo ? 0 : (kb - lo + 31) / 32) : ntiles;
           k < ntiles && lo + 32 * k < kb + step; ++k) {
        const int64_t j0 = lo + 32 * k;
        const int nv = int(p + 1 - j0 < 32 ? p + 1 - j0 : 32), off = int(j0 - kb);
        const unsigned char* kbase = sm + size_t(2 * buf) * L::win + size_t(off) * RB;
        const unsigned char* vbase = kbase + L::win;
        const unsigned char* krow[4];
        const unsigned char* vrow[2];
#pragma unroll
        for (int n = 0; n < 4; ++n) {
          const int key = n * 8 + (lane & 7);  // the row this lane addresses for ldmatrix
          krow[n] = (key < nv ? kbase + key * RB : zero) + (lane >> 3) * 16;
        }
#pragma unroll
        for (int kk = 0; kk < 2; ++kk) {
          const int key = kk * 16 + (lane & 15);
          vrow[kk] = key < nv ? vbase + key * RB : zero;
        }
        const unsigned okmask = __ballot_sync(0xffffffffu, lane < nv && valid[buf * kWinKeys + off + lane]);
        float s[4][4];
        mma_tile_scores<D>(s, qa, krow, okmask, scale, lane);
        // Tile i of chunk z is warp i's only tile in the split kernel.
        const int64_t z = k / tpc, i = k - z * tpc;
        if (i == 0) {
          mma_state_init(acc);
          mma_tile_accumulate<D, true>(acc, s, vrow);
        } else {
          MmaState<D> ro;
          mma_state_init(ro);
          mma_tile_accumulate<D, true>(ro, s, vrow);
          mma_state_merge(acc, ro);
        }
        if (i == tpc - 1 || k == ntiles - 1) {
          for (int64_t r = i + 1; r < kMmaAttnWarps; ++r) {  // the warps without a tile
            MmaState<D> e;
            mma_state_init(e);
            mma_state_merge(acc, e);
          }
          fold();
        }
      }
      __syncthreads();  // the buffer is restaged two windows on
    }
  } else if (ok) {
    // The row alone, one tile at a time through the warp's own buffers.
    unsigned char* ks = sm + size_t(warp) * 2 * 32 * RB;
    unsigned char* vs = ks + 32 * RB;
    const unsigned char* krow[4];
    const unsigned char* vrow[2];
    tile_rows<D>(ks, vs, lane, krow, vrow);
    auto scores = [&](int64_t k, float (&s)[4][4]) {
      const int64_t j0 = lo + 32 * k;
      const int nv = int(p + 1 - j0 < 32 ? p + 1 - j0 : 32);
      const unsigned okmask = stage_tile_warp<D>(ks, vs, a, P, rs, j0, nv, kv_off, err, op, lane);
      mma_tile_scores<D>(s, qa, krow, okmask, scale, lane);
    };
    const int64_t nch = (ntiles + tpc - 1) / tpc;
    for (int64_t z = 0; z < nch; ++z) {
      const int64_t k0 = z * tpc, k1 = std::min(k0 + tpc, ntiles);
      mma_state_init(acc);
      for (int64_t k = k0; k < k1; k += kMmaAttnWarps) {
        float s[4][4];
        scores(k, s);
        mma_tile_accumulate<D>(acc, s, vrow);  // (FRESH on the first tile: ptxas spills at 255 registers)
      }
      for (int r = 1; r < kMmaAttnWarps; ++r) {
        MmaState<D> ro;
        mma_state_init(ro);
        for (int64_t k = k0 + r; k < k1; k += kMmaAttnWarps) {
          float s[4][4];
          scores(k, s);
          mma_tile_accumulate<D>(ro, s, vrow);
        }
        mma_state_merge(acc, ro);
      }
      fold();
    }
  }
  if (!ok) return;
  const float4 r = *ml;
  const float Lr[2] = {r.z, r.w};
  // o / L, gated as output_gate_kernel gates the stored value (gate), and
  // with xp the values as stored in the products' order too: 32-k block b
  // of a head is 4 16-byte pieces, piece p the pairs 8j + 2p (j = 0..3),
  // which are this lane's n-tiles 4b..4b+3 when p = tq (the merge kernel's
  // layout).
#pragma unroll
  for (int b = 0; b < NT / 4; ++b) {
    uint32_t words[2][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const int n = 4 * b + j;
      const float4 v = ofin[n * 32 + lane];
      const float o[4] = {v.x, v.y, v.z, v.w};
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int head = gr + 8 * h;
        float y[2];
#pragma unroll
        for (int c = 0; c < 2; ++c) {
          const int64_t at = t * ldo + int64_t(g * G + head) * D + n * 8 + 2 * tq + c;
          y[c] = chunk_out(o[2 * h + c], Lr[h]);
          if (head < G && gate) y[c] = as_stored(odt, y[c]) * sigmoidf_(ld(gate, gdt, at));
          if (head < G) st(out, odt, at, y[c]);
        }
        words[h][j] = pack_bf16x2(y[0], y[1]);
      }
    }
    if (xp)
#pragma unroll
      for (int h = 0; h < 2; ++h)
        if (gr + 8 * h < G)
          *reinterpret_cast<uint4*>(xp + t * Kp + int64_t(g * G + gr + 8 * h) * D + 8 * (4 * b + tq)) =
              make_uint4(words[h][0], words[h][1], words[h][2], words[h][3]);
  }
}

template <int D>
cudaError_t launch_prefill(cudaStream_t s, const AttnCall& c, __nv_bfloat16* xp) {
  constexpr size_t smem = PrefillSmem<D>::bytes;
  if (cudaError_t e = allow_dynamic_smem<attention_prefill_kernel<D>>(int(smem)); e != cudaSuccess) return e;
  const dim3 grid(unsigned((c.T + kRowsPerBlock - 1) / kRowsPerBlock), unsigned(c.hq / c.G));
  attention_prefill_kernel<D><<<grid, kRowsPerBlock * 32, smem, s>>>(
      c.out, c.odt, c.ldo, static_cast<const __nv_bfloat16*>(c.q), c.ldq, c.a, c.P, c.T, c.G, c.window, c.scale,
      c.err, c.op, c.gate, c.gdt, xp, xp ? wgmma_xperm_elements(1, int64_t(c.hq) * c.d) : 0);
  return cudaGetLastError();
}

}  // namespace

cudaError_t run_prefill_attention(cudaStream_t s, const AttnCall& c, void* scratch) {
  auto* xp = c.xperm ? reinterpret_cast<__nv_bfloat16*>(static_cast<char*>(scratch) + c.xperm_offset) : nullptr;
  return c.d == 64 ? launch_prefill<64>(s, c, xp) : launch_prefill<128>(s, c, xp);
}

}  // namespace muse::cuda
