// MuseModel: weights, activation buffers, and the parts of a step both
// decoders share (embedding, attention, dense MLP, head).
#include "muse/model/muse_model.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <cstring>

#include "muse/core/log.h"
#include "muse/model/muse_model_impl.h"
#include "muse/parallel/communicator.h"

namespace muse {

Result<std::unique_ptr<MuseModel>> MuseModel::create(Backend& backend, const ModelConfig& config,
                                                     const WeightSource& source, const ModelOptions& options) {
  if (config.num_layers < 1 || config.hidden_size < 1 || config.head_dim < 2 || config.head_dim % 2 ||
      config.num_kv_heads < 1 || config.num_heads % config.num_kv_heads)
    return make_error("model config: unusable decoder shape");
  if (int64_t(config.layer_types.size()) != config.num_layers ||
      int64_t(config.layer_rope_theta.size()) != config.num_layers)
    return make_error("model config: layer_types / layer_rope_theta must list every layer");
  const StepPlanCapacity& cap = options.plan;
  if (cap.max_rows < 1 || cap.max_seqs < 1 || cap.max_logit_rows < 1 || cap.max_blocks < 1 || options.kv_block_size < 1)
    return make_error("model options: step capacity must be at least 1 everywhere");
  std::unique_ptr<MuseModel> m(new MuseModel(backend, config));
  static std::atomic<uint64_t> instances{0};
  m->instance_ = ++instances;
  const ParallelRank& pr = options.weights.shard;
  if (pr.active()) {
    if (!options.comm || options.comm->size() != pr.size || options.comm->rank() != pr.rank)
      return make_error("model options: a parallel rank needs its group's communicator");
    MUSE_RETURN_IF_ERROR(check_parallel(config, ParallelOptions{pr.size, pr.expert_parallel}));
    m->parallel_ = pr;
    m->comm_ = options.comm;
  }
  m->widths_ = rank_widths(config, m->parallel_);
  MUSE_ASSIGN_OR_RETURN(m->weights_, upload_weights(backend, config, source, options.weights));
  MUSE_RETURN_IF_ERROR(m->allocate(options));
  return m;
}

MuseModel::~MuseModel() {
  for (auto& t : owned_) backend_.release(t);
  release_weights(backend_, weights_);
}

Status MuseModel::allocate(const ModelOptions& options) {
  const ModelConfig& c = config_;
  cap_ = options.plan;
  // This rank's widths (the whole model on one rank).
  const int64_t R = cap_.max_rows, L = cap_.max_logit_rows, H = c.hidden_size, Q = widths_.q_heads * c.head_dim,
                KV = widths_.kv_heads * c.head_dim, Vl = widths_.vocab;
  // Activations the model does not define as fp32 are stored in the
  // backend's activation dtype (F32 on the CPU, BF16 on the GPU); Spark's
  // residual stream, the router and the logits stay F32 everywhere.
  const DType act = backend_.activation_dtype();
  const DType stream = c.is_spark() ? DType::F32 : act;
  auto make = [&](Tensor& t, DType dt, std::initializer_list<int64_t> shape) -> Status {
    auto r = backend_.alloc(dt, shape);
    if (!r.ok()) return r.error();
    t = *r;
    owned_.push_back(t);
    return Status::Ok();
  };
  int64_t ffn = 0;  // widest dense MLP
  bool sparse = false;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    if (c.is_sparse(l)) sparse = true;
    else ffn = widths_.intermediate;
  }
  Tensor plan_buffer;
  MUSE_RETURN_IF_ERROR(make(plan_buffer, DType::I32, {StepPlanLayout::for_capacity(cap_).total}));
  plan_ = StepPlanView::over(plan_buffer, cap_, c.sliding_window, options.kv_block_size);
  MUSE_RETURN_IF_ERROR(make(buf_.cos, DType::F32, {R, c.head_dim / 2}));
  MUSE_RETURN_IF_ERROR(make(buf_.sin, DType::F32, {R, c.head_dim / 2}));
  MUSE_RETURN_IF_ERROR(make(buf_.x, stream, {R, H}));
  MUSE_RETURN_IF_ERROR(make(buf_.h, act, {R, H}));
  MUSE_RETURN_IF_ERROR(make(buf_.q, act, {R, Q}));
  MUSE_RETURN_IF_ERROR(make(buf_.k, act, {R, KV}));
  MUSE_RETURN_IF_ERROR(make(buf_.v, act, {R, KV}));
  MUSE_RETURN_IF_ERROR(make(buf_.g, act, {R, Q}));
  MUSE_RETURN_IF_ERROR(make(buf_.o, act, {R, Q}));
  MUSE_RETURN_IF_ERROR(make(buf_.a, act, {R, H}));
  if (ffn > 0) {
    MUSE_RETURN_IF_ERROR(make(buf_.mlp_gate, act, {R, ffn}));
    MUSE_RETURN_IF_ERROR(make(buf_.mlp_up, act, {R, ffn}));
  }
  if (sparse) {
    const int64_t E = c.num_experts, K = c.num_experts_per_tok, Hm = c.moe_hidden_size;
    MUSE_RETURN_IF_ERROR(make(buf_.router_logits, DType::F32, {R, E}));
    MUSE_RETURN_IF_ERROR(make(buf_.expert_ids, DType::I32, {R, K}));
    MUSE_RETURN_IF_ERROR(make(buf_.expert_weights, DType::F32, {R, K}));
    MUSE_RETURN_IF_ERROR(make(buf_.latent, act, {R, Hm}));
    MUSE_RETURN_IF_ERROR(make(buf_.moe_out, act, {R, Hm}));
  }
  MUSE_RETURN_IF_ERROR(make(buf_.head_in, stream, {L, H}));  // rows of x
  MUSE_RETURN_IF_ERROR(make(buf_.logits, DType::F32, {L, Vl}));
  if (!parallel_.active()) {
    const int64_t spec_bytes = int64_t(sizeof(RowSampleHeader)) + L * int64_t(sizeof(RowSampleSpec)) +
                               kMaxSampleEdits * int64_t(sizeof(RowEdit) + sizeof(float));
    MUSE_RETURN_IF_ERROR(make(buf_.sample_specs, DType::U8, {spec_bytes}));
    MUSE_RETURN_IF_ERROR(make(buf_.sample_results, DType::U8, {L * int64_t(sizeof(RowSampleResult))}));
  }
  if (parallel_.active()) {
    MUSE_RETURN_IF_ERROR(make(buf_.gathered_logits, DType::F32, {parallel_.size * L * Vl}));
    gathered_host_.assign(size_t(parallel_.size * L * Vl), 0.0f);
  }
  for (int l : options.tap_layers)
    if (l < 0 || l >= c.num_layers) return make_error("model options: tap layer " + std::to_string(l) + " does not exist");
  zero_ids_.assign(size_t(R), 0);
  tap_layers_ = options.tap_layers;
  tap_final_ = options.tap_final;
  record_experts_ = options.record_experts && sparse;
  for (int64_t l = 0; l < c.num_layers; ++l) sparse_index_.push_back(c.is_sparse(l) ? sparse_layers_++ : -1);
  if (num_taps() > 0) {
    MUSE_RETURN_IF_ERROR(make(tap_index_, DType::I32, {R}));
    std::vector<int32_t> iota(static_cast<size_t>(R));
    for (int64_t i = 0; i < R; ++i) iota[size_t(i)] = int32_t(i);
    backend_.set_input(tap_index_, iota.data(), iota.size() * sizeof(int32_t));
    MUSE_RETURN_IF_ERROR(backend_.execute());
  }
  if (record_experts_) {
    MUSE_RETURN_IF_ERROR(make(routed_, DType::I32, {sparse_layers_ * R, c.num_experts_per_tok}));
    routed_host_.assign(size_t(sparse_layers_ * R * c.num_experts_per_tok), 0);
  }
  if (num_taps() > 0) {
    if (stream != DType::F32) return make_error("hidden-state taps need an fp32 residual stream on this backend");
    for (int64_t t = 0; t < num_taps(); ++t) {
      Tensor tap;
      MUSE_RETURN_IF_ERROR(make(tap, stream, {R, H}));
      taps_.push_back(tap);
    }
  }
  return Status::Ok();
}

Status MuseModel::forward(const StepPlanBuilder& plan, std::span<const KvLayerStorage> kv, float* logits, float* taps,
                          const StepSampling* sampling) {
  const ModelConfig& c = config_;
  const int64_t T = plan.rows(), R = plan.logit_rows();
  if (T < 1 || T > cap_.max_rows) return make_error("step of " + std::to_string(T) + " rows (1.." + std::to_string(cap_.max_rows) + ")");
  if (plan.layout().total != plan_.layout.total) return make_error("step plan built for another capacity");
  if (int64_t(kv.size()) != c.num_layers) return make_error("step input: one KV storage per layer expected");
  if (R > 0 && !logits && !parallel_.active()) return make_error("step input: logits wanted but no output buffer");
  const int64_t sampled = sampling ? sampling->rows : 0;
  if (sampled > 0 && (parallel_.active() || sampled > R || sampling->edits > kMaxSampleEdits || !sampling->results ||
                      sampling->buffer.size() > buf_.sample_specs.bytes()))
    return make_error("step input: " + std::to_string(sampled) + " sampled rows (of " + std::to_string(R) +
                      " logit rows) with " + std::to_string(sampling->edits) + " edits do not fit this step");

  // A decode-like step runs its layers and head as a recorded region: its
  // key holds everything that decides those ops, and its key-length hint
  // is rounded up (an over-estimate only launches blocks that find no keys)
  // so that a decode keeps one recording for a while as its context grows.
  // A dense model's step also runs at the backend's padded row count
  // (Backend::graph_rows; CUDA: 17..24 rows as 24, 25..32 as 32, ...), so
  // a server's changing batch sizes share a few recordings; the padding
  // rows' results are not used and attention skips them (every other op
  // keeps rows independent, so their stale inputs touch no real row). A
  // MoE step keeps its row count: its padding rows would be grouped with
  // the real rows by expert and read more experts' weights.
  const bool recorded = !comm_ && plan.max_seq_rows() <= kGraphMaxSeqRows;
  const int64_t Tx = recorded && sparse_layers_ == 0 ? std::clamp(backend_.graph_rows(T), T, cap_.max_rows) : T;
  Step s;
  s.T = Tx;
  plan_.max_seq_rows = plan.max_seq_rows();  // launch hints for the ops
  plan_.max_seq_end = recorded ? coarse_seq_end(plan.max_seq_end()) : plan.max_seq_end();
  s.plan = &plan_;
  auto view = [Tx](const Tensor& t) { return t.empty() ? t : t.rows(0, Tx); };
  s.ids = plan_.tokens.rows(0, Tx), s.positions = plan_.positions.rows(0, Tx);
  s.cos = view(buf_.cos), s.sin = view(buf_.sin);
  s.x = view(buf_.x), s.h = view(buf_.h), s.q = view(buf_.q), s.k = view(buf_.k), s.v = view(buf_.v);
  s.g = view(buf_.g), s.o = view(buf_.o), s.a = view(buf_.a);
  s.mlp_gate = view(buf_.mlp_gate), s.mlp_up = view(buf_.mlp_up);
  s.router_logits = view(buf_.router_logits), s.expert_ids = view(buf_.expert_ids);
  s.expert_weights = view(buf_.expert_weights), s.latent = view(buf_.latent), s.moe_out = view(buf_.moe_out);

  Backend& b = backend_;
  // The whole step description goes up in one copy; every op reads it there.
  b.set_input(plan_.buffer, plan.data(), plan.upload_bytes());
  // Padding rows embed token 0 (the plan image holds whatever earlier steps left there).
  if (Tx > T) b.set_input(plan_.tokens.rows(T, Tx - T), zero_ids_.data(), size_t(Tx - T) * sizeof(int32_t));
  const Backend::GraphStats graphs_before = recorded ? b.graph_stats() : Backend::GraphStats{};
  if (recorded) b.begin_graph(graph_key(Tx, R, taps != nullptr, kv));
  bool any_rope = false;
  for (double theta : c.layer_rope_theta) any_rope |= theta != 0.0;
  // One RoPE table per step. The frequency base is the config's rope_theta;
  // layer_rope_theta only switches RoPE off (0 = NoPE), as in transformers.
  if (any_rope) b.rope_tables(s.cos, s.sin, s.positions, c.rope_theta, c.head_dim);

  // x = rms(E[t]) (weightless), both models.
  b.embed(s.x, weights_.embed, s.ids);
  b.rms_norm(s.x, s.x, Tensor{}, NormGain::None, float(c.rms_norm_eps));

  for (int64_t l = 0; l < c.num_layers; ++l) {
    // Recording, sparse layer i routes straight into rows i·Tx.. of routed_
    // (Tx == T: sparse steps are never padded), so no copy runs in the step
    // and one download after it takes every layer's ids.
    if (record_experts_ && sparse_index_[size_t(l)] >= 0)
      s.expert_ids = routed_.rows(sparse_index_[size_t(l)] * Tx, Tx);
    if (c.is_spark()) spark_layer(s, l, kv[size_t(l)]);
    else glimmer_layer(s, l, kv[size_t(l)]);
    // The device may start on the step while the host enqueues the other
    // layers (on the H200 the whole enqueue was ~0.2 ms of idle GPU a step).
    if (l == 0) b.flush();
    // A tap copies the residual stream after the layer (every row).
    for (size_t t = 0; taps && t < tap_layers_.size(); ++t)
      if (tap_layers_[t] == l) b.gather_rows(taps_[t].rows(0, Tx), s.x, tap_index_.rows(0, Tx));
  }
  if (taps && tap_final_)
    b.rms_norm(taps_.back().rows(0, Tx), s.x, weights_.final_norm, NormGain::After, float(c.rms_norm_eps));

  // Head on the requested rows only: rms(x)·w_norm (absolute), lm_head, softcap.
  if (R > 0) {
    Tensor rows = plan_.logit_rows.rows(0, R), head_in = buf_.head_in.rows(0, R), out = buf_.logits.rows(0, R);
    b.gather_rows(head_in, s.x, rows);
    b.rms_norm(head_in, head_in, weights_.final_norm, NormGain::After, float(c.rms_norm_eps));
    b.matmul(out, head_in, weights_.lm_head);
    b.softcap(out, float(c.output_multiplier), float(c.final_logit_softcapping));
    // Each rank holds a vocabulary shard of the logits: gather them all.
    if (comm_) b.all_gather(buf_.gathered_logits.rows(0, parallel_.size * R * widths_.vocab), out, *comm_);
  }
  if (recorded) b.end_graph();  // the sampler's inputs (their count varies by request) go up after it
  if (R > 0) {
    const Tensor out = buf_.logits.rows(0, R);
    if (sampled > 0) {
      b.set_input(buf_.sample_specs, sampling->buffer.data(), sampling->buffer.size());
      b.sample_rows(buf_.sample_results, out, buf_.sample_specs, sampled, sampling->edits);
    }
  }
  MUSE_RETURN_IF_ERROR(b.execute());
  if (const Backend::GraphStats now = recorded ? b.graph_stats() : graphs_before; now.captured > graphs_before.captured) {
    if (graphs_logged_ < 32) {
      ++graphs_logged_;
      LOG_INFO("graph: recorded the step of %lld rows (%lld logits, keys up to %lld) in %.1f ms; %lld held, %.2f s recording in all%s",
               (long long)Tx, (long long)R, (long long)plan_.max_seq_end,
               (now.capture_seconds - graphs_before.capture_seconds) * 1e3, (long long)now.live, now.capture_seconds,
               graphs_logged_ == 32 ? " (later recordings are logged at debug level)" : "");
    } else {
      LOG_DEBUG("graph: recorded the step of %lld rows; %lld held", (long long)Tx, (long long)now.live);
    }
  }
  const bool logits_down = sampled == 0 || sampling->logits_too;
  if (R > 0 && logits && !comm_ && logits_down) MUSE_RETURN_IF_ERROR(b.download(buf_.logits.rows(0, R), logits));
  if (sampled > 0)
    MUSE_RETURN_IF_ERROR(b.download(buf_.sample_results.rows(0, sampled * int64_t(sizeof(RowSampleResult))),
                                    sampling->results));
  if (R > 0 && logits && comm_) {
    // [rank][row][shard] -> [row][vocab]; the last shard's padding is dropped.
    const int64_t N = parallel_.size, Vl = widths_.vocab, V = c.vocab_size;
    MUSE_RETURN_IF_ERROR(b.download(buf_.gathered_logits.rows(0, N * R * Vl), gathered_host_.data()));
    for (int64_t r = 0; r < N; ++r) {
      const int64_t cols = std::min(Vl, V - r * Vl);
      for (int64_t i = 0; i < R && cols > 0; ++i)
        std::memcpy(logits + i * V + r * Vl, gathered_host_.data() + (r * R + i) * Vl, size_t(cols) * 4);
    }
  }
  // One synchronized copy for every sparse layer's ids (a copy a layer cost
  // each step a device round trip per sparse layer).
  if (record_experts_) MUSE_RETURN_IF_ERROR(b.download(routed_.rows(0, sparse_layers_ * T), routed_host_.data()));
  for (int64_t t = 0; taps && t < num_taps(); ++t)
    MUSE_RETURN_IF_ERROR(b.download(taps_[size_t(t)].rows(0, T), taps + t * T * c.hidden_size));
  return Status::Ok();
}

// Everything that decides a recorded step's ops besides the model itself
// (its weights, buffers and config are fixed for its life; `instance_`
// keeps two models on one backend apart): the row counts, the launch hints,
// the taps, and the KV storage the attention ops were handed.
uint64_t MuseModel::graph_key(int64_t rows, int64_t logit_rows, bool taps, std::span<const KvLayerStorage> kv) const {
  uint64_t h = 0x9e3779b97f4a7c15ull;
  auto mix = [&h](uint64_t v) {  // splitmix64 of the running hash and v
    uint64_t z = (h ^ v) + 0x9e3779b97f4a7c15ull;
    z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
    z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
    h = z ^ (z >> 31);
  };
  mix(instance_), mix(uint64_t(rows)), mix(uint64_t(logit_rows)), mix(taps ? 1 : 0);
  mix(uint64_t(plan_.max_seq_rows)), mix(uint64_t(plan_.max_seq_end));
  for (const KvLayerStorage& c : kv) {
    mix(reinterpret_cast<uintptr_t>(c.k.data)), mix(reinterpret_cast<uintptr_t>(c.v.data));
    mix(uint64_t(c.k.dim(0))), mix(uint64_t(c.k.dim(1))), mix(uint64_t(c.k.dim(2))), mix(uint64_t(c.k.dim(3)));
    mix(uint64_t(int(c.layout))), mix(uint64_t(c.slot)), mix(uint64_t(c.group)), mix(uint64_t(c.pages_per_block));
    mix(uint64_t(c.k.dtype)), mix(uint64_t(std::bit_cast<uint32_t>(c.k_scale))), mix(uint64_t(std::bit_cast<uint32_t>(c.v_scale)));
  }
  return h == 0 ? 1 : h;
}

// Attention (§3.3) from the normed input s.h into s.a: q/k/v/gate
// projections, weightless QK-norm (q × qk_scale_factor), RoPE on sliding
// layers, GQA over the cache, the output gate (Spark: per-head norm first),
// o_proj.
void MuseModel::attention_block(const Step& s, int64_t l, const KvLayerStorage& kv) {
  const ModelConfig& c = config_;
  const LayerWeights& w = weights_.layers[size_t(l)];
  Backend& b = backend_;
  // The gate is read only by the output gate, after attention's chunks:
  // where the backend says so, attention computes it itself, so its weights
  // stream while qk-norm/RoPE and the chunks (latency-bound at decode) run
  // instead of before them. Each product's rows have the same bits grouped
  // or alone.
  const bool gate_inside = b.gate_in_attention(s.h, w.gate);
  const Projection qkvg[] = {{w.q, s.q}, {w.k, s.k}, {w.v, s.v}, {w.gate, s.g}};
  b.project(s.h, std::span<const Projection>(qkvg, gate_inside ? 3 : 4));
  const bool rope = c.layer_rope_theta[size_t(l)] != 0.0;
  b.qk_norm_rope(s.q, s.k, rope ? s.cos : Tensor{}, rope ? s.sin : Tensor{}, c.head_dim, float(c.rms_norm_eps),
                 float(c.qk_scale_factor));
  const int64_t window = c.is_full(l) ? 0 : c.sliding_window;
  b.attention_store_gate(s.o, s.q, s.k, s.v, kv, *s.plan, c.head_dim, window,
                         float(1.0 / std::sqrt(double(c.head_dim))),
                         {s.g, c.is_spark(), float(c.rms_norm_eps), gate_inside ? &s.h : nullptr,
                          gate_inside ? &w.gate : nullptr});
  b.matmul(s.a, s.o, w.o);
  reduce(s.a);  // o_proj is row-split: each rank holds its heads' part of the sum
}

// f = down(silu(gate·h) ⊙ up·h) into s.a.
void MuseModel::dense_mlp(const Step& s, const LayerWeights& w) {
  Backend& b = backend_;
  b.project_swiglu(s.h, {w.mlp_gate, s.mlp_gate}, {w.mlp_up, s.mlp_up}, s.mlp_gate);
  b.matmul(s.a, s.mlp_gate, w.mlp_down);
  reduce(s.a);  // down is row-split
}

}  // namespace muse
