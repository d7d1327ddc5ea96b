#include "muse/core/dtype.h"

#include <cmath>
#include <limits>

namespace muse {

namespace {
struct DTypeInfo {
  DType t;
  std::string_view name;
  int bits;
};
constexpr DTypeInfo kInfo[] = {
    {DType::BOOL, "BOOL", 8},         {DType::F4, "F4", 4},
    {DType::F6_E2M3, "F6_E2M3", 6},   {DType::F6_E3M2, "F6_E3M2", 6},
    {DType::U8, "U8", 8},             {DType::I8, "I8", 8},
    {DType::F8_E5M2, "F8_E5M2", 8},   {DType::F8_E4M3, "F8_E4M3", 8},
    {DType::F8_E8M0, "F8_E8M0", 8},   {DType::F8_E4M3FNUZ, "F8_E4M3FNUZ", 8},
    {DType::F8_E5M2FNUZ, "F8_E5M2FNUZ", 8}, {DType::I16, "I16", 16},
    {DType::U16, "U16", 16},          {DType::F16, "F16", 16},
    {DType::BF16, "BF16", 16},        {DType::I32, "I32", 32},
    {DType::U32, "U32", 32},          {DType::F32, "F32", 32},
    {DType::C64, "C64", 64},          {DType::F64, "F64", 64},
    {DType::I64, "I64", 64},          {DType::U64, "U64", 64},
};
}  // namespace

int dtype_bits(DType t) { return kInfo[int(t)].bits; }
std::string_view dtype_name(DType t) { return kInfo[int(t)].name; }

bool parse_dtype(std::string_view name, DType* out) {
  for (const auto& i : kInfo) {
    if (i.name == name) {
      *out = i.t;
      return true;
    }
  }
  return false;
}

float f16_to_f32(uint16_t h) {
  uint32_t sign = uint32_t(h & 0x8000) << 16;
  uint32_t exp = (h >> 10) & 0x1f;
  uint32_t man = h & 0x3ff;
  float f;
  if (exp == 0) {
    f = std::ldexp(float(man), -24);
    uint32_t u;
    std::memcpy(&u, &f, 4);
    u |= sign;
    std::memcpy(&f, &u, 4);
    return f;
  }
  uint32_t u;
  if (exp == 31) u = sign | 0x7f800000u | (man << 13);
  else u = sign | ((exp + 112) << 23) | (man << 13);
  std::memcpy(&f, &u, 4);
  return f;
}

uint16_t f32_to_f16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  uint16_t sign = uint16_t((u >> 16) & 0x8000);
  uint32_t a = u & 0x7fffffffu;
  if (a > 0x7f800000u) return sign | 0x7e00;  // NaN
  if (a >= 0x477ff000u) return sign | 0x7c00;  // overflow -> inf (rounds up past 65504)
  if (a < 0x38800000u) {                        // subnormal or zero in f16
    float af;
    std::memcpy(&af, &a, 4);
    // round-to-nearest-even to multiples of 2^-24
    float scaled = af * 16777216.0f;  // exact
    float r = std::nearbyint(scaled);
    return sign | uint16_t(r);
  }
  uint32_t exp = (a >> 23) - 112;
  uint32_t man = a & 0x7fffff;
  uint32_t h = (exp << 10) | (man >> 13);
  uint32_t rest = man & 0x1fff;
  if (rest > 0x1000 || (rest == 0x1000 && (h & 1))) ++h;
  return sign | uint16_t(h);
}

// Round to nearest even; saturates at ±448 (0x7E) as vLLM's fp8 casts do;
// NaN stays NaN. Shared by the FP8 KV cache and the load-time quantizers.
uint8_t f32_to_f8_e4m3(float x) {
  if (std::isnan(x)) return 0x7F;
  const uint8_t sign = std::signbit(x) ? 0x80 : 0;
  const float a = std::fabs(x);
  if (a == 0.0f) return sign;
  int e = std::ilogb(a);
  if (e < -6) {  // subnormal: multiples of 2^-9 (8 rounds up into the smallest normal, 0x08)
    const int m = int(std::nearbyint(std::ldexp(a, 9)));
    return uint8_t(sign | m);
  }
  int m = int(std::nearbyint((std::ldexp(a, -e) - 1.0f) * 8.0f));
  if (m == 8) m = 0, ++e;
  const int biased = e + 7;
  if (biased > 15 || (biased == 15 && m == 7)) return uint8_t(sign | 0x7E);  // saturate to 448
  return uint8_t(sign | (biased << 3) | m);
}

float f8_e4m3_to_f32(uint8_t v) {
  uint32_t sign = v >> 7, exp = (v >> 3) & 0xf, man = v & 7;
  if (exp == 15 && man == 7) return std::numeric_limits<float>::quiet_NaN();
  float r = exp == 0 ? std::ldexp(float(man), -9) : std::ldexp(float(8 + man), int(exp) - 10);
  return sign ? -r : r;
}

float f8_e5m2_to_f32(uint8_t v) { return f16_to_f32(uint16_t(v) << 8); }

float f8_e8m0_to_f32(uint8_t v) {
  if (v == 0xff) return std::numeric_limits<float>::quiet_NaN();
  return std::ldexp(1.0f, int(v) - 127);
}

float e2m1_to_f32(uint8_t code) {
  static constexpr float kValues[16] = {0, 0.5f, 1, 1.5f, 2, 3, 4, 6, -0.0f, -0.5f, -1, -1.5f, -2, -3, -4, -6};
  return kValues[code & 15];
}

}  // namespace muse
