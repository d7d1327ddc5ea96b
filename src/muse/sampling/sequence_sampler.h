// One sequence's sampling, the way vLLM's V1 sampler does it, on one row of
// logits at a time:
//
//   raw logits ──► ids >= sampled_vocab_size masked
//              ──► min_tokens (EOS and stop ids masked until enough tokens)
//              ──► logit_bias
//              ──► penalties: repetition (prompt + output), frequency and
//                  presence (output only)
//              ──► constraint (ids a TokenConstraint refuses masked)
//              ──► greedy: argmax                            (temperature 0)
//                  random: ÷ temperature → min_p → top_k → top_p → draw
//
// Logprobs come from the distribution the token was drawn from (Processed:
// everything above applied, truncated ids at -inf; for greedy requests the
// penalised logits at temperature 1) or from the raw logits (Raw, vLLM's
// default "raw_logprobs"). -inf is reported as -9999, as vLLM does.
//
// Each sequence owns its random generator (seeded per request and choice), so
// the same seed gives the same tokens whatever else shares the batch, and a
// preempted sequence resumes its stream where it stopped.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "muse/core/status.h"
#include "muse/sampling/row_sampling.h"
#include "muse/sampling/sampler.h"
#include "muse/sampling/token_constraint.h"

namespace muse {

enum class LogprobsMode { Processed, Raw };

struct SamplingConfig {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // <= 0: off
  double top_p = 1.0;        // 1: off
  double min_p = 0.0;        // 0: off
  double presence_penalty = 0.0;
  double frequency_penalty = 0.0;
  double repetition_penalty = 1.0;  // 1: off
  std::vector<std::pair<int32_t, float>> logit_bias;
  int64_t min_tokens = 0;
  std::vector<int32_t> min_tokens_blocked;  // masked while fewer than min_tokens were generated
  // Absent: the engine service draws one per request (serve's --seed); a
  // sampler without one uses 0.
  std::optional<uint64_t> seed;
};
// Ranges are not checked here: requests are validated where they come in
// (server/api_request.cc for the HTTP APIs, muse run's options), once.

struct TokenLogprobEntry {
  int32_t id = 0;
  float logprob = 0;
};

struct SampledToken {
  int32_t id = 0;
  bool has_logprobs = false;
  float logprob = 0;                    // of `id`
  std::vector<TokenLogprobEntry> top;   // best first, ties to the lower id
};

// Log-softmax of `logits` over ids < limit: the logprob of `chosen` and the
// top k entries (k <= 0: none). -inf becomes kMinLogprob.
SampledToken compute_logprobs(std::span<const float> logits, int64_t limit, int32_t chosen, int k);

class SequenceSampler {
 public:
  SequenceSampler(SamplingConfig config, int64_t sampled_vocab_size);

  // Prompt tokens (the repetition penalty covers them).
  void set_prompt(std::span<const int32_t> prompt);
  // Restricts every later draw to the ids `constraint` allows; accept() feeds
  // it. When the processors leave no allowed id possible (say min_tokens
  // masks the only allowed one), the allowed id with the highest raw logit is
  // taken, so a constrained sequence never leaves its grammar.
  void set_constraint(std::unique_ptr<TokenConstraint> constraint) { constraint_ = std::move(constraint); }
  // Picks the next token from `logits` (modified in place: it is the
  // workspace). top_logprobs < 0: no logprobs.
  SampledToken sample(std::span<float> logits, int top_logprobs = -1, LogprobsMode mode = LogprobsMode::Processed);
  // The next draw as a row spec for a backend (row_sampling.h): the
  // processors resolved into `edits` (appended; spec.edit_begin says where),
  // the truncation, and the variate this sampler's generator draws for it
  // (advanced exactly as sample() would). False, nothing changed, when the
  // draw needs the host: a constraint, or more than kRowSampleMaxTop top
  // logprobs. spec.logit_row is the caller's to set.
  bool plan_row(int64_t vocab, int top_logprobs, LogprobsMode mode, RowSampleSpec* spec, std::vector<RowEdit>* edits);
  // The same path as sample() (processors, constraint, temperature,
  // truncation, logprobs), but the token is picked by `choose` from the
  // normalised distribution the draw would use (over ids < the sampled
  // vocabulary; ids outside the truncation at 0) instead of by this
  // sampler's generator, which does not advance. Speculative decoding
  // decides drafted tokens this way (engine/speculation.cc). Greedy
  // requests: argmax, `choose` is not called.
  using Chooser = std::function<int32_t(std::span<const double> p)>;
  SampledToken sample_choosing(std::span<float> logits, const Chooser& choose, int top_logprobs = -1,
                               LogprobsMode mode = LogprobsMode::Processed);
  // Whether the next distributions depend on no accepted token: no
  // penalties, no constraint, min_tokens reached (block verification needs
  // every row's distribution before any token is accepted).
  bool stateless() const { return !penalties_ && !constraint_ && generated_ >= config_.min_tokens; }
  // Records a generated token (the penalties and min_tokens count it).
  void accept(int32_t token);
  int64_t generated() const { return generated_; }
  bool greedy() const { return config_.temperature == 0.0; }
  const SamplingConfig& config() const { return config_; }

  // For tests: the probabilities the next draw uses (after every processor),
  // over all ids; the argmax id gets 1 for greedy. Does not advance the RNG.
  std::vector<double> distribution(std::span<const float> logits) const;
  // For tests: the logits after min_tokens, bias and penalties (ids beyond
  // the sampled vocabulary at -inf).
  std::vector<float> processed_logits(std::span<const float> logits) const;

 private:
  int64_t limit(size_t n) const;
  // The processors as one edit per id, sorted (row_sampling.h).
  void build_edits(int64_t n, std::vector<RowEdit>& out) const;
  void apply_processors(std::span<float> logits) const;
  // Masks the ids the constraint refuses; false if no allowed id is left
  // finite (then `out` is the fallback id).
  bool apply_constraint(std::span<float> logits, std::span<const float> raw, int32_t* out) const;
  // Random path: fills cand_ (kept ids, draw order) and probs_ (unnormalised).
  void truncate(std::span<const float> scaled) const;
  SampledToken sample_impl(std::span<float> logits, const Chooser* choose, int top_logprobs, LogprobsMode mode);

  SamplingConfig config_;
  int64_t sampled_vocab_size_;
  Rng rng_;
  int64_t generated_ = 0;
  std::vector<int32_t> prompt_ids_;                 // sorted, unique
  std::unordered_map<int32_t, int32_t> counts_;     // generated id -> count
  bool penalties_ = false;
  std::unique_ptr<TokenConstraint> constraint_;
  mutable std::vector<uint8_t> mask_;  // scratch: the constraint's allowed ids
  // Scratch (mutable so distribution() can reuse the same code).
  mutable std::vector<int32_t> cand_;
  mutable std::vector<double> probs_;
  mutable std::vector<RowEdit> edits_, edit_scratch_;
};

}  // namespace muse
