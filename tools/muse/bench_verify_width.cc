// muse bench --device cuda --verify-widths: what a wider speculative verify
// costs on this model, and whether the scheduler's width choice
// (speculative/verify_width.h) lands on the fastest width (issue 15's
// MoE-aware width). One sequence at the first --context; a verify step of
// w rows (the anchor and w − 1 drafts, every row's logits, as the
// scheduler's verify item) timed for w = 1..8 and rolled back after each
// step with Session::truncate; on a MoE model the distinct experts the w
// rows route to are recorded beside it (each row brings its own top-k, so
// the bytes grow with w). With a fixed per-position acceptance (the
// fraction of drafts position j survives, a^j; seed 000's 3.17 accepted
// tokens at k = 7 is a ≈ 0.7), the expected tokens per second of each
// width against the one pick_widths chooses from the same measured table.
#include <cmath>
#include <cstdio>

#include "muse/core/json.h"
#include "muse/engine/engine.h"
#include "muse/speculative/verify_width.h"
#include "bench_options.h"

namespace muse::tool {

Result<Json> bench_verify_widths(Engine& e, const BenchOptions& o, double acceptance) {
  constexpr int kMaxWidth = 8;
  auto s = e.new_session();
  if (!s.ok()) return make_error(s.message());
  Session& session = **s;
  MUSE_RETURN_IF_ERROR(session.extend_uncomputed(o.contexts.front() - 1, 7));
  const int64_t base = session.length();
  StepCostModel cost;
  std::vector<double> distinct;
  Json rows = Json::array();
  for (int w = 1; w <= kMaxWidth; ++w) {
    std::vector<int32_t> tokens;
    for (int i = 0; i < w; ++i) tokens.push_back(int32_t(11 + (i * 7919 + w * 104729) % 200000));
    const StepItem item{&session, std::span<const int32_t>(tokens), LogitsWanted::All};
    std::vector<double> ts;
    double experts = 0;
    for (int r = 0; r <= o.runs; ++r) {
      const double t0 = now_s();
      for (int64_t k = 0; k < o.tokens; ++k) {
        MUSE_RETURN_IF_ERROR(e.step(std::span<const StepItem>(&item, 1)));
        experts = e.distinct_experts();
        MUSE_RETURN_IF_ERROR(session.truncate(base));
      }
      if (r > 0) ts.push_back((now_s() - t0) / double(o.tokens));  // run 0 warms up
    }
    cost.seconds.push_back(median_of(ts));
    distinct.push_back(experts);
  }
  cost.finish();
  // Expected tokens of a step verifying d drafts: the bonus plus a + a² + ... + a^d.
  auto expected = [&](int d) {
    double t = 1, p = 1;
    for (int j = 1; j <= d; ++j) t += p *= acceptance;
    return t;
  };
  const std::vector<float> confidence(size_t(kMaxWidth - 1), float(acceptance));
  const std::vector<std::vector<float>> conf{confidence};
  const std::vector<int> caps{kMaxWidth - 1};
  const int chosen = pick_widths(conf, caps, 0, cost)[0];
  int fastest = 0;
  for (int d = 0; d < kMaxWidth; ++d)
    if (expected(d) / cost.cost(d + 1) > expected(fastest) / cost.cost(fastest + 1)) fastest = d;
  if (!o.json)
    std::printf("\nverify widths (one sequence at context %lld; acceptance %.2f per position)\n%-6s %10s %10s %10s %12s\n",
                (long long)o.contexts.front(), acceptance, "rows", "step ms", "vs 1 row", "experts", "tok/s");
  for (int d = 0; d < kMaxWidth; ++d) {
    const double tps = expected(d) / cost.cost(d + 1);
    Json r = Json::object();
    r.set("rows", d + 1);
    r.set("step_ms", cost.seconds[size_t(d)] * 1e3);
    r.set("distinct_experts", distinct[size_t(d)]);
    r.set("expected_tokens_per_second", tps);
    rows.push_back(r);
    if (!o.json)
      std::printf("%-6d %10.3f %9.2fx %10.1f %12.1f%s%s\n", d + 1, cost.seconds[size_t(d)] * 1e3,
                  cost.seconds[size_t(d)] / cost.seconds[0], distinct[size_t(d)], tps, d == chosen ? "  <- chosen" : "",
                  d == fastest ? "  <- fastest" : "");
  }
  const double ratio = (expected(chosen) / cost.cost(chosen + 1)) / (expected(fastest) / cost.cost(fastest + 1));
  if (!o.json)
    std::printf("chosen %d drafts, fastest %d: %.1f%% of the fastest width's tokens/s\n", chosen, fastest, 100 * ratio);
  Json out = Json::object();
  out.set("acceptance", acceptance);
  out.set("widths", rows);
  out.set("chosen_drafts", chosen);
  out.set("fastest_drafts", fastest);
  out.set("chosen_fraction_of_fastest", ratio);
  return out;
}

}  // namespace muse::tool
