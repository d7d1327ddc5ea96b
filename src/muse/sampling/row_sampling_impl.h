// The pieces SequenceSampler and sample_row_host share, so that the host
// sampler and the row definition the backends implement are one sequence of
// operations (row_sampling.h). Internal to sampling/.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "muse/sampling/row_sampling.h"

namespace muse {

struct SampledToken;

// The processors: `edits` applied to ids < n in order (bias, block, repetition, subtract).
void apply_row_edits(std::span<float> logits, int64_t n, std::span<const RowEdit> edits, float repetition_penalty);

// Log-softmax of logits over ids < n (ids with kept[i] == 0 count as -inf):
// the logprob of `chosen` and the top k entries, best first, ties to the lower id.
void fill_row_logprobs(std::span<const float> logits, int64_t n, int32_t chosen, int k, SampledToken& out,
                       const std::vector<uint8_t>* kept = nullptr);

struct RowTruncation {
  int64_t top_k = 0;
  double top_p = 1.0, min_p = 0.0;
};
// The random path's candidates over temperature-scaled logits: kept ids in
// draw order (id order, or by rank when top_k or top_p truncates) and their
// unnormalised probabilities exp(x - max).
void truncate_row(std::span<const float> scaled, int64_t n, const RowTruncation& t, std::vector<int32_t>& cand,
                  std::vector<double>& probs);

// The inverse-CDF draw over the candidates in order: the first whose running
// sum exceeds uniform · total (the last one when rounding leaves none).
int32_t draw_row(std::span<const int32_t> cand, std::span<const double> probs, double uniform);

}  // namespace muse
