// The FP8 and INT4 decoding rings (cuda_quant.cuh has the common parts and
// the FP4 ring; the same arithmetic, granules of 128 k).
//
// FP8 (E4M3 codes, [N, K] bytes). Lane tq of a quad owns k [32·tq, 32·tq + 32)
// of a granule as two 16-byte pieces per weight row; word w of piece j holds
// k = 32·tq + 16·j + 4·w + 0..3 and decodes to the pairs (k, k+2), (k+1, k+3):
// one mma step. The ring copies whole lines, as FP4's (cuda_quant.cuh): a
// tile's granule is [16 rows][8 chunks of 16 bytes]; copy m: lane l takes
// chunk l % 8 of row 4m + l / 8, stored at 8ρ + (c ^ (ρ % 2)), so the 8 lanes
// of a line and the 8 lanes of a fragment read (rows g, g + 1, chunks
// 2·tq + j) each meet 8 bank groups. Per-tensor / per-channel scales
// multiply the fp32 sum once (quant_row_factor); with 128×128 (or any
// multiple of 128 wide) blocks a granule is one block column, so its fp32
// partial is multiplied by the row's block scale and added to the total,
// granules in order.
//
// INT4 (GPTQ: I32 words [K/8, N], word (r, n) holding k = 8r + i at bits
// 4i..4i+3). A 16-byte load is 4 consecutive rows of one 8-k word row, so a
// warp owns 32 weight rows (two mma tiles: lane group g holds rows 4g .. 4g+3,
// tile 0 rows g / g+8 = 4g, 4g+1, tile 1 = 4g+2, 4g+3); lane tq owns words
// 4·tq .. 4·tq + 3 of a granule (k [32·tq, 32·tq + 32)). The ring copies a
// granule's 16 word rows of the warp's 32 columns (128 bytes each) as whole
// lines: copy j, lane l takes chunk c = l % 8 (columns 4c .. 4c + 3) of word
// row 4j + l / 8, stored at 8·row + (c ^ 2j); lane (g, tq) reads chunk g of
// word row 4·tq + j, and the 8 lanes of either meet 8 bank groups. Each
// word decodes to q − z (exact small integers) in the pairs (k+i, k+i+4) as
// FP4 does; a granule lies in one group (group size a multiple of 128, or
// one group), so its fp32 partial is multiplied by the row's group scale.
#pragma once

#include <cuda_fp16.h>

#include "muse/backends/cuda/cuda_quant.cuh"

namespace muse::cuda {

// ---------------------------------------------------------------------------
// FP8
// ---------------------------------------------------------------------------
constexpr int kQGranule = 128;

template <int RW>
constexpr int fp8_slot_uint4() {
  return RW * 128;  // [RW][16 rows][8 chunks], swizzled (fp8_accumulate)
}
template <int RW, int NT, int STAGES>
constexpr size_t fp8_ring_bytes() {
  constexpr size_t ring = size_t(kSplit) * STAGES * fp8_slot_uint4<RW>() * sizeof(uint4);
  constexpr size_t part = size_t(kSplit - 1) * RW * NT * 4 * 32 * sizeof(float);
  return ring > part ? ring : part;
}

// FP8 E4M3 → exact bf16: e4m3_pair's 2^-120 undone.
constexpr uint32_t kE4m3Unbias = 0x7B807B80u;  // bf16x2 (2^120, 2^120)

// tile[r]: weight tile r for the copies; sblk[r][h]: the block-scale row of
// weight row g + 8h of tile r (F32, BLOCK only; scale of granule k0 at
// k0 / bc). xr[c]: activation row 8c + g offset by 32·tq.
template <bool ALIGNED, bool BLOCK, int RW, int NT, int STAGES>
__device__ __forceinline__ void fp8_accumulate(uint4* ring, const QTile (&tile)[RW],
                                               const float* const (&sblk)[RW][2], const bool (&wok)[RW][2],
                                               const __nv_bfloat16* const (&xr)[NT], const bool (&xok)[NT],
                                               int64_t K, int bc, int s, int lane, float (&acc)[RW][NT][4]) {
  constexpr int SLOT = fp8_slot_uint4<RW>();
#pragma unroll
  for (int r = 0; r < RW; ++r)
#pragma unroll
    for (int c = 0; c < NT; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[r][c][i] = 0.0f;
  const int g = lane >> 2, tq = lane & 3;
  const int64_t kl = 32 * tq;
  const int64_t ngran = (K + kQGranule - 1) / kQGranule;
  const int mine = s < ngran ? int((ngran - s + kSplit - 1) / kSplit) : 0;
  uint4* my = ring + size_t(s) * STAGES * SLOT;
  const int cr = lane >> 3, cc = lane & 7, cdst = 8 * cr + (cc ^ (cr & 1));  // copies: chunk cc of rows 4m + cr
  const int rbase = 8 * g + 2 * tq, rs = g & 1;  // reads: chunk 2·tq + j of row g (+ 8h) at rbase + (j ^ rs)
  const int ld = int(K);  // offsets within a tile (16 rows) in 32 bits, uniform per copy; one pointer per tile
  const uint8_t* cbase[RW];
#pragma unroll
  for (int r = 0; r < RW; ++r) cbase[r] = tile[r].codes + cr * ld + 16 * cc;
  auto issue = [&](int i) {
    const int k0 = (s + i * kSplit) * kQGranule;  // granule start
    uint4* slot = my + (i % STAGES) * SLOT;
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int m = 0; m < 4; ++m) {
        const int row = 4 * m + cr;
        const int k = k0 + 16 * cc;
        const uint8_t* src = cbase[r] + (4 * m * ld + k0);
        uint4* dst = slot + r * 128 + 32 * m + cdst;
        if (ALIGNED) {  // K % 128 == 0: a chunk is whole
          const bool ok = row < tile[r].rows && k < K;
          cp_async16(dst, ok ? src : tile[r].codes, ok ? 16 : 0);
        } else {  // K % 8 == 0
#pragma unroll
          for (int q = 0; q < 2; ++q) {
            const bool ok = row < tile[r].rows && k + 8 * q < K;
            cp_async8(reinterpret_cast<uint2*>(dst) + q, ok ? src + 8 * q : tile[r].codes, ok ? 8 : 0);
          }
        }
      }
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < mine) issue(i);
    cp_async_commit();
  }
  pdl_wait();
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int i = 0; i < mine; ++i) {
    ring_turn<STAGES>(i, mine, issue);  // the lanes' fragments are other lanes' copies
    const int64_t k0 = (int64_t(s) + int64_t(i) * kSplit) * kQGranule;
    const uint4* slot = my + (i % STAGES) * SLOT;
    float sc[RW][2];
    if (BLOCK) {  // loaded now, used after the granule's mma steps
#pragma unroll
      for (int r = 0; r < RW; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) sc[r][h] = wok[r][h] ? __ldg(sblk[r][h] + k0 / bc) : 0.0f;
    }
    float part[RW][NT][4];
#pragma unroll
    for (int r = 0; r < RW; ++r)
#pragma unroll
      for (int c = 0; c < NT; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[r][c][e] = 0.0f;
    float (&sum)[RW][NT][4] = BLOCK ? part : acc;
#pragma unroll
    for (int j = 0; j < 2; ++j) {
      uint4 cv[RW][2];
#pragma unroll
      for (int r = 0; r < RW; ++r)
#pragma unroll
        for (int h = 0; h < 2; ++h) cv[r][h] = slot[r * 128 + 64 * h + rbase + (j ^ rs)];
      uint4 xv[NT][2];
#pragma unroll
      for (int c = 0; c < NT; ++c)
#pragma unroll
        for (int q = 0; q < 2; ++q) {
          const int64_t k = k0 + 16 * j + 8 * q;  // + kl
          // Aligned (K % 128 == 0): whole granules and clamped rows, so the
          // load is inside x and unguarded (see fp4_accumulate).
          xv[c][q] = ALIGNED ? ldg_x(xr[c] + k) : xok[c] && k + kl < K ? ldg_x(xr[c] + k) : zero;
        }
#pragma unroll
      for (int w = 0; w < 4; ++w) {
        uint32_t xp[NT][2];
#pragma unroll
        for (int c = 0; c < NT; ++c) {
          const uint4& v = xv[c][w >> 1];
          if (w & 1) x_pairs_2apart(v.z, v.w, xp[c]);
          else x_pairs_2apart(v.x, v.y, xp[c]);
        }
#pragma unroll
        for (int r = 0; r < RW; ++r) {
          uint32_t p[2][2];
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t word = w == 0 ? cv[r][h].x : w == 1 ? cv[r][h].y : w == 2 ? cv[r][h].z : cv[r][h].w;
            p[h][0] = bf16x2_mul(e4m3_pair<0>(word), kE4m3Unbias);
            p[h][1] = bf16x2_mul(e4m3_pair<1>(word), kE4m3Unbias);
          }
#pragma unroll
          for (int c = 0; c < NT; ++c) mma16816(sum[r][c], p[0][0], p[1][0], p[0][1], p[1][1], xp[c][0], xp[c][1]);
        }
      }
    }
    if (BLOCK) {
#pragma unroll
      for (int r = 0; r < RW; ++r)
#pragma unroll
        for (int c = 0; c < NT; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e) acc[r][c][e] = fmaf(part[r][c][e], sc[r][e >> 1], acc[r][c][e]);
    }
  }
  pdl_streaming_done();
  cp_async_wait<0>();
}

// ---------------------------------------------------------------------------
// INT4 (GPTQ)
// ---------------------------------------------------------------------------
// RQ groups of 32 rows per warp (2·RQ mma tiles).
template <int RQ>
constexpr int int4_slot_uint4() {
  return RQ * 128 + RQ * 16 + RQ * 8;  // codes [RQ][16 word rows][8 chunks], scales [RQ][32] uint2, zeros [RQ][32] u32
}
template <int RQ, int NT, int STAGES>
constexpr size_t int4_ring_bytes() {
  constexpr size_t ring = size_t(kSplit) * STAGES * int4_slot_uint4<RQ>() * sizeof(uint4);
  constexpr size_t part = size_t(kSplit - 1) * 2 * RQ * NT * 4 * 32 * sizeof(float);
  return ring > part ? ring : part;
}

// Per row group q: words (0, n_q) (n_q = first of this lane's 4 rows; the
// pointer to word row 0, column n_q), scales (group 0, n_q) (F16/BF16),
// zeros (group 0, word of n_q) and the nibble shift of n_q in it; ok: the
// lane's rows exist. N: words per word row; zeros_ld: zero words per group.
struct Int4Rows {
  const uint8_t* words;
  const uint8_t* cwords;  // the copies' columns: 4·(lane % 8) of the group (word row 0)
  bool cok;               // those columns exist
  const uint8_t* scales;
  const uint8_t* zeros;  // null: symmetric (z = 8)
  int zshift;
  bool ok;
  bool pair_ok;  // the rows of quad g | 1 exist too (the 16-byte scale copy of an even quad covers them)
};

__device__ __forceinline__ float half_bits_to_float(uint32_t h, bool bf16) {
  return bf16 ? __uint_as_float(h << 16) : __half2float(__ushort_as_half(uint16_t(h)));
}

// WHOLE: K % 128 == 0 (every granule whole): x loads unguarded, as FP4's aligned path.
template <bool WHOLE, int RQ, int NT, int STAGES>
__device__ __forceinline__ void int4_accumulate(uint4* ring, const Int4Rows (&rows)[RQ],
                                                const __nv_bfloat16* const (&xr)[NT], const bool (&xok)[NT],
                                                int64_t K, int64_t N, int64_t G, int zero_offset, bool bf16_scales,
                                                int s, int lane, float (&acc)[2 * RQ][NT][4]) {
  constexpr int SLOT = int4_slot_uint4<RQ>();
#pragma unroll
  for (int t = 0; t < 2 * RQ; ++t)
#pragma unroll
    for (int c = 0; c < NT; ++c)
#pragma unroll
      for (int i = 0; i < 4; ++i) acc[t][c][i] = 0.0f;
  const int64_t kl = 32 * (lane & 3);
  const int64_t words_k = K / 8;  // word rows
  const int64_t ngran = (K + kQGranule - 1) / kQGranule;
  const int mine = s < ngran ? int((ngran - s + kSplit - 1) / kSplit) : 0;
  const int64_t zeros_ld = N / 8 * 4;  // bytes per group of zero words
  uint4* my = ring + size_t(s) * STAGES * SLOT;
  auto issue = [&](int i) {
    const int64_t k0 = (int64_t(s) + int64_t(i) * kSplit) * kQGranule;
    const int64_t grp = G >= K ? 0 : k0 / G;
    uint4* slot = my + (i % STAGES) * SLOT;
#pragma unroll
    for (int q = 0; q < RQ; ++q) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const int row = 4 * j + (lane >> 3), c = lane & 7;  // word row within the granule, chunk
        const int64_t wr = k0 / 8 + row;
        const bool ok = rows[q].cok && wr < words_k;
        const uint8_t* src = rows[q].cwords + (lane >> 3) * N * 4 + (k0 / 8 + 4 * j) * N * 4;  // lane + uniform part
        cp_async16(slot + q * 128 + 8 * row + (c ^ (2 * j)), ok ? src : rows[q].cwords, ok ? 16 : 0);
      }
      // The quad's 4 lanes share their rows' scales and zero points: lane
      // tq = 0 of every other quad copies the 8 rows' 16 bytes of scales
      // (L2 only; 8 bytes where the next quad's rows do not exist), lane
      // tq = 0 of each quad its zero word; the others read them after the
      // __syncwarp in the consume loop.
      if ((lane & 7) == 0) {
        uint2* sdst = reinterpret_cast<uint2*>(slot + RQ * 128) + q * 32 + lane;
        const uint8_t* src = rows[q].ok ? rows[q].scales + grp * N * 2 : rows[q].scales;
        if (rows[q].pair_ok) cp_async16(sdst, src, 16);
        else cp_async8(sdst, src, rows[q].ok ? 8 : 0);  // the last rows: quad g + 1 has none
      }
      if (rows[q].zeros && (lane & 3) == 0)
        cp_async4(reinterpret_cast<uint32_t*>(slot + RQ * 144) + q * 32 + lane,
                  rows[q].ok ? rows[q].zeros + grp * zeros_ld : rows[q].zeros, rows[q].ok ? 4 : 0);
    }
  };
#pragma unroll
  for (int i = 0; i < STAGES - 1; ++i) {
    if (i < mine) issue(i);
    cp_async_commit();
  }
  pdl_wait();
  const uint4 zero = make_uint4(0, 0, 0, 0);
  for (int i = 0; i < mine; ++i) {
    ring_turn<STAGES>(i, mine, issue);  // other lanes' code, scale and zero copies of granule i are in
    const int64_t k0 = (int64_t(s) + int64_t(i) * kSplit) * kQGranule;
    const uint4* slot = my + (i % STAGES) * SLOT;
    float sc[RQ][4];
    uint32_t zb[RQ][4];  // bf16x2 (128 + z, 128 + z) per row
    const int g = lane >> 2;
#pragma unroll
    for (int q = 0; q < RQ; ++q) {
      // Quad g's 4 scales: the 16 bytes lane 8·(g / 2) copied, its half g % 2.
      const uint2 sv = reinterpret_cast<const uint2*>(slot + RQ * 128)[q * 32 + (g & ~1) * 4 + (g & 1)];
      sc[q][0] = half_bits_to_float(sv.x & 0xFFFFu, bf16_scales);
      sc[q][1] = half_bits_to_float(sv.x >> 16, bf16_scales);
      sc[q][2] = half_bits_to_float(sv.y & 0xFFFFu, bf16_scales);
      sc[q][3] = half_bits_to_float(sv.y >> 16, bf16_scales);
      const uint32_t zw =
          rows[q].zeros ? reinterpret_cast<const uint32_t*>(slot + RQ * 144)[q * 32 + (lane & ~3)] >> rows[q].zshift
                        : 0x88888888u;
#pragma unroll
      for (int p = 0; p < 4; ++p) {
        const uint32_t z = ((zw >> (4 * p)) & 15u) + uint32_t(rows[q].zeros ? zero_offset : 0);
        zb[q][p] = (0x4300u | z) * 0x10001u;  // bf16(128 + z): z in the mantissa of 2^7 (z < 128)
      }
    }
    float part[2 * RQ][NT][4];
#pragma unroll
    for (int t = 0; t < 2 * RQ; ++t)
#pragma unroll
      for (int c = 0; c < NT; ++c)
#pragma unroll
        for (int e = 0; e < 4; ++e) part[t][c][e] = 0.0f;
#pragma unroll
    for (int j = 0; j < 4; ++j) {
      uint32_t xp[NT][4];
#pragma unroll
      for (int c = 0; c < NT; ++c) {
        const int64_t k = k0 + 8 * j;  // + kl
        x_pairs_4apart(WHOLE ? ldg_x(xr[c] + k) : xok[c] && k + kl < K ? ldg_x(xr[c] + k) : zero, xp[c]);
      }
#pragma unroll
      for (int q = 0; q < RQ; ++q) {
        const uint4 cv = slot[q * 128 + 32 * (lane & 3) + 8 * j + (g ^ (2 * (lane & 3)))];  // word row 4·tq + j
        uint32_t p[4][4];  // [row of the lane's 4][pair]
#pragma unroll
        for (int rr = 0; rr < 4; ++rr) {
          const uint32_t word = rr == 0 ? cv.x : rr == 1 ? cv.y : rr == 2 ? cv.z : cv.w;
          p[rr][0] = bf16x2_sub(u4_pair_plus128<0>(word), zb[q][rr]);
          p[rr][1] = bf16x2_sub(u4_pair_plus128<1>(word), zb[q][rr]);
          p[rr][2] = bf16x2_sub(u4_pair_plus128<2>(word), zb[q][rr]);
          p[rr][3] = bf16x2_sub(u4_pair_plus128<3>(word), zb[q][rr]);
        }
#pragma unroll
        for (int tt = 0; tt < 2; ++tt)
#pragma unroll
          for (int c = 0; c < NT; ++c) {
            const uint32_t(&lo)[4] = p[2 * tt];
            const uint32_t(&hi)[4] = p[2 * tt + 1];
            mma16816(part[2 * q + tt][c], lo[0], hi[0], lo[1], hi[1], xp[c][0], xp[c][1]);
            mma16816(part[2 * q + tt][c], lo[2], hi[2], lo[3], hi[3], xp[c][2], xp[c][3]);
          }
      }
    }
#pragma unroll
    for (int q = 0; q < RQ; ++q)
#pragma unroll
      for (int tt = 0; tt < 2; ++tt)
#pragma unroll
        for (int c = 0; c < NT; ++c)
#pragma unroll
          for (int e = 0; e < 4; ++e)
            acc[2 * q + tt][c][e] = fmaf(part[2 * q + tt][c][e], sc[q][2 * tt + (e >> 1)], acc[2 * q + tt][c][e]);
  }
  pdl_streaming_done();
  cp_async_wait<0>();
}

// Dynamic shared memory of a decoding block: RW 16-row tiles per warp (INT4:
// RW / 2 groups of 32 rows), NT activation tiles.
template <QFmt F, int RW, int NT, int STAGES>
constexpr size_t quant_ring_bytes() {
  if constexpr (fp4_format(F)) return fp4_ring_bytes<RW, NT, STAGES>();
  else if constexpr (F == QFmt::Fp8) return fp8_ring_bytes<RW, NT, STAGES>();
  else return int4_ring_bytes<RW / 2, NT, STAGES>();
}

}  // namespace muse::cuda
