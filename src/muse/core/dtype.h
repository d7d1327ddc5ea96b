// Element types of checkpoint tensors and their scalar conversions.
#pragma once

#include <cstdint>
#include <cstring>
#include <string_view>

namespace muse {

// The safetensors dtype set (checkpoint-formats.md §1). Bits per element, not
// bytes: F4 is 4 bits, F6 6 bits.
enum class DType : uint8_t {
  BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, F8_E5M2FNUZ,
  I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64,
};

int dtype_bits(DType t);
std::string_view dtype_name(DType t);
// Parses a safetensors dtype string ("BF16"); false when unknown.
bool parse_dtype(std::string_view name, DType* out);

// Scalar conversions (bit-exact with PyTorch: bf16 round-to-nearest-even,
// e4m3fn saturating only where torch saturates: it does not; NaN stays NaN).
inline float bf16_to_f32(uint16_t h) {
  uint32_t u = uint32_t(h) << 16;
  float f;
  std::memcpy(&f, &u, 4);
  return f;
}
inline uint16_t f32_to_bf16(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  if ((u & 0x7fffffffu) > 0x7f800000u) return uint16_t((u >> 16) | 0x40);  // quiet NaN
  u += 0x7fffu + ((u >> 16) & 1u);
  return uint16_t(u >> 16);
}
// Round a float to the nearest bf16 value and back (emulates a bf16 store).
inline float round_bf16(float f) { return bf16_to_f32(f32_to_bf16(f)); }

float f16_to_f32(uint16_t h);
uint16_t f32_to_f16(float f);
float f8_e4m3_to_f32(uint8_t v);  // e4m3fn: no inf, NaN = S.1111.111
uint8_t f32_to_f8_e4m3(float f);  // nearest even, saturating at ±448
float f8_e5m2_to_f32(uint8_t v);
float f8_e8m0_to_f32(uint8_t v);  // 2^(v-127), 0xFF = NaN
float e2m1_to_f32(uint8_t code);  // low 4 bits

}  // namespace muse
