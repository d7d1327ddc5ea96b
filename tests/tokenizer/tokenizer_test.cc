// Tokenizer behaviour on small tokenizer.json files built in code: BPE
// merge order, ignore_merges, byte fallback and unknown tokens, added tokens
// with their flags, normalizers, post-processors, decoders, loading errors.
#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "muse/core/json.h"
#include "muse/tokenizer/tokenizer.h"
#include "tiny_tokenizers.h"

namespace muse {
namespace {

using testing::AddedSpec;
using testing::byte_level_tokenizer;
using testing::sentencepiece_tokenizer;
using Ids = std::vector<int32_t>;

Tokenizer load(const Json& j) {
  auto t = Tokenizer::from_json(j.dump());
  EXPECT_TRUE(t.ok()) << t.message();
  return t.ok() ? *t : Tokenizer();
}

TEST(Bpe, MergesByRankLeftmostFirst) {
  // "aaa": merge "a a" is the only one; leftmost pair merges first -> "aa" "a".
  Tokenizer t = load(byte_level_tokenizer({{"a", "a"}}));
  int32_t aa = t.token_to_id("aa");
  EXPECT_EQ(t.encode("aaa"), (Ids{aa, t.token_to_id("a")}));
  // Rank order, not position: "b c" (rank 0) beats "a b" (rank 1) in "abc".
  Tokenizer u = load(byte_level_tokenizer({{"b", "c"}, {"a", "b"}, {"a", "bc"}}));
  EXPECT_EQ(u.encode("abc"), (Ids{u.token_to_id("abc")}));
  EXPECT_EQ(u.encode("ab"), (Ids{u.token_to_id("ab")}));
  EXPECT_EQ(u.decode(u.encode("abc abx")), "abc abx");
}

TEST(Bpe, IgnoreMergesTakesWholeWordsFromTheVocabulary) {
  // "xyz" is in the vocabulary (merge "xy z") but the only way BPE reaches it
  // is through "xy"; without that merge ranked first it ends as "x" "yz".
  std::vector<std::pair<std::string, std::string>> merges = {{"y", "z"}, {"x", "y"}, {"xy", "z"}};
  Tokenizer plain = load(byte_level_tokenizer(merges));
  Tokenizer ignore = load(byte_level_tokenizer(merges, {}, testing::kO200kPattern, /*ignore_merges=*/true));
  EXPECT_EQ(plain.encode("xyz"), (Ids{plain.token_to_id("x"), plain.token_to_id("yz")}));
  EXPECT_EQ(ignore.encode("xyz"), (Ids{ignore.token_to_id("xyz")}));
}

TEST(Bpe, LongWordsUseTheHeapAndAgreeWithShortOnes) {
  Tokenizer t = load(byte_level_tokenizer({{" ", " "}, {"  ", "  "}, {"    ", "    "}, {"a", "b"}}));
  for (int n : {1, 2, 3, 7, 8, 9, 95, 96, 97, 200, 1000}) {
    std::string spaces(size_t(n), ' ');
    Ids ids = t.encode(spaces + "x");
    EXPECT_EQ(t.decode(ids), spaces + "x");
    // Greedy by rank from the left: groups of 8, then 4/2/1 (and the pattern
    // leaves the last space to the word).
    size_t eights = 0;
    for (int32_t id : ids) eights += t.id_to_token(id) == testing::byte_level_string(std::string(8, ' '));
    EXPECT_EQ(eights, size_t(n - 1) / 8) << n;
  }
  std::string ab;
  for (int i = 0; i < 300; ++i) ab += "ab";
  Ids ids = t.encode(ab);
  EXPECT_EQ(ids.size(), 300u);
}

TEST(Bpe, ByteFallbackAndUnknownTokens) {
  Tokenizer t = load(sentencepiece_tokenizer({"h", "e", "l", "o", "\xE2\x96\x81"}, {{"h", "e"}, {"l", "l"}, {"he", "ll"}}));
  Ids ids = t.encode("hello \xE4\xB8\xAD");  // 中 is not in the vocabulary: three byte tokens
  std::vector<std::string> toks;
  for (int32_t id : ids) toks.push_back(t.id_to_token(id));
  EXPECT_EQ(toks, (std::vector<std::string>{"hell", "o", "\xE2\x96\x81", "<0xE4>", "<0xB8>", "<0xAD>"}));
  EXPECT_EQ(t.decode(ids), "hello \xE4\xB8\xAD");
  // add_special_tokens applies the TemplateProcessing post-processor (BOS).
  EXPECT_EQ(t.encode("he", true), (Ids{2, t.token_to_id("he")}));
  // skip_special_tokens drops <bos>.
  EXPECT_EQ(t.decode({2, t.token_to_id("he")}, true), "he");
  EXPECT_EQ(t.decode({2, t.token_to_id("he")}, false), "<bos>he");
  // An invalid byte run decodes to one U+FFFD per byte token (Hugging Face's ByteFallback).
  int32_t b0 = t.token_to_id("<0xE4>"), b1 = t.token_to_id("<0xB8>");
  EXPECT_EQ(t.decode({b0, b1, t.token_to_id("o")}), "\xEF\xBF\xBD\xEF\xBF\xBDo");
}

TEST(AddedTokens, SpecialTokensSplitTheTextFirst) {
  Tokenizer t = load(byte_level_tokenizer({{"h", "i"}}, {{"<|eot|>"}, {"<|start|>"}, {"<|s|>"}}));
  int32_t eot = t.token_to_id("<|eot|>"), start = t.token_to_id("<|start|>");
  ASSERT_GE(eot, 0);
  EXPECT_TRUE(t.is_special(eot));
  EXPECT_FALSE(t.is_special(t.token_to_id("hi")));
  EXPECT_EQ(t.encode("hi<|eot|><|start|>hi"), (Ids{t.token_to_id("hi"), eot, start, t.token_to_id("hi")}));
  // Longest match wins; a near miss is ordinary text.
  Ids near = t.encode("<|eot |>");
  EXPECT_EQ(std::count(near.begin(), near.end(), eot), 0);
  EXPECT_EQ(t.decode(t.encode("x<|eot|>y")), "x<|eot|>y");
  EXPECT_EQ(t.decode(t.encode("x<|eot|>y"), /*skip_special_tokens=*/true), "xy");
  EXPECT_EQ(t.id_to_token(eot), "<|eot|>");
  EXPECT_EQ(t.id_to_token(1 << 20), "");
  EXPECT_EQ(t.token_to_id("nope"), -1);
}

TEST(AddedTokens, LstripRstripAndSingleWord) {
  AddedSpec l{"<L>"}, r{"<R>"}, w{"<W>"};
  l.lstrip = true;
  r.rstrip = true;
  w.single_word = true;
  Tokenizer t = load(byte_level_tokenizer({}, {l, r, w}));
  int32_t L = t.token_to_id("<L>"), R = t.token_to_id("<R>"), W = t.token_to_id("<W>");
  EXPECT_EQ(t.encode("a  <L>"), (Ids{t.token_to_id("a"), L}));   // spaces before <L> absorbed
  EXPECT_EQ(t.encode("<R>   b"), (Ids{R, t.token_to_id("b")}));   // spaces after <R> absorbed
  int32_t space = t.token_to_id(testing::byte_level(' '));
  EXPECT_EQ(t.encode("x <W> y"), (Ids{t.token_to_id("x"), space, W, space, t.token_to_id("y")}));
  Ids glued = t.encode("x<W>y");  // not a single word: stays text
  EXPECT_EQ(std::count(glued.begin(), glued.end(), W), 0);
}

TEST(AddedTokens, IdsFollowHuggingFaceNotTheJsonIdField) {
  // Added tokens absent from the model vocabulary get ids after its last
  // entry, in list order, whatever their "id" says.
  Json j = byte_level_tokenizer({}, {{"<a>"}, {"<b>"}});
  j["added_tokens"].as_array()[0].set("id", 9999);
  Tokenizer t = load(j);
  EXPECT_EQ(t.token_to_id("<a>"), 256);
  EXPECT_EQ(t.token_to_id("<b>"), 257);
  EXPECT_EQ(t.vocab_size(), 258u);
  EXPECT_EQ(t.id_limit(), 258);
}

TEST(Encode, InvalidUtf8IsReplacedPerMaximalSubpart) {
  Tokenizer t = load(byte_level_tokenizer({}));
  EXPECT_EQ(t.encode("a\xFF" "b"), t.encode("a\xEF\xBF\xBD" "b"));
  EXPECT_EQ(t.encode("\xE4\xB8"), t.encode("\xEF\xBF\xBD"));
  EXPECT_EQ(t.decode(t.encode("x\xC0\x80y")), "x\xEF\xBF\xBD\xEF\xBF\xBDy");
  EXPECT_TRUE(t.encode("").empty());
  // Decoding ids that split a character yields U+FFFD, never invalid UTF-8.
  Ids ids = t.encode("\xE4\xB8\xAD");
  ASSERT_EQ(ids.size(), 3u);
  EXPECT_EQ(t.decode({ids[0], ids[1]}), "\xEF\xBF\xBD");
  EXPECT_EQ(t.decode({-5, 1 << 30}), "");
}

TEST(Normalizers, SequenceOfPrependReplaceAndNfc) {
  Json j = sentencepiece_tokenizer({"a", "b", "\xC3\xA9", "\xE2\x96\x81"}, {});
  j.set("normalizer", Json::parse(R"({"type": "Sequence", "normalizers": [
      {"type": "NFC"}, {"type": "Prepend", "prepend": "\u2581"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})").value());
  Tokenizer t = load(j);
  // "e" + COMBINING ACUTE composes to é under NFC.
  Ids ids = t.encode("ab e\xCC\x81");
  std::vector<std::string> toks;
  for (int32_t id : ids) toks.push_back(t.id_to_token(id));
  EXPECT_EQ(toks, (std::vector<std::string>{"\xE2\x96\x81", "a", "b", "\xE2\x96\x81", "\xC3\xA9"}));
}

TEST(Normalizers, LowercaseStripAndRegexReplace) {
  Json j = byte_level_tokenizer({});
  j.set("normalizer", Json::parse(R"({"type": "Sequence", "normalizers": [
      {"type": "Strip", "strip_left": true, "strip_right": true}, {"type": "Lowercase"},
      {"type": "Replace", "pattern": {"Regex": "\\d+"}, "content": "#"}]})").value());
  Tokenizer t = load(j);
  EXPECT_EQ(t.decode(t.encode("  HeLLo 123 WORLD\xC4\xB0  ")), "hello # worldi\xCC\x87");
}

TEST(PreTokenizers, MetaspaceWithPrependSchemeFirst) {
  Json j = sentencepiece_tokenizer({"\xE2\x96\x81", "a", "b"}, {{"\xE2\x96\x81", "a"}});
  j.set("normalizer", nullptr);
  j.set("pre_tokenizer", Json::parse(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true})").value());
  j.set("decoder", Json::parse(R"({"type": "Metaspace", "replacement": "\u2581", "prepend_scheme": "first", "split": true})").value());
  Tokenizer t = load(j);
  int32_t sa = t.token_to_id("\xE2\x96\x81" "a");
  EXPECT_EQ(t.encode("a a"), (Ids{sa, sa}));
  // After a special token the piece is not at the start: no prepended U+2581.
  EXPECT_EQ(t.encode("<bos>a"), (Ids{2, t.token_to_id("a")}));
  EXPECT_EQ(t.decode(t.encode("a ab")), "a ab");
}

TEST(Decoders, StripFuseReplaceSequence) {
  Json j = sentencepiece_tokenizer({"\xE2\x96\x81", "x"}, {{"\xE2\x96\x81", "x"}});
  j.set("decoder", Json::parse(R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "}, {"type": "ByteFallback"},
      {"type": "Fuse"}, {"type": "Strip", "content": " ", "start": 1, "stop": 0}]})").value());
  j.set("normalizer", Json::parse(R"({"type": "Sequence", "normalizers": [{"type": "Prepend", "prepend": "\u2581"},
      {"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"}]})").value());
  Tokenizer t = load(j);
  EXPECT_EQ(t.decode(t.encode("x x")), "x x");  // Llama 2 layout: leading space stripped once
}

TEST(Loading, ErrorsNameWhatIsWrong) {
  auto bad = [](const std::string& text) { return Tokenizer::from_json(text); };
  EXPECT_NE(bad("{").message().find("not valid JSON"), std::string::npos);
  EXPECT_NE(bad("[]").message().find("JSON object"), std::string::npos);
  EXPECT_NE(bad("{}").message().find("'model'"), std::string::npos);
  EXPECT_NE(bad(R"({"model": {"type": "Unigram", "vocab": []}})").message().find("Unigram"), std::string::npos);
  Json j = byte_level_tokenizer({{"a", "b"}});
  j["model"]["merges"].as_array().push_back(Json("q r"));
  EXPECT_NE(bad(j.dump()).message().find("not in the vocabulary"), std::string::npos);
  Json k = byte_level_tokenizer({});
  k.set("pre_tokenizer", Json::parse(R"({"type": "Split", "pattern": {"Regex": "(("}, "behavior": "Isolated"})").value());
  EXPECT_NE(bad(k.dump()).message().find("invalid regex"), std::string::npos);
  Json m = byte_level_tokenizer({});
  m.set("decoder", Json::parse(R"({"type": "Frobnicate"})").value());
  EXPECT_NE(bad(m.dump()).message().find("Frobnicate"), std::string::npos);
  EXPECT_NE(Tokenizer::from_file("/nonexistent/tokenizer.json").message().find("/nonexistent/tokenizer.json"),
            std::string::npos);
  Tokenizer empty;
  EXPECT_TRUE(empty.encode("x").empty());
  EXPECT_EQ(empty.decode({1, 2}), "");
}

TEST(Loading, LegacyMergesAndPairMerges) {
  Json j = byte_level_tokenizer({{"a", "b"}});
  j["model"].set("merges", Json(JsonArray{Json("a b")}));
  Tokenizer legacy = load(j);
  EXPECT_EQ(legacy.encode("ab"), (Ids{legacy.token_to_id("ab")}));
}

}  // namespace
}  // namespace muse
