#include "muse/speculative/drafter.h"

#include <cmath>
#include <cstring>
#include <limits>

#include "muse/backends/cpu/kernels.h"
#include "muse/core/dtype.h"
#include "muse/core/json.h"
#include "muse/core/mapped_file.h"
#include "muse/loading/safetensors.h"
#include "muse/speculative/keyed_random.h"

namespace muse {

namespace {

// Fixed-order dot product: eight lanes, folded pairwise (vectorizes, and the
// order never depends on anything but n).
float dot(const float* a, const float* b, int64_t n) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t j = 0;
  for (; j + 8 <= n; j += 8)
    for (int l = 0; l < 8; ++l) acc[l] += a[j + l] * b[j + l];
  float tail = 0;
  for (; j < n; ++j) tail += a[j] * b[j];
  return ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7])) + tail;
}

// A weight matrix [out, in]: BF16 when every value is one (the drafter is
// read once per block, so halving its bytes halves most of its time), F32
// otherwise, so nothing is ever rounded.
struct Mat {
  std::vector<uint16_t> bf16;
  std::vector<float> f32;
  static Mat of(std::vector<float> v) {
    Mat m;
    bool exact = true;
    for (float x : v) exact &= round_bf16(x) == x || std::isnan(x);
    if (!exact) {
      m.f32 = std::move(v);
      return m;
    }
    m.bf16.resize(v.size());
    for (size_t i = 0; i < v.size(); ++i) m.bf16[i] = f32_to_bf16(v[i]);
    return m;
  }
};

// out[r, o] = x[r, :] · W[o, :] for the first out_dim rows of W [·, in]:
// the CPU backend's matmul kernels (the host's widest ISA; one fixed
// summation order per element, whatever the row count), single-threaded.
void linear(const float* x, int64_t rows, int64_t in, const Mat& W, int64_t out_dim, float* out) {
  if (!W.bf16.empty()) cpu::best_kernels().matmul_bf16(x, in, rows, W.bf16.data(), in, out_dim, in, out, out_dim);
  else cpu::best_kernels().matmul_f32(x, in, rows, W.f32.data(), in, out_dim, in, out, out_dim);
}

// y = x · rsqrt(mean(x²) + eps) ⊙ w (absolute gain, the Qwen3/DeepSpec RMSNorm).
void rms(float* y, const float* x, int64_t n, const float* w, float eps) {
  const float ms = dot(x, x, n) / float(n);
  const float r = 1.0f / std::sqrt(ms + eps);
  for (int64_t i = 0; i < n; ++i) y[i] = x[i] * r * w[i];
}

// Rotate-half RoPE on one head of d values at `pos`.
void rope(float* x, int64_t d, int64_t pos, const std::vector<float>& inv_freq) {
  const int64_t half = d / 2;
  for (int64_t i = 0; i < half; ++i) {
    const float ang = float(pos) * inv_freq[size_t(i)];
    const float c = std::cos(ang), s = std::sin(ang);
    const float a = x[i], b = x[i + half];
    x[i] = a * c - b * s;
    x[i + half] = b * c + a * s;
  }
}

float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

Result<int64_t> get_int(const Json& j, const std::string& src, const char* key, int64_t lo, int64_t hi) {
  const Json* v = j.find(key);
  if (!v || !v->is_int()) return make_error(src + ": " + key + " must be an integer");
  if (v->as_int() < lo || v->as_int() > hi)
    return make_error(src + ": " + key + " = " + std::to_string(v->as_int()) + " is outside [" + std::to_string(lo) +
                      ", " + std::to_string(hi) + "]");
  return v->as_int();
}

}  // namespace

struct Drafter::Weights {
  struct Layer {
    std::vector<float> in_norm, post_norm, q_norm, k_norm;
    Mat q, k, v, o, gate, up, down;
  };
  std::vector<float> hidden_norm, norm, w1, conf_w;
  Mat fc, w2;
  float conf_b = 0;
  std::vector<Layer> layers;
  std::vector<float> embed;  // the target's, [vocab, hidden] (rows looked up)
  Mat lm_head;               // the target's
  std::vector<float> inv_freq;
};

Result<DrafterConfig> load_drafter_config(const std::string& dir, const ModelConfig& target) {
  DrafterConfig c;
  c.source = dir + "/config.json";
  MUSE_ASSIGN_OR_RETURN(std::string text, read_file(c.source));
  auto parsed = Json::parse(text);
  if (!parsed.ok()) return make_error(c.source + ": " + parsed.message());
  const Json& j = *parsed;
  if (!j.is_object()) return make_error(c.source + ": the top level must be a JSON object");
  const std::string& s = c.source;
  c.model_type = j.get_string("model_type", "");
  MUSE_ASSIGN_OR_RETURN(c.hidden, get_int(j, s, "hidden_size", 1, 1 << 17));
  MUSE_ASSIGN_OR_RETURN(c.layers, get_int(j, s, "num_hidden_layers", 1, 64));
  MUSE_ASSIGN_OR_RETURN(c.heads, get_int(j, s, "num_attention_heads", 1, 1024));
  MUSE_ASSIGN_OR_RETURN(c.kv_heads, get_int(j, s, "num_key_value_heads", 1, 1024));
  MUSE_ASSIGN_OR_RETURN(c.intermediate, get_int(j, s, "intermediate_size", 1, 1 << 20));
  MUSE_ASSIGN_OR_RETURN(c.block_size, get_int(j, s, "block_size", 2, 64));
  c.head_dim = j.get_int("head_dim", c.hidden / c.heads);
  if (c.head_dim < 2 || c.head_dim % 2 || c.heads % c.kv_heads) return make_error(s + ": unusable head shape");
  c.sliding_window = j.get_int("sliding_window", 0);
  if (c.sliding_window < 0) return make_error(s + ": sliding_window must not be negative");
  // transformers' MuseGlimmerAssistantModel: an inclusive window (see window_reach).
  const bool glimmer_assistant = c.model_type == "muse_glimmer_assistant";
  c.window_reach = glimmer_assistant ? c.sliding_window : std::max<int64_t>(c.sliding_window - 1, 0);
  // layer_types: absent means every layer is windowed when there is a window
  // (the assistant config's default), none when there is not.
  if (const Json* types = j.find("layer_types")) {
    if (!types->is_array() || int64_t(types->size()) != c.layers)
      return make_error(s + ": layer_types must list num_hidden_layers entries");
    for (const Json& t : types->as_array()) {
      const std::string name = t.is_string() ? t.as_string() : t.dump();
      if (name != "sliding_attention" && name != "full_attention")
        return make_error(s + ": layer_types entry " + name + " is not sliding_attention or full_attention");
      if (name == "sliding_attention" && c.sliding_window < 1)
        return make_error(s + ": layer_types has sliding_attention layers but no sliding_window");
      c.windowed_layers.push_back(name == "sliding_attention");
    }
  } else {
    c.windowed_layers.assign(size_t(c.layers), c.sliding_window > 0);
  }
  const Json* ids = j.find("target_layer_ids");
  if (!ids) ids = j.find("aux_hidden_state_layer_ids");
  if (!ids || !ids->is_array() || ids->size() == 0) return make_error(s + ": target_layer_ids must be a non-empty list");
  for (const Json& e : ids->as_array()) {
    if (!e.is_int() || e.as_int() < 0 || e.as_int() >= target.num_layers)
      return make_error(s + ": target_layer_ids entry " + e.dump() + " is not a layer of the target (0.." +
                        std::to_string(target.num_layers - 1) + ")");
    c.target_layer_ids.push_back(int(e.as_int()));
  }
  c.final_hidden_state = j.get_bool("final_hidden_state_tapped", false);
  c.target_hidden = j.get_int("target_hidden_size", target.hidden_size);
  if (c.target_hidden != target.hidden_size)
    return make_error(s + ": target_hidden_size " + std::to_string(c.target_hidden) + " is not the target's " +
                      std::to_string(target.hidden_size));
  c.markov_rank = j.get_int("markov_rank", 0);
  if (j.get_string("markov_head_type", "vanilla") != "vanilla" && c.markov_rank > 0)
    return make_error(s + ": markov_head_type \"" + j.get_string("markov_head_type", "") +
                      "\" is not supported yet (vanilla only)");
  c.confidence_head = j.get_bool("enable_confidence_head", false);
  c.confidence_with_markov = j.get_bool("confidence_head_with_markov", c.markov_rank > 0);
  c.rms_norm_eps = j.get_double("rms_norm_eps", 1e-6);
  // transformers 5 writes rope_parameters.rope_theta (and the assistant's
  // class default is 500000); older configs a top-level rope_theta.
  c.rope_theta = j.get_double("rope_theta", glimmer_assistant ? 500000.0 : 10000.0);
  if (const Json* rope = j.find("rope_parameters"); rope && rope->is_object()) {
    const std::string type = rope->get_string("rope_type", "default");
    if (type != "default") return make_error(s + ": rope_parameters.rope_type \"" + type + "\" is not supported");
    c.rope_theta = rope->get_double("rope_theta", c.rope_theta);
  }
  if (!(c.rope_theta > 0)) return make_error(s + ": rope_theta must be positive");
  c.vocab = j.get_int("vocab_size", target.vocab_size);
  if (c.vocab != target.vocab_size)
    return make_error(s + ": vocab_size " + std::to_string(c.vocab) + " is not the target's " +
                      std::to_string(target.vocab_size) + " (reduced draft vocabularies are not supported)");
  c.sampling_vocab = j.get_int("sampling_vocab_size", target.sampled_vocab_size > 0 ? target.sampled_vocab_size : c.vocab);
  MUSE_ASSIGN_OR_RETURN(int64_t mask, get_int(j, s, "mask_token_id", 0, c.vocab - 1));
  c.mask_token_id = int32_t(mask);
  c.sample_from_anchor = j.get_bool("sample_from_anchor", c.model_type.find("dspark") != std::string::npos);
  return c;
}

Drafter::~Drafter() = default;

Result<std::unique_ptr<Drafter>> Drafter::load(const std::string& dir, const ModelConfig& target,
                                               std::vector<float> embed, std::vector<float> lm_head) {
  MUSE_ASSIGN_OR_RETURN(DrafterConfig c, load_drafter_config(dir, target));
  MUSE_ASSIGN_OR_RETURN(SafetensorsFile f, SafetensorsFile::open(dir + "/model.safetensors"));
  auto read = [&f](const std::string& name, std::span<const int64_t> shape, std::vector<float>* out) -> Status {
    const TensorInfo* t = f.find(name);
    if (!t) return make_error(f.path() + ": missing tensor " + name);
    if (!std::equal(t->shape.begin(), t->shape.end(), shape.begin(), shape.end())) {
      std::string want, got;
      for (int64_t d : shape) want += (want.empty() ? "" : ", ") + std::to_string(d);
      for (int64_t d : t->shape) got += (got.empty() ? "" : ", ") + std::to_string(d);
      return make_error(f.path() + ": " + name + " has shape [" + got + "], expected [" + want + "]");
    }
    const int64_t n = t->numel();
    out->resize(size_t(n));
    const uint8_t* p = f.data(*t);
    if (t->dtype == DType::F32) {
      std::memcpy(out->data(), p, size_t(n) * 4);
    } else if (t->dtype == DType::BF16) {
      for (int64_t i = 0; i < n; ++i) {
        uint16_t h;
        std::memcpy(&h, p + 2 * i, 2);
        (*out)[size_t(i)] = bf16_to_f32(h);
      }
    } else {
      return make_error(f.path() + ": " + name + " must be F32 or BF16");
    }
    return Status::Ok();
  };
  return create(std::move(c), read, std::move(embed), std::move(lm_head));
}

Result<std::unique_ptr<Drafter>> Drafter::create(
    DrafterConfig c,
    const std::function<Status(const std::string&, std::span<const int64_t>, std::vector<float>*)>& read,
    std::vector<float> embed, std::vector<float> lm_head) {
  const int64_t H = c.hidden, V = c.vocab, r = c.markov_rank;
  if (int64_t(embed.size()) != V * c.target_hidden || int64_t(lm_head.size()) != V * c.target_hidden)
    return make_error("drafter: the target's embedding / lm_head must be [vocab, hidden]");
  if (c.target_hidden != H)
    return make_error(c.source + ": hidden_size " + std::to_string(H) + " differs from the target's " +
                      std::to_string(c.target_hidden) + " (the shared embedding and lm_head need them equal)");
  std::unique_ptr<Drafter> d(new Drafter());
  d->w_ = std::make_unique<Weights>();
  Weights& w = *d->w_;
  // The drafter's one name table: DeepSpec/HF names first, then the Muse
  // Glimmer assistant's spellings (dspark.md §2.1, §3a, §3d).
  auto get = [&](std::initializer_list<const char*> names, std::vector<int64_t> shape, std::vector<float>* out) -> Status {
    Status last = Status::Ok();
    for (const char* n : names) {
      last = read(n, shape, out);
      if (last.ok()) return last;
    }
    return last;
  };
  std::vector<float> tmp;
  auto mat = [&](Status st, Mat* m) -> Status {
    if (st.ok()) *m = Mat::of(std::move(tmp));
    return st;
  };
  MUSE_RETURN_IF_ERROR(mat(get({"fc.weight", "encoder.fc.weight"}, {H, c.tap_width()}, &tmp), &w.fc));
  MUSE_RETURN_IF_ERROR(get({"hidden_norm.weight", "encoder.output_norm_enc.weight"}, {H}, &w.hidden_norm));
  MUSE_RETURN_IF_ERROR(get({"norm.weight"}, {H}, &w.norm));
  const int64_t Q = c.q_dim(), KV = c.kv_dim(), D = c.head_dim, I = c.intermediate;
  for (int64_t l = 0; l < c.layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    Weights::Layer L;
    auto g = [&](const std::string& n, std::vector<int64_t> shape, std::vector<float>* out) {
      return read(p + n, shape, out);
    };
    MUSE_RETURN_IF_ERROR(g("input_layernorm.weight", {H}, &L.in_norm));
    MUSE_RETURN_IF_ERROR(g("post_attention_layernorm.weight", {H}, &L.post_norm));
    MUSE_RETURN_IF_ERROR(mat(g("self_attn.q_proj.weight", {Q, H}, &tmp), &L.q));
    MUSE_RETURN_IF_ERROR(mat(g("self_attn.k_proj.weight", {KV, H}, &tmp), &L.k));
    MUSE_RETURN_IF_ERROR(mat(g("self_attn.v_proj.weight", {KV, H}, &tmp), &L.v));
    MUSE_RETURN_IF_ERROR(mat(g("self_attn.o_proj.weight", {H, Q}, &tmp), &L.o));
    MUSE_RETURN_IF_ERROR(g("self_attn.q_norm.weight", {D}, &L.q_norm));
    MUSE_RETURN_IF_ERROR(g("self_attn.k_norm.weight", {D}, &L.k_norm));
    MUSE_RETURN_IF_ERROR(mat(g("mlp.gate_proj.weight", {I, H}, &tmp), &L.gate));
    MUSE_RETURN_IF_ERROR(mat(g("mlp.up_proj.weight", {I, H}, &tmp), &L.up));
    MUSE_RETURN_IF_ERROR(mat(g("mlp.down_proj.weight", {H, I}, &tmp), &L.down));
    w.layers.push_back(std::move(L));
  }
  if (r > 0) {
    MUSE_RETURN_IF_ERROR(get({"markov_head.markov_w1.weight"}, {V, r}, &w.w1));
    MUSE_RETURN_IF_ERROR(mat(get({"markov_head.markov_w2.weight"}, {V, r}, &tmp), &w.w2));
  }
  if (c.confidence_head) {
    const int64_t in = H + (c.confidence_with_markov ? r : 0);
    MUSE_RETURN_IF_ERROR(get({"confidence_head.proj.weight"}, {1, in}, &w.conf_w));
    std::vector<float> b;
    if (read("confidence_head.proj.bias", std::vector<int64_t>{1}, &b).ok()) w.conf_b = b[0];
  }
  w.embed = std::move(embed);
  w.lm_head = Mat::of(std::move(lm_head));
  // inv_freq_i = 1 / θ^(2i/d) in fp32, as the reference computes it.
  for (int64_t i = 0; i < D / 2; ++i)
    w.inv_freq.push_back(1.0f / std::pow(float(c.rope_theta), float(2 * i) / float(D)));
  d->c_ = std::move(c);
  return d;
}

DraftContext Drafter::new_context(int64_t max_positions) const {
  DraftContext ctx;
  // Row 0 (at the anchor a) reaches furthest back: a − window_reach. A layer
  // without a window reads everything, so then the ring is the sequence.
  const int64_t reach = c_.context_reach();
  ctx.slots = std::max<int64_t>(1, reach > 0 ? reach : max_positions);
  ctx.pos.assign(size_t(ctx.slots), -1);
  ctx.k.assign(size_t(c_.layers * ctx.slots * c_.kv_dim()), 0.0f);
  ctx.v.assign(size_t(c_.layers * ctx.slots * c_.kv_dim()), 0.0f);
  return ctx;
}

void Drafter::append_context(DraftContext& ctx, const float* taps, int64_t n, int64_t first_pos) const {
  const Weights& w = *w_;
  const int64_t H = c_.hidden, KV = c_.kv_dim(), D = c_.head_dim, W = c_.tap_width();
  const float eps = float(c_.rms_norm_eps);
  if (first_pos != ctx.next_pos) ctx.clear();
  if (n <= 0) return;
  // c_j = hidden_norm(fc · taps_j) for all n positions at once, the same
  // vector for every layer; then each layer's K (k_norm, RoPE) and V.
  std::vector<float> fused(static_cast<size_t>(n * H)), k(static_cast<size_t>(n * KV)), v(static_cast<size_t>(n * KV));
  linear(taps, n, W, w.fc, H, fused.data());
  for (int64_t t = 0; t < n; ++t) rms(fused.data() + t * H, fused.data() + t * H, H, w.hidden_norm.data(), eps);
  for (int64_t t = 0; t < n; ++t) ctx.pos[size_t((first_pos + t) % ctx.slots)] = first_pos + t;
  for (int64_t l = 0; l < c_.layers; ++l) {
    const Weights::Layer& L = w.layers[size_t(l)];
    linear(fused.data(), n, H, L.k, KV, k.data());
    linear(fused.data(), n, H, L.v, KV, v.data());
    for (int64_t t = 0; t < n; ++t) {
      const int64_t p = first_pos + t, slot = p % ctx.slots;
      float* kt = k.data() + t * KV;
      for (int64_t h = 0; h < c_.kv_heads; ++h) {
        rms(kt + h * D, kt + h * D, D, L.k_norm.data(), eps);
        rope(kt + h * D, D, p, w.inv_freq);
      }
      std::copy_n(kt, KV, ctx.k.data() + (l * ctx.slots + slot) * KV);
      std::copy_n(v.data() + t * KV, KV, ctx.v.data() + (l * ctx.slots + slot) * KV);
    }
  }
  ctx.next_pos = first_pos + n;
}

void Drafter::backbone(const DraftContext& ctx, int32_t anchor, int64_t a, std::vector<float>* h_out) const {
  const Weights& w = *w_;
  const int64_t K = c_.block_size, H = c_.hidden, Q = c_.q_dim(), KV = c_.kv_dim(), D = c_.head_dim;
  const int64_t I = c_.intermediate, rep = c_.heads / c_.kv_heads;
  const float eps = float(c_.rms_norm_eps), scale = 1.0f / std::sqrt(float(D));
  // The context slots in the ring, oldest first (a fixed order); each
  // windowed layer then keeps those within window_reach of the row.
  std::vector<int64_t> ctx_slots;
  for (int64_t p = std::max<int64_t>(0, a - ctx.slots); p < a; ++p) {
    const int64_t slot = p % ctx.slots;
    if (ctx.pos[size_t(slot)] == p) ctx_slots.push_back(slot);
  }
  std::vector<float>& h = *h_out;
  h.assign(size_t(K * H), 0.0f);
  std::vector<float> x(size_t(K * H)), q(size_t(K * Q)), kb(size_t(K * KV)), vb(size_t(K * KV));
  std::vector<float> o(size_t(K * Q)), t(size_t(K * H)), gate(size_t(K * I)), up(size_t(K * I));
  std::vector<float> scores(ctx_slots.size() + size_t(K));
  // Block [anchor, MASK×(k−1)]: raw rows of the target's embedding (no embedding norm).
  for (int64_t i = 0; i < K; ++i) {
    const int32_t id = i == 0 ? anchor : c_.mask_token_id;
    std::copy_n(w.embed.data() + int64_t(id) * H, H, x.data() + i * H);
  }
  for (const Weights::Layer& L : w.layers) {
    const int64_t li = &L - w.layers.data();
    const int64_t reach = c_.windowed_layers[size_t(li)] ? c_.window_reach : std::numeric_limits<int64_t>::max();
    for (int64_t i = 0; i < K; ++i) rms(h.data() + i * H, x.data() + i * H, H, L.in_norm.data(), eps);
    linear(h.data(), K, H, L.q, Q, q.data());
    linear(h.data(), K, H, L.k, KV, kb.data());
    linear(h.data(), K, H, L.v, KV, vb.data());
    for (int64_t i = 0; i < K; ++i) {
      for (int64_t hh = 0; hh < c_.heads; ++hh) {
        float* qh = q.data() + i * Q + hh * D;
        rms(qh, qh, D, L.q_norm.data(), eps);
        rope(qh, D, a + i, w.inv_freq);
      }
      for (int64_t hh = 0; hh < c_.kv_heads; ++hh) {
        float* kh = kb.data() + i * KV + hh * D;
        rms(kh, kh, D, L.k_norm.data(), eps);
        rope(kh, D, a + i, w.inv_freq);
      }
    }
    const float* ck = ctx.k.data() + li * ctx.slots * KV;
    const float* cv = ctx.v.data() + li * ctx.slots * KV;
    for (int64_t i = 0; i < K; ++i) {
      for (int64_t hh = 0; hh < c_.heads; ++hh) {
        const int64_t g = hh / rep;
        const float* qh = q.data() + i * Q + hh * D;
        // Keys: the visible context, then every block row (no causal mask in the block).
        size_t n = 0;
        float mx = -std::numeric_limits<float>::infinity();
        std::vector<const float*> vals;
        vals.reserve(ctx_slots.size() + size_t(K));
        for (int64_t slot : ctx_slots) {
          if ((a + i) - ctx.pos[size_t(slot)] > reach) continue;
          scores[n] = dot(qh, ck + slot * KV + g * D, D) * scale;
          vals.push_back(cv + slot * KV + g * D);
          mx = std::max(mx, scores[n++]);
        }
        for (int64_t j = 0; j < K; ++j) {
          scores[n] = dot(qh, kb.data() + j * KV + g * D, D) * scale;
          vals.push_back(vb.data() + j * KV + g * D);
          mx = std::max(mx, scores[n++]);
        }
        float sum = 0;
        for (size_t s = 0; s < n; ++s) sum += (scores[s] = std::exp(scores[s] - mx));
        float* oh = o.data() + i * Q + hh * D;
        std::fill_n(oh, D, 0.0f);
        for (size_t s = 0; s < n; ++s) {
          const float p = scores[s] / sum;
          for (int64_t e = 0; e < D; ++e) oh[e] += p * vals[s][e];
        }
      }
    }
    linear(o.data(), K, Q, L.o, H, t.data());
    for (int64_t e = 0; e < K * H; ++e) x[size_t(e)] += t[size_t(e)];
    for (int64_t i = 0; i < K; ++i) rms(h.data() + i * H, x.data() + i * H, H, L.post_norm.data(), eps);
    linear(h.data(), K, H, L.gate, I, gate.data());
    linear(h.data(), K, H, L.up, I, up.data());
    for (int64_t e = 0; e < K * I; ++e) {
      const float gv = gate[size_t(e)];
      gate[size_t(e)] = gv / (1.0f + std::exp(-gv)) * up[size_t(e)];
    }
    linear(gate.data(), K, I, L.down, H, t.data());
    for (int64_t e = 0; e < K * H; ++e) x[size_t(e)] += t[size_t(e)];
  }
  for (int64_t i = 0; i < K; ++i) rms(h.data() + i * H, x.data() + i * H, H, w.norm.data(), eps);
}

void Drafter::base_logits(const DraftContext& ctx, int32_t anchor, int64_t a, std::vector<float>* out) const {
  std::vector<float> h;
  backbone(ctx, anchor, a, &h);
  const int64_t n_drafts = c_.drafts_per_block(), first_row = c_.block_size - n_drafts;
  out->assign(size_t(n_drafts * c_.sampling_vocab), 0.0f);
  linear(h.data() + first_row * c_.hidden, n_drafts, c_.hidden, w_->lm_head, c_.sampling_vocab, out->data());
}

void Drafter::draft(const DraftContext& ctx, int32_t anchor, int64_t a, const DraftSampling& smp, DraftBlock* out) const {
  const Weights& w = *w_;
  const int64_t H = c_.hidden;
  std::vector<float> h;
  backbone(ctx, anchor, a, &h);

  // Heads, serially over the emitting rows: z_i = lm_head(h_i) + W2·W1[x_{i−1}],
  // confidence σ(w·[h_i; W1[x_{i−1}]] + b), then draw x_i.
  const int64_t n_drafts = c_.drafts_per_block(), first_row = c_.block_size - n_drafts, SV = c_.sampling_vocab;
  const int64_t r = c_.markov_rank;
  out->anchor_pos = a;
  out->tokens.assign(size_t(n_drafts), 0);
  out->confidence.assign(size_t(n_drafts), 1.0f);
  if (smp.probabilistic) out->q.assign(size_t(n_drafts * SV), 0.0f);
  else out->q.clear();
  std::vector<float> feat(static_cast<size_t>(H + r)), bias(static_cast<size_t>(SV));
  // U = lm_head(h) for every emitting row at once; the Markov bias per row.
  std::vector<float> U(static_cast<size_t>(n_drafts * SV));
  linear(h.data() + first_row * H, n_drafts, H, w.lm_head, SV, U.data());
  int32_t prev = anchor;
  for (int64_t d = 0; d < n_drafts; ++d) {
    const float* hr = h.data() + (first_row + d) * H;
    const float* e = r > 0 ? w.w1.data() + int64_t(prev) * r : nullptr;
    std::span<float> z(U.data() + d * SV, size_t(SV));
    if (e) {
      linear(e, 1, r, w.w2, SV, bias.data());
      for (int64_t v = 0; v < SV; ++v) z[size_t(v)] += bias[size_t(v)];
    }
    if (c_.confidence_head) {
      std::copy_n(hr, H, feat.data());
      const int64_t in = H + (c_.confidence_with_markov ? r : 0);
      if (c_.confidence_with_markov && e) std::copy_n(e, r, feat.data() + H);
      out->confidence[size_t(d)] = sigmoid(dot(feat.data(), w.conf_w.data(), in) + w.conf_b);
    }
    int32_t pick = 0;
    if (!smp.probabilistic) {
      for (int64_t v = 1; v < SV; ++v)
        if (z[size_t(v)] > z[size_t(pick)]) pick = int32_t(v);  // ties to the lower id
    } else {
      float* qd = out->q.data() + d * SV;
      draft_distribution(z, smp.temperature, smp.top_k, smp.top_p, std::span<float>(qd, size_t(SV)));
      pick = draw_from(std::span<const float>(qd, size_t(SV)), keyed_uniform(smp.seed, a + 1 + d, kDraftStream));
    }
    out->tokens[size_t(d)] = pick;
    prev = pick;
  }
}

}  // namespace muse
