#include "muse/tokenizer/fast_split.h"

#include <string>

namespace muse::tok {
namespace {

constexpr std::string_view kGpt2 = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr std::string_view kCl100k =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kQwen2 =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
constexpr std::string_view kO200k =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr std::string_view kDigits3 = R"(\p{N}{1,3})";
constexpr std::string_view kDeepSeekCjk = "[\xE4\xB8\x80-\xE9\xBE\xA5\xE3\x81\x80-\xE3\x82\x9F\xE3\x82\xA0-\xE3\x83\xBF]+";
constexpr std::string_view kDeepSeekWords =
    R"([!"#$%&'()*+,\-./:;<=>?@\[\\\]^_`{|}~][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

constexpr uint16_t kUpperish = kLu | kLt | kLm | kLo | kM;  // [\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]
constexpr uint16_t kLowerish = kLl | kLm | kLo | kM;        // [\p{Ll}\p{Lm}\p{Lo}\p{M}]

struct Text {
  const CharTables& t;
  const char* s;
  size_t n;
  // Class bits and code point of the character at i (i < n).
  uint16_t at(size_t i, uint32_t* cp, int* len) const {
    unsigned char c = static_cast<unsigned char>(s[i]);
    if (c < 0x80) {
      *cp = c;
      *len = 1;
      return t.ascii[c];
    }
    *cp = decode_utf8(s, i, len);
    return char_classes_fast(t, *cp);
  }
  uint16_t at(size_t i, int* len) const {
    uint32_t cp;
    return at(i, &cp, len);
  }
  // End of the run of characters whose classes intersect `mask`, from i.
  size_t run(size_t i, uint16_t mask) const {
    int len;
    while (i < n && (at(i, &len) & mask)) i += len;
    return i;
  }
};

inline bool is_cr_lf(uint32_t cp) { return cp == '\r' || cp == '\n'; }

// Length of (?i:'s|'t|'re|'ve|'m|'ll|'d) (or the case-sensitive form) at i,
// 0 if none. Under Oniguruma's case folding the only non-ASCII character
// folding to one of these letters is U+017F (long s) for 's'; the test suite
// checks this against Oniguruma for every code point.
size_t contraction(const Text& x, size_t i, bool ignore_case) {
  if (i + 1 >= x.n || x.s[i] != '\'') return 0;
  unsigned char c = static_cast<unsigned char>(x.s[i + 1]);
  size_t first_len = 1;
  if (ignore_case) {
    if (c >= 'A' && c <= 'Z') c = c - 'A' + 'a';
    if (c == 0xC5 && i + 2 < x.n && static_cast<unsigned char>(x.s[i + 2]) == 0xBF) {
      c = 's';  // U+017F
      first_len = 2;
    }
  }
  auto next_is = [&](char want) {
    size_t j = i + 1 + first_len;
    if (j >= x.n) return false;
    char d = x.s[j];
    if (ignore_case && d >= 'A' && d <= 'Z') d = char(d - 'A' + 'a');
    return d == want;
  };
  switch (c) {
    case 's': case 't': case 'm': case 'd': return 1 + first_len;
    case 'r': case 'v': return next_is('e') ? 2 + first_len : 0;
    case 'l': return next_is('l') ? 2 + first_len : 0;
    default: return 0;
  }
}

// \s*[\r\n]+ | \s+(?!\S) | \s+  at a whitespace character; `with_newline_rule`
// false drops the first alternative (GPT-2).
size_t match_whitespace(const Text& x, size_t pos, bool with_newline_rule) {
  size_t i = pos, last_start = pos, after_last_newline = 0, chars = 0;
  uint32_t cp;
  int len;
  while (i < x.n && (x.at(i, &cp, &len) & kSpace)) {
    last_start = i;
    i += len;
    ++chars;
    if (is_cr_lf(cp)) after_last_newline = i;
  }
  if (with_newline_rule && after_last_newline) return after_last_newline;
  if (i == x.n || chars == 1) return i;  // \s+(?!\S) at the end, or \s+
  return last_start;                     // \s+(?!\S): leave one space for the next word
}

size_t match_gpt2(const Text& x, size_t pos) {
  if (size_t c = contraction(x, pos, false)) return pos + c;
  uint32_t cp0;
  int l0;
  uint16_t c0 = x.at(pos, &cp0, &l0);
  size_t after_space = pos;
  uint16_t c1 = c0;
  if (cp0 == ' ' && pos + 1 < x.n) {
    int l1;
    c1 = x.at(pos + 1, &l1);
    after_space = pos + 1;
  }
  for (uint16_t cls : {uint16_t(kL), uint16_t(kN)}) {
    if (after_space != pos && (c1 & cls)) return x.run(after_space, cls);
    if (c0 & cls) return x.run(pos, cls);
  }
  auto other = [](uint16_t c) { return !(c & (kSpace | kL | kN)); };
  if (after_space != pos && other(c1)) {
    size_t i = after_space;
    int len;
    while (i < x.n && other(x.at(i, &len))) i += len;
    return i;
  }
  if (other(c0)) {
    size_t i = pos;
    int len;
    while (i < x.n && other(x.at(i, &len))) i += len;
    return i;
  }
  if (c0 & kSpace) return match_whitespace(x, pos, false);
  return pos;
}

// " ?[^\s\p{L}\p{N}]+" followed by a run of `tail` characters.
size_t match_punct(const Text& x, size_t pos, uint32_t cp0, bool slash_in_tail) {
  size_t i = cp0 == ' ' ? pos + 1 : pos;
  uint32_t cp;
  int len;
  if (i >= x.n || (x.at(i, &cp, &len) & (kSpace | kL | kN))) return pos;
  while (i < x.n && !(x.at(i, &cp, &len) & (kSpace | kL | kN))) i += len;
  while (i < x.n && (x.s[i] == '\r' || x.s[i] == '\n' || (slash_in_tail && x.s[i] == '/'))) ++i;
  return i;
}

size_t match_cl100k(const Text& x, size_t pos, int max_digits) {
  if (size_t c = contraction(x, pos, true)) return pos + c;
  uint32_t cp0;
  int l0;
  uint16_t c0 = x.at(pos, &cp0, &l0);
  // [^\r\n\p{L}\p{N}]?\p{L}+
  if (!is_cr_lf(cp0) && !(c0 & (kL | kN)) && pos + l0 < x.n) {
    int l1;
    if (x.at(pos + l0, &l1) & kL) return x.run(pos + l0, kL);
  }
  if (c0 & kL) return x.run(pos, kL);
  if (c0 & kN) {  // \p{N}{1,max_digits}
    size_t i = pos;
    int len;
    for (int k = 0; k < max_digits && i < x.n && (x.at(i, &len) & kN); ++k) i += len;
    return i;
  }
  if (size_t e = match_punct(x, pos, cp0, false); e != pos) return e;
  if (c0 & kSpace) return match_whitespace(x, pos, true);
  return pos;
}

// [^\r\n\p{L}\p{N}]?U*L+C? | [^\r\n\p{L}\p{N}]?U+L*C? where U, L are the
// "upper-ish" and "lower-ish" letter classes of o200k (both contain Lm, Lo, M).
size_t match_o200k_letters(const Text& x, size_t pos, bool p_ok, int l0) {
  // First alternative, with and then without the optional prefix.
  for (int take = p_ok ? 1 : 0; take >= 0; --take) {
    size_t start = take ? pos + l0 : pos;
    size_t u_end = start, last_lower_end = 0;
    int len;
    uint16_t c = 0;
    while (u_end < x.n && ((c = x.at(u_end, &len)) & kUpperish)) {
      u_end += len;
      if (c & kLowerish) last_lower_end = u_end;
    }
    if (u_end < x.n && (c & kLowerish)) {  // greedy U*, then L+ from there
      size_t e = x.run(u_end, kLowerish);
      return e + contraction(x, e, true);
    }
    if (last_lower_end) {  // backtrack U* to its last L-class character
      return last_lower_end + contraction(x, last_lower_end, true);
    }
  }
  // Second alternative.
  for (int take = p_ok ? 1 : 0; take >= 0; --take) {
    size_t start = take ? pos + l0 : pos;
    int len;
    if (start < x.n && (x.at(start, &len) & kUpperish)) {
      size_t e = x.run(x.run(start, kUpperish), kLowerish);
      return e + contraction(x, e, true);
    }
  }
  return pos;
}

size_t match_o200k(const Text& x, size_t pos) {
  uint32_t cp0;
  int l0;
  uint16_t c0 = x.at(pos, &cp0, &l0);
  bool p_ok = !is_cr_lf(cp0) && !(c0 & (kL | kN));
  if (size_t e = match_o200k_letters(x, pos, p_ok, l0); e != pos) return e;
  if (c0 & kN) {
    size_t i = pos;
    int len;
    for (int k = 0; k < 3 && i < x.n && (x.at(i, &len) & kN); ++k) i += len;
    return i;
  }
  if (size_t e = match_punct(x, pos, cp0, true); e != pos) return e;
  if (c0 & kSpace) return match_whitespace(x, pos, true);
  return pos;
}

size_t match_digits3(const Text& x, size_t pos) {
  size_t i = pos;
  int len;
  for (int k = 0; k < 3 && i < x.n && (x.at(i, &len) & kN); ++k) i += len;
  return i;
}

bool deepseek_cjk(uint32_t cp) {
  return (cp >= 0x4E00 && cp <= 0x9FA5) || (cp >= 0x3040 && cp <= 0x309F) || (cp >= 0x30A0 && cp <= 0x30FF);
}

size_t match_deepseek_cjk(const Text& x, size_t pos) {
  size_t i = pos;
  uint32_t cp;
  int len;
  while (i < x.n && (x.at(i, &cp, &len), deepseek_cjk(cp))) i += len;
  return i;
}

bool ascii_punct(uint32_t c) {
  return (c >= 0x21 && c <= 0x2F) || (c >= 0x3A && c <= 0x40) || (c >= 0x5B && c <= 0x60) || (c >= 0x7B && c <= 0x7E);
}
bool ascii_letter(char c) { return (c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z'); }

size_t match_deepseek_words(const Text& x, size_t pos) {
  uint32_t cp0;
  int l0;
  uint16_t c0 = x.at(pos, &cp0, &l0);
  // [ASCII punctuation][A-Za-z]+
  if (ascii_punct(cp0) && pos + 1 < x.n && ascii_letter(x.s[pos + 1])) {
    size_t i = pos + 1;
    while (i < x.n && ascii_letter(x.s[i])) ++i;
    return i;
  }
  // [^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+
  if (!is_cr_lf(cp0) && !(c0 & (kL | kP | kS)) && pos + l0 < x.n) {
    int l1;
    if (x.at(pos + l0, &l1) & (kL | kM)) return x.run(pos + l0, kL | kM);
  }
  if (c0 & (kL | kM)) return x.run(pos, kL | kM);
  //  ?[\p{P}\p{S}]+[\r\n]*
  {
    size_t i = cp0 == ' ' ? pos + 1 : pos;
    int len;
    if (i < x.n && (x.at(i, &len) & (kP | kS))) {
      i = x.run(i, kP | kS);
      while (i < x.n && (x.s[i] == '\r' || x.s[i] == '\n')) ++i;
      return i;
    }
  }
  if (c0 & kSpace) return match_whitespace(x, pos, true);
  return pos;
}

std::string canonical(std::string_view pattern) {
  std::string out;
  for (char c : pattern) {
    if (c == '\r') out += "\\r";
    else if (c == '\n') out += "\\n";
    else out.push_back(c);
  }
  return out;
}

}  // namespace

FastPattern detect_fast_pattern(std::string_view pattern) {
  std::string p = canonical(pattern);
  if (p == kGpt2) return FastPattern::Gpt2;
  if (p == kCl100k) return FastPattern::Cl100k;
  if (p == kQwen2) return FastPattern::Qwen2;
  if (p == kO200k) return FastPattern::O200k;
  if (p == kDigits3) return FastPattern::Digits3;
  if (p == kDeepSeekCjk) return FastPattern::DeepSeekCjk;
  if (p == kDeepSeekWords) return FastPattern::DeepSeekWords;
  return FastPattern::None;
}

const char* fast_pattern_name(FastPattern p) {
  switch (p) {
    case FastPattern::Gpt2: return "gpt2";
    case FastPattern::Cl100k: return "cl100k";
    case FastPattern::Qwen2: return "qwen2";
    case FastPattern::O200k: return "o200k";
    case FastPattern::Digits3: return "digits3";
    case FastPattern::DeepSeekCjk: return "deepseek-cjk";
    case FastPattern::DeepSeekWords: return "deepseek-words";
    default: return "none";
  }
}

size_t fast_match_at(FastPattern p, const CharTables& t, const char* s, size_t n, size_t pos) {
  Text x{t, s, n};
  switch (p) {
    case FastPattern::Gpt2: return match_gpt2(x, pos);
    case FastPattern::Cl100k: return match_cl100k(x, pos, 3);
    case FastPattern::Qwen2: return match_cl100k(x, pos, 1);
    case FastPattern::O200k: return match_o200k(x, pos);
    case FastPattern::Digits3: return match_digits3(x, pos);
    case FastPattern::DeepSeekCjk: return match_deepseek_cjk(x, pos);
    case FastPattern::DeepSeekWords: return match_deepseek_words(x, pos);
    default: return pos;
  }
}

}  // namespace muse::tok
