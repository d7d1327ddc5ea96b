// The sampling primitives: the seeded random generator and the greedy
// choice. SequenceSampler (sequence_sampler.h) samples with them, for the
// server and `muse run` alike.
#pragma once

#include <cstdint>
#include <span>

namespace muse {

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

}  // namespace muse
