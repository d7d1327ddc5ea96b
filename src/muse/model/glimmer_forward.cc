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
  // h = rms(x)·(1+w_in); a = attention(h); x += rms_1e-8(a)·(1+w_postattn)
  b.rms_norm(s.h, s.x, w.norm_input, NormGain::After, eps);
  attention_block(s, l, kv);
  b.residual_norm(s.x, s.a, w.norm_post_attn, NormGain::After, Tensor{}, Tensor{}, post_eps);
  // h = rms(x)·(1+w_preffn); f = mlp(h); x += rms_1e-8(f)·(1+w_postffn)
  b.rms_norm(s.h, s.x, w.norm_pre_ffn, NormGain::After, eps);
  dense_mlp(s, w);
  b.residual_norm(s.x, s.a, w.norm_post_ffn, NormGain::After, Tensor{}, Tensor{}, post_eps);
}

}  // namespace muse
