// Lossless acceptance of drafted tokens (dspark.md §4.4), written against
// plain distributions so the rules can be tested in isolation (a toy target
// and drafter, χ² over 10^6 draws: tests/speculative/acceptance_test.cc).
//
// P rows are the target's distributions after the request's processing
// (penalties, constraint, temperature, top-k/p): P_i for draft i is row
// i − 1 of the verify. Q rows are what each draft was drawn from; an empty Q
// row means a one-hot (greedy) draft.
#pragma once

#include <cstdint>
#include <span>
#include <vector>

namespace muse {

struct TokenVerdict {
  bool accepted = false;
  int32_t token = 0;  // the draft when accepted, else the residual draw
};

// Token-level rejection sampling of draft x: accept when u < P(x)/Q(x);
// otherwise draw from normalize(max(P − Q, 0)) with u_residual (from P when
// that mass is about 0). One-hot Q: accept with probability P(x), otherwise
// draw from P with x removed.
TokenVerdict verify_token(std::span<const double> P, std::span<const float> Q, int32_t x, double u, double u_residual);

struct BlockVerdict {
  int accepted = 0;   // τ: drafts 1..τ are kept
  int32_t bonus = 0;  // the token after them
};

// Block verification (Sun et al., arXiv 2403.10444; dspark.md §4.4):
// p_i = min(1, p_{i−1}·P_i(x_i)/Q_i(x_i)); h_i = ρ_i / (ρ_i + 1 − p_i) with
// ρ_i = Σ_v max(p_i·P_{i+1}(v) − Q_{i+1}(v), 0) for i < n, h_n = p_n; τ is
// the largest i with u_i ≤ h_i; the bonus is drawn from
// normalize(max(p_τ·P_{τ+1} − Q_{τ+1}, 0)) when τ < n, else from P_{n+1}.
// P has n + 1 rows, Q and drafts n, u n uniforms.
BlockVerdict verify_block(std::span<const std::vector<double>> P, std::span<const std::span<const float>> Q,
                          std::span<const int32_t> drafts, std::span<const double> u, double u_bonus);

}  // namespace muse
