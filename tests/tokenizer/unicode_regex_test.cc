// UTF-8 handling, the Oniguruma-derived class table, and the hand-written
// pre-tokenizer matchers checked against Oniguruma itself.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "muse/core/json.h"
#include "muse/tokenizer/fast_split.h"
#include "muse/tokenizer/regex.h"
#include "muse/tokenizer/unicode.h"

namespace muse::tok {
namespace {

std::string lossy(std::string_view s) {
  std::string out;
  append_utf8_lossy(out, s);
  return out;
}

TEST(Utf8, LossyMatchesTheMaximalSubpartRule) {
  const std::string R = "\xEF\xBF\xBD";
  EXPECT_EQ(lossy("abc"), "abc");
  EXPECT_EQ(lossy("\x80"), R);
  EXPECT_EQ(lossy("\xC0\x80"), R + R);              // C0 is never valid
  EXPECT_EQ(lossy("\xE0\x80\x80"), R + R + R);      // E0 needs A0..BF next
  EXPECT_EQ(lossy("\xED\xA0\x80"), R + R + R);      // surrogate
  EXPECT_EQ(lossy("\xF0\x9F\x98"), R);              // truncated 4-byte: one subpart
  EXPECT_EQ(lossy("\xF0\x9F\x98" "a"), R + "a");
  EXPECT_EQ(lossy("\xE2\x28\xA1"), R + "(" + R);
  EXPECT_EQ(lossy("\xF4\x90\x80\x80"), R + R + R + R);
  EXPECT_EQ(lossy("\xF0\x9F\x98\x80"), "\xF0\x9F\x98\x80");
  std::string out;
  EXPECT_FALSE(sanitize_utf8("valid é", &out));
  EXPECT_TRUE(sanitize_utf8("bad \xFF", &out));
  EXPECT_EQ(out, "bad " + R);
}

TEST(CharClasses, AgreeWithUnicode) {
  EXPECT_EQ(char_classes('A') & (kL | kLu), kL | kLu);
  EXPECT_EQ(char_classes('a') & (kL | kLl), kL | kLl);
  EXPECT_TRUE(char_classes('7') & kN);
  EXPECT_TRUE(char_classes(0x0663) & kN);   // ARABIC-INDIC DIGIT THREE
  EXPECT_TRUE(char_classes(0x00B2) & kN);   // superscript two (No)
  EXPECT_TRUE(char_classes(0x4E2D) & kLo);  // 中
  EXPECT_TRUE(char_classes(0x0301) & kM);
  EXPECT_TRUE(char_classes(0x01C5) & kLt);  // ǅ
  EXPECT_TRUE(char_classes(0x02B0) & kLm);
  EXPECT_TRUE(char_classes(0x017F) & kLl);  // long s
  for (uint32_t cp : {0x20u, 0x09u, 0x0Au, 0x0Bu, 0x0Cu, 0x0Du, 0x85u, 0xA0u, 0x1680u, 0x2000u, 0x200Au, 0x2028u,
                      0x2029u, 0x202Fu, 0x205Fu, 0x3000u})
    EXPECT_TRUE(char_classes(cp) & kSpace) << std::hex << cp;
  EXPECT_FALSE(char_classes(0xFEFF) & kSpace);  // not White_Space (JavaScript's \s differs)
  EXPECT_FALSE(char_classes(0x200B) & kSpace);
  EXPECT_TRUE(char_classes('!') & kP);
  EXPECT_TRUE(char_classes('+') & kS);
  EXPECT_EQ(char_classes(0x110000), 0);
}

// The only code points Oniguruma's case-insensitive (?i:'s|'t|'re|'ve|'m|'ll|'d)
// accepts are the ASCII letters and U+017F for s: the fast matchers rely on it.
TEST(FastSplit, ContractionCaseFoldingIsExactlyWhatOnigurumaDoes) {
  auto re = Regex::compile("(?i:'s|'t|'re|'ve|'m|'ll|'d)", /*allow_fast_path=*/false);
  ASSERT_TRUE(re.ok()) << re.message();
  // One long string: "'" + cp + "e" for each code point; count the matches.
  for (const char* tail : {"e", "l"}) {
    std::string text;
    std::vector<uint32_t> at;  // byte offset -> code point
    for (uint32_t cp = 1; cp < 0x110000; ++cp) {
      if (cp >= 0xD800 && cp <= 0xDFFF) continue;
      if (cp == '\'') continue;
      text += "\x01'";
      append_utf8(text, cp);
      text += tail;
    }
    std::vector<Span> matches;
    re->find_all(text, matches);
    std::string got;
    for (const Span& m : matches) {
      int len;
      uint32_t cp = decode_utf8(text.data(), m.start + 1, &len);
      append_utf8(got, cp);
      got += m.end - m.start == size_t(1 + len) ? "." : "+";
    }
    std::string want = tail[0] == 'e' ? "D.M.R+S.T.V+d.m.r+s.t.v+\xC5\xBF." : "D.L+M.S.T.d.l+m.s.t.\xC5\xBF.";
    EXPECT_EQ(got, want) << "tail " << tail;
  }
}

// An alphabet with every class combination the matchers distinguish plus the
// characters they test by value.
std::vector<std::string> alphabet() {
  std::vector<uint32_t> cps = {
      'a', 'z', 'A', 'Z', 's', 'S', 't', 'T', 'r', 'R', 'e', 'E', 'v', 'V', 'm', 'M', 'l', 'L', 'd', 'D', 'x', 'k',
      0x017F, 0x212A, '\'', 0x2019, ' ', ' ', ' ', '\t', '\n', '\r', 0x0B, 0x0C, 0x85, 0xA0, 0x3000, 0x2028, 0xFEFF,
      0x200B, '/', '\\', '.', ',', '!', '?', '-', '_', '#', '$', '+', '<', '|', '>', '0', '5', '9', 0x0663, 0x00B2,
      0x2167, 0xFF11, 0x4E2D, 0x3042, 0x30AB, 0xAC00, 0x0627, 0x064E, 0x0915, 0x093F, 0x094D, 0x0301, 0x0308,
      0x20DD, 0x01C5, 0x1F88, 0x02B0, 0x3005, 0x00E9, 0x00C9, 0x0130, 0x0131, 0x00DF, 0x1E9E, 0x03A3, 0x03C2,
      0x1F600, 0x1F44D, 0x1F3FD, 0x200D, 0xFE0F, 0x20E3, 0x1F1FA, 0x1D400, 0xE000, 0x10FFFD, 0x0378, 0x00AD, 0x0600,
      0x9FA5, 0x9FA6, 0x3040, 0x309F, 0x30FF, 0x3100, 0x4DFF, 0x07, 0x00, '`', '~', '@', '[', ']', '^', 0x00A7, 0x2014};
  std::vector<std::string> out;
  for (uint32_t cp : cps) {
    std::string s;
    append_utf8(s, cp);
    out.push_back(s);
  }
  out.push_back("'s");
  out.push_back("'re");
  out.push_back("'LL");
  out.push_back("   ");
  out.push_back("\r\n");
  return out;
}

void expect_same_splits(const Regex& fast, const Regex& slow, const std::string& text) {
  std::vector<Span> a, b;
  fast.find_matches(text, a);
  slow.find_matches(text, b);
  ASSERT_EQ(a.size(), b.size()) << json_quote(text);
  for (size_t i = 0; i < a.size(); ++i) {
    ASSERT_EQ(a[i].start, b[i].start) << json_quote(text);
    ASSERT_EQ(a[i].end, b[i].end) << json_quote(text);
    ASSERT_EQ(a[i].is_match, b[i].is_match) << json_quote(text);
  }
}

TEST(FastSplit, EqualsOnigurumaOnRandomStrings) {
  const std::vector<std::pair<FastPattern, std::string>> patterns = {
      {FastPattern::Gpt2, R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)"},
      {FastPattern::Cl100k,
       R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
      {FastPattern::Qwen2,
       R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
      {FastPattern::O200k,
       R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)"},
      {FastPattern::Digits3, R"(\p{N}{1,3})"},
      {FastPattern::DeepSeekCjk, "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+"},
      {FastPattern::DeepSeekWords,
       "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
       "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"},
  };
  auto letters = alphabet();
  for (const auto& [kind, pattern] : patterns) {
    auto fast = Regex::compile(pattern, true);
    auto slow = Regex::compile(pattern, false);
    ASSERT_TRUE(fast.ok() && slow.ok());
    ASSERT_EQ(fast->fast_pattern(), kind);
    ASSERT_EQ(slow->fast_pattern(), FastPattern::None);
    std::mt19937 rng(1234 + int(kind));
    for (int iter = 0; iter < 20000; ++iter) {
      std::string text;
      int len = 1 + int(rng() % 14);
      for (int k = 0; k < len; ++k) text += letters[rng() % letters.size()];
      expect_same_splits(*fast, *slow, text);
      if (HasFatalFailure()) return;
    }
    // Every alphabet character in a few fixed contexts.
    for (const std::string& c : letters)
      for (const char* ctx : {"%", "a%", "%a", " %b", "A%'s", "% ", "%\n", "%1234", "1%", "%  x"}) {
        std::string text = ctx;
        text.replace(text.find('%'), 1, c);
        expect_same_splits(*fast, *slow, text);
      }
  }
}

TEST(FastSplit, LiteralCrLfSpellingIsRecognised) {
  std::string p = "(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\\p{L}\\p{N}]?\\p{L}+|\\p{N}{1,3}| ?[^\\s\\p{L}\\p{N}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+";
  EXPECT_EQ(detect_fast_pattern(p), FastPattern::Cl100k);
  EXPECT_EQ(detect_fast_pattern("\\p{N}{1,4}"), FastPattern::None);
}

TEST(Regex, OnigIterationSkipsEmptyMatchAfterMatch) {
  auto re = Regex::compile("a*");
  ASSERT_TRUE(re.ok());
  std::vector<Span> spans;
  re->find_matches("baab", spans);
  // onig crate find_iter on "baab": (0,0) (1,3) (4,4): empty match at 3 is
  // skipped because it immediately follows the previous match.
  std::vector<std::pair<int, int>> got;
  for (const Span& s : spans) got.push_back({int(s.start), int(s.end)});
  std::vector<std::pair<int, int>> want = {{0, 0}, {0, 1}, {1, 3}, {3, 4}, {4, 4}};
  EXPECT_EQ(got, want);
  EXPECT_FALSE(Regex::compile("(unclosed").ok());
  EXPECT_NE(Regex::compile("(unclosed").message().find("invalid regex"), std::string::npos);
}

}  // namespace
}  // namespace muse::tok
