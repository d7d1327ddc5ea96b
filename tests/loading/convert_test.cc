#include "muse/loading/convert.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

using namespace muse;

namespace {
uint32_t bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, 4);
  return u;
}
}  // namespace

TEST(Convert, F16FastMatchesScalarOnAllInputs) {
  for (uint32_t h = 0; h < 65536; ++h) {
    float a = f16_to_f32(uint16_t(h)), b = f16_to_f32_fast(uint16_t(h));
    if (std::isnan(a)) {
      EXPECT_TRUE(std::isnan(b)) << h;
    } else {
      ASSERT_EQ(bits(a), bits(b)) << "half 0x" << std::hex << h;
    }
  }
}

TEST(Convert, BulkMatchesScalarForEveryByteFormat) {
  std::vector<uint8_t> all(256);
  for (int i = 0; i < 256; ++i) all[size_t(i)] = uint8_t(i);
  std::vector<float> out(256);
  struct Case {
    DType t;
    float (*ref)(uint8_t);
  };
  for (Case c : {Case{DType::F8_E4M3, f8_e4m3_to_f32}, Case{DType::F8_E5M2, f8_e5m2_to_f32},
                 Case{DType::F8_E8M0, f8_e8m0_to_f32}}) {
    ASSERT_TRUE(convert_to_f32(c.t, all.data(), 0, 256, out.data()).ok());
    for (int i = 0; i < 256; ++i) {
      float r = c.ref(uint8_t(i));
      if (std::isnan(r)) EXPECT_TRUE(std::isnan(out[size_t(i)])) << i;
      else EXPECT_EQ(r, out[size_t(i)]) << dtype_name(c.t) << " " << i;
    }
  }
  // Known values: e4m3fn max 448, min subnormal 2^-9; e5m2 inf; e8m0 2^(v-127).
  ASSERT_TRUE(convert_to_f32(DType::F8_E4M3, all.data(), 0, 256, out.data()).ok());
  EXPECT_EQ(out[0x7e], 448.0f);
  EXPECT_EQ(out[0x01], std::ldexp(1.0f, -9));
  EXPECT_EQ(out[0x38], 1.0f);
  EXPECT_TRUE(std::isnan(out[0x7f]));
  ASSERT_TRUE(convert_to_f32(DType::F8_E5M2, all.data(), 0, 256, out.data()).ok());
  EXPECT_TRUE(std::isinf(out[0x7c]));
  EXPECT_EQ(out[0x3c], 1.0f);
  ASSERT_TRUE(convert_to_f32(DType::F8_E8M0, all.data(), 0, 256, out.data()).ok());
  EXPECT_EQ(out[127], 1.0f);
  EXPECT_EQ(out[130], 8.0f);
  // FNUZ variants: bias one higher, 0x80 is NaN, no negative zero.
  ASSERT_TRUE(convert_to_f32(DType::F8_E4M3FNUZ, all.data(), 0, 256, out.data()).ok());
  EXPECT_EQ(out[0x40], 1.0f);
  EXPECT_TRUE(std::isnan(out[0x80]));
  EXPECT_EQ(out[0x7f], 240.0f);
  ASSERT_TRUE(convert_to_f32(DType::F8_E5M2FNUZ, all.data(), 0, 256, out.data()).ok());
  EXPECT_EQ(out[0x40], 1.0f);
  EXPECT_TRUE(std::isnan(out[0x80]));
  EXPECT_EQ(out[0x7f], 57344.0f);
}

TEST(Convert, F4LowNibbleFirstAndIntegers) {
  const uint8_t packed[2] = {0x72, 0xF9};  // codes 2,7 then 9,15
  float out[4];
  ASSERT_TRUE(convert_to_f32(DType::F4, packed, 0, 4, out).ok());
  EXPECT_EQ(out[0], 1.0f);
  EXPECT_EQ(out[1], 6.0f);
  EXPECT_EQ(out[2], -0.5f);
  EXPECT_EQ(out[3], -6.0f);
  ASSERT_TRUE(convert_to_f32(DType::F4, packed, 2, 2, out).ok());
  EXPECT_EQ(out[0], -0.5f);
  EXPECT_FALSE(convert_to_f32(DType::F4, packed, 1, 2, out).ok());

  int32_t ints[3] = {-5, 0, 1 << 20};
  ASSERT_TRUE(convert_to_f32(DType::I32, reinterpret_cast<const uint8_t*>(ints), 0, 3, out).ok());
  EXPECT_EQ(out[0], -5.0f);
  EXPECT_EQ(out[2], float(1 << 20));
  const uint8_t i8[2] = {0xff, 0x7f};
  ASSERT_TRUE(convert_to_f32(DType::I8, i8, 0, 2, out).ok());
  EXPECT_EQ(out[0], -1.0f);
  ASSERT_TRUE(convert_to_f32(DType::U8, i8, 0, 2, out).ok());
  EXPECT_EQ(out[0], 255.0f);
  EXPECT_FALSE(convert_to_f32(DType::C64, i8, 0, 1, out).ok());
  EXPECT_FALSE(convert_to_f32(DType::F6_E2M3, i8, 0, 1, out).ok());
}

TEST(Convert, ToBf16RoundsNearestEven) {
  float src[4] = {1.0f, 1.00390625f /* tie: 1 + 2^-8 -> 1.0 */, 1.01171875f /* 1 + 3·2^-8 -> 1 + 2^-6 */, -2.5f};
  uint16_t out[4];
  ASSERT_TRUE(convert_to_bf16(DType::F32, reinterpret_cast<const uint8_t*>(src), 0, 4, out).ok());
  EXPECT_EQ(out[0], 0x3f80);
  EXPECT_EQ(out[1], 0x3f80);
  EXPECT_EQ(out[2], 0x3f82);
  EXPECT_EQ(out[3], f32_to_bf16(-2.5f));
  uint16_t halves[2] = {f32_to_f16(0.5f), f32_to_f16(-3.0f)};
  ASSERT_TRUE(convert_to_bf16(DType::F16, reinterpret_cast<const uint8_t*>(halves), 0, 2, out).ok());
  EXPECT_EQ(bf16_to_f32(out[0]), 0.5f);
  EXPECT_EQ(bf16_to_f32(out[1]), -3.0f);
}

TEST(Convert, ParallelEqualsSerialOnRandomData) {
  // Large enough to split across threads, odd-sized to exercise the tail.
  const int64_t n = (int64_t(3) << 20) + 17;
  std::mt19937 rng(7);
  std::vector<uint16_t> src(static_cast<size_t>(n));
  for (auto& v : src) v = uint16_t(rng());
  const auto* bytes = reinterpret_cast<const uint8_t*>(src.data());
  for (DType t : {DType::BF16, DType::F16}) {
    std::vector<float> a(static_cast<size_t>(n)), b(static_cast<size_t>(n));
    ASSERT_TRUE(convert_to_f32(t, bytes, 0, n, a.data()).ok());
    ASSERT_TRUE(convert_to_f32_parallel(t, bytes, n, b.data(), 4).ok());
    EXPECT_EQ(0, std::memcmp(a.data(), b.data(), size_t(n) * 4)) << dtype_name(t);
    std::vector<uint16_t> c(static_cast<size_t>(n)), d(static_cast<size_t>(n));
    ASSERT_TRUE(convert_to_bf16(t, bytes, 0, n, c.data()).ok());
    ASSERT_TRUE(convert_to_bf16_parallel(t, bytes, n, d.data(), 3).ok());
    EXPECT_EQ(c, d);
  }
  // Unaligned source pointer.
  std::vector<float> a(100), b(100);
  ASSERT_TRUE(convert_to_f32(DType::BF16, bytes + 1, 0, 100, a.data()).ok());
  for (int i = 0; i < 100; ++i) {
    uint16_t h;
    std::memcpy(&h, bytes + 1 + 2 * i, 2);
    EXPECT_EQ(bits(a[size_t(i)]), bits(bf16_to_f32(h)));
  }
}
