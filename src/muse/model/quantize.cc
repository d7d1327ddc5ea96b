#include "muse/model/quantize.h"

#include <cmath>
#include <cstring>

#include "muse/core/dtype.h"

namespace muse {

uint8_t f32_to_e2m1(float x) {
  const uint8_t sign = std::signbit(x) ? 8 : 0;
  const float a = std::fabs(x);
  // Grid 0, .5, 1, 1.5, 2, 3, 4, 6; midpoints go to the even code.
  uint8_t c;
  if (!(a > 0.25f)) c = 0;
  else if (a < 0.75f) c = 1;
  else if (a <= 1.25f) c = 2;
  else if (a < 1.75f) c = 3;
  else if (a <= 2.5f) c = 4;
  else if (a < 3.5f) c = 5;
  else if (a <= 5.0f) c = 6;
  else c = 7;
  return uint8_t(sign | c);
}

namespace {

std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

float amax_of(const float* p, int64_t n, int64_t stride = 1) {
  float m = 0.0f;
  for (int64_t i = 0; i < n; ++i) m = std::fmax(m, std::fabs(p[i * stride]));
  return m;
}

void put_nibble(std::vector<uint8_t>& v, int64_t index, uint8_t code) {
  uint8_t& b = v[size_t(index / 2)];
  b = index % 2 ? uint8_t((b & 0x0F) | (code << 4)) : uint8_t((b & 0xF0) | code);
}

}  // namespace

Result<HostQuantWeight> quantize_weight(QuantKind kind, const float* w, const std::vector<int64_t>& shape, int halves) {
  if (shape.size() != 2 && shape.size() != 3) return make_error("quantize: matrices only, got " + shape_text(shape));
  const int64_t E = shape.size() == 3 ? shape[0] : 1, N = shape[shape.size() - 2], K = shape.back();
  HostQuantWeight q;
  q.format.kind = kind;
  auto need = [&](int64_t mult, const char* fmt) -> Status {
    if (K % mult) return make_error(std::string(fmt) + " needs in_features divisible by " + std::to_string(mult) +
                                    "; " + shape_text(shape) + " has " + std::to_string(K));
    return Status::Ok();
  };
  auto lead = [&](std::vector<int64_t> inner) {
    if (shape.size() == 3) inner.insert(inner.begin(), E);
    return inner;
  };
  switch (kind) {
    case QuantKind::Nvfp4: {
      MUSE_RETURN_IF_ERROR(need(16, "NVFP4"));
      if (halves != 1 && (halves != 2 || N % 2)) return make_error("NVFP4: halves must be 1, or 2 with an even row count");
      q.format.scale_dtype = DType::F8_E4M3;
      q.format.block_rows = 1, q.format.block_cols = 16, q.format.global_parts = halves;
      q.codes.assign(size_t(E * N * K / 2), 0);
      q.scales.resize(size_t(E * N * K / 16));
      q.scale_shape = lead({N, K / 16});
      q.global.resize(size_t(E * halves));
      const int64_t hrows = N / halves;
      for (int64_t e = 0; e < E; ++e)
        for (int64_t h = 0; h < halves; ++h) {
          const float* m = w + (e * N + h * hrows) * K;
          const float amax = amax_of(m, hrows * K);
          const float s2 = amax > 0 ? amax / (6.0f * 448.0f) : 1.0f;
          q.global[size_t(e * halves + h)] = s2;
          for (int64_t r = 0; r < hrows; ++r)
            for (int64_t b = 0; b < K / 16; ++b) {
              const int64_t row = e * N + h * hrows + r;
              const float* blk = w + row * K + b * 16;
              const uint8_t sc = f32_to_f8_e4m3(amax_of(blk, 16) / 6.0f / s2);
              q.scales[size_t(row * (K / 16) + b)] = sc;
              const float s = f8_e4m3_to_f32(sc) * s2;
              for (int64_t i = 0; i < 16; ++i)
                put_nibble(q.codes, row * K + b * 16 + i, s > 0 ? f32_to_e2m1(blk[i] / s) : 0);
            }
        }
      return q;
    }
    case QuantKind::Mxfp4: {
      MUSE_RETURN_IF_ERROR(need(32, "MXFP4"));
      q.format.scale_dtype = DType::F8_E8M0;
      q.format.block_rows = 1, q.format.block_cols = 32;
      q.codes.assign(size_t(E * N * K / 2), 0);
      q.scales.resize(size_t(E * N * K / 32));
      q.scale_shape = lead({N, K / 32});
      for (int64_t row = 0; row < E * N; ++row)
        for (int64_t b = 0; b < K / 32; ++b) {
          const float* blk = w + row * K + b * 32;
          const float amax = amax_of(blk, 32);
          int x = amax > 0 ? std::ilogb(amax) - 2 : -127;  // emax(E2M1) = 2
          x = x < -127 ? -127 : x > 127 ? 127 : x;
          q.scales[size_t(row * (K / 32) + b)] = uint8_t(x + 127);
          const float s = std::ldexp(1.0f, x);
          for (int64_t i = 0; i < 32; ++i) put_nibble(q.codes, row * K + b * 32 + i, f32_to_e2m1(blk[i] / s));
        }
      return q;
    }
    case QuantKind::Fp8: {
      q.code_dtype = DType::F8_E4M3;
      q.format.scale_dtype = DType::F32;
      q.format.block_rows = 1, q.format.block_cols = int32_t(K);
      q.codes.resize(size_t(E * N * K));
      q.scales.resize(size_t(E * N * 4));
      q.scale_shape = lead({N, 1});
      for (int64_t row = 0; row < E * N; ++row) {
        const float amax = amax_of(w + row * K, K);
        const float s = amax > 0 ? amax / 448.0f : 1.0f;
        std::memcpy(q.scales.data() + row * 4, &s, 4);
        for (int64_t k = 0; k < K; ++k) q.codes[size_t(row * K + k)] = f32_to_f8_e4m3(w[row * K + k] / s);
      }
      return q;
    }
    case QuantKind::Int4: {
      MUSE_RETURN_IF_ERROR(need(8, "INT4"));
      if (N % 8) return make_error("INT4 needs out_features divisible by 8; " + shape_text(shape) + " has " + std::to_string(N));
      const int64_t G = K < 128 ? K : 128, groups = (K + G - 1) / G;
      q.format.scale_dtype = DType::F16;
      q.format.block_rows = 1, q.format.block_cols = int32_t(G), q.format.zero_offset = 1;
      q.codes.assign(size_t(E * K / 8 * N * 4), 0);
      q.scales.resize(size_t(E * groups * N * 2));
      q.zeros.resize(size_t(E * groups * (N / 8) * 4));
      q.scale_shape = lead({groups, N});
      q.zero_shape = lead({groups, N / 8});
      for (size_t i = 0; i < q.zeros.size(); i += 4) {
        const uint32_t sevens = 0x77777777u;  // GPTQ v1 stores z − 1 = 7 for the symmetric zero 8
        std::memcpy(q.zeros.data() + i, &sevens, 4);
      }
      for (int64_t e = 0; e < E; ++e)
        for (int64_t n = 0; n < N; ++n)
          for (int64_t g = 0; g < groups; ++g) {
            const int64_t k0 = g * G, k1 = k0 + G < K ? k0 + G : K;
            const float* row = w + (e * N + n) * K;
            const float amax = amax_of(row + k0, k1 - k0);
            const uint16_t h = f32_to_f16(amax > 0 ? 2.0f * amax / 15.0f : 2.0f / 15.0f);
            std::memcpy(q.scales.data() + ((e * groups + g) * N + n) * 2, &h, 2);
            const float s = f16_to_f32(h);
            for (int64_t k = k0; k < k1; ++k) {
              float v = std::nearbyint(row[k] / s) + 8.0f;
              const uint32_t c = uint32_t(v < 0 ? 0 : v > 15 ? 15 : v);
              uint8_t* word = q.codes.data() + ((e * (K / 8) + k / 8) * N + n) * 4;
              uint32_t bits;
              std::memcpy(&bits, word, 4);
              bits |= c << (4 * (k % 8));
              std::memcpy(word, &bits, 4);
            }
          }
      return q;
    }
    case QuantKind::None: break;
  }
  return make_error("quantize: no format given");
}

}  // namespace muse
