// `--speculative-config '<json>'` (vLLM's keys, as `vllm serve` takes them):
// one typed struct, filled by parse_speculative_config. Unknown keys and
// values are errors that name them, so a typo never silently turns
// speculation off.
#pragma once

#include <string>
#include <string_view>

#include "muse/core/status.h"

namespace muse {

enum class SpecMethod { DSpark, DFlash };
enum class DraftSampleMethod { Greedy, Probabilistic };
enum class RejectionSampleMethod { Standard, Block };

struct SpeculativeConfig {
  bool enabled = false;  // false: no --speculative-config given
  SpecMethod method = SpecMethod::DSpark;
  std::string model;     // the drafter's directory (config.json + model.safetensors)
  // Drafts verified per step (1..the drafter's block; 0: the whole block).
  // The drafter always drafts its trained block; this only shortens the
  // verify (dspark.md §4.7: shorter drafts of a block drafter are wrong).
  int num_speculative_tokens = 0;
  DraftSampleMethod draft_sample_method = DraftSampleMethod::Greedy;
  RejectionSampleMethod rejection_sample_method = RejectionSampleMethod::Standard;
  // The confidence head and the step-cost table choose the verify width per
  // step, up to num_speculative_tokens (dspark.md §4.6).
  bool enable_adaptive_verification = false;
};

// Parses the JSON object; an empty string gives a disabled config.
Result<SpeculativeConfig> parse_speculative_config(std::string_view json_text);

const char* to_string(SpecMethod m);
const char* to_string(DraftSampleMethod m);
const char* to_string(RejectionSampleMethod m);

}  // namespace muse
