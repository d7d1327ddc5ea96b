#include "muse/sampling/sequence_sampler.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <string>

#include "muse/sampling/row_sampling_impl.h"

namespace muse {

namespace {
constexpr float kNegInf = -std::numeric_limits<float>::infinity();
}  // namespace

SequenceSampler::SequenceSampler(SamplingConfig config, int64_t sampled_vocab_size)
    : config_(std::move(config)), sampled_vocab_size_(sampled_vocab_size), rng_(config_.seed.value_or(0)) {
  penalties_ = config_.repetition_penalty != 1.0 || config_.frequency_penalty != 0.0 || config_.presence_penalty != 0.0;
  // One bias per id (a repeated id's biases summed in list order), sorted:
  // each id is one edit (row_sampling.h).
  auto& bias = config_.logit_bias;
  std::stable_sort(bias.begin(), bias.end(), [](const auto& a, const auto& b) { return a.first < b.first; });
  size_t w = 0;
  for (size_t i = 0; i < bias.size(); ++i) {
    if (w > 0 && bias[w - 1].first == bias[i].first) bias[w - 1].second += bias[i].second;
    else bias[w++] = bias[i];
  }
  bias.resize(w);
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

void SequenceSampler::build_edits(int64_t n, std::vector<RowEdit>& out) const {
  // Everything but the prompt's repetition entries, sorted by id, then
  // merged with the (sorted) prompt ids: one edit per id.
  std::vector<RowEdit>& extra = edit_scratch_;
  extra.clear();
  for (const auto& [id, bias] : config_.logit_bias)
    if (id >= 0 && id < n) extra.push_back({id, kEditBias, bias, 0.0f});
  if (generated_ < config_.min_tokens)
    for (int32_t id : config_.min_tokens_blocked)
      if (id >= 0 && id < n) extra.push_back({id, kEditBlocked, 0.0f, 0.0f});
  const bool rep = config_.repetition_penalty != 1.0;
  const bool sub = config_.frequency_penalty != 0.0 || config_.presence_penalty != 0.0;
  if (rep || sub)
    for (const auto& [id, count] : counts_) {
      if (id < 0 || id >= n) continue;
      RowEdit e{id, rep ? uint32_t(kEditRepeat) : 0u, 0.0f, 0.0f};
      if (sub) {
        e.flags |= kEditSubtract;
        e.subtract = float(config_.frequency_penalty * count + config_.presence_penalty);
      }
      extra.push_back(e);
    }
  std::sort(extra.begin(), extra.end(), [](const RowEdit& a, const RowEdit& b) { return a.id < b.id; });
  size_t p = 0;
  auto flush_prompt_below = [&](int64_t id) {
    for (; p < prompt_ids_.size() && prompt_ids_[p] < id; ++p)
      if (prompt_ids_[p] >= 0 && prompt_ids_[p] < n) out.push_back({prompt_ids_[p], kEditRepeat, 0.0f, 0.0f});
  };
  for (size_t i = 0; i < extra.size();) {
    RowEdit e = extra[i];
    for (++i; i < extra.size() && extra[i].id == e.id; ++i) {
      e.flags |= extra[i].flags;
      if (extra[i].flags & kEditBias) e.bias = extra[i].bias;
      if (extra[i].flags & kEditSubtract) e.subtract = extra[i].subtract;
    }
    flush_prompt_below(e.id);
    if (p < prompt_ids_.size() && prompt_ids_[p] == e.id) {
      e.flags |= kEditRepeat;  // in the prompt and the output: penalised once
      ++p;
    }
    out.push_back(e);
  }
  flush_prompt_below(std::numeric_limits<int64_t>::max());
}

void SequenceSampler::apply_processors(std::span<float> logits) const {
  const int64_t n = limit(logits.size());
  for (size_t i = size_t(n); i < logits.size(); ++i) logits[i] = kNegInf;
  std::vector<RowEdit>& edits = edits_;
  edits.clear();
  build_edits(n, edits);
  apply_row_edits(logits, n, edits, float(config_.repetition_penalty));
}

void SequenceSampler::truncate(std::span<const float> scaled) const {
  truncate_row(scaled, limit(scaled.size()), {config_.top_k, config_.top_p, config_.min_p}, cand_, probs_);
}

SampledToken compute_logprobs(std::span<const float> logits, int64_t limit, int32_t chosen, int k) {
  SampledToken out;
  out.id = chosen;
  fill_row_logprobs(logits, std::min<int64_t>(limit, int64_t(logits.size())), chosen, k, out);
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

bool SequenceSampler::plan_row(int64_t vocab, int top_logprobs, LogprobsMode mode, RowSampleSpec* spec,
                               std::vector<RowEdit>* edits) {
  if (constraint_ || top_logprobs > kRowSampleMaxTop) return false;
  const int64_t n = limit(size_t(vocab));
  RowSampleSpec r;
  r.limit = int32_t(n);
  r.edit_begin = int32_t(edits->size());
  build_edits(n, *edits);
  r.edit_count = int32_t(edits->size()) - r.edit_begin;
  r.top_logprobs = top_logprobs < 0 ? -1 : top_logprobs;
  r.flags = (greedy() ? kRowGreedy : 0u) | (mode == LogprobsMode::Raw ? kRowRawLogprobs : 0u);
  r.repetition_penalty = float(config_.repetition_penalty);
  if (!greedy()) {
    r.inv_temperature = float(1.0 / config_.temperature);
    r.top_k = int32_t(std::clamp<int64_t>(config_.top_k, 0, std::numeric_limits<int32_t>::max()));
    r.top_p = config_.top_p;
    r.min_p = config_.min_p;
    r.uniform = rng_.uniform();  // the one variate this token's draw takes
  }
  *spec = r;
  return true;
}

SampledToken SequenceSampler::sample(std::span<float> logits, int top_logprobs, LogprobsMode mode) {
  // The row definition the backends implement (row_sampling.h) wherever it applies.
  RowSampleSpec spec;
  std::vector<RowEdit>& edits = edits_;
  edits.clear();
  if (plan_row(int64_t(logits.size()), top_logprobs, mode, &spec, &edits))
    return to_sampled_token(sample_row_host(spec, edits, logits), spec);
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
    if (want) fill_row_logprobs(raw, n, out.id, top_logprobs, out);
    return out;
  }
  if (greedy()) {
    out.id = argmax(logits, n);
    if (want) fill_row_logprobs(mode == LogprobsMode::Raw ? std::span<const float>(raw) : logits, n, out.id, top_logprobs, out);
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
    out.id = draw_row(cand_, probs_, rng_.uniform());
  }
  if (want) {
    if (mode == LogprobsMode::Raw) {
      fill_row_logprobs(raw, n, out.id, top_logprobs, out);
    } else {
      std::vector<uint8_t> kept(size_t(n), 0);
      for (int32_t c : cand_)
        if (size_t(c) < kept.size()) kept[size_t(c)] = 1;
      fill_row_logprobs(logits, n, out.id, top_logprobs, out, &kept);
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
