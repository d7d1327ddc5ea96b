// One Muse Glimmer decoder layer (muse-architecture.md §3.1; transformers
// MuseGlimmerTextDecoderLayer): sandwich norms around attention and a dense
// SwiGLU, residual adds in fp32.
#include "muse/model/muse_model_impl.h"

namespace muse {

void MuseModel::glimmer_layer(const Step& s, int64_t l, const KvLayerStorage& kv) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[size_t(l)];
  Backend& b = backend_;
  const float eps = float(c.rms_norm_eps), post_eps = float(c.post_norm_eps);
  // h = rms(x)·(1+w_in) (after layer 0 the previous layer's last op wrote
  // it); a = attention(h); x += rms_1e-8(a)·(1+w_postattn)
  if (l == 0) b.rms_norm(s.h, s.x, w.norm_input, NormGain::After, eps);
  attention_block(s, l, kv);
  // ... and h = rms(x)·(1+w_preffn), in the same op; f = mlp(h)
  b.residual_norm_then_norm(s.x, s.a, w.norm_post_attn, NormGain::After, Tensor{}, Tensor{}, post_eps,
                            {s.h, w.norm_pre_ffn, NormGain::After, eps});
  dense_mlp(s, w);
  // x += rms_1e-8(f)·(1+w_postffn), and the next layer's h
  if (l + 1 < c.num_layers)
    b.residual_norm_then_norm(s.x, s.a, w.norm_post_ffn, NormGain::After, Tensor{}, Tensor{}, post_eps,
                              {s.h, weights_.layers[size_t(l + 1)].norm_input, NormGain::After, eps});
  else
    b.residual_norm(s.x, s.a, w.norm_post_ffn, NormGain::After, Tensor{}, Tensor{}, post_eps);
}

}  // namespace muse
