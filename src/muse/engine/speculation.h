// Speculative decoding in the scheduler (dspark.md §4): drafting a block per
// decoding sequence, the verify width, and deciding which drafted tokens a
// verify step keeps. Decisions go through the sequence's own
// SequenceSampler, one row at a time, so penalties, min_tokens, logit bias,
// output grammars and logprobs apply to drafted tokens exactly as to normal
// ones (a draft the constraint forbids has P = 0 and is rejected).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "muse/engine/engine.h"
#include "muse/sampling/sequence_sampler.h"
#include "muse/speculative/drafter.h"
#include "muse/speculative/spec_config.h"
#include "muse/speculative/verify_width.h"

namespace muse {

// Counters for /metrics (vLLM's spec_decode names) and the log.
struct SpecDecodeStats {
  uint64_t drafts = 0;           // verify steps that carried drafts
  uint64_t draft_tokens = 0;     // drafts verified
  uint64_t accepted_tokens = 0;  // drafts kept
  std::vector<uint64_t> accepted_per_pos;  // [k]: drafts kept at position i (0-based)
  double draft_seconds = 0;      // time spent drafting blocks
};

struct VerifyOutcome {
  std::vector<SampledToken> tokens;  // accepted drafts, then the bonus (or the correction)
  int accepted = 0;                  // drafts kept: tokens.size() − 1
};

// Decides a verify step of one sequence. `rows` are the n + 1 logit rows of
// [anchor, d_1..d_n] (modified: they are the sampler's workspace);
// `first_pos` is the position of d_1. Every returned token has been
// accept()ed by the sampler. Stops early after a token `ends` says finishes
// the sequence (EOS, a stop id).
//   - greedy requests, and greedy drafts under `standard`: each row is
//     sampled as without speculation and the draft kept while it equals
//     the sampled token (at T > 0 this is the one-hot rejection rule, and
//     it keeps the request's own random stream: the output is the same as
//     without speculation for the same seed);
//   - probabilistic drafts under `standard`: token-level rejection sampling
//     against the draft distributions, uniforms keyed on (seed, position);
//   - `block` at T > 0: block verification when the sampler is stateless
//     (its distributions do not depend on accepted tokens), else `standard`.
VerifyOutcome verify_drafts(SequenceSampler& sampler, std::span<float> rows, int64_t vocab,
                            std::span<const int32_t> drafts, const DraftBlock& block, const SpeculativeConfig& config,
                            int64_t first_pos, int top_logprobs, LogprobsMode mode,
                            const std::function<bool(int32_t)>& ends);

// Before the engine opens: reads the drafter's config, checks it against
// the target and the method, and asks the engine to tap its layers.
Status prepare_speculation(const SpeculativeConfig& config, const std::string& target_dir, EngineOptions* engine);
// After: the drafter, with the target's embedding and lm_head.
Result<std::shared_ptr<const Drafter>> load_drafter(const SpeculativeConfig& config, const Engine& engine);

}  // namespace muse
