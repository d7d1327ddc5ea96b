// UTF-8 helpers and the Unicode character classes the tokenizer needs.
//
// The class table is read out of Oniguruma (the regex engine Hugging Face
// tokenizers uses), so the hand-written pre-tokenizer fast paths classify
// every code point exactly as the general regex path does.
#pragma once

#include "muse/core/json.h"  // append_utf8

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

namespace muse::tok {

// ---------------------------------------------------------------------------
// UTF-8
// ---------------------------------------------------------------------------

// Decodes the code point at s[i] of a *valid* UTF-8 string; sets *len.
inline uint32_t decode_utf8(const char* s, size_t i, int* len) {
  const auto* p = reinterpret_cast<const unsigned char*>(s) + i;
  unsigned c = p[0];
  if (c < 0x80) { *len = 1; return c; }
  if (c < 0xE0) { *len = 2; return ((c & 0x1F) << 6) | (p[1] & 0x3F); }
  if (c < 0xF0) { *len = 3; return ((c & 0x0F) << 12) | ((p[1] & 0x3F) << 6) | (p[2] & 0x3F); }
  *len = 4;
  return ((c & 0x07) << 18) | ((p[1] & 0x3F) << 12) | ((p[2] & 0x3F) << 6) | (p[3] & 0x3F);
}

// Byte length of the UTF-8 sequence starting with lead byte c (valid input).
inline int utf8_len(unsigned char c) { return c < 0x80 ? 1 : c < 0xE0 ? 2 : c < 0xF0 ? 3 : 4; }

inline void append_utf8_cp(std::string& out, uint32_t cp) { muse::append_utf8(out, cp); }

// What the bytes at s[i..n) start with, under the Unicode "maximal subpart"
// rule (Unicode 15 §3.9, U+FFFD substitution; what WHATWG TextDecoder,
// Python's errors="replace" and Rust's from_utf8_lossy do).
struct Utf8Step {
  enum Kind : uint8_t { Valid, Invalid, Truncated } kind;
  uint8_t len;  // Valid: sequence length; Invalid: maximal subpart (>= 1); Truncated: bytes present
};
Utf8Step utf8_step(const unsigned char* s, size_t n, size_t i);

// Appends `bytes` to `out`, each maximal invalid subpart (and a truncated
// sequence at the end) replaced by U+FFFD.
void append_utf8_lossy(std::string& out, std::string_view bytes);
// Returns the lossy conversion of `bytes` into `*out` and true, or false
// (leaving *out alone) when `bytes` is already valid UTF-8.
bool sanitize_utf8(std::string_view bytes, std::string* out);

// ---------------------------------------------------------------------------
// Character classes (Oniguruma's Unicode tables)
// ---------------------------------------------------------------------------

enum CharClass : uint16_t {
  kL = 1 << 0,    // \p{L}
  kLu = 1 << 1,   // \p{Lu}
  kLl = 1 << 2,   // \p{Ll}
  kLt = 1 << 3,   // \p{Lt}
  kLm = 1 << 4,   // \p{Lm}
  kLo = 1 << 5,   // \p{Lo}
  kM = 1 << 6,    // \p{M}
  kN = 1 << 7,    // \p{N}
  kSpace = 1 << 8,  // \s (Unicode White_Space, as Oniguruma's \s)
  kP = 1 << 9,    // \p{P}
  kS = 1 << 10,   // \p{S}
  kNd = 1 << 11,  // \p{Nd}
  kWord = 1 << 12,  // \w
};

// The class bits of code point `cp` (0 for cp > 0x10FFFF).
uint16_t char_classes(uint32_t cp);

// Table lookup without the lazy-initialisation check; valid only after
// ensure_char_tables() (the fast pre-tokenizer calls it once per split).
struct CharTables {
  uint16_t ascii[128];
  const uint32_t* stage1;  // (cp >> 8) -> block offset into stage2
  const uint16_t* stage2;
};
const CharTables& char_tables();
inline uint16_t char_classes_fast(const CharTables& t, uint32_t cp) {
  if (cp < 128) return t.ascii[cp];
  if (cp > 0x10FFFF) return 0;
  return t.stage2[t.stage1[cp >> 8] + (cp & 0xFF)];
}

// Rust's char::is_whitespace (Unicode White_Space), used by the added-token
// lstrip/rstrip rules and the Strip normalizer.
inline bool is_white_space(uint32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

}  // namespace muse::tok
