// Sampling where the logits are: one row of logits turned into a token by
// the backend that computed it, so that only token ids (and logprobs when
// asked) leave the device.
//
// A SequenceSampler (sequence_sampler.h) describes its next draw as a
// RowSampleSpec plus a list of per-id edits (plan_row): the logits
// processors resolved against its state (logit_bias, min_tokens, the
// repetition/frequency/presence penalties), the truncation parameters, and
// the uniform variate its own generator draws for this token. A backend then
// runs `Backend::sample_rows` over a buffer of such rows; sample_row_host()
// below is the definition, written as the same sequence of operations as
// SequenceSampler::sample (CPU backend; the CUDA kernel is tested against
// it). Same seed, same logits: same token, on either backend. The device
// sums probabilities in a fixed tree order instead of id order, so the
// float sums differ in the last bits; a draw can differ only when the
// uniform variate lands within that rounding of a boundary (~1e-15).
//
// Not expressible as a spec (the sampler samples on the host instead): a
// grammar constraint, more than kRowSampleMaxTop top logprobs, a repeated
// logit_bias id.
#pragma once

#include <cstdint>
#include <span>

namespace muse {

struct SampledToken;

inline constexpr int kRowSampleMaxTop = 20;
// The logprob reported for an impossible token (vLLM's convention; JSON has no -inf).
inline constexpr float kMinLogprob = -9999.0f;

enum RowSampleFlags : uint32_t {
  kRowGreedy = 1u << 0,      // argmax (temperature 0)
  kRowRawLogprobs = 1u << 1, // logprobs from the raw logits (LogprobsMode::Raw)
};

// One row's draw. Plain data with a fixed layout: it is uploaded as bytes.
struct RowSampleSpec {
  int32_t logit_row = 0;       // row of the logits tensor
  int32_t limit = 0;           // ids >= limit are never drawn (the sampled vocabulary)
  int32_t edit_begin = 0;      // this row's edits: edits[edit_begin, edit_begin + edit_count)
  int32_t edit_count = 0;
  int32_t top_k = 0;           // <= 0: off
  int32_t top_logprobs = -1;   // -1: no logprobs; else how many top entries (<= kRowSampleMaxTop)
  uint32_t flags = 0;          // RowSampleFlags
  float inv_temperature = 1;   // float(1 / temperature), as the sampler multiplies
  float repetition_penalty = 1;
  int32_t pad = 0;
  double top_p = 1;            // 1: off
  double min_p = 0;            // 0: off
  double uniform = 0;          // the draw's variate in [0, 1) (random rows)
};
static_assert(sizeof(RowSampleSpec) == 64);

enum RowEditFlags : uint32_t {
  kEditBias = 1u << 0,     // x += bias
  kEditBlocked = 1u << 1,  // x = -inf (min_tokens)
  kEditRepeat = 1u << 2,   // x = x > 0 ? x / repetition_penalty : x * repetition_penalty
  kEditSubtract = 1u << 3, // x -= subtract (frequency · count + presence)
};

// The processors for one id, applied in the sampler's order: bias, block,
// repetition, frequency/presence. Ids are unique within a row.
struct RowEdit {
  int32_t id = 0;
  uint32_t flags = 0;
  float bias = 0;
  float subtract = 0;
};
static_assert(sizeof(RowEdit) == 16);

// What a row's draw gives back (fixed layout: downloaded as bytes).
struct RowSampleResult {
  int32_t id = 0;
  float logprob = 0;           // of id (top_logprobs >= 0)
  int32_t top_count = 0;
  int32_t pad = 0;
  int32_t top_id[kRowSampleMaxTop] = {};
  float top_logprob[kRowSampleMaxTop] = {};
};
static_assert(sizeof(RowSampleResult) == 176);

// The row buffer Backend::sample_rows reads: a header, `rows` specs, then the edits.
struct RowSampleHeader {
  int32_t rows = 0;
  int32_t edits = 0;
  int32_t vocab = 0;           // columns of the logits tensor
  int32_t pad = 0;
};
static_assert(sizeof(RowSampleHeader) == 16);

// The definition: samples `logits` (one row, modified in place) by `spec`.
RowSampleResult sample_row_host(const RowSampleSpec& spec, std::span<const RowEdit> edits, std::span<float> logits);

// The SampledToken a result stands for (logprobs when the spec asked).
SampledToken to_sampled_token(const RowSampleResult& r, const RowSampleSpec& spec);

}  // namespace muse
