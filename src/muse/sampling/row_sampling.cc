#include "muse/sampling/row_sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "muse/sampling/row_sampling_impl.h"
#include "muse/sampling/sequence_sampler.h"

namespace muse {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}  // namespace

void apply_row_edits(std::span<float> logits, int64_t n, std::span<const RowEdit> edits, float repetition_penalty) {
  for (const RowEdit& e : edits) {
    if (e.id < 0 || e.id >= n) continue;
    float& x = logits[size_t(e.id)];
    if (e.flags & kEditBias) x += e.bias;
    if (e.flags & kEditBlocked) x = kNegInf;
    if (e.flags & kEditRepeat) x = x > 0 ? x / repetition_penalty : x * repetition_penalty;
    if (e.flags & kEditSubtract) x -= e.subtract;
  }
}

void fill_row_logprobs(std::span<const float> logits, int64_t n, int32_t chosen, int k, SampledToken& out,
                       const std::vector<uint8_t>* kept) {
  auto value = [&](int64_t i) { return kept && !(*kept)[size_t(i)] ? kNegInf : logits[size_t(i)]; };
  float mx = kNegInf;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, value(i));
  double sum = 0.0;
  if (mx != kNegInf)
    for (int64_t i = 0; i < n; ++i) {
      const float x = value(i);
      if (x != kNegInf) sum += std::exp(double(x) - double(mx));
    }
  const double lse = mx == kNegInf ? 0.0 : double(mx) + std::log(sum);
  auto logprob = [&](int64_t i) -> float {
    const float x = i >= 0 && i < n ? value(i) : kNegInf;
    if (x == kNegInf || mx == kNegInf) return kMinLogprob;
    return std::max(kMinLogprob, float(double(x) - lse));
  };
  out.has_logprobs = true;
  out.logprob = logprob(chosen);
  out.top.clear();
  if (k <= 0) return;
  std::vector<int32_t> ids(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) ids[size_t(i)] = int32_t(i);
  const size_t take = std::min<size_t>(size_t(k), ids.size());
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(take), ids.end(), [&](int32_t a, int32_t b) {
    const float xa = value(a), xb = value(b);
    return xa != xb ? xa > xb : a < b;
  });
  for (size_t i = 0; i < take; ++i) out.top.push_back({ids[i], logprob(ids[i])});
}

void truncate_row(std::span<const float> scaled, int64_t n, const RowTruncation& t, std::vector<int32_t>& cand,
                  std::vector<double>& probs) {
  cand.clear();
  probs.clear();
  float mx = kNegInf;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, scaled[size_t(i)]);
  if (mx == kNegInf) {  // everything masked: fall back to the lowest id
    cand.push_back(0);
    probs.push_back(1.0);
    return;
  }
  const bool by_rank = (t.top_k > 0 && t.top_k < n) || t.top_p < 1.0;
  // min_p: relative to the most likely token, p_i / p_max = exp(l_i - max).
  for (int64_t i = 0; i < n; ++i) {
    const float x = scaled[size_t(i)];
    if (x == kNegInf) continue;
    const double p = std::exp(double(x) - double(mx));
    if (p == 0.0 || (t.min_p > 0.0 && p < t.min_p)) continue;
    cand.push_back(int32_t(i));
  }
  if (by_rank) {
    auto better = [&](int32_t a, int32_t b) {
      const float xa = scaled[size_t(a)], xb = scaled[size_t(b)];
      return xa != xb ? xa > xb : a < b;
    };
    if (t.top_k > 0 && size_t(t.top_k) < cand.size()) {
      std::partial_sort(cand.begin(), cand.begin() + ptrdiff_t(t.top_k), cand.end(), better);
      cand.resize(size_t(t.top_k));
    } else {
      std::sort(cand.begin(), cand.end(), better);
    }
  }
  probs.resize(cand.size());
  double sum = 0.0;
  for (size_t i = 0; i < cand.size(); ++i) sum += probs[i] = std::exp(double(scaled[size_t(cand[i])]) - double(mx));
  if (t.top_p < 1.0) {  // smallest prefix (most likely first) whose mass reaches top_p
    double acc = 0.0;
    size_t keep = cand.size();
    for (size_t i = 0; i < cand.size(); ++i) {
      acc += probs[i] / sum;
      if (acc >= t.top_p) {
        keep = i + 1;
        break;
      }
    }
    cand.resize(keep);
    probs.resize(keep);
  }
}

int32_t draw_row(std::span<const int32_t> cand, std::span<const double> probs, double uniform) {
  double sum = 0.0;
  for (double p : probs) sum += p;
  const double u = uniform * sum;
  double acc = 0.0;
  for (size_t i = 0; i < cand.size(); ++i) {
    acc += probs[i];
    if (u < acc) return cand[i];
  }
  return cand.back();
}

RowSampleResult sample_row_host(const RowSampleSpec& spec, std::span<const RowEdit> edits, std::span<float> logits) {
  const int64_t n = std::min<int64_t>(spec.limit, int64_t(logits.size()));
  const bool want = spec.top_logprobs >= 0;
  const bool raw_mode = spec.flags & kRowRawLogprobs;
  std::vector<float> raw;
  if (want && raw_mode) raw.assign(logits.begin(), logits.begin() + n);
  apply_row_edits(logits, n, edits, spec.repetition_penalty);
  SampledToken out;
  if (spec.flags & kRowGreedy) {
    out.id = argmax(logits, n);
    if (want) fill_row_logprobs(raw_mode ? std::span<const float>(raw) : logits, n, out.id, spec.top_logprobs, out);
  } else {
    for (int64_t i = 0; i < n; ++i) logits[size_t(i)] *= spec.inv_temperature;
    std::vector<int32_t> cand;
    std::vector<double> probs;
    truncate_row(logits, n, {spec.top_k, spec.top_p, spec.min_p}, cand, probs);
    out.id = draw_row(cand, probs, spec.uniform);
    if (want) {
      if (raw_mode) {
        fill_row_logprobs(raw, n, out.id, spec.top_logprobs, out);
      } else {
        std::vector<uint8_t> kept(size_t(n), 0);
        for (int32_t c : cand)
          if (size_t(c) < kept.size()) kept[size_t(c)] = 1;  // (an empty vocabulary falls back to id 0)
        fill_row_logprobs(logits, n, out.id, spec.top_logprobs, out, &kept);
      }
    }
  }
  RowSampleResult r;
  r.id = out.id;
  r.logprob = out.logprob;
  r.top_count = int32_t(out.top.size());
  for (size_t i = 0; i < out.top.size() && i < size_t(kRowSampleMaxTop); ++i) {
    r.top_id[i] = out.top[i].id;
    r.top_logprob[i] = out.top[i].logprob;
  }
  return r;
}

SampledToken to_sampled_token(const RowSampleResult& r, const RowSampleSpec& spec) {
  SampledToken t;
  t.id = r.id;
  if (spec.top_logprobs < 0) return t;
  t.has_logprobs = true;
  t.logprob = r.logprob;
  for (int32_t i = 0; i < r.top_count && i < kRowSampleMaxTop; ++i) t.top.push_back({r.top_id[i], r.top_logprob[i]});
  return t;
}

}  // namespace muse
