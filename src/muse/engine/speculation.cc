#include "muse/engine/speculation.h"

#include "muse/speculative/acceptance.h"
#include "muse/speculative/keyed_random.h"

namespace muse {

VerifyOutcome verify_drafts(SequenceSampler& sampler, std::span<float> rows, int64_t V, std::span<const int32_t> drafts,
                            const DraftBlock& block, const SpeculativeConfig& config, int64_t first_pos,
                            int top_logprobs, LogprobsMode mode, const std::function<bool(int32_t)>& ends) {
  VerifyOutcome out;
  const int n = int(drafts.size());
  auto row = [&](int i) { return rows.subspan(size_t(i) * size_t(V), size_t(V)); };
  auto take = [&](SampledToken t) {
    sampler.accept(t.id);
    out.tokens.push_back(std::move(t));
  };
  const bool probabilistic_q = !block.q.empty();
  const uint64_t seed = sampler.config().seed.value_or(0);
  const int64_t SV = probabilistic_q ? int64_t(block.q.size()) / int64_t(block.tokens.size()) : 0;
  auto q_row = [&](int i) {
    return probabilistic_q ? std::span<const float>(block.q.data() + size_t(i) * size_t(SV), size_t(SV))
                           : std::span<const float>();
  };

  // Sample-and-compare: greedy requests, and one-hot drafts under `standard`.
  if (sampler.greedy() ||
      (!probabilistic_q && config.rejection_sample_method == RejectionSampleMethod::Standard)) {
    for (int i = 0; i <= n; ++i) {
      take(sampler.sample(row(i), top_logprobs, mode));
      const int32_t id = out.tokens.back().id;
      if (i == n || id != drafts[size_t(i)] || ends(id)) break;
    }
    out.accepted = int(out.tokens.size()) - 1;
    return out;
  }

  // Block verification needs every P_i before anything is accepted.
  if (config.rejection_sample_method == RejectionSampleMethod::Block && sampler.stateless()) {
    std::vector<std::vector<double>> P(size_t(n) + 1);
    for (int i = 0; i <= n; ++i) P[size_t(i)] = sampler.distribution(row(i));
    std::vector<std::span<const float>> Q;
    std::vector<double> u;
    for (int i = 0; i < n; ++i) {
      Q.push_back(q_row(i));
      u.push_back(keyed_uniform(seed, first_pos + i, kAcceptStream));
    }
    const BlockVerdict v = verify_block(P, Q, drafts, u, keyed_uniform(seed, first_pos + n, kResidualStream));
    // Emitted through the sampler so logprobs come from the same distributions.
    for (int i = 0; i <= v.accepted; ++i) {
      const int32_t pick = i < v.accepted ? drafts[size_t(i)] : v.bonus;
      take(sampler.sample_choosing(row(i), [pick](std::span<const double>) { return pick; }, top_logprobs, mode));
      if (ends(pick)) break;
    }
    out.accepted = int(out.tokens.size()) - 1;
    return out;
  }

  // Token-level rejection sampling, one row at a time.
  for (int i = 0; i <= n; ++i) {
    bool rejected = false;
    const int64_t pos = first_pos + i;
    auto choose = [&](std::span<const double> P) -> int32_t {
      if (i == n) return draw_from(P, keyed_uniform(seed, pos, kResidualStream));
      const TokenVerdict t = verify_token(P, q_row(i), drafts[size_t(i)], keyed_uniform(seed, pos, kAcceptStream),
                                          keyed_uniform(seed, pos, kResidualStream));
      rejected = !t.accepted;
      return t.token;
    };
    take(sampler.sample_choosing(row(i), choose, top_logprobs, mode));
    if (rejected || i == n || ends(out.tokens.back().id)) break;
    // A constrained sampler with nothing allowed returns its fallback without choosing.
    if (out.tokens.back().id != drafts[size_t(i)]) break;
  }
  out.accepted = int(out.tokens.size()) - 1;
  return out;
}

namespace {
Status check_method(const SpeculativeConfig& config, const DrafterConfig& d) {
  if (config.method == SpecMethod::DSpark && !d.sample_from_anchor)
    return make_error("--speculative-config: method dspark needs a drafter whose rows all emit (sample_from_anchor); " +
                      d.source + " is a DFlash drafter: use method dflash");
  if (config.method == SpecMethod::DFlash && d.sample_from_anchor)
    return make_error("--speculative-config: method dflash needs a drafter whose mask rows emit; " + d.source +
                      " samples from the anchor (a DSpark drafter): use method dspark");
  if (config.num_speculative_tokens > d.drafts_per_block())
    return make_error("--speculative-config: num_speculative_tokens " + std::to_string(config.num_speculative_tokens) +
                      " exceeds the drafter's block (" + std::to_string(d.drafts_per_block()) + " drafts)");
  return Status::Ok();
}
}  // namespace

Status prepare_speculation(const SpeculativeConfig& config, const std::string& target_dir, EngineOptions* engine) {
  if (!config.enabled) return Status::Ok();
  MUSE_ASSIGN_OR_RETURN(ModelConfig target, load_model_config(target_dir));
  MUSE_ASSIGN_OR_RETURN(DrafterConfig d, load_drafter_config(config.model, target));
  MUSE_RETURN_IF_ERROR(check_method(config, d));
  engine->tap_layers = d.target_layer_ids;
  engine->tap_final = d.final_hidden_state;
  engine->record_experts = true;  // the MoE-aware verify width (verify_width.h); no effect on dense targets
  return Status::Ok();
}

Result<std::shared_ptr<const Drafter>> load_drafter(const SpeculativeConfig& config, const Engine& engine) {
  MUSE_ASSIGN_OR_RETURN(DrafterConfig d, load_drafter_config(config.model, engine.config()));
  MUSE_RETURN_IF_ERROR(check_method(config, d));
  MUSE_ASSIGN_OR_RETURN(std::vector<float> embed, engine.read_weight_f32("embed_tokens"));
  MUSE_ASSIGN_OR_RETURN(std::vector<float> lm_head, engine.read_weight_f32("lm_head"));
  MUSE_ASSIGN_OR_RETURN(std::unique_ptr<Drafter> drafter,
                        Drafter::load(config.model, engine.config(), std::move(embed), std::move(lm_head)));
  return std::shared_ptr<const Drafter>(std::move(drafter));
}

}  // namespace muse
