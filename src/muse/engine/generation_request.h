// One generation request, the same value from the API validators to the
// scheduler: server/api_request.cc (and anthropic_request.cc) fill it while
// they validate the body; admission (server/generation_job.cc) adds the
// prompt ids and the resolved max_tokens; server/engine_service.cc adds the
// seed and the constraint factory; Scheduler::submit takes it by move.
// Nothing copies it field by field on the way. `muse run` fills one
// directly.
//
// Ranges are checked where a request comes in (the API validators, muse
// run's options), once; the scheduler checks only what depends on the engine
// (vocabulary, context, KV pages, --max-num-seqs).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "muse/core/json.h"
#include "muse/sampling/sequence_sampler.h"

namespace muse {

struct GenerationRequest {
  std::string id;               // unique; appears in logs; key for cancel()
  std::vector<int32_t> prompt;  // already rendered and tokenized
  int n = 1;                    // independent choices sharing the prompt
  SamplingConfig sampling;      // choice i samples with seed sampling.seed + i

  // Stop conditions. The engine applies the token-level ones; the stop
  // strings are matched on the text by the engine service (across token
  // boundaries, never leaked).
  int64_t max_tokens = 16;              // resolved: prompt + max_tokens <= the context
  std::vector<int32_t> stop_token_ids;  // in addition to the EOS ids
  bool ignore_eos = false;
  std::vector<std::string> stop_strings;
  bool include_stop_str_in_output = false;

  int logprobs = -1;         // -1: none; k >= 0: the chosen token's + top k
  int prompt_logprobs = -1;  // -1: none; k >= 0: per prompt token, top k (completions echo)
  // Text of the outputs; false for chat: the response parser needs the
  // framing tokens as text.
  bool skip_special_tokens = true;

  // Structured output to enforce: null, or {"type":"json_object"} /
  // {"type":"json_schema","schema":{...}} for the answer body, or
  // {"type":"tool_call","name":N|null,"tools":[...],"parallel_tool_calls":bool}
  // for tool_choice required (null) / named. The engine service turns it into
  // `make_constraint`.
  Json constraint;
  // Builds each sequence's TokenConstraint (a forced tool call, a grammar);
  // empty: unconstrained.
  std::function<std::unique_ptr<TokenConstraint>()> make_constraint;
  // Sees the raw logits of every position of each sequence, each position
  // once and in order ([rows x vocab] floats): the prompt's rows (row i
  // predicts token i + 1), then one per generated token fed back. Called on
  // the scheduler thread, before the row is sampled from. Empty: only the
  // rows that are sampled from are computed. (`muse run --dump-logits`; the
  // real engine only.)
  std::function<void(int index, std::span<const float> rows)> logits_observer;
};

}  // namespace muse
