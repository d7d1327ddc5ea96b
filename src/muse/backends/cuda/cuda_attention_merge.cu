// The split path's merge: each (row, q head)'s chunk partials (m, l,
// acc[d], as the chunk kernels of cuda_attention_split.cu store them)
// merged in chunk order from the empty state, then o / L, with the op's
// tail: the output gate, the step's k/v into the cache, o's copy in the
// products' order.
//
// Two kernels, the same arithmetic in the same order, so the same bits:
// - attention_merge_warp_kernel (the rule): a warp a (row, head), lane l
//   holding dims l, l + 32, ...; every load that depends on no other (the
//   chunks' m and l, the first chunks' values, the gate, the k/v it stores)
//   in one round, the chunk weights by a scan across the lanes, then each
//   chunk's weights shuffled to every lane. Four (row, head)s a block.
// - attention_merge_kernel: a block of 128 threads a (row, head), thread i
//   dim i, the weights by warp 0 through shared memory.
// Why the warp: at batch 64 the block form runs 2,048 blocks (Glimmer, 32
// heads) of 72 registers, seven an SM: more than two waves of a chain of
// L2 rounds and barriers, 14-15 µs a layer for 10 MB (ncu on an H100,
// 2026-12-07), between the chunks and the o projection. A warp needs no
// barrier, and 64 rows × 32 heads are 512 blocks of four warps (125
// registers: four blocks an SM): one wave. Below kWarpMergeFromUnits the
// rule keeps the blocks (see there).
#include <algorithm>

#include "muse/backends/cuda/cuda_attention.cuh"
#include "muse/backends/cuda/cuda_mma.cuh"  // launch_pdl

namespace muse::cuda {
namespace {

using namespace attn;

// The merge weights (c0, c1) of chunk z = 32·k + lane of a group of 32
// against the state of chunks 0..z-1, whose max is the prefix max of m
// (max is exact, so the scan's order does not matter); `carry` holds the
// max of the groups before and moves past this one. Both merges call it.
__device__ __forceinline__ void chunk_weights_in_warp(float m, int lane, float& carry, float& c0, float& c1) {
  float incl = m;
#pragma unroll
  for (int off = 1; off < 32; off <<= 1) {
    const float x = __shfl_up_sync(0xffffffffu, incl, off);
    if (lane >= off) incl = fmaxf(incl, x);
  }
  float before = __shfl_up_sync(0xffffffffu, incl, 1);
  before = fmaxf(lane == 0 ? -INFINITY : before, carry);
  float M;
  merge_weights(before, m, M, c0, c1);
  carry = fmaxf(carry, __shfl_sync(0xffffffffu, incl, 31));
}

// Piece c (16 bytes) of a head's outputs as stored (ob, d of them) in the
// products' order (wgmma_permute_x_kernel's): chunk p = c % 4 of 32-k
// block c / 4 is word p of that block's four 16-byte pieces. Both merges
// write o's permuted copy with it.
__device__ __forceinline__ uint4 head_xperm_piece(const __nv_bfloat16* ob, int c) {
  const int blk = c / 4, p = c % 4;
  uint32_t w[4];
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int e = 32 * blk + 8 * j + 2 * p;
    w[j] = uint32_t(__bfloat16_as_ushort(ob[e])) | uint32_t(__bfloat16_as_ushort(ob[e + 1])) << 16;
  }
  return make_uint4(w[0], w[1], w[2], w[3]);
}

// What the merge does after its outputs (AttnCall's gate and store_kv).
struct MergeTail {
  const void* gate;  // null: plain attention
  int gdt;
  bool head_norm;
  float eps;
  bool store_kv;
  int G;  // q heads per kv head
  KvArgs a;
  // Not null: the outputs also go here in the wgmma products' order (rows of
  // Kp; offer_xperm: the o projection after reads them so).
  __nv_bfloat16* xp;
  int64_t Kp;
};

// out row t, q head h: the chunks of attention_split_kernel merged in chunk
// order from the empty state (merge_weights, merge_value: chunk z's weights
// against chunks 0..z-1, by warp 0), every output dim and L by the same
// chain, then o / L.
//
// With a gate (attention_store_gate), each output is then gated exactly as
// output_gate_kernel does it from the stored value: o ← o ⊙ σ(g), or with
// head_norm rms(o_h) ⊙ σ(g_h), the head's sum of squares by one warp in
// output_gate's order (lane i, i + 32, ..., then the butterfly). With
// store_kv, the block of a kv head's first q head then writes that head's
// k/v of row t into the cache as kv_store_kernel does: every chunk block
// has read the cache by now (this kernel waits for the chunk kernel, and
// the caller runs all rows in one launch), so a sliding page may be reused.
__global__ void __launch_bounds__(128) attention_merge_kernel(void* out, int odt, int64_t ldo,
                                                              const float* __restrict__ part, PlanDev P, int64_t T,
                                                              int64_t r0, int d, int hq, int64_t window,
                                                              int launched, DeviceError* err, int op,
                                                              MergeTail tail) {
  pdl_launch_dependents();  // light: the next kernel may launch; it waits for us
  __shared__ float2 cz[kMaxChunks];  // chunk z's merge weights (c0, c1)
  __shared__ float lz[kMaxChunks];
  __shared__ float Ls;
  __shared__ float ov[kMaxHeadDim];  // head_norm: the head's stored outputs
  __shared__ int64_t dst;            // store_kv: the cache row of row t's position
  __shared__ __nv_bfloat16 ob[kMaxHeadDim];  // tail.xp: the outputs as stored
  const int64_t t = r0 + blockIdx.x;
  const int h = blockIdx.y;
  // Before waiting for the chunk kernel (launched with PDL): the plan and
  // the block table, which no kernel of this step writes (as the chunk
  // kernel does). Every block waits before it leaves.
  RowSeq rs;
  const bool ok = row_sequence(P, t, T, rs, err, op);
  const int64_t p = ok ? rs.pos_begin + (t - rs.row_begin) : 0;
  const bool store = ok && tail.store_kv && h % tail.G == 0;
  if (store && threadIdx.x == 0) dst = cache_row(tail.a, P, rs, p, err, op, true);
  pdl_wait();
  if (!ok) return;
  const int64_t lo = window_lo(p, window);
  const int64_t nkeys = p - lo + 1, C = chunk_keys(nkeys);
  const int nch = int((nkeys + C - 1) / C);
  if (nch > launched) {  // a wrong max_seq_end hint: chunks were not computed
    if (threadIdx.x == 0) report_error(err, op, kErrChunkHint, int(t), nch);
    return;
  }
  const int stride = part_stride(d);
  const float* base = part + (int64_t(blockIdx.x) * hq + h) * launched * stride;  // the chunk kernel's gridDim.z
  // One round of loads before the first barrier (none depends on another):
  // warp 0's m and l, and this thread's first dim's first chunk values, its
  // gate and (store) its k/v. (A thread's dims: i = threadIdx.x, + 128.)
  constexpr int kFirst = 8;
  const int i0 = threadIdx.x;
  const int64_t at0 = t * ldo + int64_t(h) * d + i0;
  const int64_t kv0 = int64_t(h / tail.G) * d + i0;
  float v0[kFirst];
#pragma unroll
  for (int u = 0; u < kFirst; ++u) v0[u] = i0 < d && u < nch ? base[u * stride + kPartHead + i0] : 0.0f;
  const float g0 = tail.gate && i0 < d ? ld(tail.gate, tail.gdt, at0) : 0.0f;
  const float k0 = store && i0 < d ? ld(tail.a.k_new, tail.a.ndt, t * tail.a.kv_dim + kv0) : 0.0f;
  const float w0 = store && i0 < d ? ld(tail.a.v_new, tail.a.ndt, t * tail.a.kv_dim + kv0) : 0.0f;
  if (threadIdx.x < 32) {
    // Chunk z's merge weights against the state of chunks 0..z-1: its max
    // is the prefix max of m (max is exact, so the scan's order does not
    // matter), the rest is merge_weights as the prefill kernel calls it.
    const int lane = threadIdx.x;
    float mv[kMaxChunks / 32], lv[kMaxChunks / 32];
#pragma unroll
    for (int k = 0; k < kMaxChunks / 32; ++k) {
      const int zz = lane + 32 * k;
      mv[k] = zz < nch ? base[zz * stride] : -INFINITY;
      lv[k] = zz < nch ? base[zz * stride + 1] : 0.0f;
    }
    float carry = -INFINITY;  // the max of the groups of 32 before
#pragma unroll
    for (int k = 0; k < kMaxChunks / 32; ++k) {
      if (32 * k >= nch) break;
      float c0, c1;
      chunk_weights_in_warp(mv[k], lane, carry, c0, c1);
      const int zz = lane + 32 * k;
      if (zz < nch) cz[zz] = make_float2(c0, c1), lz[zz] = lv[k];
    }
  }
  __syncthreads();
  // Output dim i's final value, stored (and kept as stored for tail.xp).
  auto put = [&](int i, int64_t at, float v) {
    st(out, odt, at, v);
    if (tail.xp) ob[i] = __float2bfloat16_rn(v);
  };
  // Every thread folds L alongside its first dim (an independent chain of
  // the same length), so no thread waits for another's.
  float L = 0.0f;
  for (int i = threadIdx.x; i < d; i += blockDim.x) {
    const bool first = i == i0;
    float o = 0.0f;
    int zz = 0;
    if (first) {
#pragma unroll
      for (int u = 0; u < kFirst; ++u)
        if (u < nch) {
          const float2 c = cz[u];
          o = merge_value(o, v0[u], c.x, c.y);
          L = merge_value(L, lz[u], c.x, c.y);
        }
      zz = nch < kFirst ? nch : kFirst;
    }
    for (; zz + 8 <= nch; zz += 8) {  // 8 loads in flight, then the merges in chunk order
      float v[8];
#pragma unroll
      for (int u = 0; u < 8; ++u) v[u] = base[(zz + u) * stride + kPartHead + i];
#pragma unroll
      for (int u = 0; u < 8; ++u) {
        const float2 c = cz[zz + u];
        o = merge_value(o, v[u], c.x, c.y);
        if (first) L = merge_value(L, lz[zz + u], c.x, c.y);
      }
    }
    for (; zz < nch; ++zz) {
      const float2 c = cz[zz];
      o = merge_value(o, base[zz * stride + kPartHead + i], c.x, c.y);
      if (first) L = merge_value(L, lz[zz], c.x, c.y);
    }
    const int64_t at = t * ldo + int64_t(h) * d + i;
    if (!tail.gate) {
      put(i, at, chunk_out(o, L));
    } else {
      const float x = as_stored(odt, chunk_out(o, L));
      if (tail.head_norm) ov[i] = x;
      else put(i, at, x * sigmoidf_(first ? g0 : ld(tail.gate, tail.gdt, at)));
    }
  }
  if (tail.gate && tail.head_norm) {
    __syncthreads();
    if (threadIdx.x < 32) {
      float ss = 0.0f;
      for (int i = threadIdx.x; i < d; i += 32) ss += ov[i] * ov[i];
      ss = warp_sum(ss);
      if (threadIdx.x == 0) Ls = 1.0f / sqrtf(ss / float(d) + tail.eps);
    }
    __syncthreads();
    const float r = Ls;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      const int64_t at = t * ldo + int64_t(h) * d + i;
      put(i, at, (ov[i] * r) * sigmoidf_(i == i0 ? g0 : ld(tail.gate, tail.gdt, at)));
    }
  }
  if (tail.xp) {  // the head's 32-k blocks in the products' order
    __syncthreads();
    for (int c = threadIdx.x; c < d / 8; c += blockDim.x)
      *reinterpret_cast<uint4*>(tail.xp + t * tail.Kp + int64_t(h) * d + 8 * c) = head_xperm_piece(ob, c);
  }
  if (store) {
    // dst was written before the barrier after the chunk weights; -2: a
    // sliding block the sequence does not keep.
    if (dst < 0) return;
    const KvArgs& a = tail.a;
    for (int i = threadIdx.x; i < d; i += blockDim.x) {
      const int64_t off = int64_t(h / tail.G) * d + i;
      st(a.ck, a.cdt, dst + off, i == i0 ? k0 : ld(a.k_new, a.ndt, t * a.kv_dim + off));
      st(a.cv, a.cdt, dst + off, i == i0 ? w0 : ld(a.v_new, a.ndt, t * a.kv_dim + off));
    }
  }
}


// ---------------------------------------------------------------------------
// The warp form. DJ = dims a lane holds (d <= 32·DJ); KB = chunks whose
// values are in flight at once (KB·DJ registers).
// ---------------------------------------------------------------------------
constexpr int kMergeWarps = 4;
// The rule: warps from this many (row, head)s a launch (Glimmer's 32 heads
// from 32 rows, Spark's 128 from 8), blocks below. H100, 2026-12-07
// (bench/NOTES.md), warps everywhere against blocks, four rounds: Glimmer
// batch 64 -0.2 ms a step (-0.9%), batch 4 and 16 +0.1 to +0.3 ms (the
// rule keeps blocks there), batch 1 and the Spark slice within noise.
constexpr int64_t kWarpMergeFromUnits = 1024;

template <int DJ>
__global__ void __launch_bounds__(kMergeWarps * 32)
    attention_merge_warp_kernel(void* out, int odt, int64_t ldo, const float* __restrict__ part, PlanDev P,
                                int64_t T, int64_t r0, int64_t rows, int d, int hq, int64_t window, int launched,
                                DeviceError* err, int op, MergeTail tail) {
  constexpr int KB = 64 / DJ < 16 ? 64 / DJ : 16;
  pdl_launch_dependents();  // light: the next kernel may launch; it waits for us
  __shared__ __nv_bfloat16 ob[kMergeWarps][32 * DJ];  // tail.xp: the head's outputs as stored
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int64_t u = int64_t(blockIdx.x) * kMergeWarps + warp;  // (slab row, head)
  const bool live = u < rows * hq;
  const int64_t rl = live ? u / hq : 0;
  const int h = live ? int(u % hq) : 0;
  const int64_t t = r0 + rl;
  // Before waiting for the chunk kernel (launched with PDL): the plan and
  // the block table, which no kernel of this step writes. Every warp waits
  // before it leaves.
  RowSeq rs;
  const bool ok = live && row_sequence(P, t, T, rs, err, op, lane == 0);
  const int64_t p = ok ? rs.pos_begin + (t - rs.row_begin) : 0;
  const bool store = ok && tail.store_kv && h % tail.G == 0;  // the warp of a kv head's first q head
  int64_t dst = -1;
  if (store && lane == 0) dst = cache_row(tail.a, P, rs, p, err, op, true);
  pdl_wait();
  if (!ok) return;  // the whole warp: ok is the same in every lane
  const int64_t lo = window_lo(p, window);
  const int64_t nkeys = p - lo + 1, C = chunk_keys(nkeys);
  const int nch = int((nkeys + C - 1) / C);
  if (nch > launched) {  // a wrong max_seq_end hint: chunks were not computed
    if (lane == 0) report_error(err, op, kErrChunkHint, int(t), nch);
    return;
  }
  const int stride = part_stride(d);
  const float* base = part + (rl * hq + h) * launched * stride;  // the chunk kernel's gridDim.z
  const int64_t at = t * ldo + int64_t(h) * d;
  const int64_t kv_at = t * tail.a.kv_dim + int64_t(h / tail.G) * d;
  // The gate and the k/v this warp stores: they depend on nothing.
  float gv[DJ], kv[DJ], vv[DJ];
#pragma unroll
  for (int j = 0; j < DJ; ++j) {
    const int i = lane + 32 * j;
    gv[j] = tail.gate && i < d ? ld(tail.gate, tail.gdt, at + i) : 0.0f;
    kv[j] = store && i < d ? ld(tail.a.k_new, tail.a.ndt, kv_at + i) : 0.0f;
    vv[j] = store && i < d ? ld(tail.a.v_new, tail.a.ndt, kv_at + i) : 0.0f;
  }
  float o[DJ];
#pragma unroll
  for (int j = 0; j < DJ; ++j) o[j] = 0.0f;
  float L = 0.0f, carry = -INFINITY;  // carry: the max of m over the groups of 32 chunks before
  for (int z0 = 0; z0 < nch; z0 += 32) {
    const int n = nch - z0 < 32 ? nch - z0 : 32;  // chunks of this group (the same in every lane)
    const int zl = z0 + lane;                     // this lane's chunk for the weights
    const float mz = zl < nch ? base[int64_t(zl) * stride] : -INFINITY;
    const float lz = zl < nch ? base[int64_t(zl) * stride + 1] : 0.0f;
    float v[KB][DJ];
    auto load_values = [&](int u0) {  // chunks z0 + u0 .. + KB - 1, this lane's dims
#pragma unroll
      for (int k = 0; k < KB; ++k)
#pragma unroll
        for (int j = 0; j < DJ; ++j) {
          const int i = lane + 32 * j;
          v[k][j] = u0 + k < n && i < d ? base[int64_t(z0 + u0 + k) * stride + kPartHead + i] : 0.0f;
        }
    };
    load_values(0);
    float c0, c1;  // chunk zl's merge weights, as attention_merge_kernel's warp 0 computes them
    chunk_weights_in_warp(mz, lane, carry, c0, c1);
    for (int u0 = 0; u0 < n; u0 += KB) {
      if (u0 > 0) load_values(u0);
#pragma unroll
      for (int k = 0; k < KB; ++k) {
        if (u0 + k >= n) break;  // the same in every lane
        const int src = u0 + k;
        const float a0 = __shfl_sync(0xffffffffu, c0, src), a1 = __shfl_sync(0xffffffffu, c1, src);
        const float lk = __shfl_sync(0xffffffffu, lz, src);
#pragma unroll
        for (int j = 0; j < DJ; ++j) o[j] = merge_value(o[j], v[k][j], a0, a1);
        L = merge_value(L, lk, a0, a1);
      }
    }
  }
  // Output dim i's final value, stored (and kept as stored for tail.xp).
  auto put = [&](int j, float val) {
    const int i = lane + 32 * j;
    st(out, odt, at + i, val);
    if (tail.xp) ob[warp][i] = __float2bfloat16_rn(val);
  };
  if (!tail.gate) {
#pragma unroll
    for (int j = 0; j < DJ; ++j)
      if (lane + 32 * j < d) put(j, chunk_out(o[j], L));
  } else {
    float x[DJ];
#pragma unroll
    for (int j = 0; j < DJ; ++j) x[j] = as_stored(odt, chunk_out(o[j], L));
    if (tail.head_norm) {
      // The head's sum of squares in output_gate's order: lane i, i + 32,
      // ..., then the butterfly.
      float ss = 0.0f;
#pragma unroll
      for (int j = 0; j < DJ; ++j)
        if (lane + 32 * j < d) ss += x[j] * x[j];
      ss = warp_sum(ss);
      const float r = 1.0f / sqrtf(ss / float(d) + tail.eps);
#pragma unroll
      for (int j = 0; j < DJ; ++j)
        if (lane + 32 * j < d) put(j, (x[j] * r) * sigmoidf_(gv[j]));
    } else {
#pragma unroll
      for (int j = 0; j < DJ; ++j)
        if (lane + 32 * j < d) put(j, x[j] * sigmoidf_(gv[j]));
    }
  }
  if (tail.xp) {  // the head's 32-k blocks in the products' order
    __syncwarp();
    for (int c = lane; c < d / 8; c += 32)
      *reinterpret_cast<uint4*>(tail.xp + t * tail.Kp + int64_t(h) * d + 8 * c) = head_xperm_piece(ob[warp], c);
  }
  if (store) {
    // -1: no page (the error is recorded); -2: a sliding block the sequence does not keep.
    dst = __shfl_sync(0xffffffffu, dst, 0);
    if (dst < 0) return;
    const KvArgs& a = tail.a;
#pragma unroll
    for (int j = 0; j < DJ; ++j) {
      const int i = lane + 32 * j;
      if (i >= d) break;
      const int64_t off = int64_t(h / tail.G) * d + i;
      st(a.ck, a.cdt, dst + off, kv[j]);
      st(a.cv, a.cdt, dst + off, vv[j]);
    }
  }
}

template <int DJ>
cudaError_t launch_merge_warps(cudaStream_t s, const AttnCall& c, const float* part, int64_t r0, int64_t rows,
                               const MergeTail& tail) {
  const int64_t blocks = (rows * c.hq + kMergeWarps - 1) / kMergeWarps;
  return launch_pdl<attention_merge_warp_kernel<DJ>>(s, dim3(unsigned(blocks)), dim3(kMergeWarps * 32), 0, c.out,
                                                     c.odt, c.ldo, part, c.P, c.T, r0, rows, c.d, c.hq, c.window,
                                                     c.chunks, c.err, c.op, tail);
}

}  // namespace

cudaError_t launch_attention_merge(cudaStream_t s, const AttnCall& c, const float* part, int64_t r0, int64_t rows,
                                   __nv_bfloat16* xp, int64_t Kp) {
  const MergeTail tail{c.gate, c.gdt, c.head_norm, c.gate_eps, c.store_kv, c.G, c.a, xp, Kp};
  const bool block = c.merge_kernel == 1 || (c.merge_kernel == 0 && rows * c.hq < kWarpMergeFromUnits);
  if (block)
    return launch_pdl<attention_merge_kernel>(s, dim3(unsigned(rows), unsigned(c.hq)), dim3(128), 0,  // 128: its bound
                                              c.out, c.odt, c.ldo, part, c.P, c.T, r0, c.d, c.hq, c.window, c.chunks,
                                              c.err, c.op, tail);
  if (c.d <= 32) return launch_merge_warps<1>(s, c, part, r0, rows, tail);
  if (c.d <= 64) return launch_merge_warps<2>(s, c, part, r0, rows, tail);
  if (c.d <= 128) return launch_merge_warps<4>(s, c, part, r0, rows, tail);
  return launch_merge_warps<8>(s, c, part, r0, rows, tail);  // up to kMaxHeadDim
}

}  // namespace muse::cuda
