// project with a quantized weight: out[T, N] = x[T, K] · Wᵀ, W decoded to
// bf16 in registers inside the tensor-core ring (cuda_quant.cuh), x BF16.
//
// Every T runs through the same fixed-order kernel, in 64-row blocks of x
// (as the BF16 products do): a row's result depends on K alone, so decode
// rows are batch-invariant and prefill rows chunk-invariant. For long
// prefills this re-streams (and re-decodes) the codes once per 64 rows:
// correct, not fast (docs/cuda.md, "Not yet"); no dequantized copy of a
// weight is ever made.
//
// Tiles (the same bits whatever the tile, as for BF16) per format and T:
// launch_quant_rows below.
#include <string>

#include "muse/backends/cuda/cuda_quant_fp8_int4.cuh"

namespace muse::cuda {
namespace {

// Blocks per SM asked of ptxas where, after the coalesced copies, its
// unasked allocation cost a block the rings' 55 KB allow (and the old
// kernels had): NVFP4 at NT = 4 took 142 registers (3 blocks; asked for 4:
// 128 registers, 4 bytes of spill), MXFP4 at NT = 8 186 (2; asked for 3:
// 168 and 20 bytes). 0 elsewhere, no bound: asking even for 1 block changed
// ptxas' allocation of the other tiles, for the worse, and the unaligned
// tiles spill 30-100 bytes when asked.
template <QFmt F, bool ALIGNED, int NT, int RW>
constexpr int quant_min_blocks() {
  if (!ALIGNED || RW != 1) return 0;
  if (F == QFmt::Nvfp4 && NT == 4) return 4;
  if (F == QFmt::Mxfp4 && NT == 8) return 3;
  return 0;
}

// One block: kSplit warps over the K-slices of 16·RW weight rows (INT4: RW =
// 2, the 32 rows of one word group) and a 64-row block of x.
template <QFmt F, bool ALIGNED, bool BLOCK, int NT, int RW, int STAGES>
__global__ void __launch_bounds__(32 * kSplit, quant_min_blocks<F, ALIGNED, NT, RW>())
    quant_gemv_kernel(const __nv_bfloat16* __restrict__ x, int64_t T, QuantDev w, void* out, int odt, int64_t ldo) {
  extern __shared__ uint4 ring[];
  __shared__ uint32_t lut[256];
  const int warp = threadIdx.x >> 5, lane = threadIdx.x & 31;
  const int g = lane >> 2, tq = lane & 3;
  const int64_t K = w.K, N = w.N;
  const int64_t t0 = int64_t(blockIdx.y) * 64;
  x += t0 * K;
  const int64_t nt = T - t0 < 64 ? T - t0 : 64;
  const int64_t n0 = int64_t(blockIdx.x) * 16 * RW;
  float acc[RW][NT][4];
  const __nv_bfloat16* xr[NT];
  bool xok[NT];
  const int64_t x_lane = F == QFmt::Int4 || F == QFmt::Fp8 ? 32 * tq : 128 * tq;  // the lane's k within a granule
#pragma unroll
  for (int c = 0; c < NT; ++c) {
    const int64_t t = 8 * c + g;
    xok[c] = t < nt;
    xr[c] = x + (t < nt ? t : nt - 1) * K + x_lane;
  }
  if constexpr (F == QFmt::Int4) {
    Int4Rows rows[1];
    const int64_t n = n0 + 4 * g, nc = n < N ? n : 0;
    rows[0].ok = n < N;
    rows[0].pair_ok = n0 + 4 * (g | 1) < N;
    rows[0].words = w.codes + nc * 4;
    const int64_t nw = n0 + 4 * (lane & 7);  // the copies' columns
    rows[0].cok = nw < N;
    rows[0].cwords = w.codes + (nw < N ? nw : 0) * 4;
    rows[0].scales = w.scales + nc * 2;
    rows[0].zeros = w.zeros ? w.zeros + (nc / 8) * 4 : nullptr;
    rows[0].zshift = int(4 * (nc % 8));
    int4_accumulate<ALIGNED, 1, NT, STAGES>(ring, rows, xr, xok, K, N, w.block_cols, w.zero_offset,
                                            w.bf16_scales != 0, warp, lane, acc);
  } else {
    QTile tile[RW];
    const uint8_t* srow[RW][2];
    const float* sblk[RW][2];
    bool wok[RW][2];
#pragma unroll
    for (int r = 0; r < RW; ++r) {
      tile[r] = quant_tile(w.codes, w.scales, n0 + 16 * r, N, fp4_format(F) ? K / 2 : K, w.scale_ld);
#pragma unroll
      for (int h = 0; h < 2; ++h) {
        const int64_t n = n0 + 16 * r + g + 8 * h, nc = n < N ? n : N - 1;
        wok[r][h] = n < N;
        srow[r][h] = w.scales + nc * w.scale_ld;
        sblk[r][h] = reinterpret_cast<const float*>(w.scales) + (nc / w.block_rows) * w.scale_ld;
      }
    }
    if constexpr (fp4_format(F)) {
      constexpr bool MX = F == QFmt::Mxfp4;
      fp4_fill_lut<MX>(lut);
      fp4_accumulate<MX, ALIGNED, RW, NT, STAGES>(ring, lut, tile, srow, wok, xr, xok, K, w.block_cols, warp, lane,
                                                  acc);
    } else {
      fp8_accumulate<ALIGNED, BLOCK, RW, NT, STAGES>(ring, tile, sblk, wok, xr, xok, K, w.block_cols, warp, lane, acc);
    }
  }
  ring_reduce<RW, NT>(ring, warp, lane, acc, [&](int r, int c, int i, float v) {
    // INT4: tile r holds rows 4g + 2r + i / 2 of the 32; the others rows g + 8·(i / 2) of tile r.
    const int64_t n = F == QFmt::Int4 ? n0 + 4 * g + 2 * r + (i >> 1) : n0 + 16 * r + g + 8 * (i >> 1);
    const int64_t t = 8 * c + 2 * tq + (i & 1);
    if (n < N && t < nt) st(out, odt, (t0 + t) * ldo + n, v * quant_row_factor<F>(w, 0, n));
  });
}

template <QFmt F, bool ALIGNED, bool BLOCK, int NT, int RW, int STAGES>
cudaError_t launch_quant_tile(cudaStream_t s, const __nv_bfloat16* x, int64_t T, const QuantDev& w, void* out,
                              int odt, int64_t ldo) {
  // Programmatic dependent launch, as the BF16 ring: codes and scales are
  // streamed before griddepcontrol.wait, x after.
  return launch_pdl<quant_gemv_kernel<F, ALIGNED, BLOCK, NT, RW, STAGES>>(
      s, dim3(unsigned((w.N + 16 * RW - 1) / (16 * RW)), unsigned((T + 63) / 64)), dim3(32 * kSplit),
      quant_ring_bytes<F, RW, NT, STAGES>(), x, T, w, out, odt, ldo);
}

// The tile rule per format: the rings are sized so that a block stays near
// 48-64 KB of shared memory (3-4 blocks, 12-16 warps per SM) while each warp
// keeps 2-5 granules (9-18 KB) of codes in flight. FP8 keeps one 16-row
// tile per warp up to T = 32; FP4 above 2048 rows takes two tiles per warp
// at 9 <= T <= 16 (x fragments read once per 32 rows): one tile there
// measured 92 µs for 8192² NVFP4 at T 16 against 55 µs with two (H200,
// 2026-12-01). INT4 works in 32-row groups. FP4 products of at most
// 2048 rows (k/v-shaped: 128 blocks or fewer, under one per SM, so shared
// memory does not bound them) take a fourth stage: at K = 8192 each warp's
// 4 granules are then all in flight at once, one HBM latency per block
// instead of two.
template <QFmt F, bool ALIGNED, bool BLOCK>
cudaError_t launch_quant_rows(cudaStream_t s, const __nv_bfloat16* x, int64_t T, const QuantDev& w, void* out,
                              int odt, int64_t ldo) {
  if constexpr (fp4_format(F)) {
    const bool few = w.N <= 2048;
    if (T <= 8)
      return few ? launch_quant_tile<F, ALIGNED, BLOCK, 1, 1, 4>(s, x, T, w, out, odt, ldo)
                 : launch_quant_tile<F, ALIGNED, BLOCK, 1, 1, 3>(s, x, T, w, out, odt, ldo);
    if (T <= 16)
      return few ? launch_quant_tile<F, ALIGNED, BLOCK, 2, 1, 4>(s, x, T, w, out, odt, ldo)
                 : launch_quant_tile<F, ALIGNED, BLOCK, 2, 2, 2>(s, x, T, w, out, odt, ldo);
    if (T <= 32) return launch_quant_tile<F, ALIGNED, BLOCK, 4, 1, 3>(s, x, T, w, out, odt, ldo);
    return launch_quant_tile<F, ALIGNED, BLOCK, 8, 1, 3>(s, x, T, w, out, odt, ldo);
  } else if constexpr (F == QFmt::Fp8) {
    if (T <= 8) return launch_quant_tile<F, ALIGNED, BLOCK, 1, 1, 6>(s, x, T, w, out, odt, ldo);
    if (T <= 16) return launch_quant_tile<F, ALIGNED, BLOCK, 2, 1, 6>(s, x, T, w, out, odt, ldo);
    if (T <= 32) return launch_quant_tile<F, ALIGNED, BLOCK, 4, 1, 6>(s, x, T, w, out, odt, ldo);
    return launch_quant_tile<F, ALIGNED, BLOCK, 8, 1, 6>(s, x, T, w, out, odt, ldo);
  } else {
    if (T <= 8) return launch_quant_tile<F, ALIGNED, BLOCK, 1, 2, 5>(s, x, T, w, out, odt, ldo);
    if (T <= 16) return launch_quant_tile<F, ALIGNED, BLOCK, 2, 2, 5>(s, x, T, w, out, odt, ldo);
    if (T <= 32) return launch_quant_tile<F, ALIGNED, BLOCK, 4, 2, 4>(s, x, T, w, out, odt, ldo);
    return launch_quant_tile<F, ALIGNED, BLOCK, 8, 2, 4>(s, x, T, w, out, odt, ldo);
  }
}

bool aligned_to(const void* p, uintptr_t a) { return reinterpret_cast<uintptr_t>(p) % a == 0; }
bool qp_missing_scales(const Tensor& w) { return w.quant->scales.empty(); }

}  // namespace

bool quant_kind_runs(QuantKind kind) {
  if (!mma_gemv_built()) return false;
  return kind == QuantKind::Nvfp4 || kind == QuantKind::Mxfp4 || kind == QuantKind::Fp8 || kind == QuantKind::Int4;
}

std::string quant_unsupported(const Tensor& w) {
  if (!w.quant) return "not a quantized weight";
  const QuantFormat& f = w.quant->format;
  if (!quant_kind_runs(f.kind)) return std::string(quant_kind_name(f.kind)) + " weights are not implemented on CUDA";
  if (w.rank != 2 && w.rank != 3) return "quantized weights are [N, K] or [E, N, K]";
  const int64_t K = w.cols();
  switch (f.kind) {
    case QuantKind::Nvfp4:
    case QuantKind::Mxfp4:
      if (K % 16 || f.block_rows != 1 || f.block_cols % 16 || !aligned_to(w.data, 8))
        return "4-bit float weights need K and the scale block multiples of 16, one row per scale block";
      if (f.kind == QuantKind::Nvfp4 && (f.scale_dtype != DType::F8_E4M3 || f.global_parts > 2))
        return "NVFP4 needs E4M3 block scales and at most two global scales per matrix";
      if (f.kind == QuantKind::Mxfp4 && f.scale_dtype != DType::F8_E8M0 && f.scale_dtype != DType::U8)
        return "MXFP4 needs E8M0 block scales";
      break;
    case QuantKind::Fp8:
      if (K % 8 || f.scale_dtype != DType::F32 || (f.block_cols < K && f.block_cols % 128) || !aligned_to(w.data, 8))
        return "FP8 needs K % 8 == 0, F32 scales and scale blocks a multiple of 128 columns wide (or one column)";
      break;
    case QuantKind::Int4:
      if (K % 8 || w.dim(w.rank - 2) % 8 || (f.block_cols < K && f.block_cols % 128) || qp_missing_scales(w) ||
          !aligned_to(w.data, 16) || !aligned_to(w.quant->scales.data, 16) ||
          (f.scale_dtype != DType::F16 && f.scale_dtype != DType::BF16))
        return "INT4 needs K and N multiples of 8, F16/BF16 scales and a group size that is a multiple of 128 (or all "
               "of K)";
      break;
    default: return std::string(quant_kind_name(f.kind)) + " weights are not implemented on CUDA";
  }
  return {};
}

QuantDev quant_dev(const Tensor& w) {
  const QuantParts& qp = *w.quant;
  const QuantFormat& f = qp.format;
  QuantDev d;
  const int64_t E = w.rank == 3 ? w.dim(0) : 1;
  d.N = w.dim(w.rank - 2);
  d.K = w.cols();
  d.codes = static_cast<const uint8_t*>(w.data);
  d.scales = static_cast<const uint8_t*>(qp.scales.data);
  d.global = f.global_parts > 0 ? static_cast<const float*>(qp.global.data) : nullptr;
  d.zeros = qp.zeros.empty() ? nullptr : static_cast<const uint8_t*>(qp.zeros.data);
  d.codes_stride = int64_t(w.bytes()) / E;
  d.scales_stride = int64_t(qp.scales.bytes()) / E;
  d.zeros_stride = int64_t(qp.zeros.bytes()) / E;
  d.block_rows = f.block_rows;
  d.block_cols = f.block_cols;
  d.scale_ld = (d.K + f.block_cols - 1) / f.block_cols;
  d.global_parts = f.global_parts;
  d.zero_offset = f.zero_offset;
  d.bf16_scales = f.scale_dtype == DType::BF16;
  if (f.kind == QuantKind::Nvfp4 || f.kind == QuantKind::Mxfp4) {
    const int canonical = f.kind == QuantKind::Mxfp4 ? 32 : 16;
    // The 16-byte path: whole granules (the scales' 16-byte copies need row
    // strides K / 16 or K / 32 that are multiples of 16).
    d.aligned = d.K % 512 == 0 && f.block_cols == canonical && aligned_to(d.codes, 16) && aligned_to(d.scales, 16);
  } else if (f.kind == QuantKind::Fp8) {
    d.aligned = d.K % 128 == 0 && aligned_to(d.codes, 16);  // whole granules: 16-byte copies, unguarded x
  } else if (f.kind == QuantKind::Int4) {
    d.aligned = d.K % 128 == 0;  // whole granules: unguarded x
  }
  return d;
}

cudaError_t launch_quant_project(cudaStream_t s, const Tensor& x, const Tensor& w, const Tensor& out) {
  const QuantDev d = quant_dev(w);
  auto* xp = static_cast<const __nv_bfloat16*>(x.data);
  const int64_t T = x.rows(), ldo = out.cols();
  const int odt = dt_code(out.dtype);
  switch (w.quant->format.kind) {
    case QuantKind::Nvfp4:
      return d.aligned ? launch_quant_rows<QFmt::Nvfp4, true, false>(s, xp, T, d, out.data, odt, ldo)
                       : launch_quant_rows<QFmt::Nvfp4, false, false>(s, xp, T, d, out.data, odt, ldo);
    case QuantKind::Mxfp4:
      return d.aligned ? launch_quant_rows<QFmt::Mxfp4, true, false>(s, xp, T, d, out.data, odt, ldo)
                       : launch_quant_rows<QFmt::Mxfp4, false, false>(s, xp, T, d, out.data, odt, ldo);
    case QuantKind::Fp8: {
      const bool block = d.block_cols < d.K;
      if (d.aligned)
        return block ? launch_quant_rows<QFmt::Fp8, true, true>(s, xp, T, d, out.data, odt, ldo)
                     : launch_quant_rows<QFmt::Fp8, true, false>(s, xp, T, d, out.data, odt, ldo);
      return block ? launch_quant_rows<QFmt::Fp8, false, true>(s, xp, T, d, out.data, odt, ldo)
                   : launch_quant_rows<QFmt::Fp8, false, false>(s, xp, T, d, out.data, odt, ldo);
    }
    case QuantKind::Int4:
      return d.aligned ? launch_quant_rows<QFmt::Int4, true, false>(s, xp, T, d, out.data, odt, ldo)
                       : launch_quant_rows<QFmt::Int4, false, false>(s, xp, T, d, out.data, odt, ldo);
    default: return cudaErrorNotSupported;
  }
}

bool CudaBackend::supports_quant(QuantKind kind) const { return kind == QuantKind::None || quant_kind_runs(kind); }

}  // namespace muse::cuda
