// Known-answer tests for the quantized-format decoders (checkpoint-formats.md
// §5.6 item 6): bytes packed by hand the way each reference packer writes
// them, stored in a safetensors file under the format's tensor names, read
// back and decoded. They pin nibble order, scale reciprocals, the GPTQ zero
// offset and act-order group lookup.
#include "muse/loading/quant.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <unistd.h>

#include "muse/loading/safetensors.h"

using namespace muse;

namespace {

std::string f32_bytes(std::vector<float> v) { return tensor_bytes_f32(v, DType::F32); }
std::string i32_bytes(const std::vector<uint32_t>& v) {
  std::string s(v.size() * 4, '\0');
  std::memcpy(s.data(), v.data(), s.size());
  return s;
}

// Writes tensors to a file, maps it back, and hands out inputs by name:
// the decoders see real, mapped checkpoint bytes.
class Stored {
 public:
  explicit Stored(const std::vector<TensorToWrite>& tensors) {
    path_ = testing::TempDir() + "/quant_" + std::to_string(::getpid()) + "_" +
            testing::UnitTest::GetInstance()->current_test_info()->name() + ".safetensors";
    Status s = write_safetensors(path_, tensors);
    EXPECT_TRUE(s.ok()) << s.message();
    auto f = SafetensorsFile::open(path_);
    EXPECT_TRUE(f.ok()) << f.message();
    file_ = std::make_unique<SafetensorsFile>(std::move(*f));
  }
  ~Stored() { ::unlink(path_.c_str()); }
  QuantInput operator[](const std::string& name) const {
    const TensorInfo* t = file_->find(name);
    EXPECT_NE(t, nullptr) << name;
    if (!t) return {};
    return QuantInput{file_->data(*t), size_t(t->nbytes()), t->dtype};
  }
  float scalar(const std::string& name) const {
    float v;
    std::memcpy(&v, (*this)[name].data, 4);
    return v;
  }

 private:
  std::string path_;
  std::unique_ptr<SafetensorsFile> file_;
};

}  // namespace

TEST(QuantKnownAnswer, Nvfp4ModelOptAndCompressedTensors) {
  // One row of 32 inputs = two 16-element blocks. ModelOpt packs
  // (q[1::2] << 4) | q[0::2]: byte 0x72 holds element 0 = code 2 (1.0) and
  // element 1 = code 7 (6.0); byte 0x9F holds element 16 = code 15 (-6.0) and
  // element 17 = code 9 (-0.5).
  std::string packed(16, '\0');
  packed[0] = '\x72';
  packed[8] = '\x9F';
  packed[15] = '\x1E';  // elements 30 = code 14 (-4), 31 = code 1 (0.5)
  std::string scales = "\x38\x40";  // e4m3: 1.0, 2.0
  Stored modelopt({{"w.weight", DType::U8, {1, 16}, packed},
                   {"w.weight_scale", DType::F8_E4M3, {1, 2}, scales},
                   {"w.weight_scale_2", DType::F32, {}, f32_bytes({0.5f})}});
  std::vector<float> out(32);
  ASSERT_TRUE(decode_nvfp4(modelopt["w.weight"], modelopt["w.weight_scale"], modelopt.scalar("w.weight_scale_2"), 1, 32,
                           out.data()).ok());
  std::vector<float> want(32, 0.0f);
  want[0] = 0.5f;    // 1.0 · 1.0 · 0.5
  want[1] = 3.0f;    // 6.0 · 1.0 · 0.5
  want[16] = -6.0f;  // -6 · 2.0 · 0.5
  want[17] = -0.5f;
  want[30] = -4.0f;
  want[31] = 0.5f;
  EXPECT_EQ(out, want);

  // compressed-tensors stores the reciprocal global scale (448·6/amax): the
  // same bytes with weight_global_scale = 2.0 decode identically.
  Stored ct({{"w.weight_packed", DType::U8, {1, 16}, packed},
             {"w.weight_scale", DType::F8_E4M3, {1, 2}, scales},
             {"w.weight_global_scale", DType::F32, {1}, f32_bytes({2.0f})}});
  std::vector<float> out2(32);
  ASSERT_TRUE(decode_nvfp4(ct["w.weight_packed"], ct["w.weight_scale"], 1.0f / ct.scalar("w.weight_global_scale"), 1, 32,
                           out2.data()).ok());
  EXPECT_EQ(out2, want);

  EXPECT_FALSE(decode_nvfp4(ct["w.weight_packed"], ct["w.weight_scale"], 1.0f, 1, 16, out2.data()).ok());
  EXPECT_FALSE(decode_nvfp4(ct["w.weight_packed"], ct["w.weight_global_scale"], 1.0f, 1, 32, out2.data()).ok());
}

TEST(QuantKnownAnswer, Nvfp4RandomAgainstReferencePacker) {
  // The ModelOpt packer applied to random codes; decoding must give
  // E2M1(q) · scale[k/16] · scale_2 at every position.
  const int64_t N = 3, K = 48;
  std::mt19937 rng(3);
  std::vector<uint8_t> codes(size_t(N * K)), sc(size_t(N * K / 16));
  for (auto& c : codes) c = uint8_t(rng() & 15);
  for (auto& s : sc) s = uint8_t(0x30 + rng() % 0x20);  // e4m3 in [2^-1, 2^3)
  std::string packed(size_t(N * K / 2), '\0');
  for (int64_t i = 0; i < N * K / 2; ++i) packed[size_t(i)] = char(codes[size_t(2 * i)] | (codes[size_t(2 * i + 1)] << 4));
  std::string scales(sc.begin(), sc.end());
  Stored st({{"weight", DType::U8, {N, K / 2}, packed}, {"weight_scale", DType::F8_E4M3, {N, K / 16}, scales}});
  std::vector<float> out(size_t(N * K));
  ASSERT_TRUE(decode_nvfp4(st["weight"], st["weight_scale"], 0.25f, N, K, out.data()).ok());
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k)
      ASSERT_EQ(out[size_t(n * K + k)],
                e2m1_to_f32(codes[size_t(n * K + k)]) * (f8_e4m3_to_f32(sc[size_t(n * K / 16 + k / 16)]) * 0.25f))
          << n << "," << k;
}

TEST(QuantKnownAnswer, Mxfp4QuarkAndGptOssBlocks) {
  // Two rows of 32: row 0 scale 129 (x4), row 1 scale 126 (x0.5). Byte 0x21:
  // element 0 = code 1 (0.5), element 1 = code 2 (1.0).
  std::string packed(32, '\0');
  packed[0] = '\x21';
  packed[16 + 15] = '\xA7';  // row 1, elements 30 = code 7 (6), 31 = code 10 (-1)
  std::string scales = "\x81\x7e";
  Stored quark({{"w.weight", DType::U8, {2, 16}, packed}, {"w.weight_scale", DType::U8, {2, 1}, scales}});
  std::vector<float> out(64);
  ASSERT_TRUE(decode_mxfp4(quark["w.weight"], quark["w.weight_scale"], 2, 32, out.data()).ok());
  std::vector<float> want(64, 0.0f);
  want[0] = 2.0f;
  want[1] = 4.0f;
  want[32 + 30] = 3.0f;
  want[32 + 31] = -0.5f;
  EXPECT_EQ(out, want);
  // gpt-oss stores the same bytes as _blocks [E, N, K/32, 16] with U8 _scales [E, N, K/32].
  Stored oss({{"experts.gate_up_proj_blocks", DType::U8, {1, 2, 1, 16}, packed},
              {"experts.gate_up_proj_scales", DType::U8, {1, 2, 1}, scales}});
  std::vector<float> out2(64);
  ASSERT_TRUE(decode_mxfp4(oss["experts.gate_up_proj_blocks"], oss["experts.gate_up_proj_scales"], 2, 32, out2.data()).ok());
  EXPECT_EQ(out2, want);
}

TEST(QuantKnownAnswer, Fp8PerTensorChannelAndBlock) {
  // e4m3fn: 0x38 = 1.0, 0x40 = 2.0, 0xC4 = -3.0, 0x7E = 448.
  std::string w = "\x38\x40\xC4\x7E";
  Stored st({{"t.weight", DType::F8_E4M3, {2, 2}, w},
             {"t.weight_scale", DType::F32, {}, f32_bytes({0.5f})},
             {"c.weight_scale", DType::F32, {2}, f32_bytes({0.5f, 2.0f})}});
  std::vector<float> out(4);
  ASSERT_TRUE(decode_fp8(st["t.weight"], st["t.weight_scale"], Fp8Scaling::PerTensor, 2, 2, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{0.5f, 1.0f, -1.5f, 224.0f}));
  ASSERT_TRUE(decode_fp8(st["t.weight"], st["c.weight_scale"], Fp8Scaling::PerChannel, 2, 2, out.data()).ok());
  EXPECT_EQ(out, (std::vector<float>{0.5f, 1.0f, -6.0f, 896.0f}));

  // DeepSeek 128×128 blocks with a ragged edge: [130, 2] has scale_inv [2, 1];
  // row 129 uses the second block's scale, which multiplies.
  std::string big(130 * 2, '\x38');
  Stored blk({{"b.weight", DType::F8_E4M3, {130, 2}, big},
              {"b.weight_scale_inv", DType::F32, {2, 1}, f32_bytes({3.0f, 0.25f})}});
  std::vector<float> o(260);
  ASSERT_TRUE(decode_fp8(blk["b.weight"], blk["b.weight_scale_inv"], Fp8Scaling::Block, 130, 2, o.data()).ok());
  EXPECT_EQ(o[0], 3.0f);
  EXPECT_EQ(o[127 * 2 + 1], 3.0f);
  EXPECT_EQ(o[128 * 2], 0.25f);
  EXPECT_EQ(o[129 * 2 + 1], 0.25f);
  EXPECT_FALSE(decode_fp8(blk["b.weight"], blk["b.weight_scale_inv"], Fp8Scaling::PerChannel, 130, 2, o.data()).ok());
}

TEST(QuantKnownAnswer, GptqV1V2AndActOrder) {
  // K = 8, N = 8, one group. qweight [1, 8]: column n holds q[k, n] for
  // k = 0..7 at bits 4k. Column 0 = 0x76543210 (q = k), others 0x88888888.
  std::vector<uint32_t> qweight(8, 0x88888888u);
  qweight[0] = 0x76543210u;
  // v1 stores zero − 1: 0x77777777 means zero 8 for every column.
  std::vector<float> scales(8, 1.0f);
  scales[0] = 0.5f;
  scales[3] = 2.0f;
  Stored v1({{"l.qweight", DType::I32, {1, 8}, i32_bytes(qweight)},
             {"l.qzeros", DType::I32, {1, 1}, i32_bytes({0x77777777u})},
             {"l.scales", DType::F16, {1, 8}, tensor_bytes_f32(scales, DType::F16)}});
  GptqArgs a{v1["l.qweight"], v1["l.qzeros"], v1["l.scales"], {}, 8, 8, 8, true};
  std::vector<float> out(64);
  ASSERT_TRUE(decode_gptq_int4(a, out.data()).ok());
  for (int k = 0; k < 8; ++k) EXPECT_EQ(out[size_t(k)], 0.5f * float(k - 8)) << k;  // row n = 0 of [N, K]
  for (int k = 0; k < 8; ++k) EXPECT_EQ(out[size_t(3 * 8 + k)], 0.0f);             // q = 8 = zero
  // gptq_v2 stores the zero itself: 0x88888888 with zeros_minus_one = false is the same model.
  Stored v2({{"l.qweight", DType::I32, {1, 8}, i32_bytes(qweight)},
             {"l.qzeros", DType::I32, {1, 1}, i32_bytes({0x88888888u})},
             {"l.scales", DType::F16, {1, 8}, tensor_bytes_f32(scales, DType::F16)}});
  GptqArgs b{v2["l.qweight"], v2["l.qzeros"], v2["l.scales"], {}, 8, 8, 8, false};
  std::vector<float> out2(64);
  ASSERT_TRUE(decode_gptq_int4(b, out2.data()).ok());
  EXPECT_EQ(out, out2);

  // Act-order: K = 16, group size 8, g_idx alternating groups 1, 0, 1, 0, ...
  // Group 0 scale 1, group 1 scale 10; every q = 9, zero 8 (v1 stored 7): W = scale.
  std::vector<uint32_t> qw(2 * 8, 0x99999999u);
  std::vector<uint32_t> g_idx(16);
  for (int k = 0; k < 16; ++k) g_idx[size_t(k)] = uint32_t(1 - k % 2);
  std::vector<float> gs(16, 1.0f);
  for (int n = 0; n < 8; ++n) gs[size_t(8 + n)] = 10.0f;
  Stored ao({{"qweight", DType::I32, {2, 8}, i32_bytes(qw)},
             {"qzeros", DType::I32, {2, 1}, i32_bytes({0x77777777u, 0x77777777u})},
             {"scales", DType::F16, {2, 8}, tensor_bytes_f32(gs, DType::F16)},
             {"g_idx", DType::I32, {16}, i32_bytes(g_idx)}});
  GptqArgs c{ao["qweight"], ao["qzeros"], ao["scales"], ao["g_idx"], 16, 8, 8, true};
  std::vector<float> out3(128);
  ASSERT_TRUE(decode_gptq_int4(c, out3.data()).ok());
  EXPECT_EQ(out3[0], 10.0f);  // k = 0 -> group 1
  EXPECT_EQ(out3[1], 1.0f);   // k = 1 -> group 0
  EXPECT_EQ(out3[5 * 16 + 14], 10.0f);
  g_idx[3] = 2;  // out of range
  Stored bad({{"qweight", DType::I32, {2, 8}, i32_bytes(qw)},
              {"qzeros", DType::I32, {2, 1}, i32_bytes({0x77777777u, 0x77777777u})},
              {"scales", DType::F16, {2, 8}, tensor_bytes_f32(gs, DType::F16)},
              {"g_idx", DType::I32, {16}, i32_bytes(g_idx)}});
  GptqArgs d{bad["qweight"], bad["qzeros"], bad["scales"], bad["g_idx"], 16, 8, 8, true};
  auto s = decode_gptq_int4(d, out3.data());
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("g_idx[3]"), std::string::npos) << s.message();
}

TEST(QuantKnownAnswer, CompressedTensorsPackQuantized) {
  // [N = 2, K = 8], group 8; stored nibble = value + 8, low bits first:
  // row 0 = 0xFEDCBA98 holds values 0..7, row 1 = 0x01234567 holds -1..-8.
  Stored st({{"w.weight_packed", DType::I32, {2, 1}, i32_bytes({0xFEDCBA98u, 0x01234567u})},
             {"w.weight_scale", DType::BF16, {2, 1}, tensor_bytes_f32({0.5f, 2.0f}, DType::BF16)}});
  std::vector<float> out(16);
  ASSERT_TRUE(decode_ct_int4(st["w.weight_packed"], st["w.weight_scale"], 2, 8, 8, out.data()).ok());
  for (int k = 0; k < 8; ++k) {
    EXPECT_EQ(out[size_t(k)], 0.5f * float(k));
    EXPECT_EQ(out[size_t(8 + k)], 2.0f * float(-1 - k));
  }
}

TEST(QuantConfig, DescribesSchemes) {
  auto scheme = [](const char* text) {
    auto j = Json::parse(text);
    EXPECT_TRUE(j.ok());
    auto r = describe_quantization(*j);
    EXPECT_TRUE(r.ok()) << r.message();
    return r.ok() ? *r : QuantInfo{};
  };
  EXPECT_EQ(scheme("null").scheme, QuantScheme::None);
  EXPECT_EQ(scheme(R"({"quant_method":"modelopt","quant_algo":"NVFP4"})").scheme, QuantScheme::ModelOptNvfp4);
  EXPECT_EQ(scheme(R"({"quant_method":"modelopt","quant_algo":"FP8"})").scheme, QuantScheme::ModelOptFp8);
  auto ct = scheme(R"({"quant_method":"compressed-tensors","format":"pack-quantized",
                       "config_groups":{"group_0":{"weights":{"num_bits":4,"group_size":64}}}})");
  EXPECT_EQ(ct.scheme, QuantScheme::CompressedTensorsInt4);
  EXPECT_EQ(ct.group_size, 64);
  EXPECT_EQ(scheme(R"({"quant_method":"compressed-tensors","format":"nvfp4-pack-quantized"})").scheme,
            QuantScheme::CompressedTensorsNvfp4);
  EXPECT_EQ(scheme(R"({"quant_method":"quark","global_quant_config":{"weight":{"dtype":"fp4"}}})").scheme,
            QuantScheme::QuarkMxfp4);
  EXPECT_EQ(scheme(R"({"quant_method":"quark","global_quant_config":{"weight":{"dtype":"fp8_e4m3"}}})").scheme,
            QuantScheme::QuarkFp8);
  EXPECT_EQ(scheme(R"({"quant_method":"mxfp4"})").scheme, QuantScheme::Mxfp4);
  EXPECT_EQ(scheme(R"({"quant_method":"fp8","weight_block_size":[128,128]})").scheme, QuantScheme::Fp8Block);
  auto g1 = scheme(R"({"quant_method":"gptq","bits":4,"group_size":128})");
  EXPECT_EQ(g1.scheme, QuantScheme::Gptq);
  EXPECT_TRUE(g1.zeros_minus_one);
  EXPECT_FALSE(scheme(R"({"quant_method":"gptq","bits":4,"checkpoint_format":"gptq_v2"})").zeros_minus_one);
  EXPECT_TRUE(scheme(R"({"quant_method":"auto-round","bits":4})").zeros_minus_one);
  EXPECT_FALSE(scheme(R"({"quant_method":"auto-round","bits":4,"packing_format":"auto_round"})").zeros_minus_one);
  EXPECT_EQ(scheme(R"({"quant_method":"bitsandbytes"})").scheme, QuantScheme::Unknown);
  EXPECT_FALSE(describe_quantization(*Json::parse(R"({"quant_method":5})")).ok());
  EXPECT_FALSE(describe_quantization(*Json::parse("[1]")).ok());
}

// ---------------------------------------------------------------------------
// Element encoders (model/quantize.h) and quantize -> dequantize bounds.
// ---------------------------------------------------------------------------
#include "muse/model/quantize.h"

TEST(QuantKnownAnswer, E4m3EncoderRoundsToNearestEvenAndSaturates) {
  EXPECT_EQ(f32_to_f8_e4m3(1.0f), 0x38);
  EXPECT_EQ(f32_to_f8_e4m3(-2.0f), 0xC0);
  EXPECT_EQ(f32_to_f8_e4m3(448.0f), 0x7E);   // max normal
  EXPECT_EQ(f32_to_f8_e4m3(10000.0f), 0x7E);  // saturates (no inf in e4m3fn)
  EXPECT_EQ(f32_to_f8_e4m3(-10000.0f), 0xFE);
  EXPECT_EQ(f32_to_f8_e4m3(0.0f), 0x00);
  EXPECT_EQ(f32_to_f8_e4m3(-0.0f), 0x80);     // negative zero keeps its sign
  EXPECT_EQ(f32_to_f8_e4m3(std::ldexp(1.0f, -9)), 0x01);          // smallest subnormal
  EXPECT_EQ(f32_to_f8_e4m3(std::ldexp(1.0f, -10)), 0x00);         // tie between 0 and 2^-9: to even (0)
  EXPECT_EQ(f32_to_f8_e4m3(std::ldexp(3.0f, -10)), 0x02);         // 1.5 · 2^-9: tie to even (2)
  EXPECT_EQ(f32_to_f8_e4m3(std::ldexp(7.5f, -9)), 0x08);          // rounds up out of the subnormals
  EXPECT_EQ(f32_to_f8_e4m3(1.0625f), 0x38);                      // 1 + 1/16: tie to even mantissa (1.0)
  EXPECT_EQ(f32_to_f8_e4m3(1.1875f), 0x3A);                      // 1 + 3/16: tie to even (1.25)
  EXPECT_EQ(f32_to_f8_e4m3(std::nanf("")), 0x7F);
  // Every finite code round-trips.
  for (int c = 0; c < 256; ++c) {
    if ((c & 0x7F) == 0x7F) continue;
    EXPECT_EQ(f32_to_f8_e4m3(f8_e4m3_to_f32(uint8_t(c))), c) << c;
  }
  EXPECT_TRUE(std::isnan(f8_e4m3_to_f32(0x7F)) && std::isnan(f8_e4m3_to_f32(0xFF)));
  EXPECT_EQ(f8_e4m3_to_f32(0x01), std::ldexp(1.0f, -9));
  EXPECT_EQ(f8_e4m3_to_f32(0x07), std::ldexp(7.0f, -9));  // largest subnormal
}

TEST(QuantKnownAnswer, E2m1EncoderAndNegativeZero) {
  for (int c = 0; c < 16; ++c) EXPECT_EQ(f32_to_e2m1(e2m1_to_f32(uint8_t(c))), c == 8 ? 8 : c) << c;
  // Midpoints go to the even code: 0.25 -> 0, 0.75 -> 1.0, 1.25 -> 1.0, 1.75 -> 2.0, 2.5 -> 2, 3.5 -> 4, 5 -> 4.
  const float mid[] = {0.25f, 0.75f, 1.25f, 1.75f, 2.5f, 3.5f, 5.0f};
  const uint8_t want[] = {0, 2, 2, 4, 4, 6, 6};
  for (int i = 0; i < 7; ++i) EXPECT_EQ(f32_to_e2m1(mid[i]), want[i]) << mid[i];
  EXPECT_EQ(f32_to_e2m1(7.0f), 7);    // saturates at 6
  EXPECT_EQ(f32_to_e2m1(-100.0f), 15);
  EXPECT_EQ(f32_to_e2m1(-0.1f), 8);   // rounds to -0
  EXPECT_TRUE(std::signbit(e2m1_to_f32(8)) && e2m1_to_f32(8) == 0.0f);
}

TEST(QuantKnownAnswer, E8m0Limits) {
  EXPECT_EQ(f8_e8m0_to_f32(127), 1.0f);
  EXPECT_EQ(f8_e8m0_to_f32(0), std::ldexp(1.0f, -127));  // a subnormal f32, exactly
  EXPECT_EQ(f8_e8m0_to_f32(254), std::ldexp(1.0f, 127));
  EXPECT_TRUE(std::isnan(f8_e8m0_to_f32(255)));
  // MXFP4's shared exponent: floor(log2 amax) - 2, clamped to the E8M0 range.
  std::vector<float> w(32, 0.0f);
  w[0] = 6.0f;  // floor(log2 6) - 2 = 0 -> 127
  auto q = quantize_weight(QuantKind::Mxfp4, w.data(), {1, 32});
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->scales[0], 127);
  EXPECT_EQ(q->codes[0] & 15, 7);  // 6.0
  w[0] = 1e-40f;                   // below every scale: the smallest, codes 0
  q = quantize_weight(QuantKind::Mxfp4, w.data(), {1, 32});
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->scales[0], 0);
  w[0] = 3e38f;                    // floor(log2) = 127, - 2 = 125
  q = quantize_weight(QuantKind::Mxfp4, w.data(), {1, 32});
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->scales[0], 252);
  std::vector<float> zero(32, 0.0f);
  q = quantize_weight(QuantKind::Mxfp4, zero.data(), {1, 32});
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->scales[0], 0);
}

TEST(QuantKnownAnswer, Nvfp4ScaleExtremes) {
  // The block holding the matrix amax gets block scale 448 exactly (scale_2 =
  // amax / (6·448)) and its largest element code 7 (6.0); a block of zeros
  // gets scale 0 and codes 0.
  std::vector<float> w(32, 0.0f);
  for (int i = 0; i < 16; ++i) w[size_t(i)] = float(i - 8) * 0.25f;
  auto q = quantize_weight(QuantKind::Nvfp4, w.data(), {1, 32});
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->global[0], 2.0f / (6.0f * 448.0f));
  EXPECT_EQ(q->scales[0], 0x7E);
  EXPECT_EQ(q->scales[1], 0x00);
  EXPECT_EQ(q->codes[0] & 15, 15);  // element 0 = -2.0 = amax: -6 on the grid
  std::vector<float> out(32);
  ASSERT_TRUE(decode_nvfp4({q->codes.data(), 16, DType::U8}, {q->scales.data(), 2, DType::F8_E4M3}, q->global[0], 1, 32,
                           out.data()).ok());
  EXPECT_FLOAT_EQ(out[0], -2.0f);
  for (int i = 16; i < 32; ++i) EXPECT_EQ(out[size_t(i)], 0.0f);
}

TEST(QuantRoundTrip, ErrorBoundsPerFormat) {
  // Gaussian weights with a few outliers, [48, 256]; per element bounds from
  // each format's rounding rule, and the RMS error relative to the RMS weight.
  const int64_t N = 48, K = 256;
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 0.02f);
  std::vector<float> w(size_t(N * K));
  for (auto& x : w) x = nd(rng);
  w[77] = 0.5f, w[1000] = -0.7f;
  double rms_w = 0;
  for (float x : w) rms_w += double(x) * x;
  rms_w = std::sqrt(rms_w / double(w.size()));
  for (QuantKind kind : {QuantKind::Nvfp4, QuantKind::Mxfp4, QuantKind::Fp8, QuantKind::Int4}) {
    auto q = quantize_weight(kind, w.data(), {N, K});
    ASSERT_TRUE(q.ok()) << q.message();
    std::vector<float> d(size_t(N * K));
    Status s = Status::Ok();
    if (kind == QuantKind::Nvfp4)
      s = decode_nvfp4({q->codes.data(), q->codes.size(), DType::U8}, {q->scales.data(), q->scales.size(), DType::F8_E4M3},
                       q->global[0], N, K, d.data());
    else if (kind == QuantKind::Mxfp4)
      s = decode_mxfp4({q->codes.data(), q->codes.size(), DType::U8}, {q->scales.data(), q->scales.size(), DType::U8}, N, K,
                       d.data());
    else if (kind == QuantKind::Fp8)
      s = decode_fp8({q->codes.data(), q->codes.size(), DType::F8_E4M3}, {q->scales.data(), q->scales.size(), DType::F32},
                     Fp8Scaling::PerChannel, N, K, d.data());
    else {
      GptqArgs a;
      a.qweight = {q->codes.data(), q->codes.size(), DType::I32};
      a.qzeros = {q->zeros.data(), q->zeros.size(), DType::I32};
      a.scales = {q->scales.data(), q->scales.size(), DType::F16};
      a.in_features = K, a.out_features = N, a.group_size = 128, a.zeros_minus_one = true;
      s = decode_gptq_int4(a, d.data());
    }
    ASSERT_TRUE(s.ok()) << s.message();
    double se = 0;
    int bad = 0;
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        const size_t i = size_t(n * K + k);
        const double err = std::fabs(double(d[i]) - w[i]);
        se += err * err;
        // The block (group) this element is scaled with, and its amax.
        const int64_t G = kind == QuantKind::Nvfp4 ? 16 : kind == QuantKind::Mxfp4 ? 32 : kind == QuantKind::Int4 ? 128 : K;
        double amax = 0;
        for (int64_t j = k / G * G; j < k / G * G + G; ++j) amax = std::max(amax, double(std::fabs(w[size_t(n * K + j)])));
        double bound = 0;
        switch (kind) {
          case QuantKind::Nvfp4: bound = amax / 6.0 * (1.0 + 1.0 / 16) * 1.0 + 1e-9; break;  // half the widest gap (4..6) at a scale rounded up by <= 2^-4
          case QuantKind::Mxfp4: bound = amax / 2.0 + 1e-9; break;  // X = 2^(floor(log2 amax) - 2) > amax / 8; saturation at 6X
          case QuantKind::Fp8: bound = std::max(std::fabs(w[i]) / 16.0, amax / 448.0 * std::ldexp(1.0, -10)) + 1e-12; break;
          case QuantKind::Int4: bound = 0.51 * (2.0 * amax / 15.0) + 1e-9; break;  // half a step (scale rounded to f16)
          case QuantKind::None: break;
        }
        if (!(err <= bound) && ++bad <= 3) ADD_FAILURE() << quant_kind_name(kind) << " [" << n << "," << k << "] " << w[i] << " -> " << d[i] << " bound " << bound;
      }
    const double rel = std::sqrt(se / double(w.size())) / rms_w;
    std::printf("[ %s ] rms error / rms weight = %.4f\n", quant_kind_name(kind), rel);
    const double max_rel = kind == QuantKind::Fp8 ? 0.04 : 0.20;  // measured: nvfp4 0.094, mxfp4 0.121, fp8 0.024, int4 0.165 (outliers share a group)
    EXPECT_LT(rel, max_rel) << quant_kind_name(kind);
    EXPECT_EQ(bad, 0) << quant_kind_name(kind);
  }
}

TEST(QuantConfig, RefusesActOrderAndOtherBitsByName) {
  auto a = describe_quantization(*Json::parse(R"({"quant_method": "gptq", "bits": 4, "group_size": 128, "desc_act": true})"));
  ASSERT_FALSE(a.ok());
  EXPECT_NE(a.message().find("desc_act"), std::string::npos) << a.message();
  auto b = describe_quantization(*Json::parse(R"({"quant_method": "auto-round", "bits": 8})"));
  ASSERT_FALSE(b.ok());
  EXPECT_NE(b.message().find("bits = 8"), std::string::npos);
  auto c = describe_quantization(*Json::parse(R"({"quant_method": "gptq", "bits": 4, "desc_act": false, "ignore": ["lm_head"]})"));
  ASSERT_TRUE(c.ok());
  EXPECT_EQ(c->scheme, QuantScheme::Gptq);
  EXPECT_TRUE(c->zeros_minus_one);
  EXPECT_EQ(c->group_size, 128);
  EXPECT_EQ(c->excluded, std::vector<std::string>{"lm_head"});
  auto hf = modelopt_quant_config(*Json::parse(R"({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4",
      "group_size": 16, "exclude_modules": ["lm_head", "model.layers.0.mlp.experts*"]}})"));
  ASSERT_TRUE(hf.ok());
  auto d = describe_quantization(*hf);
  ASSERT_TRUE(d.ok());
  EXPECT_EQ(d->scheme, QuantScheme::ModelOptNvfp4);
  EXPECT_EQ(d->excluded.size(), 2u);
}

// A known method with a variant muse does not read is refused naming the
// setting (not as an unknown method), and per-layer settings either become
// exclusions (AutoRound 16-bit extra_config, GPTQModel "-:" dynamic) or are
// refused by name.
TEST(QuantConfig, RefusesUnsupportedVariantsByName) {
  auto refused = [](const char* text, const char* needle) {
    auto r = describe_quantization(*Json::parse(text));
    ASSERT_FALSE(r.ok()) << text;
    EXPECT_NE(r.message().find(needle), std::string::npos) << r.message();
  };
  refused(R"({"quant_method": "modelopt", "quant_algo": "W4A8_AWQ"})", "quant_algo \"W4A8_AWQ\" is not supported");
  refused(R"({"quant_method": "modelopt"})", "quant_algo \"\"");
  refused(R"({"quant_method": "compressed-tensors", "format": "int-quantized"})", "format \"int-quantized\"");
  refused(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
              "config_groups": {"g": {"weights": {"num_bits": 8, "group_size": 128}}}})", "num_bits 8");
  refused(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
              "config_groups": {"g": {"weights": {"num_bits": 4, "symmetric": false, "group_size": 128}}}})",
          "symmetric = false");
  refused(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
              "config_groups": {"g": {"weights": {"num_bits": 4, "actorder": "group", "group_size": 128}}}})",
          "actorder \"group\"");
  refused(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
              "config_groups": {"a": {"weights": {"num_bits": 4, "group_size": 128}},
                                "b": {"weights": {"num_bits": 4, "group_size": 64}}}})", "different weight schemes");
  refused(R"({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "int8"}}})", "dtype \"int8\"");
  refused(R"({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "fp4"}},
              "layer_quant_config": {"*q_proj": {"weight": {"dtype": "fp8_e4m3"}}}})", "layer_quant_config");
  refused(R"({"quant_method": "fp8", "weight_block_size": [64, 64]})", "128 x 128 blocks only");
  refused(R"({"quant_method": "fp8", "weight_block_size": "128"})", "two integers");
  refused(R"({"quant_method": "gptq", "bits": 4, "checkpoint_format": "marlin"})", "checkpoint_format \"marlin\"");
  refused(R"({"quant_method": "gptq", "bits": 4, "group_size": 0})", "group_size 0");
  refused(R"({"quant_method": "gptq", "bits": 4, "group_size": -8})", "group_size -8");
  refused(R"({"quant_method": "gptq", "bits": 4, "desc_act": "true"})", "desc_act must be true or false");
  refused(R"({"quant_method": "gptq", "bits": 4, "dynamic": {"+:.*q_proj": {"bits": 8}}})", "dynamic override");
  refused(R"({"quant_method": "auto-round", "bits": 4, "packing_format": "auto_round:gptqmodel"})",
          "packing_format \"auto_round:gptqmodel\"");
  refused(R"({"quant_method": "auto-round", "bits": 4, "data_type": "nv_fp"})", "data_type \"nv_fp\"");
  refused(R"({"quant_method": "auto-round", "bits": 4, "extra_config": {"model.layers.0.mlp.down_proj": {"bits": 8}}})",
          "per-layer schemes");
  refused(R"({"quant_method": "gptq", "bits": 4, "ignore": [3]})", "not a module name");

  auto ok = [](const char* text) {
    auto r = describe_quantization(*Json::parse(text));
    EXPECT_TRUE(r.ok()) << text << ": " << r.message();
    return r.ok() ? *r : QuantInfo{};
  };
  EXPECT_EQ(ok(R"({"quant_method": "modelopt", "quant_algo": "nvfp4"})").scheme, QuantScheme::ModelOptNvfp4);
  auto ar = ok(R"({"quant_method": "auto-round", "bits": 4, "group_size": 128,
                   "extra_config": {"model.layers.0.self_attn.q_proj": {"bits": 16, "data_type": "float"}}})");
  EXPECT_EQ(ar.excluded, std::vector<std::string>{"model.layers.0.self_attn.q_proj"});
  auto dyn = ok(R"({"quant_method": "gptq", "bits": 4, "dynamic": {"-:.*mlp\\.gate$": {}}})");
  EXPECT_EQ(dyn.excluded, std::vector<std::string>{"re:.*mlp\\.gate$"});
  EXPECT_EQ(ok(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
                   "config_groups": {"g": {"weights": {"num_bits": 4, "group_size": 128, "actorder": "weight"}}}})")
                .scheme,
            QuantScheme::CompressedTensorsInt4);
  auto ptpc = ok(R"({"quant_method": "ptpc_fp8"})");
  EXPECT_EQ(ptpc.scheme, QuantScheme::None);
  EXPECT_EQ(ptpc.online, QuantKind::Fp8);
  EXPECT_EQ(ok(R"({"quant_method": "modelopt", "quant_algo": "NVFP4", "exclude_modules": "lm_head"})").excluded,
            std::vector<std::string>{"lm_head"});
  auto channel = ok(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
                        "config_groups": {"g": {"weights": {"num_bits": 4, "strategy": "channel", "group_size": null}}}})");
  EXPECT_EQ(channel.group_size, -1);
}

// Scale values: NaN codes and non-finite floats are refused naming the
// element; zero scales (an all-zero block) are legal.
TEST(QuantConfig, ScaleValuesAreChecked) {
  QuantFormat f;
  f.scale_dtype = DType::F8_E4M3;
  const uint8_t e4m3[] = {0x00, 0x38, 0xFE, 0x7F};
  EXPECT_TRUE(check_scale_values(f, e4m3, 3).ok());
  auto s = check_scale_values(f, e4m3, 4);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("scale 3 of 4"), std::string::npos) << s.message();
  const uint8_t neg_nan[] = {0xFF};
  EXPECT_FALSE(check_scale_values(f, neg_nan, 1).ok());
  f.scale_dtype = DType::F8_E8M0;
  const uint8_t e8m0[] = {0x00, 0x7F, 0xFE, 0xFF};
  EXPECT_TRUE(check_scale_values(f, e8m0, 3).ok());
  EXPECT_FALSE(check_scale_values(f, e8m0, 4).ok());
  f.scale_dtype = DType::F16;
  const uint16_t f16[] = {0x0000, 0x3C00, 0x7BFF, 0x7C00, 0x7E00};
  EXPECT_TRUE(check_scale_values(f, f16, 6).ok());
  auto inf = check_scale_values(f, f16, 8);
  ASSERT_FALSE(inf.ok());
  EXPECT_NE(inf.message().find("infinite"), std::string::npos) << inf.message();
  auto nan = check_scale_values(f, f16 + 4, 2);
  ASSERT_FALSE(nan.ok());
  EXPECT_NE(nan.message().find("NaN"), std::string::npos) << nan.message();
  f.scale_dtype = DType::BF16;
  const uint16_t bf16[] = {0x3F80, 0xFF80};
  EXPECT_FALSE(check_scale_values(f, bf16, 4).ok());
  f.scale_dtype = DType::F32;
  const float f32[] = {0.0f, -2.0f, std::numeric_limits<float>::quiet_NaN()};
  EXPECT_TRUE(check_scale_values(f, f32, 8).ok());
  EXPECT_FALSE(check_scale_values(f, f32, 12).ok());
  EXPECT_TRUE(check_global_values({0.5f, 0.0f}).ok());
  EXPECT_FALSE(check_global_values({0.5f, std::numeric_limits<float>::infinity()}).ok());
}
