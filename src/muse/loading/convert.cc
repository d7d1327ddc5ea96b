#include "muse/loading/convert.h"

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <thread>
#include <vector>

namespace muse {

namespace {

inline float bits_to_f32(uint32_t u) { return std::bit_cast<float>(u); }
inline uint32_t f32_to_bits(float f) { return std::bit_cast<uint32_t>(f); }

float f8_e4m3fnuz_to_f32(uint8_t v) {
  if (v == 0x80) return std::numeric_limits<float>::quiet_NaN();
  int exp = (v >> 3) & 0xf, man = v & 7;
  float r = exp == 0 ? std::ldexp(float(man), -10) : std::ldexp(float(8 + man), exp - 11);
  return (v & 0x80) ? -r : r;
}

float f8_e5m2fnuz_to_f32(uint8_t v) {
  if (v == 0x80) return std::numeric_limits<float>::quiet_NaN();
  int exp = (v >> 2) & 0x1f, man = v & 3;
  float r = exp == 0 ? std::ldexp(float(man), -17) : std::ldexp(float(4 + man), exp - 18);
  return (v & 0x80) ? -r : r;
}

// 256-entry tables for the one-byte float formats, built once.
struct ByteTables {
  float e4m3[256], e5m2[256], e8m0[256], e4m3fnuz[256], e5m2fnuz[256];
  ByteTables() {
    for (int i = 0; i < 256; ++i) {
      uint8_t b = uint8_t(i);
      e4m3[i] = f8_e4m3_to_f32(b);
      e5m2[i] = f8_e5m2_to_f32(b);
      e8m0[i] = f8_e8m0_to_f32(b);
      e4m3fnuz[i] = f8_e4m3fnuz_to_f32(b);
      e5m2fnuz[i] = f8_e5m2fnuz_to_f32(b);
    }
  }
};
const ByteTables& byte_tables() {
  static const ByteTables tables;
  return tables;
}

template <class T>
void ints_to_f32(const uint8_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) {
    T v;
    std::memcpy(&v, src + i * int64_t(sizeof(T)), sizeof(T));
    dst[i] = float(v);
  }
}

void lut_to_f32(const float* lut, const uint8_t* src, int64_t n, float* dst) {
  for (int64_t i = 0; i < n; ++i) dst[i] = lut[src[i]];
}

Status unsupported(DType dtype) {
  return make_error(std::string("conversion of ") + std::string(dtype_name(dtype)) +
                    " tensors to float is not supported");
}

}  // namespace

float f16_to_f32_fast(uint16_t h) {
  // Shift the half's exponent and mantissa into float position and rescale
  // the exponent bias by multiplying with 2^-112 (infinities and NaN stay
  // so); subnormal halves are built as 0.5·(1 + m·2^-23) − 0.5 = m·2^-24.
  const uint32_t w = uint32_t(h) << 16;
  const uint32_t sign = w & 0x80000000u;
  const uint32_t two_w = w + w;
  const float normal = bits_to_f32((two_w >> 4) + (0xE0u << 23)) * 0x1.0p-112f;
  const float subnormal = bits_to_f32((two_w >> 17) | (126u << 23)) - 0.5f;
  const uint32_t is_subnormal = 0u - uint32_t(two_w < (1u << 27));  // all ones or zero: a select the vectorizer keeps
  const uint32_t magnitude = (f32_to_bits(subnormal) & is_subnormal) | (f32_to_bits(normal) & ~is_subnormal);
  return bits_to_f32(sign | magnitude);
}

bool convertible_to_float(DType dtype) {
  switch (dtype) {
    case DType::F6_E2M3:
    case DType::F6_E3M2:
    case DType::C64:
      return false;
    default:
      return true;
  }
}

Status convert_to_f32(DType dtype, const uint8_t* src, int64_t first, int64_t n, float* dst) {
  if (n <= 0) return Status::Ok();
  if (!convertible_to_float(dtype)) return unsupported(dtype);
  if (dtype == DType::F4) {
    if ((first | n) & 1) return make_error("F4 conversion needs an even element offset and count");
    const uint8_t* p = src + first / 2;
    for (int64_t i = 0; i < n / 2; ++i) {
      dst[2 * i] = e2m1_to_f32(p[i] & 15);
      dst[2 * i + 1] = e2m1_to_f32(p[i] >> 4);
    }
    return Status::Ok();
  }
  const int64_t esize = dtype_bits(dtype) / 8;
  const uint8_t* p = src + first * esize;
  const ByteTables& lut = byte_tables();
  switch (dtype) {
    case DType::F32:
      std::memcpy(dst, p, size_t(n) * 4);
      break;
    case DType::BF16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = bf16_to_f32(h);
      }
      break;
    case DType::F16:
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        dst[i] = f16_to_f32_fast(h);
      }
      break;
    case DType::F64: ints_to_f32<double>(p, n, dst); break;
    case DType::F8_E4M3: lut_to_f32(lut.e4m3, p, n, dst); break;
    case DType::F8_E5M2: lut_to_f32(lut.e5m2, p, n, dst); break;
    case DType::F8_E8M0: lut_to_f32(lut.e8m0, p, n, dst); break;
    case DType::F8_E4M3FNUZ: lut_to_f32(lut.e4m3fnuz, p, n, dst); break;
    case DType::F8_E5M2FNUZ: lut_to_f32(lut.e5m2fnuz, p, n, dst); break;
    case DType::BOOL:
      for (int64_t i = 0; i < n; ++i) dst[i] = p[i] ? 1.0f : 0.0f;
      break;
    case DType::U8: ints_to_f32<uint8_t>(p, n, dst); break;
    case DType::I8: ints_to_f32<int8_t>(p, n, dst); break;
    case DType::U16: ints_to_f32<uint16_t>(p, n, dst); break;
    case DType::I16: ints_to_f32<int16_t>(p, n, dst); break;
    case DType::U32: ints_to_f32<uint32_t>(p, n, dst); break;
    case DType::I32: ints_to_f32<int32_t>(p, n, dst); break;
    case DType::U64: ints_to_f32<uint64_t>(p, n, dst); break;
    case DType::I64: ints_to_f32<int64_t>(p, n, dst); break;
    default:
      return unsupported(dtype);
  }
  return Status::Ok();
}

Status convert_to_bf16(DType dtype, const uint8_t* src, int64_t first, int64_t n, uint16_t* dst) {
  if (n <= 0) return Status::Ok();
  if (dtype == DType::BF16) {
    std::memcpy(dst, src + first * 2, size_t(n) * 2);
    return Status::Ok();
  }
  if (dtype == DType::F32) {
    const uint8_t* p = src + first * 4;
    for (int64_t i = 0; i < n; ++i) {
      float f;
      std::memcpy(&f, p + 4 * i, 4);
      dst[i] = f32_to_bf16(f);
    }
    return Status::Ok();
  }
  // Through f32 in cache-sized chunks.
  constexpr int64_t kChunk = 2048;
  float buf[kChunk];
  for (int64_t done = 0; done < n; done += kChunk) {
    int64_t m = std::min(kChunk, n - done);
    MUSE_RETURN_IF_ERROR(convert_to_f32(dtype, src, first + done, m, buf));
    for (int64_t i = 0; i < m; ++i) dst[done + i] = f32_to_bf16(buf[i]);
  }
  return Status::Ok();
}

namespace {

template <class Out, class Fn>
Status parallel_convert(DType dtype, const uint8_t* src, int64_t count, Out* dst, int threads, Fn fn) {
  if (!convertible_to_float(dtype)) return unsupported(dtype);
  constexpr int64_t kMinPerThread = int64_t(1) << 20;
  if (threads <= 0) threads = int(std::min(16u, std::max(1u, std::thread::hardware_concurrency())));
  threads = int(std::min<int64_t>(threads, std::max<int64_t>(1, count / kMinPerThread)));
  if (threads <= 1) return fn(dtype, src, 0, count, dst);
  int64_t chunk = (count + threads - 1) / threads;
  chunk = (chunk + 63) & ~int64_t(63);  // even (F4) and cache-line friendly
  std::vector<std::thread> pool;
  std::vector<Status> status(static_cast<size_t>(threads));
  for (int t = 0; t < threads; ++t) {
    int64_t begin = t * chunk, n = std::min(chunk, count - begin);
    if (n <= 0) break;
    pool.emplace_back([&, t, begin, n] { status[size_t(t)] = fn(dtype, src, begin, n, dst + begin); });
  }
  for (auto& th : pool) th.join();
  for (auto& s : status)
    if (!s.ok()) return s;
  return Status::Ok();
}

}  // namespace

Status convert_to_f32_parallel(DType dtype, const uint8_t* src, int64_t count, float* dst, int threads) {
  return parallel_convert(dtype, src, count, dst, threads,
                          [](DType d, const uint8_t* s, int64_t f, int64_t n, float* o) { return convert_to_f32(d, s, f, n, o); });
}

Status convert_to_bf16_parallel(DType dtype, const uint8_t* src, int64_t count, uint16_t* dst, int threads) {
  return parallel_convert(dtype, src, count, dst, threads, [](DType d, const uint8_t* s, int64_t f, int64_t n, uint16_t* o) {
    return convert_to_bf16(d, s, f, n, o);
  });
}

}  // namespace muse
