// How many drafts to verify (dspark.md §4.6): the confidence head's
// survival scores against what a wider verify costs.
//
// The cost of a target step of B rows comes from a table measured at
// start-up (Scheduler), plus, on a MoE target, a price per distinct expert
// the rows route to: each verify row brings its own top-k experts, so with
// expensive experts (later: experts in host memory, streamed per step) the
// width that pays falls to 2–3 by itself, and with cheap ones it rises to
// the block (seed 000: k = 7 accepted 3.17 tokens a step yet was slower
// than no drafter, because an 8-row check cost ≈ 3.7 one-row steps).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace muse {

struct StepCostModel {
  std::vector<double> seconds;  // [B − 1]: one step of B rows, measured (monotone after finish())
  double expert_seconds = 0;    // extra cost per distinct expert a step touches (0: experts resident)
  // [B − 1]: mean distinct experts a step of B rows routes to, from recent
  // steps (EMA); empty: not a MoE target, or nothing observed.
  std::vector<double> distinct_experts;

  // Forces the table monotone (a wider step never looks cheaper: noise in
  // the measurement must not invite wider verifies).
  void finish();
  // Step cost for B rows (linear extrapolation past the table).
  double cost(int64_t rows) const;
  // Records a step of `rows` rows that touched `distinct` experts.
  void observe_experts(int64_t rows, double distinct, double alpha = 0.2);
};

// Per-request verify widths for one step (the paper's Algorithm 1): slots
// (r, j) ranked by prefix survival a_{r,j} = ∏_{i≤j} c_{r,i}, admitted one
// by one while the expected tokens per second (anchors + Σ a) / cost(rows)
// improve. Causal: admitting draft j of a request reads c_1..c_j only (its
// later slots rank after it). `confidence[r]` are c_{r,1..}; `caps[r]` the
// most drafts request r may verify; `base_rows` the step's other rows
// (prefill chunks, plain decodes); `draft_seconds` the drafting cost.
std::vector<int> pick_widths(std::span<const std::vector<float>> confidence, std::span<const int> caps,
                             int64_t base_rows, const StepCostModel& cost, double draft_seconds = 0);

}  // namespace muse
