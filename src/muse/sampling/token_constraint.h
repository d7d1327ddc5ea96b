// A constraint on which token may come next (a grammar, a forced tool call),
// consulted by SequenceSampler before it draws: ids the constraint refuses
// are masked to -inf after the other logits processors, so top_p/min_p and
// the draw see only allowed tokens (as vLLM applies its grammar bitmask).
// One object per sequence; it keeps the state of what was generated so far.
#pragma once

#include <cstdint>
#include <span>

namespace muse {

class TokenConstraint {
 public:
  virtual ~TokenConstraint() = default;
  // May `id` come next? Must not change the state (it is asked for many ids).
  virtual bool allows(int32_t id) const = 0;
  // allowed[id] = allows(id) for every id < allowed.size(); grammars override
  // it to skip whole groups of ids at once.
  virtual void fill_mask(std::span<uint8_t> allowed) const {
    for (size_t i = 0; i < allowed.size(); ++i) allowed[i] = allows(int32_t(i));
  }
  // `id` was generated (allowed or not: a fallback may pick a refused id when
  // nothing allowed is possible, and the constraint must then stay sane).
  virtual void accept(int32_t id) = 0;
};

}  // namespace muse
