// Regular expressions for pre-tokenizers and normalizers.
//
// Patterns in tokenizer.json are written for Hugging Face tokenizers, which
// compiles them with Oniguruma (Ruby syntax, UTF-8, no options) and iterates
// matches like the Rust `onig` crate's find_iter. We use the same engine with
// the same iteration rule, so a pattern means here exactly what it means
// there. The patterns real tokenizers use (GPT-2, cl100k/Llama 3, Qwen 2,
// o200k) also have hand-written matchers (fast_split.h) that the tests and
// the fuzzer check against Oniguruma; they are picked by exact pattern text.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"
#include "muse/tokenizer/fast_split.h"

namespace muse::tok {

// Initialises Oniguruma once for UTF-8 (thread-safe, idempotent).
void ensure_onig_initialized();

// One piece of a split: [start, end) bytes and whether the pattern matched it.
struct Span {
  uint32_t start, end;
  bool is_match;
};

class Regex {
 public:
  Regex() = default;
  // `allow_fast_path` false forces Oniguruma (for differential tests).
  static Result<Regex> compile(std::string_view pattern, bool allow_fast_path = true);
  // A pattern matching `literal` exactly (Split/Replace with a String pattern).
  static Result<Regex> literal(std::string_view literal);

  // Hugging Face's Pattern::find_matches: spans covering all of `text` in
  // order, matches and the gaps between them; an empty text gives one empty
  // non-match. `text` must be valid UTF-8.
  void find_matches(std::string_view text, std::vector<Span>& out) const;
  // Just the matches, as (start, end) pairs appended to `out`.
  void find_all(std::string_view text, std::vector<Span>& out) const;

  const std::string& pattern() const { return pattern_; }
  FastPattern fast_pattern() const { return fast_; }
  bool valid() const { return re_ != nullptr; }

 private:
  void find_all_onig(std::string_view text, std::vector<Span>& out) const;

  std::string pattern_;
  std::string literal_;  // set for literal(): searched with string_view::find
  std::shared_ptr<void> re_;  // OnigRegex, freed with onig_free
  FastPattern fast_ = FastPattern::None;
};

// The {"String": s} / {"Regex": r} pattern objects of Split and Replace.
Result<Regex> pattern_regex(const Json& pattern, const std::string& where);

}  // namespace muse::tok
