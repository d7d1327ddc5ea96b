#include "muse/sampling/sampler.h"

#include <algorithm>
#include <cmath>
#include <string>

namespace muse {

Status validate(const SamplingParams& p) {
  if (!(p.temperature >= 0.0) || !std::isfinite(p.temperature))
    return make_error("temperature must be a finite number >= 0 (got " + std::to_string(p.temperature) + ")");
  if (p.top_k < 0) return make_error("top_k must be >= 0 (0 disables it)");
  if (!(p.top_p > 0.0 && p.top_p <= 1.0)) return make_error("top_p must be in (0, 1]");
  return Status::Ok();
}

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

int32_t Sampler::sample(std::span<const float> logits, int64_t sampled_vocab_size) {
  const int64_t n = std::min<int64_t>(sampled_vocab_size, int64_t(logits.size()));
  if (params_.temperature == 0.0 || params_.top_k == 1) return argmax(logits, n);
  // Candidates sorted by logit (descending, ties by id) so top-k/top-p and
  // the inverse-CDF draw see one fixed order.
  candidates_.clear();
  for (int64_t i = 0; i < n; ++i) candidates_.emplace_back(logits[size_t(i)], int32_t(i));
  auto by_logit = [](const std::pair<float, int32_t>& a, const std::pair<float, int32_t>& b) {
    return a.first != b.first ? a.first > b.first : a.second < b.second;
  };
  size_t keep = candidates_.size();
  if (params_.top_k > 0 && size_t(params_.top_k) < keep) {
    keep = size_t(params_.top_k);
    std::partial_sort(candidates_.begin(), candidates_.begin() + ptrdiff_t(keep), candidates_.end(), by_logit);
  } else {
    std::sort(candidates_.begin(), candidates_.end(), by_logit);
  }
  candidates_.resize(keep);
  const double inv_t = 1.0 / params_.temperature, top = candidates_[0].first;
  probs_.resize(keep);
  double sum = 0.0;
  for (size_t i = 0; i < keep; ++i) sum += probs_[i] = std::exp((double(candidates_[i].first) - top) * inv_t);
  if (params_.top_p < 1.0) {  // smallest prefix whose mass reaches top_p
    double acc = 0.0;
    size_t cut = keep;
    for (size_t i = 0; i < keep; ++i) {
      acc += probs_[i] / sum;
      if (acc >= params_.top_p) {
        cut = i + 1;
        break;
      }
    }
    keep = cut;
    sum = 0.0;
    for (size_t i = 0; i < keep; ++i) sum += probs_[i];
  }
  const double u = rng_.uniform() * sum;
  double acc = 0.0;
  for (size_t i = 0; i < keep; ++i) {
    acc += probs_[i];
    if (u < acc) return candidates_[i].second;
  }
  return candidates_[keep - 1].second;
}

}  // namespace muse
