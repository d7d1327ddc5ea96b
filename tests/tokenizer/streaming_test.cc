// The streaming detokenizer: whole characters only, and the concatenated
// output equal to decode() of all ids.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "muse/tokenizer/streaming_detokenizer.h"
#include "muse/tokenizer/tokenizer.h"
#include "muse/tokenizer/unicode.h"
#include "tiny_tokenizers.h"

namespace muse {
namespace {

using Ids = std::vector<int32_t>;

std::string stream_all(const Tokenizer& t, const Ids& ids, std::vector<std::string>* pieces = nullptr,
                       bool skip = false) {
  StreamingDetokenizer d(t, skip);
  std::string out;
  for (int32_t id : ids) {
    std::string piece = d.feed(id);
    EXPECT_TRUE(is_valid_utf8(piece)) << "feed returned a split character";
    if (pieces) pieces->push_back(piece);
    out += piece;
  }
  out += d.flush();
  return out;
}

TEST(StreamingDetokenizer, HoldsBytesUntilTheCharacterCompletes) {
  auto t = Tokenizer::from_json(testing::byte_level_tokenizer({}, {{"<|eot|>"}}).dump());
  ASSERT_TRUE(t.ok());
  Ids ids = t->encode("a\xF0\x9F\x98\x80" "b<|eot|>");  // a, 4 byte tokens, b, <|eot|>
  ASSERT_EQ(ids.size(), 7u);
  std::vector<std::string> pieces;
  EXPECT_EQ(stream_all(*t, ids, &pieces), "a\xF0\x9F\x98\x80" "b<|eot|>");
  EXPECT_EQ(pieces, (std::vector<std::string>{"a", "", "", "", "\xF0\x9F\x98\x80", "b", "<|eot|>"}));
  EXPECT_EQ(stream_all(*t, ids, nullptr, /*skip=*/true), "a\xF0\x9F\x98\x80" "b");
  // An incomplete character at the end comes out of flush() as U+FFFD.
  EXPECT_EQ(stream_all(*t, {ids[0], ids[1], ids[2]}), "a\xEF\xBF\xBD");
  // A lead byte followed by a non-continuation byte becomes U+FFFD as soon as that byte arrives.
  int32_t ff = t->encode("\xC3\xBF")[0];  // byte 0xC3 alone, then 0xBF
  StreamingDetokenizer d(*t);
  EXPECT_EQ(d.feed(ff), "");
  EXPECT_EQ(d.feed(t->encode("z")[0]), "\xEF\xBF\xBDz");
}

TEST(StreamingDetokenizer, EqualsDecodeOnRandomByteLevelIds) {
  auto t = Tokenizer::from_json(testing::byte_level_tokenizer({{"\xE4", "\xB8"}, {"a", "b"}}, {{"<s>"}}).dump());
  ASSERT_TRUE(t.ok());
  std::mt19937 rng(7);
  for (int iter = 0; iter < 2000; ++iter) {
    Ids ids;
    int n = 1 + int(rng() % 12);
    for (int k = 0; k < n; ++k) ids.push_back(int32_t(rng() % uint32_t(t->id_limit())));
    EXPECT_EQ(stream_all(*t, ids), t->decode(ids));
  }
}

TEST(StreamingDetokenizer, SentencePieceByteFallbackAndSpaces) {
  auto t = Tokenizer::from_json(
      testing::sentencepiece_tokenizer({"\xE2\x96\x81", "h", "i"}, {{"h", "i"}, {"\xE2\x96\x81", "hi"}}).dump());
  ASSERT_TRUE(t.ok());
  std::string text = "hi hi \xE4\xB8\xAD\xF0\x9F\x99\x82 hi";
  Ids ids = t->encode(text);
  std::vector<std::string> pieces;
  EXPECT_EQ(stream_all(*t, ids, &pieces), text);
  EXPECT_EQ(t->decode(ids), text);
  // Valid byte-fallback runs: stream == decode for random mixes of pieces and byte tokens.
  std::mt19937 rng(11);
  std::vector<std::string> chars = {"hi", " ", "\xC3\xA9", "\xE4\xB8\xAD", "\xF0\x9F\x99\x82", "x"};
  for (int iter = 0; iter < 500; ++iter) {
    std::string s;
    for (int k = 0; k < 6; ++k) s += chars[rng() % chars.size()];
    Ids e = t->encode(s);
    EXPECT_EQ(stream_all(*t, e), t->decode(e)) << s;
  }
}

TEST(StreamingDetokenizer, LlamaTwoLayoutKeepsInnerSpaces) {
  Json j = testing::sentencepiece_tokenizer({"\xE2\x96\x81", "x"}, {{"\xE2\x96\x81", "x"}});
  j.set("decoder", Json::parse(R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
      {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})").value());
  j.set("normalizer", Json::parse(R"({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})").value());
  auto t = Tokenizer::from_json(j.dump());
  ASSERT_TRUE(t.ok());
  Ids ids = t->encode("x x  x");
  EXPECT_EQ(t->decode(ids), "x x  x");
  EXPECT_EQ(stream_all(*t, ids), "x x  x");
}

}  // namespace
}  // namespace muse
