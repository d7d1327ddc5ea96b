// What the quantized wgmma GEMMs of cuda_quant_wgmma.cu (its only includer)
// share: each format's stage layout and k order, the activations' gather
// into that order, the weight's maps and row factors, and the K-slice loops
// that decode the A fragments (FP4 / FP8: q_units, INT4: q_units_int4). See
// cuda_quant_wgmma.cu for why and for the bits.
#pragma once

#include "muse/backends/cuda/cuda_moe_wgmma.cuh"
#include "muse/backends/cuda/cuda_quant_fp8_int4.cuh"

namespace muse::cuda {
namespace {

constexpr int kQUnit = 128;                              // k a unit
constexpr uint32_t kQCodeBytes = uint32_t(kWgW) * 128;   // FP8: 128 rows × a granule's 128 bytes
constexpr uint32_t kFp4CodeBytes = uint32_t(kWgW) * 64;  // FP4: 128 rows × 4 pieces of 16 bytes
// INT4: a granule's 16 word rows × 64 columns (weight rows) a box, two
// boxes; then each box's 64 group scales (128 bytes) and 8 zero words (32
// bytes, kept 128-byte aligned for the copy engine), padded to 1024.
constexpr uint32_t kI4BoxBytes = 16 * 64 * 4, kI4Scales = 2 * kI4BoxBytes, kI4Zeros = kI4Scales + 256;
constexpr uint32_t kI4StageExtra = kI4Scales + 1024;
constexpr bool fp8_fmt(QFmt F) { return F == QFmt::Fp8; }
constexpr bool int4_fmt(QFmt F) { return F == QFmt::Int4; }
template <QFmt F>
constexpr uint32_t fp4_scale_row() { return F == QFmt::Mxfp4 ? 16 : 32; }  // scale bytes of a granule's row
template <QFmt F, int NX>
constexpr uint32_t q_stage_bytes() {  // x (1024-byte aligned), codes (FP8: 1024-aligned, swizzled), FP4 scales
  return uint32_t(2 * NX * kWgRowBytes) +
         (fp8_fmt(F)    ? kQCodeBytes
          : int4_fmt(F) ? kI4StageExtra
                        : kFp4CodeBytes + uint32_t(kWgW) * fp4_scale_row<F>());
}
template <QFmt F>
constexpr int q_granule() { return fp4_format(F) ? kFp4Granule : kQGranule; }
template <QFmt F>
constexpr int q_gather_run() { return fp8_fmt(F) ? 64 : 32; }  // positions a gather thread writes
template <QFmt F>
constexpr int q_lane_span() { return fp4_format(F) ? 128 : 32; }  // k of a granule a lane of a quad owns

// The activation order of a granule (512 k): position 128·j + 32·w + 16·h +
// 8·hi + 2·tq + b holds k = 128·tq + 32·j + 8·w + 2·h + hi + 4·b, the k of
// step (j, w, i = 2h) in mma slot 8·hi + 2·tq + b. From the four 8-k runs
// in[tq] = k 128·tq + 32·j + 8·w .., the 32 positions 128·j + 32·w ..:
// x_pairs_4apart gives (k + m, k + m + 4), m = 0..3, the words of slots
// (2·tq, 2·tq + 1) of step h = m / 2, half hi = m % 2. INT4's granule (128
// k, lane tq owns k 32·tq .., cuda_quant_fp8_int4.cuh) is the same with
// 32·tq for 128·tq and no j: position 32·j + 16·h + 8·hi + 2·tq + b holds k
// = 32·tq + 8·j + 2·h + hi + 4·b (step (j, h) of int4_accumulate).
__device__ __forceinline__ void fp4_permute32(const uint4 (&in)[4], uint4* dst) {
  uint32_t p[4][4];
#pragma unroll
  for (int tq = 0; tq < 4; ++tq) x_pairs_4apart(in[tq], p[tq]);
#pragma unroll
  for (int m = 0; m < 4; ++m) dst[m] = make_uint4(p[0][m], p[1][m], p[2][m], p[3][m]);
}

// The FP8 order of a granule (128 k): position 64·j + 16·w + 8·hi + 2·tq + b
// holds k = 32·tq + 16·j + 4·w + hi + 2·b, the k of step (j, w) in mma slot
// 8·hi + 2·tq + b (x_pairs_2apart's pairs). From in[tq][2] = k 32·tq + 16·j
// .. + 15, the 64 positions 64·j ..
__device__ __forceinline__ void fp8_permute64(const uint4 (&in)[4][2], uint4* dst) {
#pragma unroll
  for (int w = 0; w < 4; ++w) {
    uint32_t p[4][2];
#pragma unroll
    for (int tq = 0; tq < 4; ++tq) {
      const uint4& v = in[tq][w >> 1];
      if (w & 1) x_pairs_2apart(v.z, v.w, p[tq]);
      else x_pairs_2apart(v.x, v.y, p[tq]);
    }
    dst[2 * w] = make_uint4(p[0][0], p[1][0], p[2][0], p[3][0]);
    dst[2 * w + 1] = make_uint4(p[0][1], p[1][1], p[2][1], p[3][1]);
  }
}

// x rows gathered and permuted: grouped row g <- u[order[g] / topk] in the
// format's order (K a multiple of its granule); one thread a run of
// positions: FP4 32, (j, w) of a granule; FP8 64, piece j of a granule;
// INT4 32, step j of a granule.
// order null (the dense products): row g <- u[g], all R rows.
template <QFmt F>
__global__ void moe_q_gather_kernel(const __nv_bfloat16* __restrict__ u, int64_t Hm, int topk,
                                    const int32_t* __restrict__ order, const int32_t* __restrict__ starts, int E,
                                    int64_t R, __nv_bfloat16* __restrict__ xg) {
  pdl_wait();  // the grouping (and u) come from the kernels before
  pdl_launch_dependents();
  constexpr int kRun = q_gather_run<F>(), kRunsGran = q_granule<F>() / kRun;
  const int64_t runs = Hm / kRun, i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (i >= R * runs) return;
  const int64_t g = i / runs, r = i % runs, k0 = (r / kRunsGran) * q_granule<F>(), jw = r % kRunsGran;
  if (starts && g >= starts[E]) return;
  const __nv_bfloat16* src = u + (order ? int64_t(order[g] / topk) : g) * Hm + k0;
  __nv_bfloat16* dst = xg + g * Hm + k0 + kRun * jw;
  if constexpr (fp8_fmt(F)) {  // jw = j
    uint4 in[4][2];
#pragma unroll
    for (int tq = 0; tq < 4; ++tq)
#pragma unroll
      for (int q = 0; q < 2; ++q) in[tq][q] = *reinterpret_cast<const uint4*>(src + 32 * tq + 16 * jw + 8 * q);
    fp8_permute64(in, reinterpret_cast<uint4*>(dst));
  } else {  // FP4: jw = 4·j + w; INT4: jw = j
    uint4 in[4];
#pragma unroll
    for (int tq = 0; tq < 4; ++tq) in[tq] = *reinterpret_cast<const uint4*>(src + 8 * jw + q_lane_span<F>() * tq);
    fp4_permute32(in, reinterpret_cast<uint4*>(dst));
  }
}

struct QMaps {
  CUtensorMap x;       // grouped activations (permuted), boxes of 64 k × NX rows
  CUtensorMap codes;   // FP4: [E][N][K/128][4][16 bytes], box {16, 1, 4, 64, 1}: piece j of 64 rows;
                       // FP8: [E][N][K], box {128, 64, 1}: a granule of 64 rows, 128-byte swizzle
                       // INT4: [E][K/8][N] words, box {64, 16, 1}: a granule's word rows of 64 columns
  CUtensorMap scales;  // FP4: [E][N][K/512][granule's scale bytes], box {bytes, 1, 64, 1}
                       // INT4: [E][G][N] F16 / BF16, box {64, 1, 1}
  CUtensorMap zeros;   // INT4 with zero points: [E][G][N/8] words, box {8, 1, 1}
};

// What the kernels need of the weight beyond its maps: the row factors
// (FP4, FP8) and INT4's group width, zero points and scale type.
struct QRows {
  const float* global;     // NVFP4: [E · parts], else null
  const uint8_t* scales;   // FP8: per-tensor / per-channel F32 scales
  int64_t N, scales_stride;
  int parts, block_rows;
  int64_t group;           // INT4: columns a scale group
  int zero_offset;         // INT4: added to stored zero points (GPTQ v1)
  bool zeros, bf16_scales;  // INT4: zero points stored; BF16 (else F16) scales
};
QRows q_rows(const QuantDev& w) {
  return QRows{w.global,     w.scales,        w.N,          w.scales_stride,     w.global_parts,
               int(w.block_rows), w.block_cols, w.zero_offset, w.zeros != nullptr, w.bf16_scales != 0};
}
template <QFmt F>
__device__ __forceinline__ float q_row_factor(const QRows& w, int e, int64_t n) {
  if constexpr (int4_fmt(F)) {  // the group scales are applied per granule
    return 1.0f;
  } else if constexpr (fp8_fmt(F)) {  // per tensor / per channel: moe_q_gemm_applies refuses block scales
    return reinterpret_cast<const float*>(w.scales + e * w.scales_stride)[n / w.block_rows];
  } else {
    if (!w.global) return kFp4Unbias;
    const int64_t parts = w.parts > 0 ? w.parts : 1;
    return w.global[e * parts + n / (w.N / parts)] * kFp4Unbias;
  }
}

#if defined(__CUDA_ARCH_FEAT_SM90_ALL)
__device__ __forceinline__ uint2 lds64(uint32_t addr) {
  uint2 v;
  asm volatile("ld.shared.v2.u32 {%0,%1}, [%2];" : "=r"(v.x), "=r"(v.y) : "r"(addr));
  return v;
}
__device__ __forceinline__ uint32_t lds32(uint32_t addr) {
  uint32_t v;
  asm volatile("ld.shared.u32 %0, [%1];" : "=r"(v) : "r"(addr));
  return v;
}

// A K-slice's units through the copy engine's stages (wg_tma_units' loop
// with the A fragments decoded from codes). FP4: unit u is piece u % 4 of
// the slice's granule u / 4; each lane reads its 16-byte pieces of rows ra
// and ra + 8 and, at a granule's first unit, its scale bytes of the granule
// (NVFP4: 8 of each row's 32, MXFP4 4 of 16), as fp4_granule_mma does. FP8:
// unit u is the slice's granule u; each lane reads chunks 2·tq and 2·tq + 1
// of rows ra and ra + 8 (128-byte swizzle: chunk c of row ρ at c ^ (ρ % 8))
// and decodes them as fp8_accumulate does.
template <QFmt F, int NX, int STAGES, class Refill>
__device__ __forceinline__ void q_units(float (&d)[NX / 2], uint32_t base, uint32_t full, uint32_t empty, int units,
                                        const uint32_t* lut, Refill&& refill) {
  constexpr bool MX = F == QFmt::Mxfp4;
  constexpr uint32_t kStage = q_stage_bytes<F, NX>(), kX = uint32_t(2 * NX * kWgRowBytes);
  constexpr uint32_t kSRow = fp4_scale_row<F>();
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5, wg = threadIdx.x >> 7;
  const int g = lane >> 2, tq = lane & 3, ra = 64 * wg + 16 * (warp & 3) + g;
#pragma unroll
  for (int i = 0; i < NX / 2; ++i) d[i] = 0.0f;
  uint32_t code_off[2][2], scale_off[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int row = ra + 8 * h;
#pragma unroll
    for (int j = 0; j < 2; ++j)
      code_off[h][j] = fp8_fmt(F) ? kX + uint32_t(row) * 128 + uint32_t(((2 * tq + j) ^ (row & 7)) << 4)
                                  : kX + uint32_t(row) * 64 + 16 * tq;
    scale_off[h] = kX + kFp4CodeBytes + uint32_t(row) * kSRow + (MX ? 4 : 8) * tq;
  }
  uint2 sc[2] = {};
  for (int u = 0; u < units; ++u) {
    const int st = u % STAGES, j = u & 3;
    const uint32_t stage = base + uint32_t(st) * kStage;
    mbar_wait(full + 8 * st, uint32_t((u / STAGES) & 1));
    uint32_t a[8][4];
    if constexpr (fp8_fmt(F)) {
#pragma unroll
      for (int jj = 0; jj < 2; ++jj) {
        uint4 cv[2];
#pragma unroll
        for (int h = 0; h < 2; ++h) cv[h] = lds128(stage + code_off[h][jj]);
#pragma unroll
        for (int w = 0; w < 4; ++w) {
          uint32_t p[2][2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t word = w == 0 ? cv[h].x : w == 1 ? cv[h].y : w == 2 ? cv[h].z : cv[h].w;
            p[h][0] = bf16x2_mul(e4m3_pair<0>(word), kE4m3Unbias);
            p[h][1] = bf16x2_mul(e4m3_pair<1>(word), kE4m3Unbias);
          }
          uint32_t(&at)[4] = a[4 * jj + w];
          at[0] = p[0][0], at[1] = p[1][0], at[2] = p[0][1], at[3] = p[1][1];
        }
      }
    } else {
      if (j == 0) {
#pragma unroll
        for (int h = 0; h < 2; ++h)
          sc[h] = MX ? make_uint2(lds32(stage + scale_off[h]), 0u) : lds64(stage + scale_off[h]);
      }
      uint4 cv[2];
#pragma unroll
      for (int h = 0; h < 2; ++h) cv[h] = lds128(stage + code_off[h][0]);
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t p[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const int byte = MX ? j : 2 * j + (w >> 1);
          const uint32_t b = ((byte < 4 ? sc[h].x : sc[h].y) >> (8 * (byte & 3))) & 0xFFu;
          const uint32_t fs = lut[b];
          const uint32_t word = w == 0 ? cv[h].x : w == 1 ? cv[h].y : w == 2 ? cv[h].z : cv[h].w;
          e2m1_pairs(word, p[h]);
#pragma unroll
          for (int i = 0; i < 4; ++i) p[h][i] = bf16x2_mul(p[h][i], fs);
        }
        a[2 * w][0] = p[0][0], a[2 * w][1] = p[1][0], a[2 * w][2] = p[0][1], a[2 * w][3] = p[1][1];
        a[2 * w + 1][0] = p[0][2], a[2 * w + 1][1] = p[1][2], a[2 * w + 1][2] = p[0][3], a[2 * w + 1][3] = p[1][3];
      }
    }
    const uint64_t db[2] = {wg_desc(stage), wg_desc(stage + uint32_t(NX * kWgRowBytes))};
    wg_hold(d);
    wg_fence();
#pragma unroll
    for (int t = 0; t < 8; ++t) wgmma_rs<NX>(d, a[t], db[t >> 2] + 2 * (t & 3));  // +32 bytes a k16 step
    wg_commit();
    if (threadIdx.x == 0 && u >= 1 && u - 1 + STAGES < units) {
      mbar_wait(empty + 8 * ((u - 1) % STAGES), uint32_t(((u - 1) / STAGES) & 1));  // every warp is past unit u - 1
      refill(u - 1 + STAGES);
    }
    wg_wait<0>();
    wg_hold(d);
#pragma unroll
    for (int t = 0; t < 8; ++t) wg_hold(a[t]);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * st);
  }
}

// INT4's units (a unit is one granule of 128 k). The per-tile kernel
// (int4_accumulate) gives a warp 32 weight rows, lane g rows 4·g .. 4·g + 3
// (one 16-byte piece of each word row), and runs two mma tiles, tt = 0 on
// rows 4·g, 4·g + 1 and tt = 1 on 4·g + 2, 4·g + 3 (as rows g and g + 8 of
// the tile). Here warp w of a warpgroup takes tile tt = w % 2 of the 32-row
// group w / 2 of its box: its A row g is box row 32·(w / 2) + 4·g + 2·tt
// and A row g + 8 the next one (int4_row); the finishes find the rows there
// (moe_cluster_quads<..., true>). Each granule's eight steps sum into e
// from 0.0f, then d = fma(e, group scale of the row, d), as the per-tile
// kernel's part and acc: its bits. A = q − z, exact in bf16.
__device__ __forceinline__ int int4_row() {
  const int w = (threadIdx.x >> 5) & 3, g = (threadIdx.x & 31) >> 2;
  return 32 * (w >> 1) + 4 * g + 2 * (w & 1);
}
template <int NX, int STAGES, class Refill>
__device__ __forceinline__ void q_units_int4(float (&d)[NX / 2], uint32_t base, uint32_t full, uint32_t empty,
                                             int units, const QRows& rows, Refill&& refill) {
  constexpr uint32_t kStage = q_stage_bytes<QFmt::Int4, NX>(), kX = uint32_t(2 * NX * kWgRowBytes);
  const int lane = threadIdx.x & 31, wg = threadIdx.x >> 7, tq = lane & 3;
  const int row = int4_row();  // of box wg
  const uint32_t code_off = kX + uint32_t(wg) * kI4BoxBytes + uint32_t(4 * tq * 64 + row) * 4;  // word row 4·tq (+ j)
  const uint32_t scale_off = kX + kI4Scales + uint32_t(wg) * 128 + uint32_t(row) * 2;
  const uint32_t zero_off = kX + kI4Zeros + uint32_t(wg) * 128 + uint32_t(row / 8) * 4;
  const int zshift = 4 * (row % 8);
#pragma unroll
  for (int i = 0; i < NX / 2; ++i) d[i] = 0.0f;
  for (int u = 0; u < units; ++u) {
    const int st = u % STAGES;
    const uint32_t stage = base + uint32_t(st) * kStage;
    mbar_wait(full + 8 * st, uint32_t((u / STAGES) & 1));
    const uint32_t sw = lds32(stage + scale_off);
    const float sc[2] = {half_bits_to_float(sw & 0xFFFFu, rows.bf16_scales), half_bits_to_float(sw >> 16, rows.bf16_scales)};
    uint32_t zb[2] = {0x4308u * 0x10001u, 0x4308u * 0x10001u};  // bf16(128 + 8): no zero points
    if (rows.zeros) {
      const uint32_t zw = lds32(stage + zero_off) >> zshift;
#pragma unroll
      for (int h = 0; h < 2; ++h) zb[h] = (0x4300u | (((zw >> (4 * h)) & 15u) + uint32_t(rows.zero_offset))) * 0x10001u;
    }
    uint32_t a[8][4];
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      const uint2 cw = lds64(stage + code_off + uint32_t(j) * 256);
      uint32_t p[2][4];
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const uint32_t word = h ? cw.y : cw.x;
        p[h][0] = bf16x2_sub(u4_pair_plus128<0>(word), zb[h]);
        p[h][1] = bf16x2_sub(u4_pair_plus128<1>(word), zb[h]);
        p[h][2] = bf16x2_sub(u4_pair_plus128<2>(word), zb[h]);
        p[h][3] = bf16x2_sub(u4_pair_plus128<3>(word), zb[h]);
      }
      a[2 * j][0] = p[0][0], a[2 * j][1] = p[1][0], a[2 * j][2] = p[0][1], a[2 * j][3] = p[1][1];
      a[2 * j + 1][0] = p[0][2], a[2 * j + 1][1] = p[1][2], a[2 * j + 1][2] = p[0][3], a[2 * j + 1][3] = p[1][3];
    }
    float e[NX / 2];
#pragma unroll
    for (int i = 0; i < NX / 2; ++i) e[i] = 0.0f;
    const uint64_t db[2] = {wg_desc(stage), wg_desc(stage + uint32_t(NX * kWgRowBytes))};
    wg_hold(e);
    wg_fence();
#pragma unroll
    for (int t = 0; t < 8; ++t) wgmma_rs<NX>(e, a[t], db[t >> 2] + 2 * (t & 3));
    wg_commit();
    if (threadIdx.x == 0 && u >= 1 && u - 1 + STAGES < units) {
      mbar_wait(empty + 8 * ((u - 1) % STAGES), uint32_t(((u - 1) / STAGES) & 1));
      refill(u - 1 + STAGES);
    }
    wg_wait<0>();
    wg_hold(e);
#pragma unroll
    for (int t = 0; t < 8; ++t) wg_hold(a[t]);
#pragma unroll
    for (int i = 0; i < NX / 2; ++i) d[i] = fmaf(e[i], sc[(i >> 1) & 1], d[i]);
    __syncwarp();
    if (lane == 0) mbar_arrive(empty + 8 * st);
  }
}
#endif

}  // namespace
}  // namespace muse::cuda
