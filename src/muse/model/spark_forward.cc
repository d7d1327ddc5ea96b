// One Muse Spark Open decoder layer (muse-architecture.md §3.2): an fp32
// residual stream s updated through per-channel gates (α, β folded at
// load), weightless and input-scale norms, and the latent MoE with a
// sigmoid router whose bias only selects.
#include "muse/model/muse_model_impl.h"

namespace muse {

void MuseModel::spark_layer(const Step& s, int64_t l, const KvLayerStorage& kv) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[size_t(l)];
  Backend& b = backend_;
  const float eps = float(c.rms_norm_eps), post_eps = float(c.post_norm_eps);
  // 1-3: x = rms(s)·(1+w_in); a = attention(x) with the per-head output
  // norm; s ← α_att ⊙ s + β_att ⊙ rms_1e-8(a) (weightless).
  // (After layer 0 the previous layer's last op wrote x.)
  if (l == 0) b.rms_norm(s.h, s.x, w.norm_input, NormGain::After, eps);
  attention_block(s, l, kv);
  // 4: h = rms(s)·(1+w_preffn), in the same op as step 3's update
  b.residual_norm_then_norm(s.x, s.a, Tensor{}, NormGain::None, w.attn_alpha, w.attn_beta, post_eps,
                            {s.h, w.norm_pre_ffn, NormGain::After, eps});
  if (c.is_sparse(l)) {
    // 5: router on h: p = σ(h·Wᵀ·output_multiplier), top-k by p + bias.
    // A side branch: it reads only h, and only the experts read its ids and
    // weights, so a backend may run it beside step 6 (CUDA: ~20 µs of
    // latency-bound fp32 warp dots off the critical path of every sparse
    // layer at decode).
    b.begin_side();
    b.matmul(s.router_logits, s.h, w.router);
    b.moe_route(s.expert_ids, s.expert_weights, s.router_logits, w.router_bias, float(c.output_multiplier),
                float(c.routed_scaling_factor));
    b.end_side();
    // 6: ũ = rms(h·W_preᵀ)·(1+w_preexp)
    b.matmul(s.latent, s.h, w.pre_expert_proj);
    b.rms_norm(s.latent, s.latent, w.pre_expert_norm, NormGain::After, eps);
    b.join_side();
    // 7-8: m = Σ_k w_k · rms_1e-8(down_e(silu(γ) ⊙ υ) ⊙ (1+w_postexp)); f = m·W_postᵀ
    // Expert parallelism: each rank runs the slots routed to its experts and
    // the parts are summed at the latent width, before the (replicated)
    // unpooler: half the traffic of a reduction at the hidden width.
    b.moe_experts(s.moe_out, s.latent, w.experts_gate_up, w.experts_down, w.post_expert_norm, s.expert_ids,
                  s.expert_weights, post_eps, comm_ ? widths_.expert_begin : -1);
    reduce(s.moe_out);
    b.matmul(s.a, s.moe_out, w.post_expert_proj);
  } else {
    dense_mlp(s, w);
  }
  // 9: s ← α_ffn ⊙ s + β_ffn ⊙ rms_1e-8(f ⊙ (1+w_postffn)) (input-scale),
  // and the next layer's step 1
  if (l + 1 < c.num_layers)
    b.residual_norm_then_norm(s.x, s.a, w.norm_post_ffn, NormGain::Before, w.ffn_alpha, w.ffn_beta, post_eps,
                              {s.h, weights_.layers[size_t(l + 1)].norm_input, NormGain::After, eps});
  else
    b.residual_norm(s.x, s.a, w.norm_post_ffn, NormGain::Before, w.ffn_alpha, w.ffn_beta, post_eps);
}

}  // namespace muse
