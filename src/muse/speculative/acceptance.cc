#include "muse/speculative/acceptance.h"

#include <algorithm>

#include "muse/speculative/keyed_random.h"

namespace muse {

namespace {

constexpr double kTinyMass = 1e-12;

double q_at(std::span<const float> Q, int32_t x, int32_t v) {
  if (Q.empty()) return v == x ? 1.0 : 0.0;
  return size_t(v) < Q.size() ? double(Q[size_t(v)]) : 0.0;
}

// Draws from max(scale·P − Q, 0); from P when that leaves (about) nothing.
int32_t draw_residual(std::span<const double> P, std::span<const float> Q, int32_t x, double scale, double u,
                      std::vector<double>& work) {
  work.resize(P.size());
  double mass = 0;
  for (size_t v = 0; v < P.size(); ++v) mass += work[v] = std::max(0.0, scale * P[v] - q_at(Q, x, int32_t(v)));
  if (mass <= kTinyMass) return draw_from(P, u);
  return draw_from(std::span<const double>(work), u);
}

}  // namespace

TokenVerdict verify_token(std::span<const double> P, std::span<const float> Q, int32_t x, double u, double u_residual) {
  const double p = size_t(x) < P.size() ? P[size_t(x)] : 0.0, q = q_at(Q, x, x);
  // u < p/q, written without the division (q = 0 never happens for a drawn draft).
  if (q > 0 && u * q < p) return {true, x};
  thread_local std::vector<double> work;  // no allocation per rejection after the first
  return {false, draw_residual(P, Q, x, 1.0, u_residual, work)};
}

BlockVerdict verify_block(std::span<const std::vector<double>> P, std::span<const std::span<const float>> Q,
                          std::span<const int32_t> drafts, std::span<const double> u, double u_bonus) {
  const int n = int(drafts.size());
  std::vector<double> pw(size_t(n) + 1, 1.0);  // p_0 .. p_n
  for (int i = 1; i <= n; ++i) {
    const int32_t x = drafts[size_t(i - 1)];
    const double pt = P[size_t(i - 1)][size_t(x)], qd = q_at(Q[size_t(i - 1)], x, x);
    pw[size_t(i)] = qd > 0 ? std::min(1.0, pw[size_t(i - 1)] * pt / qd) : 0.0;
  }
  int tau = 0;
  for (int i = 1; i <= n; ++i) {
    double h;
    if (i == n) {
      h = pw[size_t(n)];
    } else {
      const std::span<const double> Pn(P[size_t(i)]);
      const std::span<const float> Qn = Q[size_t(i)];
      const int32_t xn = drafts[size_t(i)];
      double rho = 0;
      for (size_t v = 0; v < Pn.size(); ++v) rho += std::max(0.0, pw[size_t(i)] * Pn[v] - q_at(Qn, xn, int32_t(v)));
      const double den = rho + 1.0 - pw[size_t(i)];
      h = den > 0 ? rho / den : 1.0;
    }
    if (u[size_t(i - 1)] <= h) tau = i;
  }
  BlockVerdict out;
  out.accepted = tau;
  thread_local std::vector<double> work;
  if (tau < n) {
    out.bonus = draw_residual(P[size_t(tau)], Q[size_t(tau)], drafts[size_t(tau)], pw[size_t(tau)], u_bonus, work);
  } else {
    out.bonus = draw_from(std::span<const double>(P[size_t(n)]), u_bonus);
  }
  return out;
}

}  // namespace muse
