// muse bench: CPU decode throughput on a random model of Muse Spark's shape
// (latent MoE with top-k sigmoid routing, hybrid sliding/full attention,
// gated residuals), scaled to about 1B parameters and generated in memory.
// Reports tokens/s and the weight bytes each token must read per second, as
// a fraction of this host's DRAM read bandwidth measured in the same run by
// a streaming-read kernel on the same number of threads. Medians of --runs.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <tuple>
#include <vector>

#include "bench_options.h"
#include "command.h"
#include "muse/backends/cpu/kernels.h"
#include "muse/backends/cuda/cuda_backend.h"
#include "muse/backends/cpu/thread_pool.h"
#include "muse/core/cli.h"
#include "muse/core/json.h"
#include "muse/engine/engine.h"
#include "muse/model/random_weights.h"
#include "muse/sampling/sampler.h"

namespace muse::tool {
namespace {


std::string spark_config_json(const BenchOptions& o) {
  auto n = [](int64_t v) { return std::to_string(v); };
  return R"({"model_type": "muse_spark", "text_config": {
    "vocab_size": )" + n(o.vocab) + R"(, "hidden_size": )" + n(o.hidden) + R"(, "num_hidden_layers": )" + n(o.layers) +
         R"(, "num_attention_heads": )" + n(o.heads) + R"(, "num_key_value_heads": )" + n(o.kv_heads) +
         R"(, "head_dim": )" + n(o.head_dim) + R"(, "rms_norm_eps": 1e-5, "post_norm_eps": 1e-8,
    "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "sliding_window": )" + n(o.window) + R"(,
    "max_position_embeddings": 1048576, "num_local_experts": )" + n(o.experts) + R"(, "num_experts_per_tok": )" +
         n(o.top_k) + R"(, "moe_hidden_size": )" + n(o.latent) + R"(, "moe_intermediate_size": )" +
         n(o.expert_intermediate) + R"(, "num_shared_experts": 0, "routed_scaling_factor": 1.0,
    "residual_gate_temperature": 0.3, "qk_scale_factor": 5.4730064863875, "output_multiplier": 0.17677669529663687,
    "final_logit_softcapping": 20.0, "tie_word_embeddings": false, "bos_token_id": 1, "eos_token_id": 2}})";
}

// Streaming read of `bytes` with `threads` threads (each a contiguous
// slice, the same vector loads as the matmul kernels), GB/s, best of 3 passes.
double measure_read_bandwidth(cpu::ThreadPool& pool, const std::vector<float>& buf) {
  const cpu::KernelTable& k = cpu::best_kernels();
  const int64_t n = int64_t(buf.size()), parts = pool.size() * 4, chunk = (n + parts - 1) / parts;
  std::vector<float> sink(static_cast<size_t>(parts));
  double best = 0;
  for (int pass = 0; pass < 3; ++pass) {
    const double t0 = now_s();
    pool.run(parts, [&](int64_t p, int) {
      const int64_t b = p * chunk, e = std::min(n, b + chunk);
      if (b < e) sink[size_t(p)] = k.sum_squares(buf.data() + b, e - b);
    });
    const double dt = now_s() - t0;
    best = std::max(best, double(n) * 4 / dt / 1e9);
  }
  volatile float keep = sink[0];
  (void)keep;
  return best;
}

int bench_command(int argc, char** argv) {
  BenchOptions o;
  ArgParser args("bench",
                 "CPU decode benchmark on a ~1B-parameter random model of Muse Spark's shape (generated in memory): "
                 "tokens/s and weight bytes read per second as a fraction of the host's DRAM read bandwidth, "
                 "measured in the same run on the same threads. Medians of --runs. See bench/NOTES.md.");
  args.option("--device", &o.device, "cpu|cuda", "where the model runs (default cpu)");
  args.option("--threads", &o.threads, "N", "CPU threads (default: all available)");
  args.option("--runs", &o.runs, "N", "measurement runs (default 5; medians reported)");
  args.option("--tokens", &o.tokens, "N", "decode tokens per run (default 64)");
  args.option("--prompt", &o.prompt, "N", "prompt tokens per run (default 32)");
  args.option("--hidden", &o.hidden, "N", "hidden size (default 2048)");
  args.option("--layers", &o.layers, "N", "layers (default 12: full attention at 3, 7, 11)");
  args.option("--heads", &o.heads, "N", "query heads (default 32)");
  args.option("--kv-heads", &o.kv_heads, "N", "KV heads (default 4)");
  args.option("--head-dim", &o.head_dim, "N", "head dimension (default 64)");
  args.option("--experts", &o.experts, "N", "experts per layer (default 64)");
  args.option("--top-k", &o.top_k, "N", "experts per token (default 8)");
  args.option("--latent", &o.latent, "N", "latent width (default 1024)");
  args.option("--expert-intermediate", &o.expert_intermediate, "N", "expert SwiGLU width (default 256)");
  args.option("--vocab", &o.vocab, "N", "vocabulary (default 32000)");
  args.option("--weights", &o.weights, "FORMAT",
              "bf16 (default), f32, or a format quantized at load as --quantization does: nvfp4, mxfp4, fp8, int4");
  args.option("--quantization", &o.weights, "KIND",
              "nvfp4, mxfp4, fp8 or int4: the same as --weights KIND (--device cuda: the quantized slots are random "
              "codes and scales made on the GPU)");
  args.option("--bandwidth-mib", &o.bandwidth_mib, "MIB", "streaming-read buffer for the DRAM measurement (default 2048)");
  args.flag("--json", &o.json, "print one JSON object");
  args.option("--verify-widths", &o.verify_acceptance, "A",
              "--device cuda: time speculative verify steps of 1..8 rows and check the scheduler's width choice at "
              "per-position acceptance A (e.g. 0.7)");
  args.flag("--profile", &o.profile,
            "time every backend operation in one extra run (not in the timings) and print the breakdown");
  std::string batches, contexts;
  args.option("--model", &o.model, "NAME", "--device cuda: glimmer-30b (default) or spark-slice");
  args.option("--batch", &batches, "LIST", "--device cuda: decode batch sizes (default 1,4,16,64)");
  args.option("--context", &contexts, "LIST", "--device cuda: decode contexts in tokens (default 1024,32768)");
  args.option("--prefill-tokens", &o.prefill, "N", "--device cuda: prefill length (default 8192; 0 skips)");
  args.option("--product-kernel", &o.product_kernel, "N",
              "--device cuda: force one bf16 product kernel for every row count, for A/B timing (the same bits): "
              "1 registers, 2/3/4/6 the ring with that many stages, 5 wide, 7 the prefill GEMM, 8/9 the cluster "
              "kernel with 3/4 stages, 10 the cluster kernel with a call's products in one launch, 11 / 12 the wgmma "
              "kernels with 256 / 8..64 activation rows a tile (sm_90a), 13 the 8..64-row wgmma kernel reading x "
              "permuted into scratch first, 14 the same with 32-row tiles read by TMA from one row on, 15 the "
              "streamed ring (a call's products in equal shares of the GPU's blocks) at 1..8 rows and the rule above; 0 "
              "(default) the shape rule");
  args.option("--expert-kernel", &o.expert_kernel, "N",
              "--device cuda: the FP4 expert down product's kernel, for A/B timing (the same bits): 1 a block per "
              "grouping tile and 16 rows, 2 streaming wherever the layout is aligned, 3 the rule's down product with "
              "the FP4 gate/up at five blocks an SM; 0 (default) the rule: streaming for launches of up to 96 waves "
              "(batch 16 on the Spark slice)");
  args.option("--expert-gemm", &o.expert_gemm, "N",
              "--device cuda: the experts' products, for A/B timing (the same bits): 1 the per-tile kernels, "
              "2 / 3 the grouped wgmma GEMM in tiles of 256 / 128 pairs wherever it applies (BF16, NVFP4, MXFP4, "
              "FP8 per tensor / channel, INT4 always in tiles of 128); 0 (default) the rule: BF16 from 8 pairs an "
              "expert on average (tiles of 256 from 256), NVFP4 / MXFP4 / FP8 / INT4 from 32 (tiles of 128)");
  args.option("--attention-merge", &o.attention_merge, "N",
              "--device cuda: the split attention's merge, for A/B timing (the same bits): 1 a block of 128 threads "
              "a row and q head, 2 a warp a row and q head; 0 (default) the rule: warps from 1024 rows × q heads");
  args.option("--moe-combine", &o.moe_combine, "N",
              "--device cuda: the latent experts' combine, for A/B timing (the same bits): 1 a block of 256 threads "
              "a token, 2 a cluster of eight blocks a token; 0 (default) the rule: the cluster");
  args.option("--stream-stages", &o.stream_stages, "N",
              "--device cuda: the streamed ring's depth, for A/B timing (the same bits; which calls stream stays "
              "the rule's): 2, 3 or 5 stages (six, four or two blocks an SM); 0 (default) the rule: four");
  std::string skip_ops;
  args.option("--skip-ops", &skip_ops, "LIST",
              "--device cuda: do not launch these ops (names as --profile prints them, e.g. residual_norm,swiglu): "
              "what each costs a step once its launch overlaps its neighbours'. Timing only: the outputs are not "
              "valid");
  args.flag("--enforce-eager", &o.enforce_eager,
            "--device cuda: launch every kernel as enqueued, no CUDA graphs of the decode steps (as `muse serve "
            "--enforce-eager`)");
  args.flag("--one-stream", &o.one_stream,
            "--device cuda: run every op in order on one stream, for A/B timing (the same bits): no side branch "
            "(Spark's router and top-k beside the pre-expert product)");
  args.option("--speculative", &o.spec_target, "DIR",
              "speculative-decoding benchmark on this checkpoint (e.g. models/muse-tiny) and its drafter: greedy "
              "tokens/s without the drafter, with k = 1..4 and adaptive, at --batch (default 1,8), mean accepted length");
  args.option("--write-random", &o.write_random, "DIR",
              "write --model's shape (glimmer-30b or spark-slice, --layers) as a random BF16 checkpoint in DIR "
              "(4 GiB shards) and exit: for boot timing (`muse run --model DIR --prompt-ids 1 --json` reports "
              "load_seconds)");
  args.option("--drafter", &o.spec_drafter, "DIR", "--speculative: the drafter (default DIR/drafter)");
  args.option("--prompts", &o.spec_prompts, "FILE", "--speculative: prompt ids (default bench/data/muse_tiny_gate_prompts.json)");
  if (int rc = parse_flags(args, argc, argv, "bench"); rc >= 0) return rc;
  o.batches_given = !batches.empty();
  o.layers_given = args.given("--layers");
  for (auto [text, list, flag] : {std::tuple{&batches, &o.batches, "--batch"}, std::tuple{&contexts, &o.contexts, "--context"}}) {
    if (text->empty()) continue;
    auto v = parse_int_list(*text);
    if (!v.ok()) return fail("bench", std::string(flag) + ": " + v.message());
    for (int64_t x : *v)
      if (x < 1) return fail("bench", std::string(flag) + " values must be >= 1");
    if (v->empty()) return fail("bench", std::string(flag) + " is empty");
    *list = *v;
  }
  if (o.product_kernel < 0 || o.product_kernel > 15)
    return fail("bench", "--product-kernel is 0 (the shape rule) or a kernel 1..15, not " + std::to_string(o.product_kernel));
  if (o.product_kernel != 0 && o.device != "cuda") return fail("bench", "--product-kernel needs --device cuda");
  if (o.expert_kernel < 0 || o.expert_kernel > 3)
    return fail("bench", "--expert-kernel is 0 (the rule), 1 (per-tile blocks), 2 (streaming) or 3 (gate/up at five "
                         "blocks an SM), not " +
                             std::to_string(o.expert_kernel));
  if (o.expert_kernel != 0 && o.device != "cuda") return fail("bench", "--expert-kernel needs --device cuda");
  if (o.expert_gemm < 0 || o.expert_gemm > 3)
    return fail("bench", "--expert-gemm is 0 (the rule), 1 (per-tile kernels), 2 or 3 (the grouped GEMM in tiles of "
                         "256 or 128 pairs), not " + std::to_string(o.expert_gemm));
  if (o.expert_gemm != 0 && o.device != "cuda") return fail("bench", "--expert-gemm needs --device cuda");
  if (o.attention_merge < 0 || o.attention_merge > 2)
    return fail("bench", "--attention-merge is 0 (the rule), 1 (a block a row and head) or 2 (a warp a row and head), not " +
                             std::to_string(o.attention_merge));
  if (o.attention_merge != 0 && o.device != "cuda") return fail("bench", "--attention-merge needs --device cuda");
  if (o.moe_combine < 0 || o.moe_combine > 2)
    return fail("bench", "--moe-combine is 0 (the rule), 1 (a block a token) or 2 (a cluster a token), not " +
                             std::to_string(o.moe_combine));
  if (o.moe_combine != 0 && o.device != "cuda") return fail("bench", "--moe-combine needs --device cuda");
  if (o.stream_stages != 0 && (o.stream_stages < 2 || o.stream_stages > 5))
    return fail("bench", "--stream-stages is 0 (the rule) or 2..5, not " + std::to_string(o.stream_stages));
  if (o.stream_stages != 0 && o.device != "cuda") return fail("bench", "--stream-stages needs --device cuda");
  for (size_t at = 0; !skip_ops.empty() && at <= skip_ops.size();) {
    const size_t end = std::min(skip_ops.find(',', at), skip_ops.size());
    const std::string name = skip_ops.substr(at, end - at);
    const auto& ok = cuda_skippable_ops();
    if (std::find(ok.begin(), ok.end(), name) == ok.end()) {
      std::string list;
      for (const auto& n : ok) {
        if (!list.empty()) list += ", ";
        list += n;
      }
      return fail("bench", "--skip-ops: \"" + name + "\" is not an op that may be skipped (" + list + ")");
    }
    o.skip_ops.push_back(name);
    at = end + 1;
  }
  if (!o.skip_ops.empty() && o.device != "cuda") return fail("bench", "--skip-ops needs --device cuda");
  if (o.enforce_eager && o.device != "cuda") return fail("bench", "--enforce-eager needs --device cuda");
  if (o.one_stream && o.device != "cuda") return fail("bench", "--one-stream needs --device cuda");
  if (o.runs < 1 || o.tokens < 2 || o.prompt < 1 || o.bandwidth_mib < 64 || o.threads < 0)
    return std::fprintf(stderr, "muse bench: --runs >= 1, --tokens >= 2, --prompt >= 1, --bandwidth-mib >= 64\n"), 2;
  QuantKind quantize = QuantKind::None;
  if (o.weights != "bf16" && o.weights != "f32") {
    auto k = parse_quant_kind(o.weights);
    if (!k.ok()) return std::fprintf(stderr, "muse bench: --weights is bf16, f32, nvfp4, mxfp4, fp8 or int4\n"), 2;
    quantize = *k;
  }
  auto device = parse_device(o.device);
  if (!device.ok()) return std::fprintf(stderr, "muse bench: %s\n", device.message().c_str()), 2;
  if (Status st = check_device(*device); !st.ok()) return std::fprintf(stderr, "muse bench: %s\n", st.message().c_str()), 2;
  if (!o.write_random.empty()) return bench_write_random(o);
  if (!o.spec_target.empty()) return bench_spec(o);
  if (*device == Device::Cuda) return bench_cuda(o);

  auto config = parse_model_config(spark_config_json(o), "bench config");
  if (!config.ok()) return std::fprintf(stderr, "muse bench: %s\n", config.message().c_str()), 2;
  const int64_t params = count_parameters(describe_weights(*config));
  const int threads = o.threads > 0 ? o.threads : cpu::available_cpus();
  if (!o.json)
    std::fprintf(stderr, "muse bench: %.3fB parameters, %s weights, %d threads; generating weights...\n",
                 double(params) / 1e9, o.weights.c_str(), threads);

  double t0 = now_s();
  RandomWeightOptions ro;
  ro.dtype = o.weights == "f32" ? DType::F32 : DType::BF16;
  ro.threads = threads;
  auto source = std::make_unique<RandomWeightSource>(*config, ro);
  const double gen_s = now_s() - t0;
  EngineOptions eo;
  eo.backend.cpu.threads = threads;
  eo.quantization = quantize;
  eo.max_batch_tokens = std::max<int64_t>(o.prompt, 1);
  eo.max_model_len = o.prompt + o.tokens + 1;
  auto engine = Engine::create(*config, std::move(source), eo);
  if (!engine.ok()) return std::fprintf(stderr, "muse bench: %s\n", engine.message().c_str()), 1;
  const DecodeTraffic traffic = decode_traffic(*config, (*engine)->model().weights());

  cpu::ThreadPool pool(threads);
  std::vector<float> buf(static_cast<size_t>(o.bandwidth_mib) << 18);
  for (size_t i = 0; i < buf.size(); ++i) buf[i] = float(i & 1023) * 1e-3f;  // touch every page

  std::vector<int32_t> prompt;
  for (int64_t i = 0; i < o.prompt; ++i) prompt.push_back(int32_t(3 + (i * 7919) % (o.vocab - 3)));
  bool profile_this_run = false;
  auto decode_run = [&](double* prefill_tps) -> double {
    auto s = (*engine)->new_session();
    if (!s.ok()) return 0;
    double a = now_s();
    auto logits = (*s)->feed(prompt);
    if (!logits.ok()) return 0;
    *prefill_tps = double(o.prompt) / (now_s() - a);
    // --profile: the decode of the extra run only (a failed run ends the bench).
    (*engine)->backend().set_profiling(profile_this_run);
    if (profile_this_run) (*engine)->backend().profile_reset();
    a = now_s();
    for (int64_t i = 0; i < o.tokens; ++i) {
      int32_t t = argmax(*logits, config->vocab_size);
      logits = (*s)->feed(std::span<const int32_t>(&t, 1));
      if (!logits.ok()) return 0;
    }
    return double(o.tokens) / (now_s() - a);
  };
  double warm_prefill = 0;
  if (decode_run(&warm_prefill) <= 0) return std::fprintf(stderr, "muse bench: decode failed\n"), 1;

  std::vector<double> tps, prefill, bw;
  for (int r = 0; r < o.runs; ++r) {  // interleaved, so drift hits both alike
    bw.push_back(measure_read_bandwidth(pool, buf));
    double p = 0;
    tps.push_back(decode_run(&p));
    prefill.push_back(p);
  }
  if (o.profile) {  // one more run, profiled and not timed
    profile_this_run = true;
    double p = 0;
    if (decode_run(&p) <= 0) return std::fprintf(stderr, "muse bench: decode failed\n"), 1;
  }
  const double tok_s = median_of(tps), dram = median_of(bw), gbs = tok_s * double(traffic.total()) / 1e9;

  Json j = Json::object();
  j.set("backend", (*engine)->backend().name());
  j.set("threads", threads);
  j.set("parameters", params);
  j.set("weights", o.weights);
  j.set("resident_weight_bytes", int64_t((*engine)->model().weights().resident_bytes()));
  j.set("weight_bytes_per_token", int64_t(traffic.total()));
  j.set("dense_bytes_per_token", int64_t(traffic.dense_bytes));
  j.set("expert_bytes_per_token", int64_t(traffic.expert_bytes));
  j.set("head_bytes_per_token", int64_t(traffic.head_bytes));
  j.set("flops_per_token", traffic.flops);
  j.set("decode_tokens_per_second", tok_s);
  j.set("weight_read_gb_per_second", gbs);
  j.set("dram_read_gb_per_second", dram);
  j.set("fraction_of_dram_bandwidth", gbs / dram);
  j.set("prefill_tokens_per_second", median_of(prefill));
  Json runs = Json::array();
  for (int r = 0; r < o.runs; ++r) {
    Json x = Json::object();
    x.set("decode_tokens_per_second", tps[size_t(r)]);
    x.set("dram_read_gb_per_second", bw[size_t(r)]);
    runs.push_back(x);
  }
  j.set("runs", runs);
  j.set("weight_generation_seconds", gen_s);
  if (o.profile) j.set("profile", (*engine)->backend().profile_report());
  if (o.json) {
    std::printf("%s\n", j.dump().c_str());
  } else {
    std::printf("backend            %s\n", (*engine)->backend().name().c_str());
    std::printf("model              %.3fB params (%s), %lld layers, %lld experts top-%lld, latent %lld\n",
                double(params) / 1e9, o.weights.c_str(), (long long)o.layers, (long long)o.experts,
                (long long)o.top_k, (long long)o.latent);
    std::printf("resident weights   %.1f MB\n", double((*engine)->model().weights().resident_bytes()) / 1e6);
    std::printf("bytes per token    %.1f MB (dense %.1f, experts %.1f, head %.1f); %.2f GFLOP\n",
                double(traffic.total()) / 1e6, double(traffic.dense_bytes) / 1e6, double(traffic.expert_bytes) / 1e6,
                double(traffic.head_bytes) / 1e6, traffic.flops / 1e9);
    std::printf("decode             %.1f tok/s (median of %d x %lld tokens)\n", tok_s, o.runs, (long long)o.tokens);
    std::printf("weight reads       %.1f GB/s\n", gbs);
    std::printf("DRAM read (stream) %.1f GB/s on %d threads\n", dram, threads);
    std::printf("fraction           %.1f%% of measured DRAM read bandwidth\n", 100.0 * gbs / dram);
    std::printf("prefill            %.1f tok/s (%lld-token prompt)\n", median_of(prefill), (long long)o.prompt);
    if (o.profile)
      std::printf("\nprofile of one extra run's decode (%lld tokens, not in the timings)\n%s", (long long)o.tokens,
                  (*engine)->backend().profile_report().c_str());
  }
  return 0;
}

}  // namespace

MUSE_COMMAND("bench", "CPU decode benchmark on a random ~1B Spark-shaped model", bench_command, 20);

}  // namespace muse::tool
