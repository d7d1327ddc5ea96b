// Hand-written matchers for the pre-tokenizer patterns real tokenizers use.
//
// Each reproduces Oniguruma's backtracking result for its pattern (first
// alternative that matches, greedy quantifiers, backtracking into them)
// with one left-to-right scan and the Oniguruma-derived class table. They
// are chosen only when a tokenizer.json pattern equals one of these texts
// exactly; tests/tokenizer and fuzz/fuzz_tokenizer.cc compare them with
// Oniguruma on the conformance corpus and on random strings.
#pragma once

#include <cstddef>
#include <string_view>

#include "muse/tokenizer/unicode.h"

namespace muse::tok {

enum class FastPattern {
  None,
  Gpt2,    // 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  Cl100k,  // (?i:'s|…)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
  Qwen2,   // as Cl100k with \p{N} (one digit per piece)
  O200k,   // GPT-4o / o200k: case-aware letter runs, \p{N}{1,3}, [\r\n/]* after punctuation
  Digits3,        // \p{N}{1,3} (DeepSeek V3's first split)
  DeepSeekCjk,    // [一-龥\u3040-ゟ゠-ヿ]+ (DeepSeek V3's second split)
  DeepSeekWords,  // [ASCII punct][A-Za-z]+|[^\r\n\p{L}\p{P}\p{S}]?[\p{L}\p{M}]+| ?[\p{P}\p{S}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
};

// The fast matcher for `pattern`, or None. Literal CR/LF characters in the
// pattern are treated as their \r / \n escapes (both spellings occur).
FastPattern detect_fast_pattern(std::string_view pattern);
const char* fast_pattern_name(FastPattern p);

// The end of the match starting exactly at byte `pos` of valid UTF-8 `s`
// (pos < n), or `pos` when the pattern does not match there.
size_t fast_match_at(FastPattern p, const CharTables& t, const char* s, size_t n, size_t pos);

}  // namespace muse::tok
