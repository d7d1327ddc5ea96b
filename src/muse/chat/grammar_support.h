// Pieces both output grammars (tool_call_grammar.cc, json_schema_grammar.cc)
// are built from: candidate sets over option strings matched one character
// at a time (recipients, keys, enum values) as 64-bit masks, and JSON's
// number grammar.
#pragma once

#include <bit>
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace muse::chat::detail {

constexpr size_t kMaxOptions = 64;  // candidate sets are 64-bit masks

inline uint64_t all_bits(size_t n) { return n >= 64 ? ~uint64_t(0) : (uint64_t(1) << n) - 1; }

// Candidates i whose option has character c at `pos`.
inline uint64_t narrow(const std::vector<std::string>& options, uint64_t cand, size_t pos, char c) {
  uint64_t out = 0;
  for (uint64_t m = cand; m; m &= m - 1) {
    const int i = std::countr_zero(m);
    if (pos < options[size_t(i)].size() && options[size_t(i)][pos] == c) out |= uint64_t(1) << i;
  }
  return out;
}

// The lowest candidate whose option is exactly `pos` long, or -1.
inline int exact(const std::vector<std::string>& options, uint64_t cand, size_t pos) {
  for (uint64_t m = cand; m; m &= m - 1) {
    const int i = std::countr_zero(m);
    if (options[size_t(i)].size() == pos) return i;
  }
  return -1;
}

// One step of RFC 8259's number grammar; `state` starts at 0 and `length`
// counts characters (capped so the value parses back as a number: 18 for an
// int64 integer, 64 and a two-digit exponent otherwise). False: refused.
bool json_number_step(uint8_t& state, uint16_t& length, char c, bool integer);
bool json_number_complete(uint8_t state);

}  // namespace muse::chat::detail
