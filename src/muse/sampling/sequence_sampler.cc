#include "muse/sampling/sequence_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

namespace muse {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Log-softmax over ids < n (ids with kept[i] == 0 count as -inf).
void fill_logprobs(std::span<const float> logits, int64_t n, int32_t chosen, int k, SampledToken& out,
                   const std::vector<uint8_t>* kept = nullptr) {
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

}  // namespace

SequenceSampler::SequenceSampler(SamplingConfig config, int64_t sampled_vocab_size)
    : config_(std::move(config)), sampled_vocab_size_(sampled_vocab_size), rng_(config_.seed.value_or(0)) {
  penalties_ = config_.repetition_penalty != 1.0 || config_.frequency_penalty != 0.0 || config_.presence_penalty != 0.0;
}

void SequenceSampler::set_prompt(std::span<const int32_t> prompt) {
  if (config_.repetition_penalty == 1.0) return;  // only the repetition penalty looks at the prompt
  prompt_ids_.assign(prompt.begin(), prompt.end());
  std::sort(prompt_ids_.begin(), prompt_ids_.end());
  prompt_ids_.erase(std::unique(prompt_ids_.begin(), prompt_ids_.end()), prompt_ids_.end());
}

void SequenceSampler::accept(int32_t token) {
  ++generated_;
  if (constraint_) constraint_->accept(token);
  if (penalties_) ++counts_[token];
}

int64_t SequenceSampler::limit(size_t n) const {
  return sampled_vocab_size_ > 0 ? std::min<int64_t>(sampled_vocab_size_, int64_t(n)) : int64_t(n);
}

void SequenceSampler::apply_processors(std::span<float> logits) const {
  const int64_t n = limit(logits.size());
  for (size_t i = size_t(n); i < logits.size(); ++i) logits[i] = kNegInf;
  for (const auto& [id, bias] : config_.logit_bias)
    if (id >= 0 && id < n) logits[size_t(id)] += bias;
  if (generated_ < config_.min_tokens)
    for (int32_t id : config_.min_tokens_blocked)
      if (id >= 0 && id < n) logits[size_t(id)] = kNegInf;
  if (!penalties_) return;
  const float rep = float(config_.repetition_penalty);
  if (rep != 1.0f) {
    auto penalise = [&](int32_t id) {
      if (id < 0 || id >= n) return;
      float& x = logits[size_t(id)];
      x = x > 0 ? x / rep : x * rep;
    };
    // Each id once, whether it is in the prompt, the output or both.
    for (int32_t id : prompt_ids_) penalise(id);
    for (const auto& [id, count] : counts_)
      if (!std::binary_search(prompt_ids_.begin(), prompt_ids_.end(), id)) penalise(id);
  }
  if (config_.frequency_penalty != 0.0 || config_.presence_penalty != 0.0) {
    for (const auto& [id, count] : counts_) {
      if (id < 0 || id >= n) continue;
      logits[size_t(id)] -= float(config_.frequency_penalty * count + config_.presence_penalty);
    }
  }
}

void SequenceSampler::truncate(std::span<const float> scaled) const {
  const int64_t n = limit(scaled.size());
  cand_.clear();
  probs_.clear();
  float mx = kNegInf;
  for (int64_t i = 0; i < n; ++i) mx = std::max(mx, scaled[size_t(i)]);
  if (mx == kNegInf) {  // everything masked: fall back to the lowest id
    cand_.push_back(0);
    probs_.push_back(1.0);
    return;
  }
  const bool by_rank = (config_.top_k > 0 && config_.top_k < n) || config_.top_p < 1.0;
  // min_p: relative to the most likely token, p_i / p_max = exp(l_i - max).
  const double min_rel = config_.min_p;
  for (int64_t i = 0; i < n; ++i) {
    const float x = scaled[size_t(i)];
    if (x == kNegInf) continue;
    const double p = std::exp(double(x) - double(mx));
    if (p == 0.0 || (min_rel > 0.0 && p < min_rel)) continue;
    cand_.push_back(int32_t(i));
  }
  if (by_rank) {
    auto better = [&](int32_t a, int32_t b) {
      const float xa = scaled[size_t(a)], xb = scaled[size_t(b)];
      return xa != xb ? xa > xb : a < b;
    };
    if (config_.top_k > 0 && size_t(config_.top_k) < cand_.size()) {
      std::partial_sort(cand_.begin(), cand_.begin() + ptrdiff_t(config_.top_k), cand_.end(), better);
      cand_.resize(size_t(config_.top_k));
    } else {
      std::sort(cand_.begin(), cand_.end(), better);
    }
  }
  probs_.resize(cand_.size());
  double sum = 0.0;
  for (size_t i = 0; i < cand_.size(); ++i) sum += probs_[i] = std::exp(double(scaled[size_t(cand_[i])]) - double(mx));
  if (config_.top_p < 1.0) {  // smallest prefix (most likely first) whose mass reaches top_p
    double acc = 0.0;
    size_t keep = cand_.size();
    for (size_t i = 0; i < cand_.size(); ++i) {
      acc += probs_[i] / sum;
      if (acc >= config_.top_p) {
        keep = i + 1;
        break;
      }
    }
    cand_.resize(keep);
    probs_.resize(keep);
  }
}

SampledToken compute_logprobs(std::span<const float> logits, int64_t limit, int32_t chosen, int k) {
  SampledToken out;
  out.id = chosen;
  fill_logprobs(logits, std::min<int64_t>(limit, int64_t(logits.size())), chosen, k, out);
  return out;
}

bool SequenceSampler::apply_constraint(std::span<float> logits, std::span<const float> raw, int32_t* out) const {
  const int64_t n = limit(logits.size());
  bool any = false;
  int32_t fallback = -1;
  mask_.resize(size_t(n));
  constraint_->fill_mask(mask_);
  for (int64_t i = 0; i < n; ++i) {
    if (!mask_[size_t(i)]) {
      logits[size_t(i)] = kNegInf;
      continue;
    }
    if (logits[size_t(i)] != kNegInf) any = true;
    if (fallback < 0 || raw[size_t(i)] > raw[size_t(fallback)]) fallback = int32_t(i);
  }
  if (any) return true;
  // Nothing allowed survived the processors; with nothing allowed at all the
  // constraint is finished or broken, and the unconstrained argmax goes on.
  *out = fallback >= 0 ? fallback : argmax(raw, n);
  return false;
}

SampledToken SequenceSampler::sample(std::span<float> logits, int top_logprobs, LogprobsMode mode) {
  return sample_impl(logits, nullptr, top_logprobs, mode);
}

SampledToken SequenceSampler::sample_choosing(std::span<float> logits, const Chooser& choose, int top_logprobs,
                                              LogprobsMode mode) {
  return sample_impl(logits, &choose, top_logprobs, mode);
}

SampledToken SequenceSampler::sample_impl(std::span<float> logits, const Chooser* choose, int top_logprobs,
                                          LogprobsMode mode) {
  SampledToken out;
  const int64_t n = limit(logits.size());
  const bool want = top_logprobs >= 0;
  std::vector<float> raw;
  if ((want && mode == LogprobsMode::Raw) || constraint_) raw.assign(logits.begin(), logits.begin() + n);
  apply_processors(logits);
  if (constraint_ && !apply_constraint(logits, raw, &out.id)) {
    if (want) fill_logprobs(raw, n, out.id, top_logprobs, out);
    return out;
  }
  if (greedy()) {
    out.id = argmax(logits, n);
    if (want) fill_logprobs(mode == LogprobsMode::Raw ? std::span<const float>(raw) : logits, n, out.id, top_logprobs, out);
    return out;
  }
  const float inv_t = float(1.0 / config_.temperature);
  for (int64_t i = 0; i < n; ++i) logits[size_t(i)] *= inv_t;
  truncate(logits);
  double sum = 0.0;
  for (double p : probs_) sum += p;
  if (choose) {
    std::vector<double> p(size_t(n), 0.0);
    for (size_t i = 0; i < cand_.size(); ++i) p[size_t(cand_[i])] = probs_[i] / sum;
    out.id = (*choose)(p);
  } else {
    const double u = rng_.uniform() * sum;
    double acc = 0.0;
    out.id = cand_.back();
    for (size_t i = 0; i < cand_.size(); ++i) {
      acc += probs_[i];
      if (u < acc) {
        out.id = cand_[i];
        break;
      }
    }
  }
  if (want) {
    if (mode == LogprobsMode::Raw) {
      fill_logprobs(raw, n, out.id, top_logprobs, out);
    } else {
      std::vector<uint8_t> kept(size_t(n), 0);
      for (int32_t c : cand_) kept[size_t(c)] = 1;
      fill_logprobs(logits, n, out.id, top_logprobs, out, &kept);
    }
  }
  return out;
}

std::vector<float> SequenceSampler::processed_logits(std::span<const float> logits) const {
  std::vector<float> x(logits.begin(), logits.end());
  apply_processors(x);
  return x;
}

std::vector<double> SequenceSampler::distribution(std::span<const float> logits) const {
  std::vector<float> x = processed_logits(logits);
  std::vector<double> p(x.size(), 0.0);
  const int64_t n = limit(x.size());
  if (greedy()) {
    p[size_t(argmax(x, n))] = 1.0;
    return p;
  }
  const float inv_t = float(1.0 / config_.temperature);
  for (int64_t i = 0; i < n; ++i) x[size_t(i)] *= inv_t;
  truncate(x);
  double sum = 0.0;
  for (double q : probs_) sum += q;
  for (size_t i = 0; i < cand_.size(); ++i) p[size_t(cand_[i])] = probs_[i] / sum;
  return p;
}

}  // namespace muse
