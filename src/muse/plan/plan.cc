// The arithmetic of `muse plan`. Every figure derives from the weight table
// (model/weight_table.h) expanded into the tensors a serving engine allocates
// (weight_format.h); docs/plan.md explains each step.
#include "muse/plan/plan.h"

#include "muse/kv/kv_geometry.h"
#include "muse/model/sharding.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

namespace muse::plan {

namespace {

constexpr int64_t kGiB = int64_t(1) << 30;

std::string lower(std::string s) {
  for (char& c : s) c = char(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string num(double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%g", v);
  return buf;
}

std::string gib_text(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.1f GiB", bytes / double(kGiB));
  return buf;
}

Status parse_kv_dtype(const std::string& name, KvPlan* kv) {
  const std::string n = lower(name);
  if (n == "auto" || n == "bf16" || n == "bfloat16") {
    kv->dtype = "bf16";
    kv->bytes_per_value = 2;
  } else if (n == "fp8" || n == "fp8_e4m3" || n == "fp8_e5m2") {
    kv->dtype = "fp8";
    kv->bytes_per_value = 1;
  } else if (n == "f32" || n == "float32") {  // what `muse serve --device cpu` stores by default
    kv->dtype = "f32";
    kv->bytes_per_value = 4;
  } else {
    return make_error("--kv-cache-dtype '" + name + "' is not supported (valid: auto, bf16, fp8, fp8_e4m3, fp8_e5m2, f32)");
  }
  return Status::Ok();
}

Status validate(PlanOptions& o, const ModelConfig& c) {
  if (o.max_model_len == 0) o.max_model_len = c.max_position_embeddings;
  if (o.max_model_len < 1 || o.max_model_len > c.max_position_embeddings)
    return make_error("--max-model-len = " + std::to_string(o.max_model_len) + " is impossible for this model (1 to " +
                      std::to_string(c.max_position_embeddings) + ", its max_position_embeddings)");
  if (o.max_num_seqs < 1 || o.max_num_seqs > (1 << 20))
    return make_error("--max-num-seqs = " + std::to_string(o.max_num_seqs) + " is impossible (1 to 1048576)");
  if (o.max_num_batched_tokens < 1 || o.max_num_batched_tokens > (1 << 24))
    return make_error("--max-num-batched-tokens = " + std::to_string(o.max_num_batched_tokens) +
                      " is impossible (1 to 16777216)");
  if (!(o.gpu_memory_utilization > 0 && o.gpu_memory_utilization <= 1))
    return make_error("--gpu-memory-utilization = " + num(o.gpu_memory_utilization) +
                      " is impossible (a fraction in (0, 1])");
  if (o.cpu_offload_gib && !(*o.cpu_offload_gib >= 0 && *o.cpu_offload_gib <= (1 << 24)))
    return make_error("--cpu-offload-gb = " + num(*o.cpu_offload_gib) + " is impossible (0 to 16777216 GiB)");
  if (o.runtime_overhead_gib && !(*o.runtime_overhead_gib >= 0 && *o.runtime_overhead_gib <= (1 << 20)))
    return make_error("--runtime-overhead-gb = " + num(*o.runtime_overhead_gib) + " is impossible (0 to 1048576 GiB)");
  if (o.decode_context == 0) o.decode_context = std::min<int64_t>(4096, o.max_model_len);
  if (o.decode_context < 1 || o.decode_context > o.max_model_len)
    return make_error("--decode-context = " + std::to_string(o.decode_context) + " must be between 1 and --max-model-len (" +
                      std::to_string(o.max_model_len) + ")");
  for (const auto& p : o.cpu_offload_params)
    if (p.empty() || p.find_first_of(" \t") != std::string::npos)
      return make_error("--cpu-offload-params: invalid name segment '" + p + "'");
  return Status::Ok();
}

// Working memory of one forward pass of max_num_batched_tokens tokens, plus
// sampler logits (our estimate; vLLM measures it in a profiling run).
int64_t activation_estimate(const ModelConfig& c, const PlanOptions& o, int64_t spec_tokens) {
  const int64_t H = c.hidden_size, q = c.q_dim(), kv = c.kv_dim();
  int64_t per_token = 4 * H + 3 * 2 * H + 2 * (2 * q + 2 * kv) + 2 * q;
  if (c.is_spark() && c.num_experts > 0) {
    const int64_t I = c.moe_intermediate_size, Hm = c.moe_hidden_size;
    per_token += 4 * c.num_experts + 2 * 2 * Hm + c.num_experts_per_tok * (2 * 2 * I + 2 * I + 2 * Hm);
  } else {
    per_token += 2 * 3 * c.intermediate_size;
  }
  const int64_t logits = o.max_num_seqs * (1 + spec_tokens) * c.vocab_size * 4 * 2;
  return o.max_num_batched_tokens * per_token + logits;
}

// vLLM's --cpu-offload-params rule: a segment matches whole dotted parts of
// the parameter's name inside its layer ("experts" matches
// "mlp.experts.w13_weight").
bool matches_params(const std::string& name, const std::vector<std::string>& params) {
  if (params.empty()) return true;
  std::string inner = name;
  if (inner.rfind("layers.", 0) == 0) {
    size_t dot = inner.find('.', 7);
    inner = dot == std::string::npos ? inner : inner.substr(dot + 1);
  }
  const std::string wrapped = "." + inner + ".";
  for (const auto& p : params)
    if (wrapped.find("." + p + ".") != std::string::npos) return true;
  return false;
}

struct Evaluation {
  std::vector<bool> offloaded;
  OffloadPlan offload;
  MemoryPlan memory;
  int64_t kv_budget_total = 0, capacity = 0, concurrency = 0;
  PinnedPlan pinned;
  bool gpu_fits = false, host_fits = true;
};

class Planner {
 public:
  explicit Planner(Plan& p) : p_(p), D_(p.hardware.devices) {}

  // What one GPU holds of a tensor: the split of the logical weights in it
  // (model/sharding.h: what the engine's ranks load; rank 0, whose vocabulary
  // shard is the padded one). Experts split by expert (EP) or along their
  // intermediate (TP) hold the same bytes.
  int64_t shard(const StoredTensor& t) const {
    if (D_ == 1) return t.bytes;
    if (t.logical.empty()) return t.replicated ? t.bytes : (t.bytes + D_ - 1) / D_;
    const ParallelRank r0{D_, 0, true};
    __int128 local = 0, total = 0;
    for (const WeightSpec& w : t.logical) {
      local += shard_of(w, p_.model.config, r0).numel();
      total += w.numel();
    }
    return total > 0 ? int64_t((__int128(t.bytes) * local + total - 1) / total) : t.bytes;
  }

  // vLLM's UVA offloader: layers in order, tensors in module order, the
  // budget checked before each tensor, so the last one may overshoot.
  Evaluation evaluate(double gib_per_gpu, const std::vector<std::string>& params) const {
    Evaluation e;
    e.offloaded.assign(p_.tensors.size(), false);
    e.offload = p_.offload;
    e.offload.gib_per_gpu = gib_per_gpu;
    e.offload.params = params;
    const int64_t limit = int64_t(gib_per_gpu * double(kGiB));
    int64_t per_gpu = 0;
    for (size_t i = 0; i < p_.tensors.size() && gib_per_gpu > 0; ++i) {
      const StoredTensor& t = p_.tensors[i];
      if (t.layer < 0) continue;  // embeddings, final norm, head: not in a decoder layer
      if (per_gpu >= limit) break;
      if (!matches_params(t.name, params)) continue;
      e.offloaded[i] = true;
      per_gpu += shard(t);
      ++e.offload.tensors;
      if (e.offload.first_layer < 0) e.offload.first_layer = t.layer;
      e.offload.last_layer = t.layer;
      e.offload.last_tensor = t.name;
      e.pinned.exact += shard(t);
      e.pinned.power_of_two += round_up_power_of_two(shard(t));
      e.pinned.largest_buffer = std::max(e.pinned.largest_buffer, shard(t));
      ++e.pinned.buffers;
    }
    e.offload.bytes = per_gpu * D_;
    e.pinned.exact *= D_;
    e.pinned.power_of_two *= D_;
    e.pinned.buffers *= D_;
    e.pinned.staging_pageable = e.pinned.largest_buffer * D_;
    e.pinned.host_memory = p_.hardware.host_memory_bytes;
    e.host_fits = e.pinned.exact + e.pinned.staging_pageable <= p_.hardware.host_memory_bytes;

    MemoryPlan& m = e.memory;
    m.device_bytes = p_.hardware.device_memory_bytes;
    m.budget_bytes = int64_t(double(m.device_bytes) * p_.options.gpu_memory_utilization);
    for (size_t i = 0; i < p_.tensors.size(); ++i)
      if (!e.offloaded[i]) m.decoder_weights += shard(p_.tensors[i]);
    const int64_t tower_params = p_.options.language_model_only ? 0 : p_.vision.params + p_.audio.params;
    m.towers = (tower_params * 2 + D_ - 1) / D_;
    m.drafter = (p_.drafter_params * 2 + D_ - 1) / D_;
    if (p_.options.runtime_overhead_gib) {
      m.overhead_estimated = false;
      m.runtime_overhead = int64_t(*p_.options.runtime_overhead_gib * double(kGiB));
    } else {
      m.activations = activation_estimate(p_.model.config, p_.options, p_.drafter.num_speculative_tokens);
      m.runtime_overhead = kGiB;  // CUDA context, library workspaces, CUDA graphs
    }
    m.kv_budget = m.budget_bytes - m.decoder_weights - m.towers - m.drafter - m.activations - m.runtime_overhead;
    e.kv_budget_total = m.kv_budget * D_;

    const KvPlan& kv = p_.kv;
    const int64_t usable = e.kv_budget_total / kv.replication;
    const int64_t per_seq_fixed = kv.sliding_bytes_per_sequence + kv.drafter_bytes_per_sequence;
    const int64_t per_token = kv.bytes_per_token + kv.drafter_bytes_per_token;
    e.capacity = usable > per_seq_fixed && per_token > 0 ? (usable - per_seq_fixed) / per_token : 0;
    const int64_t per_seq = per_token * p_.options.max_model_len + per_seq_fixed;
    e.concurrency = usable > 0 && per_seq > 0 ? std::min(usable / per_seq, p_.options.max_num_seqs) : 0;
    e.gpu_fits = e.concurrency >= 1;
    return e;
  }

  // Bytes each path carries per decoded token at batch 1, and the ceiling.
  DecodePlan decode(const Evaluation& e, int64_t context) const {
    DecodePlan d;
    d.context = context;
    double host = 0, device = 0;
    for (size_t i = 0; i < p_.tensors.size(); ++i) {
      const StoredTensor& t = p_.tensors[i];
      if (e.offloaded[i]) host += double(shard(t)) * D_ * t.decode_read_fraction;
      else device += double(shard(t)) * t.decode_read_fraction;
    }
    const KvPlan& kv = p_.kv;
    const double per_layer_token = double(kv.bytes_per_token_all_full) / double(std::max<int64_t>(1, kv.layers));
    d.kv_read_bytes_per_token = (double(kv.full_layers) * double(context) +
                                 double(kv.sliding_layers) * double(std::min(context, kv.window))) *
                                per_layer_token * double(kv.replication);
    device += d.kv_read_bytes_per_token / D_;
    d.host_link_bytes_per_token = host;
    d.device_bytes_per_token = device;
    d.device_bandwidth = p_.hardware.device_bandwidth;
    d.host_path_bandwidth = std::min(p_.hardware.link_bandwidth * D_, p_.hardware.host_bandwidth);
    const double t_host = host > 0 ? (d.host_path_bandwidth > 0 ? host / d.host_path_bandwidth : INFINITY) : 0;
    const double t_dev = device / d.device_bandwidth;
    d.ceiling_tokens_per_s = 1.0 / std::max(t_host, t_dev);
    d.serialized_tokens_per_s = 1.0 / (t_host + t_dev);
    d.bound = t_host > t_dev ? "host link" : "device memory";
    return d;
  }

 private:
  Plan& p_;
  int64_t D_;
};

}  // namespace

void PartSums::add(WeightPart part, int64_t n) {
  switch (part) {
    case WeightPart::Experts: experts += n; break;
    case WeightPart::Attention: attention += n; break;
    case WeightPart::Latent: latent += n; break;
    case WeightPart::Embeddings: embeddings += n; break;
    case WeightPart::Head: head += n; break;
    case WeightPart::Router: router += n; break;
    case WeightPart::Norms: norms += n; break;
    case WeightPart::ResidualGates: residual_gates += n; break;
    case WeightPart::DenseMlp: dense_mlp += n; break;
  }
}

int64_t round_up_power_of_two(int64_t n) {
  int64_t p = 1;
  while (p < n) p <<= 1;
  return p;
}

Result<Plan> make_plan(const PlanOptions& options) {
  Plan p;
  p.options = options;
  if (p.options.model.empty()) return make_error("--model is required (a profile name, a config.json or a model directory)");
  MUSE_ASSIGN_OR_RETURN(p.model, resolve_model(p.options.model, p.options.weight_format));
  p.has_hardware = !p.options.hardware.empty() || p.options.overrides.any();
  if (p.has_hardware) {
    MUSE_ASSIGN_OR_RETURN(p.hardware, resolve_hardware(p.options.hardware, p.options.overrides));
  }
  const ModelConfig& c = p.model.config;
  MUSE_RETURN_IF_ERROR(validate(p.options, c));
  MUSE_RETURN_IF_ERROR(parse_kv_dtype(p.options.kv_cache_dtype, &p.kv));
  MUSE_ASSIGN_OR_RETURN(p.drafter, resolve_drafter(p.options.drafter, p.options.speculative_config, c));

  // Parameters and bytes, from the engine's weight table.
  const std::vector<WeightSpec> weights = describe_weights(c);
  for (const WeightSpec& w : weights) {
    if (w.slot == "lm_head" && c.tie_word_embeddings) continue;
    p.params.add(w.part, w.numel());
  }
  p.tensors = stored_tensors(c, weights, p.model.scheme);
  for (const StoredTensor& t : p.tensors) p.bytes.add(t.part, t.bytes);
  p.vision = estimate_vision(c, p.model.raw);
  p.audio = estimate_audio(c);
  if (p.drafter.present) p.drafter_params = drafter_params(p.drafter.shape);

  // KV cache (muse-architecture.md §4): K and V per layer per token.
  KvPlan& kv = p.kv;
  const int64_t per_layer_token = 2 * c.num_kv_heads * c.head_dim * kv.bytes_per_value;
  kv.layers = c.num_layers;
  kv.full_layers = c.num_full_layers();
  kv.sliding_layers = c.num_sliding_layers();
  kv.window = c.sliding_window;
  kv.values_per_token_all_full = 2 * c.num_kv_heads * c.head_dim * c.num_layers;
  kv.bytes_per_token_all_full = per_layer_token * c.num_layers;
  kv.bytes_per_token = per_layer_token * kv.full_layers;
  const int64_t ring = std::min(kv.window, p.options.max_model_len);
  kv.sliding_bytes_per_sequence = per_layer_token * kv.sliding_layers * ring;
  kv.bytes_at_max_model_len = kv.bytes_per_token * p.options.max_model_len + kv.sliding_bytes_per_sequence;
  kv.all_full_bytes_at_max_model_len = kv.bytes_per_token_all_full * p.options.max_model_len;
  const int64_t D = p.hardware.devices;
  if (p.hardware.kind == MemoryKind::Discrete && D > c.num_kv_heads) kv.replication = (D + c.num_kv_heads - 1) / c.num_kv_heads;
  if (p.drafter.present) {
    const DrafterShape& d = p.drafter.shape;
    const int64_t dl = 2 * d.kv_heads * d.head_dim * kv.bytes_per_value * d.layers;
    if (d.sliding_window > 0) kv.drafter_bytes_per_sequence = dl * std::min(d.sliding_window, p.options.max_model_len);
    else kv.drafter_bytes_per_token = dl;
  }

  // The paged pool, as the engine builds it.
  auto size_pool = [&](int64_t budget) {
    KvPlan::Pool& pl = kv.pool;
    const KvGeometry g = KvGeometry::of(c, p.options.block_size, kDefaultKvMaxRollback, kv.bytes_per_value);
    pl.block_size = g.block_size;
    pl.page_bytes = g.page_bytes();
    pl.max_rollback = g.max_rollback;
    pl.pages_at_max_model_len = g.pages_for(p.options.max_model_len);
    pl.bytes_at_max_model_len = g.bytes_for(p.options.max_model_len);
    if (budget <= 0) return;
    pl.sized = true;
    pl.budget_bytes = budget;
    pl.pages = g.pool_pages(p.options.max_num_seqs, p.options.max_model_len, p.options.max_num_batched_tokens, budget);
    const int64_t transient =
        g.step_transient_pages(std::min(p.options.max_num_batched_tokens, p.options.max_model_len));
    pl.longest_sequence_tokens = g.tokens_fitting(pl.pages - transient);
  };
  if (p.options.block_size < 1) return make_error("--block-size must be at least 1");
  if (!p.has_hardware) {
    size_pool(p.options.kv_cache_memory_bytes);
    if (p.options.cpu_offload_gib || p.options.runtime_overhead_gib || !p.options.cpu_offload_params.empty())
      return make_error("--cpu-offload-gb, --cpu-offload-params and --runtime-overhead-gb need a machine: pass "
                        "--hardware NAME or --gpu-memory-gb and --gpu-bandwidth-gbs");
    p.fits = true;
    return p;
  }

  // Offload: possible on discrete GPUs with host memory and a link.
  p.offload.possible = p.hardware.kind == MemoryKind::Discrete && p.hardware.host_memory_bytes > 0 &&
                       p.hardware.link_bandwidth > 0;
  if (p.options.cpu_offload_gib && *p.options.cpu_offload_gib > 0 && !p.offload.possible)
    return make_error("--cpu-offload-gb: hardware '" + p.hardware.name + "' has no host memory to offload to (" +
                      std::string(memory_kind_name(p.hardware.kind)) +
                      " memory, or no --host-memory-gb / --link-bandwidth-gbs given)");
  std::vector<std::string> params = p.options.cpu_offload_params;
  const bool has_experts = p.params.experts > 0;
  if (!p.options.cpu_offload_gib && params.empty() && has_experts) params = {"experts"};

  Planner planner(p);
  // The smallest integer budget (GiB per GPU) whose GPU side fits: fits() is
  // monotone in the budget, so bisect.
  auto minimum_budget = [&](const std::vector<std::string>& prm) -> std::optional<int64_t> {
    int64_t eligible = 0;
    for (const StoredTensor& t : p.tensors)
      if (t.layer >= 0 && matches_params(t.name, prm)) eligible += planner.shard(t);
    int64_t hi = (eligible + kGiB - 1) / kGiB;
    if (hi == 0 || !planner.evaluate(double(hi), prm).gpu_fits) return std::nullopt;
    int64_t lo = 0;  // known not to fit (or the caller would not ask)
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (planner.evaluate(double(mid), prm).gpu_fits ? hi : lo) = mid;
    }
    return hi;
  };

  Evaluation e = planner.evaluate(p.options.cpu_offload_gib.value_or(0), params);
  p.offload.automatic = !p.options.cpu_offload_gib;
  if (!e.gpu_fits && p.offload.possible) {
    p.offload.minimum_gib_per_gpu = minimum_budget(params);
    if (p.offload.automatic && p.offload.minimum_gib_per_gpu)
      e = planner.evaluate(double(*p.offload.minimum_gib_per_gpu), params);
  }
  const auto min_gib = p.offload.minimum_gib_per_gpu;
  p.offload = e.offload;
  p.offload.possible = p.hardware.kind == MemoryKind::Discrete && p.hardware.host_memory_bytes > 0 &&
                       p.hardware.link_bandwidth > 0;
  p.offload.automatic = !p.options.cpu_offload_gib;
  p.offload.minimum_gib_per_gpu = min_gib;
  p.memory = e.memory;
  p.pinned = e.pinned;
  kv.budget_bytes = e.kv_budget_total;
  kv.capacity_tokens = e.capacity;
  kv.max_concurrency = e.concurrency;
  size_pool(p.options.kv_cache_memory_bytes > 0 ? p.options.kv_cache_memory_bytes
                                                : e.kv_budget_total / std::max<int64_t>(1, kv.replication));

  // Verdict.
  const std::string need = "one " + std::to_string(p.options.max_model_len) + "-token sequence needs " +
                           gib_text(double(kv.bytes_at_max_model_len + kv.drafter_bytes_per_sequence +
                                           kv.drafter_bytes_per_token * p.options.max_model_len)) +
                           " of KV cache";
  if (!e.gpu_fits) {
    const std::string have = "the KV budget is " + gib_text(double(e.kv_budget_total)) + " after weights and overhead";
    if (!p.offload.possible) {
      p.problems.push_back("does not fit: " + need + ", " + have + ", and " + p.hardware.name +
                           (p.hardware.kind == MemoryKind::Discrete
                                ? " has no host memory or host link figures to offload weights to"
                                : " has no separate host memory to offload weights to"));
    } else if (!min_gib) {
      p.problems.push_back("cannot fit even with offload: with every " +
                           (params.empty() ? std::string("decoder") : "'" + params.front() + "'") +
                           " weight in host memory, " + have + " and " + need);
    } else {
      p.problems.push_back("does not fit with --cpu-offload-gb " + num(p.offload.gib_per_gpu) + ": " + need +
                           ", " + have + "; offload at least --cpu-offload-gb " + std::to_string(*min_gib) +
                           (params.empty() ? "" : " --cpu-offload-params " + params.front()));
    }
  }
  if (!e.host_fits) {
    p.problems.push_back(std::string(e.gpu_fits && p.offload.automatic ? "cannot fit even with offload: " : "") +
                         "the offloaded weights need " + gib_text(double(p.pinned.exact)) +
                         " of pinned host memory (plus " + gib_text(double(p.pinned.staging_pageable)) +
                         " staging) but the host has " + gib_text(double(p.hardware.host_memory_bytes)));
  } else if (p.pinned.exact > 0) {
    if (p.pinned.power_of_two + p.pinned.staging_pageable > p.hardware.host_memory_bytes)
      p.warnings.push_back("with PyTorch's power-of-two pinned buffers the offload needs " +
                           gib_text(double(p.pinned.power_of_two)) + ", more than the host's " +
                           gib_text(double(p.hardware.host_memory_bytes)) +
                           ": set VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY=1 (exact-size pinning)");
    else if (double(p.pinned.power_of_two) > 0.9 * double(p.hardware.host_memory_bytes))
      p.warnings.push_back("pinned host memory would use more than 90% of the host's " +
                           gib_text(double(p.hardware.host_memory_bytes)));
  }
  p.fits = p.problems.empty();
  if (D > 1) {
    // The split `muse serve --tensor-parallel-size D` would load (model/sharding.h).
    const Status split = check_parallel(c, ParallelOptions{D, p.options.expert_parallel});
    if (!split.ok()) p.warnings.push_back("muse serve would refuse this split: " + split.message());
  }
  if (kv.replication > 1)
    p.warnings.push_back(std::to_string(D) + " GPUs exceed the model's " + std::to_string(c.num_kv_heads) +
                         " KV heads: each KV head is stored " + std::to_string(kv.replication) + " times");
  if (p.drafter.present && p.pinned.exact > 0)
    p.warnings.push_back("speculative decoding with offloaded experts: each drafted token routes to its own experts, so "
                         "verify cost grows with the draft (seed 000 found k=2 best on GB300)");
  if (p.memory.overhead_estimated)
    p.warnings.push_back("activation and runtime overhead is an estimate (" +
                         gib_text(double(p.memory.activations + p.memory.runtime_overhead)) +
                         " per device); vLLM measures it at startup; calibrate with --runtime-overhead-gb");

  p.decode = planner.decode(e, p.options.decode_context);
  p.decode.ceiling_at_max_model_len = planner.decode(e, p.options.max_model_len).ceiling_tokens_per_s;
  return p;
}

}  // namespace muse::plan
