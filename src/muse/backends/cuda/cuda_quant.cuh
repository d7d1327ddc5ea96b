// Quantized weights on the tensor cores: the pieces shared by project
// (cuda_quant_matmul.cu) and the latent experts (cuda_quant_moe.cu).
//
// Hopper has no FP4 MMA, so a weight is decoded to bf16 in registers, right
// before its mma.m16n8k16 (bf16 inputs, fp32 accumulation): HBM and the
// shared-memory ring carry only the stored codes and scales, and no
// dequantized copy of a weight exists anywhere. The arithmetic follows the
// BF16 ring kernels (cuda_mma.cuh): a warp owns 16-row weight tiles and one
// of kSplit K-slices, granules of K in ascending order per slice, slices
// added 0 + 1 + 2 + 3; a lane's x loads and its reads of the ring *are* its
// fragments (the k of each 16-wide mma step permuted the same way in A and
// B; the ring's copies themselves are warp-wide, whole lines), so a row's
// result depends on K only, never on T or on the other rows of the batch.
//
// Where each value is rounded (docs/cuda.md, "Quantized weights"):
//  - NVFP4 / MXFP4: e2m1 · block scale is exact in bf16 (2 × 4 significant
//    bits; E8M0 is a power of two), so the mma sees the exact weight up to
//    a power of two; the NVFP4 global (and that power of two, 2^64) multiply
//    the fp32 sum once, per output.
//  - FP8 (E4M3): the code is exact in bf16; per-tensor / per-channel scales
//    multiply the fp32 sum once; 128×128 block scales multiply each
//    granule's fp32 partial sum (one granule = one block column).
//  - INT4 (GPTQ): q − z is an exact small integer in bf16; each group's fp32
//    partial sum is multiplied by its scale (s · Σ x·(q − z)), as the CPU
//    kernels factor it.
#pragma once

#include <cstdint>
#include <type_traits>

#include "muse/backends/cuda/cuda_mma.cuh"

namespace muse::cuda {

// The formats the kernels are specialised for (tensor.h's QuantKind).
enum class QFmt : int { Nvfp4, Mxfp4, Fp8, Int4 };

// A quantized weight (every expert of a fused [E, N, K] set) as the kernels
// read it. Strides are per expert, in bytes.
struct QuantDev {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  const float* global = nullptr;   // NVFP4: [E · global_parts]
  const uint8_t* zeros = nullptr;  // INT4: packed zero points (null: symmetric, z = 8)
  int64_t N = 0, K = 0;            // one matrix
  int64_t codes_stride = 0, scales_stride = 0, zeros_stride = 0;
  int64_t scale_ld = 0;            // row-major kinds: scale entries per scale row
  int block_rows = 1, block_cols = 16;
  int global_parts = 0;            // NVFP4: rows per global = N / global_parts
  int zero_offset = 0;             // INT4
  int bf16_scales = 0;             // INT4: BF16 group scales instead of F16
  int aligned = 0;                 // whole granules (and FP4 / FP8: 16-byte copies) hold (quant_dev)
};

// The power of two the FP4 kernels keep out of the bf16 weights (see
// fp4 scale factors below) and give back once, to the fp32 sum.
constexpr float kFp4Unbias = 18446744073709551616.0f;  // 2^64

// ---------------------------------------------------------------------------
// Element and scale decoding.
// ---------------------------------------------------------------------------

// Two E2M1 codes, nibbles I and I + 4 of q, as bf16x2 (low half: nibble I)
// scaled by 2^-126: the nibble's magnitude bits land on the bf16 exponent's
// two low bits and the mantissa's top bit (6..8), its sign on the sign (15);
// code 1, 0.5, becomes the subnormal 2^-127. Exact; the scale factor
// restores the magnitude. Four operations a pair (ptxas: a shift, a shift
// or IMAD.SHL, two LOP3); e2m1_pairs below gives the same four pairs in ten.
template <int I>
__device__ __forceinline__ uint32_t e2m1_pair(uint32_t q) {
  const uint32_t t = q << (12 - 4 * I);  // nibble I at bits 12..15, nibble I + 4 at 28..31
  return (t & 0x80008000u) | ((t >> 6) & 0x01C001C0u);
}

// (M & a) | (~M & b) in one LOP3 (written in C, ptxas masks b with ~M
// first and merges after: two).
template <uint32_t M>
__device__ __forceinline__ uint32_t bit_select(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("lop3.b32 %0, %1, %2, %3, 0xE2;" : "=r"(d) : "r"(a), "n"(M), "r"(b));  // (b-slot & a) | (~b-slot & c)
  return d;
}

// The four e2m1_pair<I> of q (I = 0..3) in ten integer operations instead
// of fifteen: the magnitudes are rotated 6 bits down once and merged with
// the signs in place into one word per nibble group, {0, 1, 4, 5} and
// {2, 3, 6, 7}. Within a group no two nibbles are 2 apart, so each nibble's
// sign (bit 4J + 3) and its moved magnitude (4J − 6 .. 4J − 4, mod 32) own
// their bits, and one rotate and one mask per pair place them. Equal to
// e2m1_pair for every 32-bit word (checked exhaustively: bench/NOTES.md,
// "2026-12-05 (16:46– UTC)"). ncu on the NVFP4 gate/up kernel at batch 1: 30.2 M
// instructions → 24.9 M.
__device__ __forceinline__ void e2m1_pairs(uint32_t q, uint32_t (&p)[4]) {
  constexpr uint32_t kPair = 0x81C081C0u;            // sign and magnitude bits of both halves
  const uint32_t r = __funnelshift_r(q, q, 6);       // every magnitude 6 bits down
  const uint32_t a = bit_select<0x00880088u>(q, r);  // nibbles 0, 1, 4, 5
  const uint32_t b = bit_select<0x88008800u>(q, r);  // nibbles 2, 3, 6, 7
  p[0] = __funnelshift_l(a, a, 12) & kPair;
  p[1] = __funnelshift_l(a, a, 8) & kPair;
  p[2] = __funnelshift_l(b, b, 4) & kPair;
  p[3] = b & kPair;
}

// Two E4M3 codes, bytes B and B + 2 of q, as bf16x2 (low half: byte B)
// scaled by 2^-120: exponent and mantissa bits shifted into the bf16's
// (E4M3 subnormals become bf16 subnormals, exactly).
template <int B>
__device__ __forceinline__ uint32_t e4m3_pair(uint32_t q) {
  const uint32_t t = __byte_perm(q, 0u, B == 0 ? 0x2404u : 0x3414u);  // bytes B, B + 2 at bits 8..15, 24..31
  return (t & 0x80008000u) | ((t >> 4) & 0x07F007F0u);
}

// Two 4-bit integers, nibbles I and I + 4 of q, as bf16x2 of 128 + q (the
// nibble in the mantissa of 2^7: exact).
template <int I>
__device__ __forceinline__ uint32_t u4_pair_plus128(uint32_t q) {
  return ((q >> (4 * I)) & 0x000F000Fu) | 0x43004300u;
}

// bf16x2 products and differences, round to nearest even (subnormals kept).
__device__ __forceinline__ uint32_t bf16x2_mul(uint32_t a, uint32_t b) {
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(b), "r"(0x80008000u));
  return d;
}
__device__ __forceinline__ uint32_t bf16x2_sub(uint32_t a, uint32_t b) {  // a − b = a · 1 + (−b)
  uint32_t d;
  asm("fma.rn.bf16x2 %0, %1, %2, %3;" : "=r"(d) : "r"(a), "r"(0x3F803F80u), "r"(b ^ 0x80008000u));
  return d;
}

// E4M3 byte → float, exactly (subnormals built without fp32 subnormals; 0x7F/0xFF are NaN).
__device__ __forceinline__ float e4m3_to_float(uint32_t b) {
  const uint32_t mag = b & 0x7Fu;
  float f = mag < 8 ? float(mag) * 0.001953125f  // m · 2^-9
                    : __uint_as_float((mag << 20) + (120u << 23));
  if (mag == 0x7F) f = __int_as_float(0x7FC00000);
  return (b & 0x80u) ? -f : f;
}

// The bf16x2 factor (both halves equal) that turns a decoded E2M1 pair into
// e2m1 · block scale · 2^-64:
//   NVFP4 (E4M3 scale s): bf16(s · 2^62), exact (s has 4 significant bits);
//   MXFP4 (E8M0 scale 2^(e − 127)): 2^(e − 65), exact for e <= 192 (scales up
//   to 2^65; larger ones, meaningless for weights, read as infinity; 0xFF NaN).
template <bool MX>
__device__ __forceinline__ uint32_t fp4_scale_factor(uint32_t b) {
  uint32_t h;
  if (MX) {
    h = b == 0xFFu ? 0x7FC0u : b > 192u ? 0x7F80u : (b + 62u) << 7;
  } else {
    const float f = e4m3_to_float(b) * 4611686018427387904.0f;  // · 2^62, exact
    h = uint32_t(__bfloat16_as_ushort(__float2bfloat16_rn(f)));
  }
  return h * 0x10001u;
}

// x pairs matching the decoders' pairing: from 8 consecutive bf16 x
// (xv.x = x0,x1 ... xv.w = x6,x7), (x_i, x_{i+4}) for i = 0..3 (FP4, INT4).
__device__ __forceinline__ void x_pairs_4apart(const uint4& xv, uint32_t (&p)[4]) {
  p[0] = __byte_perm(xv.x, xv.z, 0x5410u);
  p[1] = __byte_perm(xv.x, xv.z, 0x7632u);
  p[2] = __byte_perm(xv.y, xv.w, 0x5410u);
  p[3] = __byte_perm(xv.y, xv.w, 0x7632u);
}
// From 4 consecutive bf16 x (a = x0,x1; b = x2,x3): (x0, x2), (x1, x3) (FP8).
__device__ __forceinline__ void x_pairs_2apart(uint32_t a, uint32_t b, uint32_t (&p)[2]) {
  p[0] = __byte_perm(a, b, 0x5410u);
  p[1] = __byte_perm(a, b, 0x7632u);
}

__device__ __forceinline__ void cp_async8(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
}
__device__ __forceinline__ void cp_async4(void* smem, const void* gmem, int src_bytes) {
  const unsigned s = static_cast<unsigned>(__cvta_generic_to_shared(smem));
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4, %2;" ::"r"(s), "l"(gmem), "r"(src_bytes));
}

__device__ __forceinline__ uint4 ldg_x(const __nv_bfloat16* p) { return __ldg(reinterpret_cast<const uint4*>(p)); }

constexpr bool fp4_format(QFmt f) { return f == QFmt::Nvfp4 || f == QFmt::Mxfp4; }

// The factor of output row n of expert e applied once to its fp32 sum:
// NVFP4 its global (times the 2^64 the bf16 weights leave out), MXFP4 2^64,
// FP8 its per-tensor / per-channel scale.
template <QFmt F>
__device__ __forceinline__ float quant_row_factor(const QuantDev& w, int64_t e, int64_t n) {
  if (F == QFmt::Nvfp4) {
    const int64_t parts = w.global_parts > 0 ? w.global_parts : 1;
    const float g = w.global ? w.global[e * parts + n / (w.N / parts)] : 1.0f;
    return g * kFp4Unbias;
  }
  if (F == QFmt::Mxfp4) return kFp4Unbias;
  if (F == QFmt::Fp8) {  // per tensor / per channel: one scale column; blocks are applied per granule
    if (w.block_cols < w.K) return 1.0f;
    return reinterpret_cast<const float*>(w.scales + e * w.scales_stride)[n / w.block_rows];
  }
  return 1.0f;  // INT4: group scales are applied per granule
}

// The ring's copies: coalesced, not per fragment. Each warp-wide 16-byte
// cp.async takes whole 128-byte lines, 8 consecutive lanes per line, into
// a swizzled slot; lanes then read their fragments, which other lanes
// copied, after ring_turn's __syncwarp. (Measured, 2026-12-01, Nsight Compute:
// when each lane copied its own fragment pieces, 16 bytes out of each
// 32-byte sector, every LDGSTS cost 32 shared-memory wavefronts instead of
// 4 and each sector crossed L2 -> SM twice: 71 MB for the 37.7 MB of an
// 8192² NVFP4 matrix, and 45% of the warps' stall samples sat in the copy
// code, waiting for the LSU to take the copies.)
//
// A 16-row weight tile as the copies see it: row 0's codes and scales
// (valid addresses even when no row of the tile exists) and how many of
// its rows exist.
struct QTile {
  const uint8_t* codes = nullptr;
  const uint8_t* scales = nullptr;
  int rows = 0;
};

// The tile of rows n0 .. n0 + 15 of a matrix with `rows` rows (row bytes
// `code_ld`, scale bytes per row `scale_ld`).
__device__ __forceinline__ QTile quant_tile(const uint8_t* codes, const uint8_t* scales, int64_t n0, int64_t rows,
                                            int64_t code_ld, int64_t scale_ld) {
  const int64_t nc = n0 < rows ? n0 : rows - 1;
  QTile t;
  t.codes = codes + nc * code_ld;
  t.scales = scales + nc * scale_ld;
  t.rows = int(rows - n0 < 0 ? 0 : rows - n0 > 16 ? 16 : rows - n0);
  return t;
}

// ---------------------------------------------------------------------------
// FP4 (NVFP4, MXFP4): granules of 512 k. Lane tq of a quad owns k
// [128·tq, 128·tq + 128) of each granule, as four 16-byte pieces (32 codes
// each) per weight row; word w of piece j holds k = 128·tq + 32·j + 8·w + 0..7
// and decodes to the pairs (k+i, k+i+4), i = 0..3: two mma steps, whose
// B fragments are the same pairs of x.
//
// A ring slot holds a warp's granule: per 16-row tile, codes [16 rows][16
// chunks of 16 bytes] (4 KB) and scales [16 rows][32 bytes] (NVFP4: 2 E4M3
// per 16-byte chunk; MXFP4: 16 bytes per row, 1 E8M0 per chunk). Copy m
// (0..7) of a tile: lane l takes chunk l % 16 of row 2m + l / 16, so a row's
// 256 bytes are two whole lines. Chunk c of row ρ sits at 16ρ + (c ^ σ),
// σ = c / 8 + 2·(ρ % 2): the copies' 8 lanes of a line write 8 different
// bank groups, and so do a fragment read's 8 lanes (rows g, g + 1, chunks
// 4·tq + j). The aligned path's scales (NVFP4: lane l takes 16 bytes of row
// l / 2; MXFP4: lanes 0..15 row l) are copied in the same turn, in rows of
// 32 bytes. Unaligned layouts (K not a multiple of 512, other block sizes)
// copy codes in 8-byte halves and read scales from global memory.
// ---------------------------------------------------------------------------
constexpr int kFp4Granule = 512;

template <int RW>
constexpr int fp4_slot_uint4() {
  return RW * 256 + RW * 32;
}
template <int RW, int NT, int STAGES>
constexpr size_t fp4_ring_bytes() {
  constexpr size_t ring = size_t(kSplit) * STAGES * fp4_slot_uint4<RW>() * sizeof(uint4);
  constexpr size_t part = size_t(kSplit - 1) * RW * NT * 4 * 32 * sizeof(float);
  return ring > part ? ring : part;
}

// The scale-factor table of an FP4 kernel's block (256 entries, shared).
template <bool MX>
__device__ __forceinline__ void fp4_fill_lut(uint32_t* lut) {
  for (int i = threadIdx.x; i < 256; i += blockDim.x) lut[i] = fp4_scale_factor<MX>(uint32_t(i));
  __syncthreads();
}

// One turn of a decoding ring, before granule i's mma steps: the slot
// granule i - 1 used is refilled with granule i + STAGES - 1 *before* the
// wait for granule i, so a warp has STAGES granules in flight while it
// waits (the BF16 ring waits first and keeps STAGES - 1: with two granules
// per warp at K = 4096 and two stages, the second granule's copy started
// only once the first had landed, two HBM latencies per block). Bits are
// unchanged: only when the copies start moves. The first __syncwarp: every
// lane is past granule i - 1 (lanes read each other's copies), and no read
// of that slot moves below the refill; the second: the other lanes' copies
// of granule i are visible.
template <int STAGES, class Issue>
__device__ __forceinline__ void ring_turn(int i, int mine, Issue&& issue) {
  __syncwarp();
  if (i + STAGES - 1 < mine) issue(i + STAGES - 1);
  cp_async_commit();
  cp_async_wait<STAGES - 1>();  // groups 0..i are complete: granule i has landed
  __syncwarp();
}

// The lane's copy source in tile t: chunk lane % 16 of row lane / 16 (the
// copies take rows 2m + lane / 16); fp4_copy_granule's cbase.
__device__ __forceinline__ const uint8_t* fp4_copy_base(const QTile& t, int64_t K, int lane) {
  return t.codes + (lane >> 4) * int(K / 2) + 16 * (lane & 15);
}

// The copies of granule k0 (its first k, in 32 bits like the copies'
// offsets) of RW tiles into a ring slot (see the layout above). K: the row
// length in codes; cbase[r]: fp4_copy_base of tile r (kept by the caller
// across granules). ONLY >= 0: tile ONLY's copies alone.
template <bool MX, bool ALIGNED, int RW, int ONLY = -1>
__device__ __forceinline__ void fp4_copy_granule(uint4* slot, const QTile (&tile)[RW], const uint8_t* const (&cbase)[RW],
                                                 int64_t K, int k0, int lane) {
  // The copies: chunk cc of rows 2m + cr; its place in the slot's tile.
  const int cr = lane >> 4, cc = lane & 15;
  const int cdst = 16 * cr + (cc ^ ((cc >> 3) | (cr << 1)));
  // Offsets within a tile in 32 bits (16 rows of K / 2 bytes), so that the
  // per-copy parts are uniform across the warp.
  const int code_ld = int(K / 2), scale_ld = int(K / (MX ? 32 : 16));  // scale_ld: the aligned path's canonical blocks
#pragma unroll
  for (int r = 0; r < RW; ++r) {
    if (ONLY >= 0 && r != ONLY) continue;
#pragma unroll
    for (int m = 0; m < 8; ++m) {
      const int row = 2 * m + cr;
      const uint8_t* src = cbase[r] + (2 * m * code_ld + k0 / 2);
      uint4* dst = slot + r * 256 + 32 * m + cdst;
      if (ALIGNED) {  // K % 512 == 0: every chunk of a granule is whole and inside K
        const bool ok = row < tile[r].rows;
        cp_async16(dst, ok ? src : tile[r].codes, ok ? 16 : 0);
      } else {  // K % 16 == 0: each 8-byte half is whole or past the end
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const bool ok = row < tile[r].rows && k0 + 32 * cc + 16 * q < K;
          cp_async8(reinterpret_cast<uint2*>(dst) + q, ok ? src + 8 * q : tile[r].codes, ok ? 8 : 0);
        }
      }
    }
    if (ALIGNED) {
      // The tile's scales of this granule in 16-byte L2-only copies (no L1
      // lines, which the activations need): NVFP4 32 bytes per row, lane l
      // half l % 2 of row l / 2; MXFP4 16 per row, lane l < 16 row l.
      uint4* sdst = slot + RW * 256 + r * 32 + lane;
      const int row = MX ? lane : lane >> 1;
      const bool ok = row < tile[r].rows;
      const uint8_t* src = tile[r].scales + row * scale_ld + k0 / (MX ? 32 : 16) + (MX ? 0 : 16 * (lane & 1));
      if (!MX || lane < 16) cp_async16(sdst, ok ? src : tile[r].scales, ok ? 16 : 0);
    }
  }
}

// acc[r][c] += the products of granule k0, landed in `slot`: W rows (tile
// r) · x rows (tile c). srow[r][h]: scale row of weight row g + 8h of tile
// r (not offset; the unaligned path reads its scales there); xr[c]:
// activation row 8c + g, offset by 128·tq; !wok / !xok rows read as zeros
// (their pointers stay valid). bc: the scale block (k). ONLY >= 0: tile
// ONLY's products alone (the others' accumulators untouched).
template <bool MX, bool ALIGNED, int RW, int NT, int ONLY = -1>
__device__ __forceinline__ void fp4_granule_mma(const uint4* slot, const uint32_t* lut,
                                                const uint8_t* const (&srow)[RW][2], const bool (&wok)[RW][2],
                                                const __nv_bfloat16* const (&xr)[NT], const bool (&xok)[NT],
                                                int64_t K, int bc, int64_t k0, int lane, float (&acc)[RW][NT][4]) {
  const int g = lane >> 2, tq = lane & 3;
  const int64_t kl = 128 * tq;
  // The fragment reads: chunk 4·tq + j of row g (+ 8h) at rbase + (j ^ rs).
  const int rbase = 16 * g + 4 * tq, rs = (tq >> 1) | ((g & 1) << 1);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  uint2 sc[RW][2];
  if (ALIGNED) {
    // NVFP4: this lane's 8 bytes of its row's 32; MXFP4: its 4 bytes of
    // the row's 16.
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (ONLY >= 0 && r != ONLY) continue;
        const uint8_t* row = reinterpret_cast<const uint8_t*>(slot + RW * 256 + r * 32) + (g + 8 * h) * (MX ? 16 : 32);
        if (MX) sc[r][h] = make_uint2(reinterpret_cast<const uint32_t*>(row)[tq], 0u);
        else sc[r][h] = reinterpret_cast<const uint2*>(row)[tq];
      }
  }
#pragma unroll
  for (int j = 0; j < 4; ++j) {
    const int64_t kj = k0 + 32 * j;  // + kl: this lane's piece
    uint4 cv[RW][2];
    uint32_t f[RW][2][2];  // scale factor per row and 16-k half of the piece
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        if (ONLY >= 0 && r != ONLY) continue;
        cv[r][h] = slot[r * 256 + 128 * h + rbase + (j ^ rs)];
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          uint32_t b;
          if (ALIGNED) {
            const int byte = MX ? j : 2 * j + q;
            b = ((byte < 4 ? sc[r][h].x : sc[r][h].y) >> (8 * (byte & 3))) & 0xFFu;
          } else {
            const int64_t k = kj + kl + 16 * q;
            b = wok[r][h] && k < K ? uint32_t(__ldg(srow[r][h] + k / bc)) : 0u;
          }
          f[r][h][q] = lut[b];
        }
      }
#pragma unroll
    for (int w = 0; w < 4; ++w) {
      uint32_t xp[NT][4];
#pragma unroll
      for (int c = 0; c < NT; ++c) {
        if (ALIGNED) {
          // The granule is whole and a missing row's pointer is clamped to
          // row nt − 1, so the load is always inside x and needs no guard:
          // a guarded load compiled to a branch, issued only right before
          // its own mma step; unguarded, a granule's loads are all in
          // flight at once. A missing row's mma column holds the
          // duplicate's sums, which no store reads (mma columns are
          // independent sums).
          x_pairs_4apart(ldg_x(xr[c] + kj + 8 * w), xp[c]);
        } else {
          const bool ok = xok[c] && kj + kl + 8 * w < K;
          x_pairs_4apart(ok ? ldg_x(xr[c] + kj + 8 * w) : zero, xp[c]);
        }
      }
#pragma unroll
      for (int r = 0; r < RW; ++r) {
        if (ONLY >= 0 && r != ONLY) continue;
        uint32_t p[2][4];
#pragma unroll
        for (int h = 0; h < 2; ++h) {
          const uint32_t word = w == 0 ? cv[r][h].x : w == 1 ? cv[r][h].y : w == 2 ? cv[r][h].z : cv[r][h].w;
          const uint32_t fs = f[r][h][w >> 1];
          // NVFP4 decodes in ten operations; MXFP4 keeps the shift form,
          // with which it measured faster (H100, four calls: the short form
          // cost MXFP4 1-2% at batch 16 and 64 and gave NVFP4 1-2%; why is
          // not known, it is not the fifth block an SM its fewer registers
          // allow: capped at four it lost more; bench/NOTES.md).
          if constexpr (MX) {
            p[h][0] = e2m1_pair<0>(word), p[h][1] = e2m1_pair<1>(word);
            p[h][2] = e2m1_pair<2>(word), p[h][3] = e2m1_pair<3>(word);
          } else {
            e2m1_pairs(word, p[h]);
          }
#pragma unroll
          for (int i = 0; i < 4; ++i) p[h][i] = bf16x2_mul(p[h][i], fs);
        }
#pragma unroll
        for (int c = 0; c < NT; ++c) {
          mma16816(acc[r][c], p[0][0], p[1][0], p[0][1], p[1][1], xp[c][0], xp[c][1]);
          mma16816(acc[r][c], p[0][2], p[1][2], p[0][3], p[1][3], xp[c][2], xp[c][3]);
        }
      }
    }
  }
}

// acc[r][c] = W rows (tile r) · x rows (tile c) over K-slice s: the slice's
// granules (s, s + kSplit, ...) in ascending order through the warp's ring
// of STAGES slots (arguments as for fp4_granule_mma; tile[r]: weight tile r
// for the copies).
template <bool MX, bool ALIGNED, int RW, int NT, int STAGES>
__device__ __forceinline__ void fp4_accumulate(uint4* ring, const uint32_t* lut, const QTile (&tile)[RW],
                                               const uint8_t* const (&srow)[RW][2], const bool (&wok)[RW][2],
                                               const __nv_bfloat16* const (&xr)[NT], const bool (&xok)[NT],
                                               int64_t K, int bc, int s, int lane, float (&acc)[RW][NT][4]) {
  constexpr int SLOT = fp4_slot_uint4<RW>();
#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int c = 0; c < NT; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][c][i] = 0.0f;
  const int64_t ngran = (K + kFp4Granule - 1) / kFp4Granule;
  const int mine = s < ngran ? int((ngran - s + kSplit - 1) / kSplit) : 0;
  uint4* my = ring + size_t(s) * STAGES * SLOT;
  const uint8_t* cbase[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) cbase[r] = fp4_copy_base(tile[r], K, lane);
  if constexpr (STAGES == 1 && RW == 2) {
    // One slot, two tiles (the experts' gate and up): each tile is its own
    // copy group, and a tile's slot part is refilled with the next granule
    // as soon as its products are done, so the gate's next copy is in
    // flight while the up tile's products run, and the up's while the
    // gate's next products run. Each accumulator sees the same products
    // in the same order: the same bits as the whole-slot turn.
    auto issue_tile = [&](auto r, int i) {
      if (i < mine)
        fp4_copy_granule<MX, ALIGNED, RW, decltype(r)::value>(my, tile, cbase, K, (s + i * kSplit) * kFp4Granule,
                                                             lane);
      cp_async_commit();
    };
    issue_tile(std::integral_constant<int, 0>{}, 0);
    issue_tile(std::integral_constant<int, 1>{}, 0);
    pdl_wait();  // x may come from the kernel before (the weights do not)
    for (int i = 0; i < mine; ++i) {
      const int64_t k0 = (int64_t(s) + int64_t(i) * kSplit) * kFp4Granule;
      cp_async_wait<1>();  // pending: tile 0 then tile 1 of granule i; tile 0 has landed
      __syncwarp();        // the other lanes' copies are visible
      fp4_granule_mma<MX, ALIGNED, RW, NT, 0>(my, lut, srow, wok, xr, xok, K, bc, k0, lane, acc);
      __syncwarp();  // every lane is past tile 0's part of the slot
      issue_tile(std::integral_constant<int, 0>{}, i + 1);
      cp_async_wait<1>();  // pending: tile 1 of granule i, tile 0 of i + 1
      __syncwarp();
      fp4_granule_mma<MX, ALIGNED, RW, NT, 1>(my, lut, srow, wok, xr, xok, K, bc, k0, lane, acc);
      __syncwarp();
      issue_tile(std::integral_constant<int, 1>{}, i + 1);
    }
    pdl_streaming_done();
    cp_async_wait<0>();
    return;
  }
  auto issue = [&](int i) {
    fp4_copy_granule<MX, ALIGNED, RW>(my + (i % STAGES) * SLOT, tile, cbase, K, (s + i * kSplit) * kFp4Granule, lane);
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < mine) issue(i);
    cp_async_commit();
  }
  pdl_wait();  // x may come from the kernel before (the weights do not)
  for (int i = 0; i < mine; ++i) {
    ring_turn<STAGES>(i, mine, issue);  // the lanes' fragments are other lanes' copies
    fp4_granule_mma<MX, ALIGNED, RW, NT>(my + (i % STAGES) * SLOT, lut, srow, wok, xr, xok, K, bc,
                                         (int64_t(s) + int64_t(i) * kSplit) * kFp4Granule, lane, acc);
  }
  pdl_streaming_done();
  cp_async_wait<0>();
}

// One warp's part of a streaming FP4 kernel (aligned: K % 512 == 0; the
// experts' down product, cuda_quant_moe.cu): the block's items first ..
// last − 1, each RW weight tiles times one activation tile over K-slice s,
// through one ring that runs across the items. The next item's granules
// are copied while this one's mma steps run, so HBM does not wait while a
// block reduces, ends and the next one starts, as it does between the
// per-tile kernels' short blocks. Each item's sums are fp4_accumulate's:
// the same granules in the same order, the same bits.
//   item.weights(it, tile): item it's weight tiles (the copies, at its
//     first granule);
//   item.x(it): its activation row, offset by 128·tq (at its first mma);
//   item.finish(it, acc, mine_of): after its last granule, every warp, in
//     item order; mine_of(w) gives warp w's granules an item, from which
//     the finish finds the ring slot each warp has just read: no copy
//     writes that slot before the warp's next granule, so the finish may
//     pass the slice sums through it.
template <bool MX, int RW, int STAGES, class Item>
__device__ __forceinline__ void fp4_stream(uint4* ring, const uint32_t* lut, int64_t K, int s, int lane, int first,
                                           int last, Item& item) {
  constexpr int SLOT = fp4_slot_uint4<RW>();
  const int64_t ngran = K / kFp4Granule;
  auto mine_of = [ngran](int w) { return w < ngran ? int((ngran - w + kSplit - 1) / kSplit) : 0; };
  const int mine = mine_of(s), total = (last - first) * mine;
  uint4* my = ring + size_t(s) * STAGES * SLOT;
  QTile tile[RW];
  const uint8_t* cbase[RW];
  int iit = first, ig = 0;  // the copies' item and granule
  auto issue = [&](int q) {
    if (ig == 0) {
      item.weights(iit, tile);
#pragma unroll
      for (int r = 0; r < RW; ++r) cbase[r] = fp4_copy_base(tile[r], K, lane);
    }
    fp4_copy_granule<MX, true, RW>(my + (q % STAGES) * SLOT, tile, cbase, K, (s + ig * kSplit) * kFp4Granule, lane);
    if (++ig == mine) ig = 0, ++iit;
  };
#pragma unroll
  for (int q = 0; q < STAGES - 1; ++q) {
    if (q < total) issue(q);
    cp_async_commit();
  }
  pdl_wait();  // x may come from the kernel before (the weights do not)
  const uint8_t* const srow[RW][2] = {};  // the aligned path reads its scales from the ring
  const bool wok[RW][2] = {};
  const bool xok[1] = {true};
  int q = 0;
  for (int it = first; it < last; ++it) {
    const __nv_bfloat16* const xr[1] = {item.x(it)};
    float acc[RW][1][4];
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][0][i] = 0.0f;
    for (int i = 0; i < mine; ++i, ++q) {
      ring_turn<STAGES>(q, total, issue);  // the lanes' fragments are other lanes' copies
      fp4_granule_mma<MX, true, RW, 1>(my + (q % STAGES) * SLOT, lut, srow, wok, xr, xok, K, 0,
                                       (int64_t(s) + int64_t(i) * kSplit) * kFp4Granule, lane, acc);
    }
    __syncwarp();  // every lane has read the slot the finish may write
    item.finish(it, acc, mine_of);
  }
  pdl_streaming_done();
  cp_async_wait<0>();
}

// The slot warp w read last in item ordinal n (from 0) of its block's
// stream (slot 0 when the warp has no granules: never copied into).
template <int RW, int STAGES>
__device__ __forceinline__ uint4* fp4_stream_done_slot(uint4* ring, int w, int n, int mine) {
  const int q = mine > 0 ? (n + 1) * mine - 1 : 0;
  return ring + size_t(w) * STAGES * fp4_slot_uint4<RW>() + (q % STAGES) * fp4_slot_uint4<RW>();
}

}  // namespace muse::cuda

namespace muse::cuda {

// ---------------------------------------------------------------------------
// Host side (cuda_quant_matmul.cu).
// ---------------------------------------------------------------------------
// Whether the quantized kernels were built (they need sm_80+ device code)
// and run this kind.
bool quant_kind_runs(QuantKind kind);
// Empty when project / moe_experts can take this weight with a BF16 input;
// otherwise why not (for the enqueue error).
std::string quant_unsupported(const Tensor& w);
// The kernels' view of a quantized weight (call only when quant_unsupported is empty).
QuantDev quant_dev(const Tensor& w);
// out[T, N] = x[T, K] · dequant(w)ᵀ, every T (64-row blocks), fixed order.
cudaError_t launch_quant_project(cudaStream_t s, const Tensor& x, const Tensor& w, const Tensor& out);
// The latent experts' two products with quantized gate_up [E, 2I, Hm] and
// down [E, Hm, I] (cuda_quant_moe.cu), over moe_experts' grouping tiles:
// A[g, i] = bf16(silu(γ) · υ), Y[g, n] = A_g · down[e, n] (fp32). mode:
// CudaBackendOptions::expert_kernel (0 the rule, 1 per-tile blocks only, 2
// the FP4 down product streamed wherever aligned; the same bits).
cudaError_t launch_quant_experts(cudaStream_t s, const Tensor& u, const Tensor& gate_up, const Tensor& down, int K,
                                 const int32_t* order, const int32_t* tiles, const int32_t* ntiles, int max_tiles,
                                 __nv_bfloat16* A, float* Y, int mode);

}  // namespace muse::cuda
