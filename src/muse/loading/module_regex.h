// Regular expressions from checkpoint configs (compressed-tensors "re:"
// ignore entries, GPTQModel "-:" dynamic keys), matched against module names
// as Python's re.match does: anchored at the start, a prefix suffices unless
// the pattern ends with $. Why our own: a config file is input, and a
// backtracking engine (std::regex) takes exponential time or overflows its
// stack on patterns like (a*)*b; this one compiles to an NFA and simulates it
// in O(pattern · name) time, so a hostile pattern is a clear error or a
// quick answer, never a hang.
//
// Syntax: literals, escapes (\. \\ \d \w \s and their negations), ".",
// classes [a-z0-9_] and [^...], groups ( ) and (?: ), alternation |,
// quantifiers * + ? {m} {m,} {m,n} (and their lazy forms, equal for a
// yes/no match), anchors ^ (at the start) and $ (at the end). Anything else
// (backreferences, lookaround, flags) is an error naming it.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "muse/core/status.h"

namespace muse {

class ModuleRegex {
 public:
  static Result<ModuleRegex> compile(std::string_view pattern);
  // Whether the pattern matches a prefix of `name` (all of it with $).
  bool matches(std::string_view name) const;

  // NFA states: a character test, a split (two epsilon edges), the end
  // assertion, or accept.
  struct State {
    enum Kind : uint8_t { Char, Split, End, Accept } kind = Accept;
    bool set[256] = {};  // Char: the bytes it takes
    int out = -1, out2 = -1;
  };

 private:
  std::vector<State> states_;
  int start_ = -1;
};

}  // namespace muse
