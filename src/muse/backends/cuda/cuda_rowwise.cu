// Row-wise operations: embedding, RMSNorm (all NormGain modes, groups,
// scale), the fused residual / gated residual (alone or with the norm that
// follows it), RoPE tables, QK-norm + RoPE, the output gate, SwiGLU, row
// gathers and the softcap. Each output element is computed in fp32 from
// fp32-upcast inputs and stored once; the norm statistics are block or warp
// sums in one fixed order.
//
// The kernels between the products launch with programmatic dependent
// launch (launch_pdl) and wait (pdl_wait) before their first memory access:
// each one's launch then overlaps the tail of the kernel before instead of
// following it (a batch-1 Glimmer step runs ~13 kernels a layer, most of
// them a few µs long).
#include <cmath>

#include "muse/backends/cuda/cuda_dot.cuh"
#include "muse/backends/cuda/cuda_impl.cuh"
#include "muse/backends/cuda/cuda_mma.cuh"

namespace muse::cuda {
namespace {

enum : int { kGainNone = 0, kGainAfter = 1, kGainBefore = 2 };
int gain_code(NormGain m) { return m == NormGain::After ? kGainAfter : m == NormGain::Before ? kGainBefore : kGainNone; }

// Threads for a block that reduces `n` values: a multiple of 32, at most 256.
unsigned threads_for(int64_t n) { return unsigned(n >= 256 ? 256 : std::max<int64_t>(32, (n + 31) / 32 * 32)); }

__global__ void embed_kernel(void* out, int odt, const void* table, int tdt, const int32_t* ids, int64_t H, int64_t V,
                             DeviceError* err, int op) {
  const int64_t t = blockIdx.x;
  const int32_t id = ids[t];
  if (id < 0 || id >= V) {
    if (threadIdx.x == 0) report_error(err, op, kErrTokenId, id, int(V));
    return;
  }
  for (int64_t i = threadIdx.x; i < H; i += blockDim.x) st(out, odt, t * H + i, ld(table, tdt, int64_t(id) * H + i));
}

// One block per group of n values. The CPU's sequence: Before: y = x ⊙ c,
// r from y, y · (r·scale); otherwise y = x · r (⊙ c), then · scale.
//
// Thread j holds the run of elements kNormPer·j .. kNormPer·j + kNormPer - 1
// in registers, loaded with 16-byte loads where the run is whole and
// aligned: a row costs one memory latency and a few instructions a thread.
// (A 6656-wide norm of one row ran ~25 µs as a load-then-add loop, and
// 13 µs fused with the residual when each thread held elements j,
// j + blockDim, ...: 1,160 instructions a warp on the row's one SM, ncu
// 2026-12-01.) Rows wider than kNormPer · 1024 (none of the Muse shapes)
// keep the loop.
constexpr int kNormPer = 8;
constexpr int64_t kNormRegMax = int64_t(kNormPer) * 1024;

// Threads for a norm over n values: enough that each holds at most kNormPer.
unsigned norm_threads(int64_t n) {
  const int64_t need = (n + kNormPer - 1) / kNormPer;
  const int64_t t = std::min<int64_t>(1024, (need + 31) / 32 * 32);
  return std::max<unsigned>(threads_for(n), unsigned(t));
}

__device__ __forceinline__ bool aligned16_at(const void* p, int dt, int64_t at) {
  return ((reinterpret_cast<uintptr_t>(p) + uintptr_t(at) * (dt == kBF16 ? 2u : 4u)) & 15u) == 0;
}

// v[k] = element at + k of p for k < count (count <= PER), else `fill`.
template <int PER>
__device__ __forceinline__ void ld_run(float (&v)[PER], const void* p, int dt, int64_t at, int64_t count,
                                       float fill = 0.0f) {
  static_assert(PER % 8 == 0, "runs of whole 16-byte pieces");
  if (count == PER && aligned16_at(p, dt, at)) {
    if (dt == kBF16) {
      const uint4* q = reinterpret_cast<const uint4*>(static_cast<const __nv_bfloat16*>(p) + at);
#pragma unroll
      for (int c = 0; c < PER / 8; ++c) {
        const uint4 u = q[c];
        const uint32_t w[4] = {u.x, u.y, u.z, u.w};
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          v[8 * c + 2 * h] = __uint_as_float(w[h] << 16);
          v[8 * c + 2 * h + 1] = __uint_as_float(w[h] & 0xffff0000u);
        }
      }
    } else {
      const float4* q = reinterpret_cast<const float4*>(static_cast<const float*>(p) + at);
#pragma unroll
      for (int c = 0; c < PER / 4; ++c) {
        const float4 f = q[c];
        v[4 * c] = f.x, v[4 * c + 1] = f.y, v[4 * c + 2] = f.z, v[4 * c + 3] = f.w;
      }
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < PER; ++k) v[k] = k < count ? ld(p, dt, at + k) : fill;
}

// Elements at .. at + count - 1 of p = v[0 .. count - 1], stored as dt does.
template <int PER>
__device__ __forceinline__ void st_run(void* p, int dt, int64_t at, int64_t count, const float (&v)[PER]) {
  if (count == PER && aligned16_at(p, dt, at)) {
    if (dt == kBF16) {
      uint4* q = reinterpret_cast<uint4*>(static_cast<__nv_bfloat16*>(p) + at);
#pragma unroll
      for (int c = 0; c < PER / 8; ++c) {
        uint32_t w[4];
#pragma unroll
        for (int h = 0; h < 4; ++h) {
          const __nv_bfloat162 b2 = __floats2bfloat162_rn(v[8 * c + 2 * h], v[8 * c + 2 * h + 1]);
          w[h] = *reinterpret_cast<const uint32_t*>(&b2);
        }
        q[c] = make_uint4(w[0], w[1], w[2], w[3]);
      }
    } else {
      float4* q = reinterpret_cast<float4*>(static_cast<float*>(p) + at);
#pragma unroll
      for (int c = 0; c < PER / 4; ++c) q[c] = make_float4(v[4 * c], v[4 * c + 1], v[4 * c + 2], v[4 * c + 3]);
    }
    return;
  }
#pragma unroll
  for (int k = 0; k < PER; ++k)
    if (k < count) st(p, dt, at + k, v[k]);
}

// A run of 8 values (as st_run stores them in BF16) also into xp in the
// wgmma products' order (wgmma_permute_x_kernel's: chunk p of a 32-k block
// holds word p of the block's four 16-byte pieces), at element i0 of a row
// that starts at xrow: the four pieces of a block are the runs of lanes 4b
// .. 4b + 3, which trade words in four shuffles (every lane of the warp
// takes part). Runs past the row are zeros; chunks at or past Kp are not
// written.
__device__ __forceinline__ void st_run_xperm(__nv_bfloat16* xp, int64_t xrow, int64_t i0, int64_t Kp,
                                             const float (&v)[8]) {
  uint32_t w[4];
#pragma unroll
  for (int h = 0; h < 4; ++h) {
    const __nv_bfloat162 b2 = __floats2bfloat162_rn(v[2 * h], v[2 * h + 1]);
    w[h] = *reinterpret_cast<const uint32_t*>(&b2);
  }
  const int lane = threadIdx.x & 31, q = lane & 3;
  uint32_t c[4] = {0u, 0u, 0u, 0u};
#pragma unroll
  for (int j = 0; j < 4; ++j) {  // round j: word q of piece (q + j) % 4, which that lane gives
    const int give = (q - j) & 3, from = (q + j) & 3;
    const uint32_t mine = give == 0 ? w[0] : give == 1 ? w[1] : give == 2 ? w[2] : w[3];
    const uint32_t got = __shfl_sync(0xffffffffu, mine, (lane & ~3) | from);
#pragma unroll
    for (int p = 0; p < 4; ++p)
      if (p == from) c[p] = got;
  }
  if (i0 < Kp) *reinterpret_cast<uint4*>(xp + xrow + i0) = make_uint4(c[0], c[1], c[2], c[3]);
}

// This thread's run of a row of n: its first element and length.
template <int PER>
__device__ __forceinline__ int64_t run_start() {
  return int64_t(PER) * threadIdx.x;
}
template <int PER>
__device__ __forceinline__ int64_t run_count(int64_t n) {
  const int64_t left = n - run_start<PER>();
  return left <= 0 ? 0 : left < PER ? left : PER;
}

// This thread's run of a gain into L2, before pdl_wait: gains are weights
// (no kernel writes them), and since their last use a step's other weights
// have streamed through L2, so the first load of a gain would otherwise be
// an HBM round trip on the row's critical path (after the wait).
template <int PER>
__device__ __forceinline__ void prefetch_gain(const void* gain, int gdt, int mode, int64_t n) {
  if (PER == 0 || mode == kGainNone || !gain || (gdt != kF32 && gdt != kBF16) || run_count<PER>(n) == 0) return;
  const char* p = static_cast<const char*>(gain) + run_start<PER>() * (gdt == kF32 ? 4 : 2);
  asm volatile("prefetch.global.L2 [%0];" ::"l"(p));
}

// 1/rms of a row held in registers as row_inv_rms loads it (x, and c the
// gain or 1; elements past n are 0 and 1).
template <int PER>
__device__ __forceinline__ float regs_inv_rms(const float (&x)[PER], const float (&c)[PER], int mode, int64_t n,
                                              float eps, float* red) {
  float ss = 0.0f;
#pragma unroll
  for (int k = 0; k < PER; ++k) {
    const float y = mode == kGainBefore ? x[k] * c[k] : x[k];
    ss += y * y;
  }
  ss = block_sum(ss, red);
  return 1.0f / sqrtf(ss / float(n) + eps);
}

// This thread's run of a gain (elements i0 .., count of them; past them 1),
// or ones where the norm has none.
template <int PER>
__device__ __forceinline__ void gain_run(float (&c)[PER], const void* gain, int gdt, int mode, int64_t i0,
                                         int64_t count) {
  if (mode != kGainNone)
    ld_run<PER>(c, gain, gdt, i0, count, 1.0f);
  else
#pragma unroll
    for (int k = 0; k < PER; ++k) c[k] = 1.0f;
}

// This thread's elements of the row at `base` into x (and the gain into c),
// the sum of squares of (x ⊙ c when Before, else x) over the block; returns
// 1/rms. PER = 0: no register cache (the loop form, any n).
template <int PER>
__device__ __forceinline__ float row_inv_rms(float (&x)[PER ? PER : 1], float (&c)[PER ? PER : 1], const void* in,
                                             int idt, int64_t base, const void* gain, int gdt, int mode, int64_t n,
                                             float eps, float* red) {
  float ss = 0.0f;
  if constexpr (PER > 0) {
    const int64_t i0 = run_start<PER>(), cnt = run_count<PER>(n);
    ld_run<PER>(x, in, idt, base + i0, cnt);
    gain_run<PER>(c, gain, gdt, mode, i0, cnt);
    return regs_inv_rms<PER>(x, c, mode, n, eps, red);
  } else {
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float y = ld(in, idt, base + i);
      if (mode == kGainBefore) y = y * ld(gain, gdt, i);
      ss += y * y;
    }
  }
  ss = block_sum(ss, red);
  return 1.0f / sqrtf(ss / float(n) + eps);
}

// The normed value of element i (x its input, c its gain).
__device__ __forceinline__ float normed(float x, float c, int mode, float r, float scale) {
  if (mode == kGainBefore) return (x * c) * (r * scale);
  float y = x * r;
  if (mode == kGainAfter) y = y * c;
  if (scale != 1.0f) y = y * scale;
  return y;
}

template <int PER>
__global__ void __launch_bounds__(1024) rms_norm_kernel(void* out, int odt, const void* in, int idt, const void* gain,
                                                        int gdt, int mode, float eps, int64_t g, float scale) {
  pdl_launch_dependents();  // a product may read our output: it waits for us
  prefetch_gain<PER>(gain, gdt, mode, g);
  pdl_wait();
  __shared__ float red[33];
  const int64_t base = int64_t(blockIdx.x) * g;
  float x[PER ? PER : 1], c[PER ? PER : 1];
  const float r = row_inv_rms<PER>(x, c, in, idt, base, gain, gdt, mode, g, eps, red);
  if constexpr (PER > 0) {
    float y[PER];
#pragma unroll
    for (int k = 0; k < PER; ++k) y[k] = normed(x[k], c[k], mode, r, scale);
    st_run<PER>(out, odt, base + run_start<PER>(), run_count<PER>(g), y);
  } else {
    for (int64_t i = threadIdx.x; i < g; i += blockDim.x)
      st(out, odt, base + i,
         normed(ld(in, idt, base + i), mode != kGainNone ? ld(gain, gdt, i) : 1.0f, mode, r, scale));
  }
}

// The new stream value from the old one and the normed update: a ⊙ s + b ⊙ n
// (alpha/beta given), or s + n (explicit roundings: both residual kernels
// give the same bits).
__device__ __forceinline__ float residual_value(bool ab, float a, float b, float s, float n) {
  return ab ? __fmaf_rn(a, s, __fmul_rn(b, n)) : __fadd_rn(s, n);
}

// stream += norm(update) (alpha/beta: stream = alpha ⊙ stream + beta ⊙ norm).
template <int PER>
__global__ void __launch_bounds__(1024)
    residual_norm_kernel(void* stream, int sdt, const void* update, int udt, const void* gain, int gdt, int mode,
                         const float* alpha, const float* beta, float eps, int64_t H) {
  pdl_launch_dependents();  // a product may read our output: it waits for us
  prefetch_gain<PER>(gain, gdt, mode, H);
  pdl_wait();
  __shared__ float red[33];
  const int64_t base = int64_t(blockIdx.x) * H;
  if constexpr (PER > 0) {
    // The stream (and alpha, beta) are loaded with the update, before the sum.
    const int64_t i0 = run_start<PER>(), cnt = run_count<PER>(H);
    float sv[PER], a[PER], b[PER];
    ld_run<PER>(sv, stream, sdt, base + i0, cnt);
    if (alpha) ld_run<PER>(a, alpha, kF32, i0, cnt), ld_run<PER>(b, beta, kF32, i0, cnt);
    float x[PER], c[PER];
    const float r = row_inv_rms<PER>(x, c, update, udt, base, gain, gdt, mode, H, eps, red);
    float v[PER];
#pragma unroll
    for (int k = 0; k < PER; ++k)
      v[k] = residual_value(alpha != nullptr, alpha ? a[k] : 0.0f, alpha ? b[k] : 0.0f, sv[k],
                            normed(x[k], c[k], mode, r, 1.0f));
    st_run<PER>(stream, sdt, base + i0, cnt, v);
  } else {
    float x[1], c[1];
    const float r = row_inv_rms<0>(x, c, update, udt, base, gain, gdt, mode, H, eps, red);
    for (int64_t i = threadIdx.x; i < H; i += blockDim.x) {
      const float n = normed(ld(update, udt, base + i), mode != kGainNone ? ld(gain, gdt, i) : 1.0f, mode, r, 1.0f);
      const float sold = ld(stream, sdt, base + i);
      st(stream, sdt, base + i,
         residual_value(alpha != nullptr, alpha ? alpha[i] : 0.0f, alpha ? beta[i] : 0.0f, sold, n));
    }
  }
}

// residual_norm_kernel's update, then out = norm(new stream) as
// rms_norm_kernel<PER> computes it over whole rows: from the values as the
// stream stores them, with the same block size (so the same element per
// thread and the same sums), scale 1. The same bits as the two kernels, in
// one launch and one read of the row. One row (`row`) from this thread's
// runs of the stream (sv) and the update (x), already loaded.
template <int PER>
__device__ __forceinline__ void residual_then_norm_row(float (&sv)[PER], float (&x)[PER], int64_t row, void* stream,
                                                       int sdt, const void* gain, int gdt, int mode, const float* alpha,
                                                       const float* beta, float eps, int64_t H, void* out, int odt,
                                                       const void* gain2, int g2dt, int mode2, float eps2,
                                                       __nv_bfloat16* xp, int64_t Kp, float* red) {
  const int64_t base = row * H;
  const int64_t i0 = run_start<PER>(), cnt = run_count<PER>(H);
  // The second gain is loaded with the first, before the first sum: one
  // memory latency for the row (the second gain after the stores cost
  // another L2 round trip on the step's critical path). alpha/beta (a few
  // KB, from L2) come after it, so that no more than four runs are live at
  // once (a 1024-thread block has 64 registers a thread).
  float c2[PER], c[PER];
  gain_run<PER>(c2, gain2, g2dt, mode2, i0, cnt);
  gain_run<PER>(c, gain, gdt, mode, i0, cnt);
  const float r = regs_inv_rms<PER>(x, c, mode, H, eps, red);
  float y[PER];
#pragma unroll
  for (int k = 0; k < PER; ++k) y[k] = normed(x[k], c[k], mode, r, 1.0f);
  if (alpha) {
    float a[PER], b[PER];
    ld_run<PER>(a, alpha, kF32, i0, cnt), ld_run<PER>(b, beta, kF32, i0, cnt);
#pragma unroll
    for (int k = 0; k < PER; ++k) sv[k] = residual_value(true, a[k], b[k], sv[k], y[k]);
  } else {
#pragma unroll
    for (int k = 0; k < PER; ++k) sv[k] = residual_value(false, 0.0f, 0.0f, sv[k], y[k]);
  }
  st_run<PER>(stream, sdt, base + i0, cnt, sv);
#pragma unroll
  for (int k = 0; k < PER; ++k) y[k] = k < cnt ? as_stored(sdt, sv[k]) : 0.0f;
  const float r2 = regs_inv_rms<PER>(y, c2, mode2, H, eps2, red);
  float o[PER];
#pragma unroll
  for (int k = 0; k < PER; ++k) o[k] = normed(y[k], c2[k], mode2, r2, 1.0f);
  st_run<PER>(out, odt, base + i0, cnt, o);
  if constexpr (PER == 8)
    if (xp) st_run_xperm(xp, row * Kp, i0, Kp, o);  // BF16 out (offer_xperm)
}

// A block a row (decode: every row on its own SM at once).
template <int PER>
__global__ void __launch_bounds__(1024)
    residual_then_norm_kernel(void* stream, int sdt, const void* update, int udt, const void* gain, int gdt, int mode,
                              const float* alpha, const float* beta, float eps, int64_t H, void* out, int odt,
                              const void* gain2, int g2dt, int mode2, float eps2, __nv_bfloat16* xp, int64_t Kp) {
  pdl_launch_dependents();  // a product may read our output: it waits for us
  prefetch_gain<PER>(gain, gdt, mode, H);
  prefetch_gain<PER>(gain2, g2dt, mode2, H);
  pdl_wait();
  __shared__ float red[33];
  const int64_t row = blockIdx.x, i0 = run_start<PER>(), cnt = run_count<PER>(H);
  float sv[PER], x[PER];
  ld_run<PER>(sv, stream, sdt, row * H + i0, cnt);
  ld_run<PER>(x, update, udt, row * H + i0, cnt);
  residual_then_norm_row<PER>(sv, x, row, stream, sdt, gain, gdt, mode, alpha, beta, eps, H, out, odt, gain2, g2dt,
                              mode2, eps2, xp, Kp, red);
}

// More rows than blocks fit at once (prefill): a block takes rows
// blockIdx.x, + gridDim.x, ... and copies the next rows' stream and update
// runs into shared memory (cp.async, each thread its own runs: no barrier)
// while it computes this one, so a row no longer waits for its loads. The
// block a row form is register-bound to one block an SM at Glimmer's 832
// threads, so an 8192-row prefill ran 62 waves, each a full memory latency
// plus two block sums: 354 µs a call, ~3x its bytes' time (H200,
// 2026-12-06). Same threads, elements and sums: the same bits. Whole
// aligned runs only (H % 8 == 0, 16-byte aligned rows: the caller checks).
constexpr int kRunSlotBytes = 64;  // a thread's stream run (<= 32 bytes), then its update run
constexpr int kRowsAhead = 2;      // rows in flight beyond the one being computed
template <int PER>
__global__ void __launch_bounds__(1024)
    residual_then_norm_rows_kernel(void* stream, int sdt, const void* update, int udt, const void* gain, int gdt,
                                   int mode, const float* alpha, const float* beta, float eps, int64_t H, void* out,
                                   int odt, const void* gain2, int g2dt, int mode2, float eps2, __nv_bfloat16* xp,
                                   int64_t Kp, int64_t rows) {
  static_assert(PER == 8, "a run is one or two 16-byte pieces");
  pdl_launch_dependents();  // a product may read our output: it waits for us
  prefetch_gain<PER>(gain, gdt, mode, H);
  prefetch_gain<PER>(gain2, g2dt, mode2, H);
  extern __shared__ __align__(16) unsigned char rn_slots[];
  __shared__ float red[33];
  const int64_t i0 = run_start<PER>(), cnt = run_count<PER>(H);
  const int sb = sdt == kF32 ? 32 : 16, ub = udt == kF32 ? 32 : 16;  // bytes of a run
  auto slot = [&](int64_t i) {
    return rn_slots + (size_t(i % (kRowsAhead + 1)) * blockDim.x + threadIdx.x) * kRunSlotBytes;
  };
  // The i-th row of this block into its slot; one commit group a row,
  // empty past the last row, so wait_group kRowsAhead always means row i.
  auto fetch = [&](int64_t i) {
    const int64_t row = blockIdx.x + i * gridDim.x;
    if (cnt > 0 && row < rows) {
      const char* s = static_cast<const char*>(stream) + (row * H + i0) * (sb / 8);
      const char* u = static_cast<const char*>(update) + (row * H + i0) * (ub / 8);
      for (int o = 0; o < sb; o += 16) cp_async16(slot(i) + o, s + o, 16);
      for (int o = 0; o < ub; o += 16) cp_async16(slot(i) + 32 + o, u + o, 16);
    }
    cp_async_commit();
  };
  pdl_wait();
#pragma unroll
  for (int i = 0; i < kRowsAhead; ++i) fetch(i);
  for (int64_t i = 0, row = blockIdx.x; row < rows; row += gridDim.x, ++i) {
    fetch(i + kRowsAhead);  // its slot held row i - 1, which this thread alone read
    asm volatile("cp.async.wait_group %0;" ::"n"(kRowsAhead) : "memory");
    float sv[PER], x[PER];
    ld_run<PER>(sv, slot(i), sdt, 0, cnt);
    ld_run<PER>(x, slot(i) + 32, udt, 0, cnt);
    residual_then_norm_row<PER>(sv, x, row, stream, sdt, gain, gdt, mode, alpha, beta, eps, H, out, odt, gain2, g2dt,
                                mode2, eps2, xp, Kp, red);
  }
  asm volatile("cp.async.wait_group 0;" ::: "memory");  // none left in flight at exit
}

__global__ void rope_tables_kernel(float* cos_out, float* sin_out, const int32_t* positions, const float* inv,
                                   int64_t half) {
  const int64_t t = blockIdx.x;
  const float pos = float(positions[t]);
  for (int64_t i = threadIdx.x; i < half; i += blockDim.x) {
    const float angle = pos * inv[i];
    cos_out[t * half + i] = float(cos(double(angle)));
    sin_out[t * half + i] = float(sin(double(angle)));
  }
}

// One warp per (row, head) of q then k: weightless norm (× q_scale for q),
// then rotate-half RoPE on pairs (j, j + d/2). In place. Lane l holds the
// pairs j = l, l + 32, ... (IT of them: d/2 <= 32·IT) in registers, with
// their cos/sin, all loaded before the sum: one memory latency a warp (the
// loop that read the head twice and the tables after the sum was three,
// and a prefill runs a warp for every row and head). IT = 0: the loop, any d.
template <int IT>
__global__ void qk_norm_rope_kernel(void* q, int qdt, void* k, int kdt, const float* cos_t, const float* sin_t,
                                    int64_t T, int hq, int hk, int d, float eps, float q_scale) {
  pdl_launch_dependents();  // light: attention may launch and look up its keys; it waits for us
  pdl_wait();
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  const int heads = hq + hk;
  if (w >= T * heads) return;
  const int64_t t = w / heads;
  const int h = int(w % heads);
  const bool is_q = h < hq;
  void* v = is_q ? q : k;
  const int dt = is_q ? qdt : kdt;
  const int64_t base = t * int64_t(is_q ? hq : hk) * d + int64_t(is_q ? h : h - hq) * d;
  const float scale = is_q ? q_scale : 1.0f;
  const int half = d / 2;
  // y1, y2 of pair j from its inputs and 1/rms r, stored.
  auto finish = [&](int j, float x1, float x2, float r, float c, float s) {
    float y1 = x1 * r, y2 = x2 * r;
    if (scale != 1.0f) y1 = y1 * scale, y2 = y2 * scale;
    if (cos_t) {
      const float r1 = y1 * c - y2 * s, r2 = y2 * c + y1 * s;
      y1 = r1, y2 = r2;
    }
    st(v, dt, base + j, y1);
    st(v, dt, base + j + half, y2);
  };
  float ss = 0.0f;
  if constexpr (IT > 0) {
    float x1[IT], x2[IT], c[IT], s[IT];
#pragma unroll
    for (int i = 0; i < IT; ++i) {
      const int j = lane + 32 * i;
      x1[i] = x2[i] = c[i] = s[i] = 0.0f;
      if (j < half) {
        x1[i] = ld(v, dt, base + j), x2[i] = ld(v, dt, base + j + half);
        if (cos_t) c[i] = cos_t[t * half + j], s[i] = sin_t[t * half + j];
      }
    }
#pragma unroll
    for (int i = 0; i < IT; ++i)
      if (lane + 32 * i < half) {
        ss += x1[i] * x1[i];
        ss += x2[i] * x2[i];
      }
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / float(d) + eps);
#pragma unroll
    for (int i = 0; i < IT; ++i)
      if (lane + 32 * i < half) finish(lane + 32 * i, x1[i], x2[i], r, c[i], s[i]);
  } else {
    for (int j = lane; j < half; j += 32) {
      const float x1 = ld(v, dt, base + j), x2 = ld(v, dt, base + j + half);
      ss += x1 * x1;
      ss += x2 * x2;
    }
    ss = warp_sum(ss);
    const float r = 1.0f / sqrtf(ss / float(d) + eps);
    for (int j = lane; j < half; j += 32)
      finish(j, ld(v, dt, base + j), ld(v, dt, base + j + half), r, cos_t ? cos_t[t * half + j] : 0.0f,
             cos_t ? sin_t[t * half + j] : 0.0f);
  }
}

// One warp per (row, head): o ← o ⊙ σ(g), or rms(o_h) ⊙ σ(g_h).
__global__ void output_gate_kernel(void* o, int odt, const void* g, int gdt, int64_t units, int d, bool head_norm,
                                   float eps) {
  pdl_launch_dependents();  // a product may read our output: it waits for us
  pdl_wait();
  const int64_t w = (int64_t(blockIdx.x) * blockDim.x + threadIdx.x) >> 5;
  const int lane = threadIdx.x & 31;
  if (w >= units) return;
  const int64_t base = w * d;
  float r = 1.0f;
  if (head_norm) {
    float ss = 0.0f;
    for (int i = lane; i < d; i += 32) {
      const float x = ld(o, odt, base + i);
      ss += x * x;
    }
    ss = warp_sum(ss);
    r = 1.0f / sqrtf(ss / float(d) + eps);
  }
  for (int i = lane; i < d; i += 32) {
    float y = ld(o, odt, base + i);
    if (head_norm) y = y * r;
    st(o, odt, base + i, y * sigmoidf_(ld(g, gdt, base + i)));
  }
}

__global__ void swiglu_kernel(void* out, int odt, const void* gate, int gdt, const void* up, int udt, int64_t n) {
  pdl_launch_dependents();  // a product may read our output: it waits for us
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float a = ld(gate, gdt, i), b = ld(up, udt, i);
    st(out, odt, i, a * sigmoidf_(a) * b);
  }
}

// swiglu_kernel over BF16 rows of K (K % 8 == 0), its outputs also written
// into xp in the wgmma products' order (offer_xperm): a thread a 16-byte
// piece (8 values; the four pieces of a 32-k block are a quad of lanes, as
// st_run_xperm wants: Kp / 8 is a multiple of 16). Every lane takes part in
// the quads' shuffles; those past the rows store nothing.
__global__ void swiglu_xperm_kernel(__nv_bfloat16* out, const __nv_bfloat16* gate, const __nv_bfloat16* up,
                                    int64_t T, int64_t K, __nv_bfloat16* __restrict__ xp, int64_t Kp) {
  pdl_launch_dependents();  // a product may read our output: it waits for us
  pdl_wait();
  const int64_t per_row = Kp / 8, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  const bool live = i < T * per_row;
  const int64_t row = live ? i / per_row : 0, k = live ? (i % per_row) * 8 : Kp;
  float v[8] = {0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f, 0.0f};
  if (k < K) {
    const int64_t at = row * K + k;
    const uint4 g4 = *reinterpret_cast<const uint4*>(gate + at), u4 = *reinterpret_cast<const uint4*>(up + at);
    const uint32_t gw[4] = {g4.x, g4.y, g4.z, g4.w}, uw[4] = {u4.x, u4.y, u4.z, u4.w};
    uint32_t w[4];
#pragma unroll
    for (int h = 0; h < 4; ++h) {
      const float a0 = __uint_as_float(gw[h] << 16), a1 = __uint_as_float(gw[h] & 0xffff0000u);
      const float b0 = __uint_as_float(uw[h] << 16), b1 = __uint_as_float(uw[h] & 0xffff0000u);
      v[2 * h] = a0 * sigmoidf_(a0) * b0, v[2 * h + 1] = a1 * sigmoidf_(a1) * b1;
      const __nv_bfloat162 r = __floats2bfloat162_rn(v[2 * h], v[2 * h + 1]);
      w[h] = *reinterpret_cast<const uint32_t*>(&r);
    }
    *reinterpret_cast<uint4*>(out + at) = make_uint4(w[0], w[1], w[2], w[3]);
  }
  st_run_xperm(xp, row * Kp, k, Kp, v);
}

constexpr int kGatherI32 = 2;  // beside kF32 / kBF16: I32 rows

__global__ void gather_rows_kernel(void* out, int odt, const void* in, int idt, const int32_t* rows, int64_t C,
                                   int64_t in_rows, DeviceError* err, int op) {
  pdl_launch_dependents();  // the head's norm and product wait for us
  pdl_wait();
  const int64_t i = blockIdx.x;
  const int32_t r = rows[i];
  if (r < 0 || r >= in_rows) {
    if (threadIdx.x == 0) report_error(err, op, kErrRow, r, int(in_rows));
    return;
  }
  if (odt == kGatherI32) {  // 32-bit patterns, copied as integers
    for (int64_t c = threadIdx.x; c < C; c += blockDim.x)
      static_cast<int32_t*>(out)[i * C + c] = static_cast<const int32_t*>(in)[int64_t(r) * C + c];
    return;
  }
  for (int64_t c = threadIdx.x; c < C; c += blockDim.x) st(out, odt, i * C + c, ld(in, idt, int64_t(r) * C + c));
}

__global__ void softcap_kernel(void* x, int dt, int64_t n, float multiplier, float cap) {
  pdl_wait();
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += int64_t(gridDim.x) * blockDim.x) {
    const float z = ld(x, dt, i) * multiplier;  // the same operation order as transformers
    st(x, dt, i, cap > 0 ? tanhf(z / cap) * cap : z);
  }
}

unsigned grid_stride_blocks(int64_t n) { return unsigned(std::min<int64_t>(4096, std::max<int64_t>(1, (n + 255) / 256))); }

}  // namespace

void CudaBackend::embed(const Tensor& out, const Tensor& table, const Tensor& ids) {
  const int64_t T = out.rows();
  if (!check(is_float_dtype(out.dtype) && ids.dtype == DType::I32 && ids.numel() >= T && out.cols() == table.cols() &&
                 is_float_dtype(table.dtype) && table.rows() < (int64_t(1) << 31),
             "embed", [&] { return describe(out) + " <- " + describe(table) + "[" + describe(ids) + "]"; }))
    return;
  if (T == 0) return;
  const int op = op_index();
  enqueue("embed", [=, this](cudaStream_t s) {
    embed_kernel<<<unsigned(T), threads_for(table.cols()), 0, s>>>(out.data, dt_code(out.dtype), table.data,
                                                                    dt_code(table.dtype),
                                                                    static_cast<const int32_t*>(ids.data),
                                                                    table.cols(), table.rows(), dev_error(), op);
    return cudaGetLastError();
  });
}

void CudaBackend::rms_norm(const Tensor& out, const Tensor& in, const Tensor& gain, NormGain mode, float eps,
                           int64_t group, float scale) {
  const int64_t g = group > 0 ? group : in.cols();
  if (!check(is_float_dtype(in.dtype) && is_float_dtype(out.dtype) && out.numel() == in.numel() && g > 0 &&
                 in.cols() % g == 0 && (mode == NormGain::None || (is_float_dtype(gain.dtype) && gain.numel() == g)),
             "rms_norm", [&] { return describe(in) + " group " + std::to_string(g) + " gain " + describe(gain); }))
    return;
  const int64_t groups = in.numel() / g;
  if (groups == 0) return;
  enqueue("rms_norm", [=](cudaStream_t s) {
    const bool reg = g <= kNormRegMax;
    const int odt = dt_code(out.dtype), idt = dt_code(in.dtype), gdt = dt_code(gain.dtype), gm = gain_code(mode);
    return reg ? launch_pdl<rms_norm_kernel<kNormPer>>(s, dim3(unsigned(groups)), dim3(norm_threads(g)), 0, out.data,
                                                       odt, in.data, idt, gain.data, gdt, gm, eps, g, scale)
               : launch_pdl<rms_norm_kernel<0>>(s, dim3(unsigned(groups)), dim3(256), 0, out.data, odt, in.data, idt,
                                                gain.data, gdt, gm, eps, g, scale);
  });
}

namespace {
bool residual_args_ok(const Tensor& stream, const Tensor& update, const Tensor& gain, NormGain mode,
                      const Tensor& alpha, const Tensor& beta) {
  const int64_t H = stream.cols();
  return is_float_dtype(stream.dtype) && is_float_dtype(update.dtype) && update.numel() == stream.numel() &&
         (mode == NormGain::None || (is_float_dtype(gain.dtype) && gain.numel() == H)) &&
         alpha.empty() == beta.empty() && (alpha.empty() || (alpha.numel() == H && alpha.dtype == DType::F32)) &&
         (beta.empty() || (beta.numel() == H && beta.dtype == DType::F32));
}
}  // namespace

void CudaBackend::residual_norm(const Tensor& stream, const Tensor& update, const Tensor& gain, NormGain mode,
                                const Tensor& alpha, const Tensor& beta, float eps) {
  const int64_t H = stream.cols();
  if (!check(residual_args_ok(stream, update, gain, mode, alpha, beta), "residual_norm",
             [&] { return describe(stream) + " += norm(" + describe(update) + ")"; }))
    return;
  if (stream.rows() == 0) return;
  enqueue("residual_norm", [=](cudaStream_t s) {
    const bool reg = H <= kNormRegMax;
    const int sdt = dt_code(stream.dtype), udt = dt_code(update.dtype), gdt = dt_code(gain.dtype), gm = gain_code(mode);
    auto* al = static_cast<const float*>(alpha.data);
    auto* be = static_cast<const float*>(beta.data);
    return reg ? launch_pdl<residual_norm_kernel<kNormPer>>(s, dim3(unsigned(stream.rows())), dim3(norm_threads(H)), 0,
                                                            stream.data, sdt, update.data, udt, gain.data, gdt, gm, al,
                                                            be, eps, H)
               : launch_pdl<residual_norm_kernel<0>>(s, dim3(unsigned(stream.rows())), dim3(256), 0, stream.data, sdt,
                                                     update.data, udt, gain.data, gdt, gm, al, be, eps, H);
  });
}

void CudaBackend::residual_norm_then_norm(const Tensor& stream, const Tensor& update, const Tensor& gain,
                                          NormGain mode, const Tensor& alpha, const Tensor& beta, float eps,
                                          const NextNorm& next) {
  const int64_t H = stream.cols();
  // Rows wider than the register cache, or an output that is not a plain
  // row-for-row copy of the stream's shape: the two ops.
  if (H > kNormRegMax || next.out.rows() != stream.rows() || next.out.cols() != H ||
      !(next.mode == NormGain::None || (is_float_dtype(next.gain.dtype) && next.gain.numel() == H)) ||
      !is_float_dtype(next.out.dtype) || next.out.data == stream.data) {
    Backend::residual_norm_then_norm(stream, update, gain, mode, alpha, beta, eps, next);
    return;
  }
  if (!check(residual_args_ok(stream, update, gain, mode, alpha, beta), "residual_norm",
             [&] { return describe(stream) + " += norm(" + describe(update) + ")"; }))
    return;
  if (stream.rows() == 0) return;
  const Tensor out = next.out, gain2 = next.gain;
  const int mode2 = gain_code(next.mode);
  const float eps2 = next.eps;
  // The products of out read it permuted (above 16 rows): write that too.
  const bool perm = offer_xperm(out);  // BF16 out only
  const int64_t Kp = perm ? wgmma_xperm_elements(1, H) : 0;
  // More rows than one wave of blocks holds (prefill), in whole aligned
  // runs: blocks that walk the rows with the next one's loads in flight.
  auto runs_ok = [&](const Tensor& t) {
    return (t.dtype == DType::F32 || t.dtype == DType::BF16) && reinterpret_cast<uintptr_t>(t.data) % 16 == 0;
  };
  const bool walk = H % kNormPer == 0 && runs_ok(stream) && runs_ok(update);
  enqueue("residual_norm", [=, this](cudaStream_t s) {
    if (perm) xperm_written();
    const unsigned threads = norm_threads(H);
    const size_t slots = size_t(kRowsAhead + 1) * threads * kRunSlotBytes;
    // Blocks the GPU holds at once (asked only for prefill-sized calls).
    const int64_t held = walk && stream.rows() > sm_count()
                             ? resident_blocks<residual_then_norm_rows_kernel<kNormPer>>(int(threads), slots)
                             : 0;
    if (held > 0 && stream.rows() > held)
      return launch_pdl<residual_then_norm_rows_kernel<kNormPer>>(
          s, dim3(unsigned(held)), dim3(threads), slots, stream.data, dt_code(stream.dtype), update.data,
          dt_code(update.dtype), gain.data, dt_code(gain.dtype), gain_code(mode),
          static_cast<const float*>(alpha.data), static_cast<const float*>(beta.data), eps, H, out.data,
          dt_code(out.dtype), gain2.data, dt_code(gain2.dtype), mode2, eps2,
          perm ? static_cast<__nv_bfloat16*>(scratch()) : nullptr, Kp, stream.rows());
    return launch_pdl<residual_then_norm_kernel<kNormPer>>(
        s, dim3(unsigned(stream.rows())), dim3(threads), 0, stream.data, dt_code(stream.dtype), update.data,
        dt_code(update.dtype), gain.data, dt_code(gain.dtype), gain_code(mode), static_cast<const float*>(alpha.data),
        static_cast<const float*>(beta.data), eps, H, out.data, dt_code(out.dtype), gain2.data, dt_code(gain2.dtype),
        mode2, eps2, perm ? static_cast<__nv_bfloat16*>(scratch()) : nullptr, Kp);
  });
}

void CudaBackend::rope_tables(const Tensor& cos, const Tensor& sin, const Tensor& positions, double theta,
                              int64_t head_dim) {
  const int64_t half = head_dim / 2;
  if (!check(positions.dtype == DType::I32 && cos.dtype == DType::F32 && sin.dtype == DType::F32 && head_dim % 2 == 0 &&
                 half > 0 && theta > 0 && cos.numel() % half == 0 && cos.numel() / half <= positions.numel() &&
                 sin.numel() == cos.numel(),
             "rope_tables", [&] { return describe(cos) + " for " + describe(positions); }))
    return;
  const int64_t T = cos.numel() / half;
  const float* inv = inv_freq(theta, head_dim);
  if (!inv || T == 0) return;
  enqueue("rope_tables", [=](cudaStream_t s) {
    rope_tables_kernel<<<unsigned(T), threads_for(half), 0, s>>>(static_cast<float*>(cos.data),
                                                                  static_cast<float*>(sin.data),
                                                                  static_cast<const int32_t*>(positions.data), inv, half);
    return cudaGetLastError();
  });
}

void CudaBackend::qk_norm_rope(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
                               int64_t head_dim, float eps, float q_scale) {
  const int64_t d = head_dim, half = d / 2;
  if (!check(is_float_dtype(q.dtype) && is_float_dtype(k.dtype) && q.rows() == k.rows() && d > 0 && d % 2 == 0 &&
                 q.cols() % d == 0 && k.cols() % d == 0 &&
                 (cos.empty() || (cos.dtype == DType::F32 && sin.dtype == DType::F32 && cos.numel() >= q.rows() * half &&
                                  sin.numel() == cos.numel())),
             "qk_norm_rope", [&] { return describe(q) + ", " + describe(k); }))
    return;
  const int64_t T = q.rows();
  const int hq = int(q.cols() / d), hk = int(k.cols() / d);
  const int64_t warps = T * (hq + hk);
  if (warps == 0) return;
  enqueue("qk_norm_rope", [=](cudaStream_t s) {
    auto go = [&]<int IT>() {
      return launch_pdl<qk_norm_rope_kernel<IT>>(s, dim3(blocks_for(warps, 8)), dim3(256), 0, q.data,
                                                 dt_code(q.dtype), k.data, dt_code(k.dtype),
                                                 static_cast<const float*>(cos.data),
                                                 static_cast<const float*>(sin.data), T, hq, hk, int(d), eps, q_scale);
    };
    // heads up to 128 (Muse's 64 and 128) from registers
    return half <= 32 ? go.template operator()<1>() : half <= 64 ? go.template operator()<2>() : go.template operator()<0>();
  });
}

void CudaBackend::output_gate(const Tensor& o, const Tensor& g, int64_t head_dim, bool head_norm, float eps) {
  if (!check(is_float_dtype(o.dtype) && is_float_dtype(g.dtype) && o.numel() == g.numel() && head_dim > 0 &&
                 o.cols() % head_dim == 0,
             "output_gate", [&] { return describe(o) + " gate " + describe(g); }))
    return;
  const int64_t units = o.numel() / head_dim;
  if (units == 0) return;
  enqueue("output_gate", [=](cudaStream_t s) {
    return launch_pdl<output_gate_kernel>(s, dim3(blocks_for(units, 8)), dim3(256), 0, o.data, dt_code(o.dtype), g.data,
                                          dt_code(g.dtype), units, int(head_dim), head_norm, eps);
  });
}

void CudaBackend::swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) {
  if (!check(out.numel() == gate.numel() && up.numel() == gate.numel() && is_float_dtype(out.dtype) &&
                 is_float_dtype(gate.dtype) && is_float_dtype(up.dtype),
             "swiglu", [&] { return describe(out) + " <- " + describe(gate) + ", " + describe(up); }))
    return;
  const int64_t n = out.numel();
  if (n == 0) return;
  // The product after reads out permuted (above 16 rows): SwiGLU writes that too.
  const int64_t T = out.rows(), K = out.cols();
  const bool bf16 = out.dtype == DType::BF16 && gate.dtype == DType::BF16 && up.dtype == DType::BF16;
  if (bf16 && out.rank == 2 && gate.rows() == T && up.rows() == T && gate.cols() == K && up.cols() == K &&
      aligned16(gate.data) && aligned16(up.data) && offer_xperm(out)) {
    const int64_t Kp = wgmma_xperm_elements(1, K);
    enqueue("swiglu", [=, this](cudaStream_t s) {
      xperm_written();
      return launch_pdl<swiglu_xperm_kernel>(
          s, dim3(blocks_for(T * (Kp / 8), 256)), dim3(256), 0, static_cast<__nv_bfloat16*>(out.data),
          static_cast<const __nv_bfloat16*>(gate.data), static_cast<const __nv_bfloat16*>(up.data), T, K,
          static_cast<__nv_bfloat16*>(scratch()), Kp);
    });
    return;
  }
  enqueue("swiglu", [=](cudaStream_t s) {
    return launch_pdl<swiglu_kernel>(s, dim3(grid_stride_blocks(n)), dim3(256), 0, out.data, dt_code(out.dtype),
                                     gate.data, dt_code(gate.dtype), up.data, dt_code(up.dtype), n);
  });
}

void CudaBackend::gather_rows(const Tensor& out, const Tensor& in, const Tensor& rows) {
  // I32 rows: the routed expert ids speculative decoding records.
  const bool ints = out.dtype == DType::I32 && in.dtype == DType::I32;
  if (!check(out.cols() == in.cols() && rows.numel() >= out.rows() && rows.dtype == DType::I32 &&
                 (ints || (is_float_dtype(out.dtype) && is_float_dtype(in.dtype))) && in.rows() < (int64_t(1) << 31),
             "gather_rows", [&] { return describe(out) + " <- " + describe(in) + "[" + describe(rows) + "]"; }))
    return;
  if (out.rows() == 0) return;
  const int op = op_index();
  const int odt = ints ? kGatherI32 : dt_code(out.dtype), idt = ints ? kGatherI32 : dt_code(in.dtype);
  enqueue("gather_rows", [=, this](cudaStream_t s) {
    return launch_pdl<gather_rows_kernel>(s, dim3(unsigned(out.rows())), dim3(threads_for(in.cols())), 0, out.data, odt,
                                          in.data, idt, static_cast<const int32_t*>(rows.data), in.cols(), in.rows(),
                                          dev_error(), op);
  });
}

void CudaBackend::softcap(const Tensor& x, float multiplier, float cap) {
  if (!check(is_float_dtype(x.dtype), "softcap", [&] { return describe(x); })) return;
  const int64_t n = x.numel();
  if (n == 0) return;
  enqueue("softcap", [=](cudaStream_t s) {
    return launch_pdl<softcap_kernel>(s, dim3(grid_stride_blocks(n)), dim3(256), 0, x.data, dt_code(x.dtype), n,
                                      multiplier, cap);
  });
}

}  // namespace muse::cuda
