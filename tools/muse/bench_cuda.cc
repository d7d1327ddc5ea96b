// muse bench --device cuda: decode and prefill of the real Muse shapes on
// the GPU, against the ceilings measured in the same run (bench/NOTES.md).
//
//   --model glimmer-30b   Muse Glimmer 30B, all 52 layers, BF16 (≈61 GB)
//   --model spark-slice   Muse Spark Open's layer shapes (hidden 8192, 128/16
//                         heads of 64, latent 4096, 256 experts of 3×4096×4096,
//                         top 8, the 202,048-row embedding and head), --layers
//                         of them (default 4, ≈111 GB)
//   --quantization KIND   the slots --quantization quantizes at load (the
//                         experts; per format attention) made as random
//                         quantized weights on the GPU (QuantRandomSource)
//
// Weights are random, made on the GPU where they live (no download, nothing
// generated on the host). Long contexts are not prefilled first: sessions
// are advanced without compute (Session::extend_uncomputed), so decode at
// 32K reads the same KV bytes a real context would.
//
// Figures: per (batch, context) the step time, tokens/s and the bytes the
// step must read (weights, counting the experts the batch's rows route to —
// the expected distinct count under uniform routing, E·(1 − (1 − k/E)^b) —
// plus every KV row attention reads) per second as a fraction of the HBM read
// bandwidth; prefill FLOP/s as a fraction of the bf16 GEMM rate.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <string>
#include <vector>

#include "bench_options.h"
#include "muse/backends/cuda/cuda_bench.h"
#include "muse/core/json.h"
#include "muse/engine/engine.h"
#include "muse/loading/random_model.h"
#include "muse/model/random_weights.h"
#include "muse/model/weight_table.h"
#include "muse/sampling/sampler.h"

namespace muse::tool {
namespace {

std::string glimmer_30b_json(int64_t layers) {
  return R"({"model_type": "muse_glimmer", "text_config": {
    "vocab_size": 202048, "hidden_size": 6656, "num_hidden_layers": )" + std::to_string(layers) + R"(,
    "num_attention_heads": 32, "num_key_value_heads": 2, "head_dim": 128, "intermediate_size": 19968,
    "rms_norm_eps": 1e-5, "post_norm_eps": 1e-8, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    "sliding_window": 2048, "max_position_embeddings": 131072, "qk_scale_factor": 3.87,
    "output_multiplier": 0.19611613513818404, "final_logit_softcapping": 20.0, "tie_word_embeddings": false,
    "bos_token_id": 1, "eos_token_id": 2}})";
}

std::string spark_slice_json(int64_t layers) {
  return R"({"model_type": "muse_spark", "text_config": {
    "vocab_size": 202048, "hidden_size": 8192, "num_hidden_layers": )" + std::to_string(layers) + R"(,
    "num_attention_heads": 128, "num_key_value_heads": 16, "head_dim": 64, "rms_norm_eps": 1e-5,
    "post_norm_eps": 1e-8, "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0},
    "sliding_window": 2048, "max_position_embeddings": 1048576, "num_local_experts": 256, "num_experts_per_tok": 8,
    "moe_hidden_size": 4096, "moe_intermediate_size": 4096, "num_shared_experts": 0, "routed_scaling_factor": 1.0,
    "residual_gate_temperature": 0.3, "qk_scale_factor": 5.4730064863875, "output_multiplier": 0.17677669529663687,
    "final_logit_softcapping": 20.0, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2}})";
}

// Weight bytes a step of `batch` decode rows reads, with `distinct`
// experts a sparse layer (measured; < 0: the expected count under uniform
// routing, E·(1 − (1 − k/E)^b)).
double step_weight_bytes(const ModelConfig& c, const DecodeTraffic& t, int64_t batch, double distinct = -1) {
  if (t.expert_bytes == 0) return double(t.total());
  const double E = double(c.num_experts), k = double(c.num_experts_per_tok);
  if (distinct < 0) distinct = E * (1.0 - std::pow(1.0 - k / E, double(batch)));
  return double(t.dense_bytes + t.head_bytes) + double(t.expert_bytes) * distinct / k;
}

// KV bytes attention reads for one sequence at `context` positions.
double kv_bytes(const ModelConfig& c, int64_t context, int64_t kv_elem_bytes) {
  double b = 0;
  for (int64_t l = 0; l < c.num_layers; ++l) {
    const int64_t keys = c.is_full(l) ? context : std::min(context, c.sliding_window);
    b += double(keys) * double(c.kv_dim()) * 2.0 * double(kv_elem_bytes);
  }
  return b;
}

// --quantization: the bench model's weights, every matrix made on the GPU
// (RandomWeightSource), except that the slots `--quantization` quantizes at
// load in the release's middle layers (the experts of every layer, and per
// format attention) are made quantized: random code bytes
// and scales in the format's layout, in ranges that keep the weights near
// the BF16 matrices' U(±sqrt(3/in)) (so activations, routing and norms stay
// sane), produced on the GPU like the BF16 ones (nothing crosses PCIe).
class QuantRandomSource final : public WeightSource {
 public:
  QuantRandomSource(const ModelConfig& c, const RandomWeightOptions& ro, QuantKind kind)
      : inner_(c, ro), kind_(kind), seed_(ro.seed) {}
  Result<HostTensor> view(const WeightSpec& spec) const override { return inner_.view(spec); }
  Status read_f32(const WeightSpec& spec, float* dst) const override { return inner_.read_f32(spec, dst); }
  Result<Tensor> create_on(Backend& backend, const WeightSpec& spec, DType dtype) const override {
    if (quantized_here(spec)) return make_quantized(backend, spec);
    return inner_.create_on(backend, spec, dtype);
  }
  uint64_t stored_quantized_bytes(const WeightSpec& spec) const override {
    if (!quantized_here(spec)) return 0;
    const size_t r = spec.shape.size();
    const uint64_t n = uint64_t(spec.numel()), K = uint64_t(spec.shape[r - 1]);
    const uint64_t E = r == 3 ? uint64_t(spec.shape[0]) : 1, rows = n / K;
    switch (kind_) {
      case QuantKind::Nvfp4: return n / 2 + n / 16 + 4 * E * (spec.slot == "moe.experts.gate_up" ? 2 : 1);
      case QuantKind::Mxfp4: return n / 2 + n / 32;
      case QuantKind::Fp8: return n + 4 * rows;
      case QuantKind::Int4: return n / 2 + n / 64 + n / 256;
      case QuantKind::None: break;
    }
    return 0;
  }

 private:
  // The slots --quantization quantizes, read as the release's middle layers
  // (layer 1 of 62: NVFP4's BF16 exception for the first and last layers'
  // experts does not apply to a slice standing for the model's bulk).
  bool quantized_here(const WeightSpec& spec) const {
    if (kind_ == QuantKind::None || spec.shape.size() < 2) return false;
    WeightSpec middle = spec;
    if (middle.layer >= 0) middle.layer = 1;
    return quantized_at_load(kind_, middle, 62);
  }
  Result<Tensor> make_quantized(Backend& b, const WeightSpec& spec) const;
  RandomWeightSource inner_;
  QuantKind kind_;
  uint64_t seed_;
  // Each made weight's parts; upload_weights copies them into the model's
  // weights (which then own and release the buffers).
  mutable std::vector<std::unique_ptr<QuantParts>> parts_;
};

Result<Tensor> QuantRandomSource::make_quantized(Backend& b, const WeightSpec& spec) const {
  const size_t r = spec.shape.size();
  const int64_t K = spec.shape[r - 1], N = spec.shape[r - 2], E = r == 3 ? spec.shape[0] : 1;
  uint64_t seed = seed_ * 0x9e3779b97f4a7c15ull + uint64_t(spec.layer + 3) * 0x100000001b3ull;
  for (char c : spec.slot) seed = (seed ^ uint8_t(c)) * 0x100000001b3ull;
  // A buffer of `bytes` seen as `dtype` of `shape` (with the experts' E in front).
  auto make = [&](DType dtype, std::vector<int64_t> shape, int64_t bytes) -> Result<Tensor> {
    MUSE_ASSIGN_OR_RETURN(Tensor t, b.alloc(DType::U8, {bytes}));
    if (r == 3) shape.insert(shape.begin(), E);
    t.dtype = dtype;
    t.rank = int(shape.size());
    t.shape = {};
    for (size_t i = 0; i < shape.size(); ++i) t.shape[i] = shape[i];
    return t;
  };
  auto bytes_fill = [&](const Tensor& t, uint8_t lo, uint8_t hi, uint8_t sign = 0) {
    return cuda_fill_bytes(t.data, int64_t(t.bytes()), ++seed, lo, hi, sign);
  };
  const float amp = std::sqrt(3.0f / float(K));  // the BF16 matrices' U(±amp): RMS amp/√3
  auto parts = std::make_unique<QuantParts>();
  QuantFormat& f = parts->format;
  f.kind = kind_;
  Tensor codes;
  switch (kind_) {
    case QuantKind::Nvfp4:
    case QuantKind::Mxfp4: {
      const bool mx = kind_ == QuantKind::Mxfp4;
      if (K % 32) return make_error("random " + std::string(quant_kind_name(kind_)) + " weights need K % 32 == 0");
      MUSE_ASSIGN_OR_RETURN(codes, make(DType::F4, {N, K}, E * N * K / 2));
      MUSE_RETURN_IF_ERROR(bytes_fill(codes, 0, 255));  // e2m1 codes: RMS |value| 2.93
      f.block_rows = 1, f.block_cols = mx ? 32 : 16;
      f.scale_dtype = mx ? DType::F8_E8M0 : DType::F8_E4M3;
      MUSE_ASSIGN_OR_RETURN(parts->scales, make(f.scale_dtype, {N, K / f.block_cols}, E * N * K / f.block_cols));
      if (mx) {  // one power of two near RMS / 2.93
        const int e = 127 + int(std::lround(std::log2(amp / std::sqrt(3.0f) / 2.93f)));
        MUSE_RETURN_IF_ERROR(bytes_fill(parts->scales, uint8_t(e - 1), uint8_t(e + 1)));
      } else {  // E4M3 0x30..0x38: 0.5 .. 1; the global brings the RMS to amp/√3
        MUSE_RETURN_IF_ERROR(bytes_fill(parts->scales, 0x30, 0x38));
        f.global_parts = spec.slot == "moe.experts.gate_up" ? 2 : 1;
        MUSE_ASSIGN_OR_RETURN(parts->global, b.alloc(DType::F32, {E * f.global_parts}));
        const float g = amp / std::sqrt(3.0f) / (2.93f * 0.75f);
        MUSE_RETURN_IF_ERROR(cuda_fill_uniform(parts->global.data, DType::F32, parts->global.numel(), ++seed,
                                               0.1f * g, g));
      }
      break;
    }
    case QuantKind::Fp8: {  // per output channel (PTPC, as --quantization fp8)
      MUSE_ASSIGN_OR_RETURN(codes, make(DType::F8_E4M3, {N, K}, E * N * K));
      MUSE_RETURN_IF_ERROR(bytes_fill(codes, 0x08, 0x76, 0x80));  // ±2^-6 .. ±224, never NaN: RMS ≈ 70
      f.scale_dtype = DType::F32;
      f.block_rows = 1, f.block_cols = int32_t(K);
      MUSE_ASSIGN_OR_RETURN(parts->scales, make(DType::F32, {N, 1}, E * N * 4));
      const float s = amp / std::sqrt(3.0f) / 70.0f;
      MUSE_RETURN_IF_ERROR(cuda_fill_uniform(parts->scales.data, DType::F32, parts->scales.numel(), ++seed, 0.1f * s, s));
      break;
    }
    case QuantKind::Int4: {  // GPTQ v1 layout, group 128, BF16 scales
      if (K % 128 || N % 8) return make_error("random int4 weights need K % 128 == 0 and N % 8 == 0");
      const int64_t groups = K / 128;
      MUSE_ASSIGN_OR_RETURN(codes, make(DType::F4, {N, K}, E * N * K / 2));
      MUSE_RETURN_IF_ERROR(bytes_fill(codes, 0, 255));
      f.scale_dtype = DType::BF16;
      f.block_rows = 1, f.block_cols = 128;
      f.zero_offset = 1;
      MUSE_ASSIGN_OR_RETURN(parts->scales, make(DType::BF16, {groups, N}, E * groups * N * 2));
      const float s = amp / std::sqrt(3.0f) / 4.6f;  // q − z: RMS ≈ 4.6
      MUSE_RETURN_IF_ERROR(cuda_fill_uniform(parts->scales.data, DType::BF16, parts->scales.numel(), ++seed, 0.1f * s, s));
      MUSE_ASSIGN_OR_RETURN(parts->zeros, make(DType::I32, {groups, N / 8}, E * groups * N / 8 * 4));
      MUSE_RETURN_IF_ERROR(bytes_fill(parts->zeros, 0x66, 0x66));  // z + 1 = 7 in every nibble
      break;
    }
    case QuantKind::None: return Tensor{};
  }
  MUSE_RETURN_IF_ERROR(cuda_synchronize());  // the fills ran on the default stream
  codes.quant = parts.get();
  parts_.push_back(std::move(parts));
  return codes;
}

// The config of --model with --layers (default: all 52 / 4); empty if the name is unknown.
std::string bench_model_json(const BenchOptions& o) {
  if (o.model == "glimmer-30b") return glimmer_30b_json(o.layers_given ? o.layers : 52);
  if (o.model == "spark-slice") return spark_slice_json(o.layers_given ? o.layers : 4);
  return {};
}

}  // namespace

int bench_write_random(const BenchOptions& o) {
  const std::string json = bench_model_json(o);
  if (json.empty()) return fail("bench", "--write-random: --model must be glimmer-30b or spark-slice");
  auto parsed = Json::parse(json);
  if (!parsed.ok()) return fail("bench", parsed.message());
  auto config = parse_model_config(*parsed, "bench config");
  if (!config.ok()) return fail("bench", config.message());
  RandomModelOptions ro;
  ro.max_shard_bytes = uint64_t(4) << 30;
  const double t0 = now_s();
  if (Status st = write_random_model(o.write_random, *parsed, ro); !st.ok()) return fail("bench", st.message());
  const int64_t params = count_parameters(describe_weights(*config));
  std::printf("wrote %s: %s, %lld layers, %.2fB parameters (%.2f GB BF16) in %.1f s\n", o.write_random.c_str(),
              o.model.c_str(), static_cast<long long>(config->num_layers), double(params) * 1e-9,
              double(params) * 2e-9, now_s() - t0);
  return 0;
}

int bench_cuda(const BenchOptions& o) {
  const std::string json = bench_model_json(o);
  if (json.empty()) return fail("bench", "--device cuda: --model must be glimmer-30b or spark-slice");
  auto config = parse_model_config(json, "bench config");
  if (!config.ok()) return fail("bench", config.message());
  QuantKind quant = QuantKind::None;
  if (o.weights != "bf16" && o.weights != "f32") {  // f32: the CPU bench's; the GPU holds BF16
    auto k = parse_quant_kind(o.weights);
    if (!k.ok()) return fail("bench", "--device cuda: --quantization is nvfp4, mxfp4, fp8 or int4 (" + k.message() + ")");
    quant = *k;
  }
  const int64_t params = count_parameters(describe_weights(*config));

  auto ceil0 = measure_gpu_ceilings(uint64_t(8) << 30, 8192, 5);
  if (!ceil0.ok()) return fail("bench", ceil0.message());
  if (!o.json)
    std::fprintf(stderr, "muse bench: %s; HBM read %.0f GB/s, bf16 GEMM %.0f TFLOP/s; %.2fB parameters (%s, %s)%s\n",
                 ceil0->device.c_str(), ceil0->hbm_read_gbps, ceil0->bf16_tflops, double(params) / 1e9,
                 o.model.c_str(), quant == QuantKind::None ? "bf16" : quant_kind_name(quant),
                 (std::string(o.product_kernel ? "; every bf16 product through kernel " + std::to_string(o.product_kernel) : "") +
                  (o.expert_kernel == 1 ? "; FP4 expert down product in per-tile blocks"
                   : o.expert_kernel == 2 ? "; FP4 expert down product streamed"
                   : o.expert_kernel == 3 ? "; FP4 expert gate/up at five blocks an SM"
                                          : "") +
                  (o.expert_gemm == 1   ? "; experts in per-tile kernels"
                   : o.expert_gemm >= 2 ? "; experts in the grouped GEMM, tiles of " +
                                              std::to_string(o.expert_gemm == 2 ? 256 : 128) + " pairs"
                                        : "") +
                  (o.attention_merge == 1   ? "; attention merged by blocks"
                   : o.attention_merge == 2 ? "; attention merged by warps"
                                            : "") +
                  (o.moe_combine == 1   ? "; experts combined by a block a token"
                   : o.moe_combine == 2 ? "; experts combined by a cluster a token"
                                        : "") +
                  (o.stream_stages ? "; streamed ring of " + std::to_string(o.stream_stages) + " stages" : "") +
                  (o.one_stream ? "; one stream (no side branch)" : ""))
                     .c_str());
  std::string skipped;
  for (const auto& n : o.skip_ops) {
    if (!skipped.empty()) skipped += ",";
    skipped += n;
  }
  if (!skipped.empty())
    std::fprintf(stderr, "muse bench: not launching %s (a timing probe: the outputs, and the experts counted, are not "
                 "valid)\n", skipped.c_str());

  int64_t max_batch = 1, max_ctx = 1;
  for (int64_t b : o.batches) max_batch = std::max(max_batch, b);
  for (int64_t c : o.contexts) max_ctx = std::max(max_ctx, c);
  RandomWeightOptions ro;
  ro.matrices_on_backend = true;
  EngineOptions eo;
  eo.backend.device = Device::Cuda;
  eo.backend.gpu_product_kernel = o.product_kernel;
  eo.backend.gpu_expert_kernel = o.expert_kernel;
  eo.backend.gpu_expert_gemm = o.expert_gemm;
  eo.backend.gpu_attention_merge = o.attention_merge;
  eo.backend.gpu_moe_combine = o.moe_combine;
  eo.backend.gpu_stream_stages = o.stream_stages;
  eo.backend.gpu_skip_ops = o.skip_ops;
  eo.backend.gpu_graphs = !o.enforce_eager;
  eo.backend.gpu_side_stream = !o.one_stream;
  eo.max_sequences = max_batch;
  // Each timed run decodes --tokens more positions on the same sessions.
  eo.max_model_len = std::max(max_ctx, o.prefill) + int64_t(o.runs + 1) * o.tokens + 3;
  eo.max_batch_tokens = std::max(o.prefill, max_batch);
  eo.gpu_memory_utilization = 0.95;
  // The distinct experts each step routes to, measured (MoE models): the
  // bytes a step reads count those, not an assumed spread.
  eo.record_experts = config->num_experts > 0;
  const double t_load = now_s();
  auto engine = Engine::create(*config, std::make_unique<QuantRandomSource>(*config, ro, quant), eo);
  if (!engine.ok()) return fail("bench", engine.message());
  const double load_s = now_s() - t_load;
  Engine& e = **engine;
  const DecodeTraffic traffic = decode_traffic(*config, e.model().weights());
  const int64_t kv_elem = dtype_bits(e.backend().kv_dtype()) / 8;

  Json out = Json::object();
  out.set("device", ceil0->device);
  out.set("model", o.model);
  out.set("layers", config->num_layers);
  out.set("quantization", quant == QuantKind::None ? "none" : quant_kind_name(quant));
  out.set("product_kernel", o.product_kernel);
  out.set("expert_kernel", o.expert_kernel);
  out.set("expert_gemm", o.expert_gemm);
  out.set("attention_merge", o.attention_merge);
  out.set("moe_combine", o.moe_combine);
  out.set("stream_stages", o.stream_stages);
  out.set("skipped_ops", skipped);
  out.set("one_stream", o.one_stream);
  out.set("parameters", params);
  out.set("weight_bytes", int64_t(traffic.dense_bytes + traffic.head_bytes) +
                              int64_t(double(traffic.expert_bytes) * double(config->num_experts) /
                                      double(std::max<int64_t>(1, config->num_experts_per_tok))));
  out.set("weights_made_on_gpu_seconds", load_s);
  Json rows = Json::array();
  if (!o.json)
    std::printf("%-6s %-8s %10s %10s %12s %10s %8s\n", "batch", "context", "step ms", "tok/s", "bytes/step", "GB/s",
                "of HBM");
  std::string profile, prefill_profile;
  for (int64_t ctx : o.contexts) {
    for (int64_t batch : o.batches) {
      std::vector<std::unique_ptr<Session>> sessions;
      // A different token a row, so the rows' hidden states (and a MoE
      // model's routing) differ, as a real batch's do: with one token for
      // every row, all rows routed to the same 8 experts (until 2026-12-04,
      // when the figures counted the uniform-routing expectation instead).
      std::vector<int32_t> next(static_cast<size_t>(batch), 0);
      for (int64_t i = 0; i < batch; ++i) next[size_t(i)] = int32_t(3 + (i * 7919) % (config->vocab_size - 3));
      bool ok = true;
      for (int64_t i = 0; i < batch && ok; ++i) {
        auto s = e.new_session();
        ok = s.ok() && (*s)->extend_uncomputed(ctx - 1, 7).ok();
        if (ok) sessions.push_back(std::move(s).value());
      }
      if (!ok) return fail("bench", "could not open " + std::to_string(batch) + " sessions at context " + std::to_string(ctx));
      std::vector<StepItem> items;
      // Greedy draws on the GPU, as a server decodes: token ids come down, not logits.
      RowSampleSpec greedy;
      greedy.limit = int32_t(config->vocab_size);
      greedy.flags = kRowGreedy;
      for (int64_t i = 0; i < batch; ++i) {
        items.push_back({sessions[size_t(i)].get(), std::span<const int32_t>(&next[size_t(i)], 1)});
        items.back().sample = greedy;
      }
      // Warm-up: the first use of each kernel shape, then the step's graph
      // recorded (the second step of a shape; later ones replay it).
      Status st = e.step(items);
      if (st.ok()) st = e.step(items);
      if (!st.ok()) return fail("bench", st.message());
      std::vector<double> step_s;
      double experts_sum = 0;  // measured distinct experts a sparse layer, summed over the timed steps
      int64_t experts_steps = 0;
      const bool profile_here = o.profile && ctx == o.contexts.front() && batch == o.batches.front();
      e.backend().set_profiling(false);  // the timed runs record no per-op events (they slow every step)
      for (int r = 0; r < o.runs; ++r) {
        const double t0 = now_s();
        for (int64_t k = 0; k < o.tokens; ++k) {
          st = e.step(items);
          if (!st.ok()) return fail("bench", st.message());
          experts_sum += e.distinct_experts(), ++experts_steps;
        }
        step_s.push_back((now_s() - t0) / double(o.tokens));
      }
      if (profile_here) {  // one more run, profiled and not timed
        e.backend().set_profiling(true);
        e.backend().profile_reset();
        for (int64_t k = 0; k < o.tokens && st.ok(); ++k) st = e.step(items);
        e.backend().set_profiling(false);
        if (!st.ok()) return fail("bench", st.message());
        profile = e.backend().profile_report();
      }
      const double t = median_of(step_s);
      const double experts = config->num_experts > 0 && experts_steps ? experts_sum / double(experts_steps) : -1;
      const double bytes =
          step_weight_bytes(*config, traffic, batch, experts) + double(batch) * kv_bytes(*config, ctx, kv_elem);
      const double gbs = bytes / t / 1e9;
      Json r = Json::object();
      r.set("batch", batch);
      r.set("context", ctx);
      r.set("step_ms", t * 1e3);
      r.set("tokens_per_second", double(batch) / t);
      r.set("bytes_per_step", bytes);
      r.set("read_gb_per_second", gbs);
      r.set("fraction_of_hbm", gbs / ceil0->hbm_read_gbps);
      if (experts >= 0) r.set("distinct_experts", experts);
      rows.push_back(r);
      if (!o.json)
        std::printf("%-6lld %-8lld %10.3f %10.1f %12.3e %10.1f %7.1f%%%s\n", (long long)batch, (long long)ctx, t * 1e3,
                    double(batch) / t, bytes, gbs, 100.0 * gbs / ceil0->hbm_read_gbps,
                    experts >= 0 ? ("   " + std::to_string(int(experts + 0.5)) + " experts").c_str() : "");
      std::fflush(stdout);
    }
  }
  out.set("decode", rows);
  {
    const Backend::GraphStats g = e.backend().graph_stats();
    Json gj = Json::object();
    const bool graphs_on = !o.enforce_eager;
    gj.set("enabled", graphs_on);
    gj.set("recorded", g.captured);
    gj.set("replayed_steps", g.replayed);
    gj.set("recording_seconds", g.capture_seconds);
    out.set("graphs", gj);
    if (!o.json)
      std::printf("graphs: %s; %lld decode steps recorded in %.3f s, %lld steps replayed\n",
                  graphs_on ? "on" : "off (--enforce-eager)", (long long)g.captured,
                  g.capture_seconds,
                  (long long)g.replayed);
  }

  // Prefill: one sequence of --prefill tokens in one step.
  if (o.prefill > 0) {
    std::vector<int32_t> prompt;
    for (int64_t i = 0; i < o.prefill; ++i) prompt.push_back(int32_t(3 + (i * 7919) % 200000));
    std::vector<double> ts;
    const int prefill_runs = std::max(2, o.runs / 2 + 1);
    // The first run is a warm-up; with --profile one more, profiled and not timed.
    for (int r = 0; r < prefill_runs + (o.profile ? 1 : 0); ++r) {
      auto fresh = e.new_session();
      if (!fresh.ok()) return fail("bench", fresh.message());
      const bool profiled = r == prefill_runs;
      e.backend().set_profiling(profiled);
      if (profiled) e.backend().profile_reset();
      const double t0 = now_s();
      auto l = (*fresh)->feed(prompt);
      e.backend().set_profiling(false);
      if (!l.ok()) return fail("bench", l.message());
      if (r > 0 && !profiled) ts.push_back(now_s() - t0);
    }
    if (o.profile) prefill_profile = e.backend().profile_report();
    const double t = median_of(ts);
    // FLOPs: 2 per weight per token over the dense weights (and k experts),
    // the head once (only the last row's logits are computed), plus causal
    // attention (QKᵀ and PV over the visible keys). (Until 2026-12-04 the
    // head was counted for every token: 5% more FLOPs than run on Glimmer.)
    double attn = 0;
    for (int64_t l = 0; l < config->num_layers; ++l) {
      const double P = double(o.prefill), W = double(config->sliding_window);
      const double keys = config->is_full(l) ? P * (P + 1) / 2 : (P <= W ? P * (P + 1) / 2 : W * (W + 1) / 2 + (P - W) * W);
      attn += 4.0 * keys * double(config->q_dim());
    }
    const double flops = (traffic.flops - traffic.head_flops) * double(o.prefill) + traffic.head_flops + attn;
    const double tf = flops / t / 1e12;
    Json p = Json::object();
    p.set("tokens", o.prefill);
    p.set("seconds", t);
    p.set("tokens_per_second", double(o.prefill) / t);
    p.set("tflops", tf);
    p.set("fraction_of_bf16_gemm", tf / ceil0->bf16_tflops);
    out.set("prefill", p);
    if (!o.json)
      std::printf("prefill %lld tokens: %.3f s, %.0f tok/s, %.1f TFLOP/s = %.1f%% of the bf16 GEMM rate\n",
                  (long long)o.prefill, t, double(o.prefill) / t, tf, 100.0 * tf / ceil0->bf16_tflops);
  }

  if (o.verify_acceptance > 0) {
    auto vw = bench_verify_widths(e, o, o.verify_acceptance);
    if (!vw.ok()) return fail("bench", vw.message());
    out.set("verify_widths", *vw);
  }

  auto ceil1 = measure_gpu_ceilings(uint64_t(8) << 30, 8192, 5);
  Json c = Json::object();
  c.set("hbm_read_gb_per_second_before", ceil0->hbm_read_gbps);
  c.set("bf16_gemm_tflops_before", ceil0->bf16_tflops);
  if (ceil1.ok()) {
    c.set("hbm_read_gb_per_second_after", ceil1->hbm_read_gbps);
    c.set("bf16_gemm_tflops_after", ceil1->bf16_tflops);
  }
  out.set("ceilings", c);
  if (!profile.empty()) out.set("profile", profile);
  if (!prefill_profile.empty()) out.set("prefill_profile", prefill_profile);
  if (o.json) {
    std::printf("%s\n", out.dump().c_str());
  } else {
    if (ceil1.ok())
      std::printf("ceilings after: HBM read %.0f GB/s, bf16 GEMM %.0f TFLOP/s\n", ceil1->hbm_read_gbps, ceil1->bf16_tflops);
    if (!profile.empty())
      std::printf("\nprofile (batch %lld, context %lld; one extra run, not in the timings)\n%s",
                  (long long)o.batches.front(), (long long)o.contexts.front(), profile.c_str());
    if (!prefill_profile.empty())
      std::printf("\nprofile (prefill of %lld tokens; one extra run, not in the timings)\n%s", (long long)o.prefill,
                  prefill_profile.c_str());
  }
  return 0;
}

}  // namespace muse::tool
