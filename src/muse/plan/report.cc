// Rendering a Plan: one JSON object for scripts (the keys of issue 6 plus
// detail), or an aligned plain-text table for people.
#include <cinttypes>
#include <cmath>
#include <cstdio>

#include "muse/plan/plan.h"

namespace muse::plan {

namespace {

constexpr double kGiB = double(int64_t(1) << 30);

std::string fmt(const char* f, double v) {
  char buf[64];
  std::snprintf(buf, sizeof buf, f, v);
  return buf;
}

std::string grouped(int64_t v) {
  std::string s = std::to_string(v < 0 ? -v : v), out;
  for (size_t i = 0; i < s.size(); ++i) {
    if (i && (s.size() - i) % 3 == 0) out += ',';
    out += s[i];
  }
  return v < 0 ? "-" + out : out;
}

std::string params_text(int64_t n) {
  if (n == 0) return "0";
  if (n >= 1'000'000'000) return fmt("%.2f B", double(n) / 1e9);
  return fmt("%.1f M", double(n) / 1e6);
}

std::string bytes_text(double b) {
  if (std::fabs(b) >= 1e9) return fmt("%.2f GB", b / 1e9) + " (" + fmt("%.2f GiB", b / kGiB) + ")";
  if (std::fabs(b) >= 1e6) return fmt("%.1f MB", b / 1e6);
  return grouped(int64_t(b)) + " B";
}

std::string row(const std::string& label, const std::string& a, const std::string& b = "") {
  auto pad = [](std::string x, size_t w) {
    if (x.size() < w) x.append(w - x.size(), ' ');
    return x;
  };
  std::string line = "  " + pad(label, 32) + " " + pad(a, 26) + " " + b;
  while (!line.empty() && line.back() == ' ') line.pop_back();
  return line + "\n";
}

Json part_json(const PartSums& s, bool params) {
  Json j = Json::object();
  j.set("experts", s.experts);
  j.set("attention", s.attention);
  j.set("latent", s.latent);
  j.set("embeddings", s.embeddings + s.head);  // embedding table and untied output layer
  j.set("embed_tokens", s.embeddings);
  j.set("lm_head", s.head);
  j.set("router", s.router);
  j.set("norms", s.norms);
  j.set("residual_gates", s.residual_gates);
  j.set("dense_mlp", s.dense_mlp);
  j.set(params ? "total" : "decoder_total", s.total());
  return j;
}

int64_t active_params(const Plan& p) {
  const ModelConfig& c = p.model.config;
  const PartSums& s = p.params;
  int64_t experts = c.num_experts > 0 ? s.experts / c.num_experts * c.num_experts_per_tok : 0;
  return experts + s.attention + s.latent + s.router + s.norms + s.residual_gates + s.dense_mlp +
         (c.tie_word_embeddings ? s.embeddings : s.head);
}

std::string flags_text(const Plan& p) {
  std::string s = "--cpu-offload-gb " + fmt("%g", p.offload.gib_per_gpu);
  for (const auto& prm : p.offload.params) s += " --cpu-offload-params " + prm;
  return s;
}

}  // namespace

Json plan_to_json(const Plan& p) {
  const ModelConfig& c = p.model.config;
  Json j = Json::object();

  Json model = Json::object();
  model.set("name", p.model.name);
  model.set("builtin", p.model.builtin);
  model.set("family", c.is_spark() ? "muse_spark" : "muse_glimmer");
  model.set("weight_format", weight_format_name(p.model.scheme.format));
  model.set("weight_format_basis", p.model.scheme.basis);
  Json bf16_layers = Json::array();
  for (size_t i = 0; i < p.model.scheme.bf16_expert_layer.size(); ++i)
    if (p.model.scheme.bf16_expert_layer[i] && c.num_experts > 0) bf16_layers.push_back(int64_t(i));
  model.set("bf16_expert_layers", bf16_layers);
  model.set("layers", c.num_layers);
  model.set("max_position_embeddings", c.max_position_embeddings);
  j.set("model", model);

  const HardwareProfile& h = p.hardware;
  Json hw = Json::object();
  if (p.has_hardware) {
  hw.set("name", h.name);
  hw.set("description", h.description);
  hw.set("memory_kind", memory_kind_name(h.kind));
  hw.set("devices", int64_t(h.devices));
  hw.set("device_memory_bytes", h.device_memory_bytes);
  hw.set("device_bandwidth_bytes_per_s", h.device_bandwidth);
  hw.set("host_memory_bytes", h.host_memory_bytes);
  hw.set("host_bandwidth_bytes_per_s", h.host_bandwidth);
  hw.set("link", h.link_label);
  hw.set("link_bandwidth_bytes_per_s", h.link_bandwidth);
  hw.set("source", h.source);
  }
  j.set("hardware", p.has_hardware ? hw : Json());

  const PlanOptions& o = p.options;
  Json serving = Json::object();
  serving.set("max_model_len", o.max_model_len);
  serving.set("max_num_seqs", o.max_num_seqs);
  serving.set("max_num_batched_tokens", o.max_num_batched_tokens);
  serving.set("gpu_memory_utilization", o.gpu_memory_utilization);
  serving.set("kv_cache_dtype", p.kv.dtype);
  serving.set("cpu_offload_gb", p.offload.gib_per_gpu);
  Json prm = Json::array();
  for (const auto& s : p.offload.params) prm.push_back(s);
  serving.set("cpu_offload_params", prm);
  serving.set("language_model_only", o.language_model_only);
  if (!p.drafter.method.empty()) {
    Json spec = Json::object();
    spec.set("method", p.drafter.method);
    spec.set("drafter", p.drafter.present ? Json(p.drafter.shape.name) : Json());
    spec.set("num_speculative_tokens", p.drafter.num_speculative_tokens);
    serving.set("speculative", spec);
  }
  j.set("serving", serving);

  Json params = part_json(p.params, true);
  params.set("active_per_token", active_params(p));
  params.set("vision", p.vision.params);
  params.set("audio", p.audio.params);
  params.set("drafter", p.drafter_params);
  j.set("params", params);

  Json bytes = part_json(p.bytes, false);
  bytes.set("vision", p.vision.params * 2);
  bytes.set("audio", p.audio.params * 2);
  bytes.set("drafter", p.drafter_params * 2);
  bytes.set("total", p.bytes.total() + (p.vision.params + p.audio.params + p.drafter_params) * 2);
  j.set("weight_bytes", bytes);

  const KvPlan& kv = p.kv;
  Json k = Json::object();
  k.set("dtype", kv.dtype);
  k.set("values_per_token_all_full", kv.values_per_token_all_full);
  k.set("bytes_per_token_all_full", kv.bytes_per_token_all_full);
  k.set("bytes_per_token", kv.bytes_per_token);
  k.set("sliding_bytes_per_sequence", kv.sliding_bytes_per_sequence);
  k.set("bytes_at_max_model_len", kv.bytes_at_max_model_len);
  k.set("all_full_bytes_at_max_model_len", kv.all_full_bytes_at_max_model_len);
  k.set("full_layers", kv.full_layers);
  k.set("sliding_layers", kv.sliding_layers);
  k.set("sliding_window", kv.window);
  k.set("replication", kv.replication);
  k.set("drafter_bytes_per_sequence", kv.drafter_bytes_per_sequence);
  k.set("drafter_bytes_per_token", kv.drafter_bytes_per_token);
  k.set("budget_bytes", p.has_hardware ? Json(kv.budget_bytes) : Json());
  k.set("capacity_tokens", p.has_hardware ? Json(kv.capacity_tokens) : Json());
  k.set("max_concurrency_at_max_model_len", p.has_hardware ? Json(kv.max_concurrency) : Json());
  Json pool = Json::object();
  pool.set("block_size", kv.pool.block_size);
  pool.set("page_bytes", kv.pool.page_bytes);
  pool.set("max_rollback", kv.pool.max_rollback);
  pool.set("pages_at_max_model_len", kv.pool.pages_at_max_model_len);
  pool.set("bytes_at_max_model_len", kv.pool.bytes_at_max_model_len);
  pool.set("budget_bytes", kv.pool.sized ? Json(kv.pool.budget_bytes) : Json());
  pool.set("pages", kv.pool.sized ? Json(kv.pool.pages) : Json());
  pool.set("longest_sequence_tokens", kv.pool.sized ? Json(kv.pool.longest_sequence_tokens) : Json());
  k.set("paged_pool", std::move(pool));
  j.set("kv", k);
  if (!p.has_hardware) {
    // Model only: nothing about memory, offload or speed can be said.
    for (const char* key : {"memory_per_gpu", "offload", "decode"}) j.set(key, Json());
    Json pin = Json::object();
    pin.set("exact", Json());
    pin.set("power_of_two", Json());
    j.set("pinned_host_bytes", pin);
    j.set("decode_ceiling_tokens_per_s", Json());
    j.set("fits", Json());
    j.set("problems", Json::array());
    Json warnings = Json::array();
    warnings.push_back("no hardware given: pass --hardware (or --gpu-memory-gb and --gpu-bandwidth-gbs) for memory, "
                       "offload, pinned host memory and the decode ceiling");
    j.set("warnings", warnings);
    return j;
  }

  const MemoryPlan& m = p.memory;
  Json mem = Json::object();
  mem.set("device_bytes", m.device_bytes);
  mem.set("budget_bytes", m.budget_bytes);
  mem.set("decoder_weights", m.decoder_weights);
  mem.set("towers", m.towers);
  mem.set("drafter", m.drafter);
  mem.set("activations", m.activations);
  mem.set("runtime_overhead", m.runtime_overhead);
  mem.set("overhead_estimated", m.overhead_estimated);
  mem.set("kv_budget", m.kv_budget);
  j.set("memory_per_gpu", mem);

  Json off = Json::object();
  off.set("possible", p.offload.possible);
  off.set("automatic", p.offload.automatic);
  off.set("cpu_offload_gb", p.offload.gib_per_gpu);
  off.set("cpu_offload_params", prm);
  off.set("bytes", p.offload.bytes);
  off.set("tensors_per_gpu", p.offload.tensors);
  off.set("first_layer", int64_t(p.offload.first_layer));
  off.set("last_layer", int64_t(p.offload.last_layer));
  off.set("last_tensor", p.offload.last_tensor);
  off.set("minimum_cpu_offload_gb", p.offload.minimum_gib_per_gpu ? Json(*p.offload.minimum_gib_per_gpu) : Json());
  j.set("offload", off);

  Json pin = Json::object();
  pin.set("exact", p.pinned.exact);
  pin.set("power_of_two", p.pinned.power_of_two);
  pin.set("buffers", p.pinned.buffers);
  pin.set("largest_buffer", p.pinned.largest_buffer);
  pin.set("staging_pageable", p.pinned.staging_pageable);
  pin.set("host_memory", p.pinned.host_memory);
  j.set("pinned_host_bytes", pin);

  const DecodePlan& d = p.decode;
  Json dec = Json::object();
  dec.set("context", d.context);
  dec.set("host_link_bytes_per_token", d.host_link_bytes_per_token);
  dec.set("device_bytes_per_token_per_gpu", d.device_bytes_per_token);
  dec.set("kv_read_bytes_per_token", d.kv_read_bytes_per_token);
  dec.set("host_path_bandwidth_bytes_per_s", d.host_path_bandwidth);
  dec.set("device_bandwidth_bytes_per_s", d.device_bandwidth);
  dec.set("ceiling_tokens_per_s", d.ceiling_tokens_per_s);
  dec.set("serialized_tokens_per_s", d.serialized_tokens_per_s);
  dec.set("ceiling_at_max_model_len_tokens_per_s", d.ceiling_at_max_model_len);
  dec.set("bound", d.bound);
  j.set("decode", dec);
  j.set("decode_ceiling_tokens_per_s", d.ceiling_tokens_per_s);

  j.set("fits", p.fits);
  Json problems = Json::array(), warnings = Json::array();
  for (const auto& s : p.problems) problems.push_back(s);
  for (const auto& s : p.warnings) warnings.push_back(s);
  j.set("problems", problems);
  j.set("warnings", warnings);
  return j;
}

std::string plan_to_table(const Plan& p) {
  const ModelConfig& c = p.model.config;
  const HardwareProfile& h = p.hardware;
  std::string t;
  t += "muse plan: " + p.model.name + (p.has_hardware ? " on " + h.name : std::string()) + "\n";
  t += "  model      " + std::string(c.is_spark() ? "Muse Spark" : "Muse Glimmer") + ", " +
       std::to_string(c.num_layers) + " layers (" + std::to_string(p.kv.full_layers) + " full, " +
       std::to_string(p.kv.sliding_layers) + " sliding); weights " + weight_format_name(p.model.scheme.format) +
       " (" + p.model.scheme.basis + ")\n";
  if (p.has_hardware)
    t += "  hardware   " + h.description + ": " + std::to_string(h.devices) + " x " +
       fmt("%.1f GB ", double(h.device_memory_bytes) / 1e9) + h.device_memory_label + " @ " +
       fmt("%.0f GB/s", h.device_bandwidth / 1e9);
  if (h.kind == MemoryKind::Discrete && h.host_memory_bytes > 0)
    t += "; host " + fmt("%.0f GiB", double(h.host_memory_bytes) / kGiB) + " @ " + fmt("%.0f GB/s", h.host_bandwidth / 1e9) +
         "; " + h.link_label + " " + fmt("%.1f GB/s", h.link_bandwidth / 1e9) + " per GPU";
  if (!p.has_hardware) t += "  hardware   none given (model only)";
  t += "\n  serving    max-model-len " + grouped(p.options.max_model_len) + ", max-num-seqs " +
       std::to_string(p.options.max_num_seqs) + ", gpu-memory-utilization " +
       fmt("%.2f", p.options.gpu_memory_utilization) + ", kv-cache-dtype " + p.kv.dtype;
  if (p.drafter.present)
    t += ", " + p.drafter.method + " drafter " + p.drafter.shape.name + " (k=" +
         std::to_string(p.drafter.num_speculative_tokens) + ")";
  t += "\n\nWeights" + std::string(28, ' ') + "params                     bytes\n";
  auto part = [&](const char* label, int64_t n, int64_t b) {
    if (n || b) t += row(label, params_text(n), bytes_text(double(b)));
  };
  part("experts", p.params.experts, p.bytes.experts);
  part("attention", p.params.attention, p.bytes.attention);
  part("latent projections", p.params.latent, p.bytes.latent);
  part("dense MLP", p.params.dense_mlp, p.bytes.dense_mlp);
  part("embeddings + output layer", p.params.embeddings + p.params.head, p.bytes.embeddings + p.bytes.head);
  part("router", p.params.router, p.bytes.router);
  part("norms + residual gates", p.params.norms + p.params.residual_gates, p.bytes.norms + p.bytes.residual_gates);
  part("text decoder", p.params.total(), p.bytes.total());
  t += row("  active per token", params_text(active_params(p)), "");
  part(p.options.language_model_only ? "vision tower (not loaded)" : "vision tower", p.vision.params, p.vision.params * 2);
  part(p.options.language_model_only ? "audio encoder (not loaded)" : "audio encoder", p.audio.params, p.audio.params * 2);
  if (p.drafter.present) part(("drafter " + p.drafter.shape.name).c_str(), p.drafter_params, p.drafter_params * 2);

  const KvPlan& kv = p.kv;
  t += "\nKV cache (" + kv.dtype + ", one sequence)\n";
  t += row("per token, all " + std::to_string(kv.layers) + " layers full", grouped(kv.bytes_per_token_all_full) + " B",
           grouped(kv.values_per_token_all_full) + " values");
  t += row("per token, " + std::to_string(kv.full_layers) + " full layers", grouped(kv.bytes_per_token) + " B", "");
  t += row(std::to_string(kv.sliding_layers) + " sliding rings x " + grouped(std::min(kv.window, p.options.max_model_len)),
           bytes_text(double(kv.sliding_bytes_per_sequence)), "fixed per sequence");
  t += row("at max-model-len " + grouped(p.options.max_model_len), bytes_text(double(kv.bytes_at_max_model_len)),
           "all-full: " + bytes_text(double(kv.all_full_bytes_at_max_model_len)));
  if (p.drafter.present)
    t += row("drafter context KV", bytes_text(double(kv.drafter_bytes_per_sequence)),
             kv.drafter_bytes_per_token ? grouped(kv.drafter_bytes_per_token) + " B/token" : "per sequence");
  t += row("paged pool: page of " + std::to_string(kv.pool.block_size) + " positions",
           grouped(kv.pool.page_bytes) + " B",
           "sliding layers keep window + " + std::to_string(kv.pool.max_rollback) + " (rollback)");
  t += row("pool pages at max-model-len", grouped(kv.pool.pages_at_max_model_len) + " pages",
           bytes_text(double(kv.pool.bytes_at_max_model_len)));
  if (kv.pool.sized)
    t += row("pool of " + bytes_text(double(kv.pool.budget_bytes)), grouped(kv.pool.pages) + " pages",
             "one sequence of up to " + grouped(kv.pool.longest_sequence_tokens) + " tokens");
  if (!p.has_hardware)
    return t + "\nNo hardware given: pass --hardware (" + [] {
             std::string l;
             for (const auto& n : hardware_profile_names()) l += (l.empty() ? "" : ", ") + n;
             return l;
           }() + ") or --gpu-memory-gb and --gpu-bandwidth-gbs for memory, offload, pinned host memory and the decode ceiling.\n";
  t += row("capacity", grouped(kv.capacity_tokens) + " tokens",
           "max concurrency at max-model-len: " + std::to_string(kv.max_concurrency));

  const MemoryPlan& m = p.memory;
  t += "\nDevice memory (per " + std::string(h.kind == MemoryKind::CpuOnly ? "socket" : "GPU") + ")\n";
  t += row("budget (" + fmt("%.2f", p.options.gpu_memory_utilization) + " x " +
               fmt("%.1f GB)", double(m.device_bytes) / 1e9),
           fmt("%.2f GiB", double(m.budget_bytes) / kGiB));
  t += row("decoder weights resident", fmt("%.2f GiB", double(m.decoder_weights) / kGiB));
  if (m.towers) t += row("vision + audio", fmt("%.2f GiB", double(m.towers) / kGiB));
  if (m.drafter) t += row("drafter", fmt("%.2f GiB", double(m.drafter) / kGiB));
  if (m.overhead_estimated) t += row("activations (estimate)", fmt("%.2f GiB", double(m.activations) / kGiB));
  t += row(m.overhead_estimated ? "runtime overhead (estimate)" : "runtime overhead (given)",
           fmt("%.2f GiB", double(m.runtime_overhead) / kGiB));
  t += row("KV cache budget", fmt("%.2f GiB", double(m.kv_budget) / kGiB));

  t += "\nOffload (vLLM UVA, layers in order)\n";
  if (!p.offload.possible) {
    t += "  not possible: " + std::string(memory_kind_name(h.kind)) + " memory" +
         (h.kind == MemoryKind::Discrete ? " without host memory or link figures" : "") + "\n";
  } else if (p.offload.bytes == 0) {
    t += "  none needed" + std::string(p.offload.minimum_gib_per_gpu ? "" : "") + "\n";
  } else {
    t += row(p.offload.automatic ? "minimum needed" : "as given", flags_text(p), "");
    t += row("offloaded", bytes_text(double(p.offload.bytes)),
             std::to_string(p.offload.tensors) + " tensors per GPU, layers " + std::to_string(p.offload.first_layer) +
                 "-" + std::to_string(p.offload.last_layer) + ", last " + p.offload.last_tensor);
  }
  if (!p.offload.automatic && p.offload.minimum_gib_per_gpu)
    t += row("minimum that fits", "--cpu-offload-gb " + std::to_string(*p.offload.minimum_gib_per_gpu), "");

  if (p.pinned.exact > 0) {
    t += "\nPinned host memory (peak, whole machine)\n";
    t += row("exact-size buffers", fmt("%.2f GiB", double(p.pinned.exact) / kGiB),
             "VLLM_WEIGHT_OFFLOADING_DISABLE_PIN_MEMORY=1");
    t += row("power-of-two buffers", fmt("%.2f GiB", double(p.pinned.power_of_two) / kGiB),
             "PyTorch pinned allocator (vLLM default), " +
                 fmt("%.3fx", double(p.pinned.power_of_two) / double(p.pinned.exact)));
    t += row("buffers", grouped(p.pinned.buffers),
             "largest " + bytes_text(double(p.pinned.largest_buffer)) + "; + pageable staging copy " +
                 fmt("%.2f GiB", double(p.pinned.staging_pageable) / kGiB));
    t += row("host memory", fmt("%.2f GiB", double(h.host_memory_bytes) / kGiB), "");
  }

  const DecodePlan& d = p.decode;
  t += "\nDecode ceiling (batch 1, context " + grouped(d.context) + ", no speculation; bandwidth only)\n";
  if (d.host_link_bytes_per_token > 0)
    t += row("host link", bytes_text(d.host_link_bytes_per_token) + "/tok",
             fmt("at %.0f GB/s", d.host_path_bandwidth / 1e9) +
                 fmt(" -> %.2f ms", 1e3 * d.host_link_bytes_per_token / d.host_path_bandwidth));
  t += row("device memory (per device)", bytes_text(d.device_bytes_per_token) + "/tok",
           fmt("at %.0f GB/s", d.device_bandwidth / 1e9) +
               fmt(" -> %.2f ms", 1e3 * d.device_bytes_per_token / d.device_bandwidth) +
               " (KV reads " + bytes_text(d.kv_read_bytes_per_token) + ")");
  t += row("ceiling", fmt("%.1f tok/s", d.ceiling_tokens_per_s),
           "bound by " + d.bound + fmt("; serialized %.1f tok/s", d.serialized_tokens_per_s) +
               fmt("; at max-model-len %.1f tok/s", d.ceiling_at_max_model_len));

  t += "\n" + std::string(p.fits ? "FITS" : "DOES NOT FIT") + "\n";
  for (const auto& s : p.problems) t += "  problem: " + s + "\n";
  for (const auto& s : p.warnings) t += "  note: " + s + "\n";
  return t;
}

}  // namespace muse::plan
