// Randomness of speculative decoding keyed on (request seed, position,
// stream) rather than drawn from a sequential generator (dspark.md §4.2,
// item 11 of its contract): a draft's noise and an accept test's uniform
// depend only on where they are, so the same seed gives the same output
// whatever the verify width, the batch or a preemption did, and the draft
// noise is independent of the accept-test uniforms (separate streams).
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <span>
#include <vector>

namespace muse {

enum KeyedStream : uint64_t { kDraftStream = 1, kAcceptStream = 2, kResidualStream = 3 };

inline uint64_t mix64(uint64_t z) {
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
  return z ^ (z >> 31);
}

// Uniform in [0, 1), 53 bits, a pure function of its arguments.
inline double keyed_uniform(uint64_t seed, int64_t position, uint64_t stream) {
  uint64_t h = mix64(seed + 0x9e3779b97f4a7c15ull);
  h = mix64(h ^ (uint64_t(position) * 0xd1b54a32d192ed03ull));
  h = mix64(h ^ (stream * 0x8cb92ba72f3d8dd7ull));
  return double(h >> 11) * (1.0 / 9007199254740992.0);
}

// Inverse-CDF draw from (possibly unnormalised) non-negative weights; u in [0, 1).
template <class T>
int32_t draw_from(std::span<const T> p, double u) {
  double total = 0;
  for (T v : p) total += double(v);
  if (!(total > 0)) return 0;
  double acc = 0, target = u * total;
  int32_t last = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    if (!(p[i] > 0)) continue;
    last = int32_t(i);
    acc += double(p[i]);
    if (target < acc) return int32_t(i);
  }
  return last;  // rounding at the top end
}

// q = softmax(z / T) restricted by top-k and top-p (the request's
// truncation, so q is what the draft was really drawn from), normalised.
inline void draft_distribution(std::span<const float> z, double temperature, int64_t top_k, double top_p,
                               std::span<float> q) {
  const size_t n = z.size();
  const double T = temperature > 0 ? temperature : 1.0;
  float mx = -INFINITY;
  for (float v : z) mx = std::max(mx, v);
  double sum = 0;
  for (size_t i = 0; i < n; ++i) {
    const double e = std::isfinite(z[i]) ? std::exp(double(z[i] - mx) / T) : 0.0;
    q[i] = float(e);
    sum += e;
  }
  for (size_t i = 0; i < n; ++i) q[i] = float(double(q[i]) / sum);
  if ((top_k > 0 && size_t(top_k) < n) || top_p < 1.0) {
    std::vector<int32_t> order(n);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return q[size_t(a)] > q[size_t(b)]; });
    size_t keep = top_k > 0 ? std::min(n, size_t(top_k)) : n;
    double acc = 0;
    for (size_t i = 0; i < keep; ++i) {
      acc += q[size_t(order[i])];
      if (acc >= top_p) {
        keep = i + 1;
        break;
      }
    }
    double kept = 0;
    for (size_t i = keep; i < n; ++i) q[size_t(order[i])] = 0;
    for (size_t i = 0; i < keep; ++i) kept += q[size_t(order[i])];
    for (size_t i = 0; i < keep; ++i) q[size_t(order[i])] = float(double(q[size_t(order[i])]) / kept);
  }
}

}  // namespace muse
