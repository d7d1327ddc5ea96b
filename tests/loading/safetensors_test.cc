#include "muse/loading/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <unistd.h>

using namespace muse;

namespace {

// A raw file from a header string and a data buffer (for corrupt-file tests).
std::string raw_file(const std::string& header, size_t data_bytes, uint64_t declared = UINT64_MAX) {
  uint64_t n = declared == UINT64_MAX ? header.size() : declared;
  std::string out(8, '\0');
  for (int i = 0; i < 8; ++i) out[size_t(i)] = char((n >> (8 * i)) & 0xff);
  return out + header + std::string(data_bytes, '\x11');
}

Result<SafetensorsHeader> parse(const std::string& bytes) {
  return parse_safetensors(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size(), "test.safetensors");
}

void expect_error(const std::string& bytes, std::vector<std::string> fragments) {
  auto r = parse(bytes);
  ASSERT_FALSE(r.ok()) << "expected an error mentioning " << fragments[0];
  for (const auto& f : fragments) EXPECT_NE(r.message().find(f), std::string::npos) << r.message();
  EXPECT_NE(r.message().find("test.safetensors"), std::string::npos) << r.message();
}

}  // namespace

TEST(Safetensors, RoundTrip) {
  std::vector<float> a = {1.5f, -2.0f, 3.25f, 0.0f, 1e-3f, -7.0f};
  std::string a_bytes = tensor_bytes_f32(a, DType::F32);
  std::string b_bytes = tensor_bytes_f32({0.5f, -0.25f}, DType::BF16);
  std::string c_bytes = "\x01\x02\x03";
  std::string scalar_bytes = tensor_bytes_f32({42.0f}, DType::F32);
  std::vector<TensorToWrite> tensors = {
      {"b.weight", DType::BF16, {2}, b_bytes},
      {"a.weight", DType::F32, {2, 3}, a_bytes},
      {"codes", DType::U8, {3}, c_bytes},
      {"empty", DType::F32, {0, 4}, ""},
      {"scalar", DType::F32, {}, scalar_bytes},
  };
  auto bytes = serialize_safetensors(tensors, {{"format", "pt"}, {"note", "x"}});
  ASSERT_TRUE(bytes.ok()) << bytes.message();
  uint64_t n;
  std::memcpy(&n, bytes->data(), 8);
  EXPECT_EQ((8 + n) % 8, 0u) << "header padded to 8 bytes";

  auto h = parse(*bytes);
  ASSERT_TRUE(h.ok()) << h.message();
  ASSERT_EQ(h->tensors.size(), 5u);
  ASSERT_EQ(h->metadata.size(), 2u);
  EXPECT_EQ(h->metadata[1].first, "note");
  const TensorInfo* t = h->find("a.weight");
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(t->shape, (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(t->dtype, DType::F32);
  EXPECT_EQ(0, std::memcmp(bytes->data() + h->data_offset + t->begin, a_bytes.data(), a_bytes.size()));
  const TensorInfo* s = h->find("scalar");
  ASSERT_NE(s, nullptr);
  EXPECT_TRUE(s->shape.empty());
  EXPECT_EQ(s->numel(), 1);
  EXPECT_EQ(h->find("empty")->nbytes(), 0u);
  EXPECT_EQ(h->find("missing"), nullptr);

  // Through a real file and the mapping.
  std::string path = testing::TempDir() + "/roundtrip.safetensors";
  ASSERT_TRUE(write_safetensors(path, tensors).ok());
  auto f = SafetensorsFile::open(path);
  ASSERT_TRUE(f.ok()) << f.message();
  const TensorInfo* fb = f->find("b.weight");
  ASSERT_NE(fb, nullptr);
  EXPECT_EQ(0, std::memcmp(f->data(*fb), b_bytes.data(), 4));
  ::unlink(path.c_str());
}

TEST(Safetensors, AllDtypesParse) {
  for (const char* d : {"BOOL", "U8", "I8", "F8_E5M2", "F8_E4M3", "F8_E8M0", "F8_E4M3FNUZ", "F8_E5M2FNUZ", "I16", "U16",
                        "F16", "BF16", "I32", "U32", "F32", "C64", "F64", "I64", "U64"}) {
    DType t;
    ASSERT_TRUE(parse_dtype(d, &t));
    int bytes = dtype_bits(t) / 8;
    std::string header = std::string("{\"x\":{\"dtype\":\"") + d + "\",\"shape\":[3],\"data_offsets\":[0," +
                         std::to_string(3 * bytes) + "]}}";
    auto r = parse(raw_file(header, size_t(3 * bytes)));
    EXPECT_TRUE(r.ok()) << d << ": " << r.message();
  }
  // Sub-byte types: F4 packs two per byte, F6 four per three bytes.
  EXPECT_TRUE(parse(raw_file(R"({"x":{"dtype":"F4","shape":[2,4],"data_offsets":[0,4]}})", 4)).ok());
  EXPECT_TRUE(parse(raw_file(R"({"x":{"dtype":"F6_E2M3","shape":[4],"data_offsets":[0,3]}})", 3)).ok());
  expect_error(raw_file(R"({"x":{"dtype":"F4","shape":[3],"data_offsets":[0,2]}})", 2), {"whole number of bytes"});
}

TEST(Safetensors, SpacePaddedHeaderAndEmptyFile) {
  EXPECT_TRUE(parse(raw_file("{}", 0)).ok());
  EXPECT_TRUE(parse(raw_file("{}      ", 0)).ok());
  EXPECT_TRUE(parse(raw_file(R"({"__metadata__":{"format":"pt"}})", 0)).ok());
}

TEST(SafetensorsErrors, ShortAndOversized) {
  expect_error("abc", {"too short"});
  expect_error(raw_file("{}", 0, 200'000'000), {"exceeds the 100,000,000-byte limit"});
  expect_error(raw_file("{}", 0, 5000), {"runs past the end", "truncated"});
  expect_error(raw_file("[]", 0), {"does not start with '{'"});
  expect_error(raw_file("  {}", 0), {"does not start with '{'"});
}

TEST(SafetensorsErrors, CorruptJson) {
  expect_error(raw_file("{\"x\": ", 0), {"corrupt header", "invalid JSON"});
  expect_error(raw_file("{\"x\": 1} trailing", 0), {"corrupt header"});
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"a":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
               {"corrupt header"});
  expect_error(raw_file(R"({"x": 5})", 0), {"\"x\"", "must be an object"});
  expect_error(raw_file(R"({"x":{"dtype":"F17","shape":[1],"data_offsets":[0,4]}})", 4), {"unknown dtype \"F17\""});
  expect_error(raw_file(R"({"x":{"shape":[1],"data_offsets":[0,4]}})", 4), {"\"dtype\""});
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[-1],"data_offsets":[0,4]}})", 4), {"non-negative"});
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":"1","data_offsets":[0,4]}})", 4), {"shape"});
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0]}})", 4), {"data_offsets"});
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,0]}})", 4), {"end before"});
  expect_error(raw_file(R"({"__metadata__":{"format":1}})", 0), {"__metadata__", "must be a string"});
  expect_error(raw_file(R"({"__metadata__":[1]})", 0), {"__metadata__"});
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[4294967296,4294967296,4294967296],"data_offsets":[0,4]}})", 4),
               {"overflows"});
}

TEST(SafetensorsErrors, BadOffsets) {
  // Size disagrees with shape.
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[2],"data_offsets":[0,4]}})", 4), {"\"x\"", "span 4 bytes", "needs 8"});
  // Hole before the first tensor and between tensors.
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8), {"hole before tensor \"x\""});
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[1],"data_offsets":[0,4]},"b":{"dtype":"F32","shape":[1],"data_offsets":[8,12]}})", 12),
               {"hole before tensor \"b\""});
  // Overlap.
  expect_error(raw_file(R"({"a":{"dtype":"F32","shape":[2],"data_offsets":[0,8]},"b":{"dtype":"F32","shape":[1],"data_offsets":[4,8]}})", 8),
               {"overlaps", "\"a\""});
  // Truncated data (file shorter than the last offset) and trailing bytes.
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[4],"data_offsets":[0,16]}})", 10), {"truncated", "\"x\""});
  expect_error(raw_file(R"({"x":{"dtype":"F32","shape":[1],"data_offsets":[0,4]}})", 9), {"5 bytes after the last tensor"});
}

TEST(SafetensorsErrors, TruncatedRealFile) {
  std::string ones = tensor_bytes_f32(std::vector<float>(64, 1.0f), DType::F32);
  std::vector<TensorToWrite> tensors = {{"w", DType::F32, {64}, ones}};
  auto bytes = serialize_safetensors(tensors);
  ASSERT_TRUE(bytes.ok());
  for (size_t cut : {size_t(3), size_t(20), bytes->size() - 1}) expect_error(bytes->substr(0, cut), {"test.safetensors"});
}

TEST(Safetensors, WriterRejectsBadInput) {
  std::string four(4, '\0');
  EXPECT_FALSE(serialize_safetensors({{"w", DType::F32, {2}, four}}).ok());
  EXPECT_FALSE(serialize_safetensors({{"w", DType::F32, {1}, four}, {"w", DType::F32, {1}, four}}).ok());
  EXPECT_FALSE(serialize_safetensors({{"__metadata__", DType::F32, {1}, four}}).ok());
}

TEST(ShardIndex, ParsesAndValidates) {
  auto idx = parse_shard_index(R"({"metadata": {"total_size": 12}, "weight_map": {"a": "s1.safetensors", "b": "s2.safetensors", "c": "s1.safetensors"}})");
  ASSERT_TRUE(idx.ok()) << idx.message();
  EXPECT_EQ(idx->files, (std::vector<std::string>{"s1.safetensors", "s2.safetensors"}));
  EXPECT_EQ(idx->weight_map.size(), 3u);
  for (const char* bad : {R"([])", R"({"metadata": {}})", R"({"weight_map": {"a": 1}})",
                          R"({"weight_map": {"a": "../x.safetensors"}})", R"({"weight_map": {"a": "/etc/passwd"}})",
                          R"({"weight_map": {"a": ""}})", "{"}) {
    EXPECT_FALSE(parse_shard_index(bad).ok()) << bad;
  }
}
