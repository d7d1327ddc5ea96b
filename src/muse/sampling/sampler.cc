#include "muse/sampling/sampler.h"

#include <algorithm>

namespace muse {

namespace {
uint64_t splitmix64(uint64_t& x) {
  uint64_t z = (x += 0x9e3779b97f4a7c15ull);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}
inline uint64_t rotl(uint64_t x, int k) { return (x << k) | (x >> (64 - k)); }
}  // namespace

Rng::Rng(uint64_t seed) {
  for (auto& s : s_) s = splitmix64(seed);
}

uint64_t Rng::next() {
  const uint64_t result = rotl(s_[1] * 5, 7) * 9;
  const uint64_t t = s_[1] << 17;
  s_[2] ^= s_[0];
  s_[3] ^= s_[1];
  s_[1] ^= s_[2];
  s_[0] ^= s_[3];
  s_[2] ^= t;
  s_[3] = rotl(s_[3], 45);
  return result;
}

double Rng::uniform() { return double(next() >> 11) * (1.0 / 9007199254740992.0); }

int32_t argmax(std::span<const float> logits, int64_t limit) {
  const int64_t n = std::min<int64_t>(limit, int64_t(logits.size()));
  int64_t best = 0;
  for (int64_t i = 1; i < n; ++i)
    if (logits[size_t(i)] > logits[size_t(best)]) best = i;  // strict: ties keep the lower id
  return int32_t(best);
}

}  // namespace muse
