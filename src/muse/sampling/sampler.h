// Token sampling from one row of logits: greedy (temperature 0) or
// temperature sampling with optional top-k / top-p, from a seeded RNG so the
// same seed gives the same tokens. Ids >= sampled_vocab_size (Spark's
// untrained embedding rows) are never chosen. The server teammate extends
// this with penalties, min-p, logit bias, etc. as logits processors.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "muse/core/status.h"

namespace muse {

struct SamplingParams {
  double temperature = 0.0;  // 0: greedy
  int64_t top_k = 0;         // 0: off
  double top_p = 1.0;        // 1: off
  uint64_t seed = 0;
};
Status validate(const SamplingParams& params);

// xoshiro256** seeded through splitmix64: small, fast, and identical on
// every platform (unlike std:: distributions).
class Rng {
 public:
  explicit Rng(uint64_t seed);
  uint64_t next();
  double uniform();  // [0, 1), 53 bits

 private:
  uint64_t s_[4];
};

// The greedy choice: the highest logit among ids < limit, ties to the lower id.
int32_t argmax(std::span<const float> logits, int64_t limit);

class Sampler {
 public:
  explicit Sampler(const SamplingParams& params) : params_(params), rng_(params.seed) {}
  // One token from a row of logits; only ids < sampled_vocab_size compete.
  int32_t sample(std::span<const float> logits, int64_t sampled_vocab_size);
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
  Rng rng_;
  std::vector<std::pair<float, int32_t>> candidates_;
  std::vector<double> probs_;
};

}  // namespace muse
