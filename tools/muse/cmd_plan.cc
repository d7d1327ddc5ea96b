// muse plan: size a deployment (weights, KV cache, offload, pinned host
// memory, decode ceiling) before downloading anything. No GPU needed.
#include <cmath>
#include <cstdio>
#include <string>

#include "command.h"
#include "muse/core/cli.h"
#include "muse/plan/plan.h"

namespace muse::tool {
namespace {

int plan_command(int argc, char** argv) {
  plan::PlanOptions o;
  std::string max_model_len, decode_context, kv_cache_memory;
  std::vector<std::string> offload_params;
  int gpus = 0;
  double gpu_mem = -1, gpu_bw = -1, host_mem = -1, host_bw = -1, link_bw = -1, offload = -1, overhead = -1;
  bool json = false;

  std::string models, hardware;
  for (const auto& n : plan::model_profile_names()) models += (models.empty() ? "" : ", ") + n;
  for (const auto& n : plan::hardware_profile_names()) hardware += (hardware.empty() ? "" : ", ") + n;

  ArgParser args("plan",
                 "Size a deployment before downloading it: weight bytes by part, KV cache per token and capacity, what "
                 "must be offloaded, peak pinned host memory (exact and with power-of-two rounding) and the batch-1 "
                 "decode ceiling from memory and link bandwidth. Method and sources: docs/plan.md. Exit status: 0 fits, "
                 "1 does not fit, 2 bad input.");
  args.option("--model", &o.model, "NAME|CONFIG.json", "built-in profile (" + models + ") or a config.json / model directory");
  args.alias("-m", "--model");
  args.option("--weight-format", &o.weight_format, "FORMAT",
              "bf16|nvfp4|mxfp4|fp8|int4 (default: the profile's, or the config's quantization_config)");
  args.option("--hardware", &o.hardware, "NAME", "built-in hardware (" + hardware + "); without it (or machine figures) only the model is sized");
  args.option("--gpus", &gpus, "N", "number of GPUs (overrides the profile)");
  args.alias("--tensor-parallel-size", "--gpus");
  args.alias("-tp", "--gpus");
  args.flag("--enable-expert-parallel", &o.expert_parallel,
            "as `muse serve`: routed experts split by expert (the same bytes per GPU; Spark needs it for --gpus > 1)");
  args.option("--gpu-memory-gb", &gpu_mem, "GIB", "memory per GPU, GiB");
  args.option("--gpu-bandwidth-gbs", &gpu_bw, "GB/S", "memory bandwidth per GPU, GB/s");
  args.option("--host-memory-gb", &host_mem, "GIB", "host DRAM of the machine, GiB");
  args.option("--host-bandwidth-gbs", &host_bw, "GB/S", "host DRAM bandwidth of the machine, GB/s");
  args.option("--link-bandwidth-gbs", &link_bw, "GB/S", "host-to-GPU link per GPU, one direction, GB/s");
  args.option("--max-model-len", &max_model_len, "N", "context length (default: the model's maximum); 128K, 1M accepted");
  args.option("--max-num-seqs", &o.max_num_seqs, "N", "concurrent sequences (default 256)");
  args.option("--max-num-batched-tokens", &o.max_num_batched_tokens, "N", "tokens per forward pass (default 8192)");
  args.option("--gpu-memory-utilization", &o.gpu_memory_utilization, "F", "fraction of GPU memory to use (default 0.9)");
  args.option("--kv-cache-dtype", &o.kv_cache_dtype, "DTYPE", "auto|bf16|fp8|fp8_e4m3|fp8_e5m2|f32 (default auto = bf16; f32 is the CPU server's auto)");
  args.option("--block-size", &o.block_size, "N", "positions per KV block of the paged pool (default 64)");
  args.option("--kv-cache-memory-bytes", &kv_cache_memory, "SIZE",
              "the pool's budget, as muse serve (4G, 512M or bytes; default: the machine's KV budget)");
  args.option("--cpu-offload-gb", &offload, "GIB",
              "weights to offload per GPU, GiB, as vLLM (default: the minimum that fits)");
  args.repeated("--cpu-offload-params", &offload_params, "NAMES",
                "offload only parameters whose names contain these segments (comma list; default: experts)");
  args.option("--speculative-config", &o.speculative_config, "JSON", "vLLM speculative config, e.g. '{\"method\":\"dspark\"}'");
  args.option("--drafter", &o.drafter, "NAME|CONFIG.json",
              "draft model: muse-spark-open-dspark, muse-glimmer-30b-assistant, or a drafter config.json");
  args.flag("--language-model-only", &o.language_model_only, "do not load the vision and audio towers");
  args.option("--decode-context", &decode_context, "N", "context length for the decode ceiling (default min(4096, max-model-len))");
  args.option("--runtime-overhead-gb", &overhead, "GIB",
              "activations + runtime overhead per GPU, GiB (default: our estimate; calibrate from vLLM's startup log)");
  args.flag("--json", &json, "print one JSON object instead of the table");

  if (int rc = parse_flags(args, argc, argv, "plan"); rc >= 0) return rc;
  auto fail = [](const std::string& m) { return tool::fail("plan", m); };
  if (args.given("--gpus")) o.overrides.gpus = gpus;
  if (args.given("--gpu-memory-gb")) o.overrides.gpu_memory_gib = gpu_mem;
  if (args.given("--gpu-bandwidth-gbs")) o.overrides.gpu_bandwidth_gbs = gpu_bw;
  if (args.given("--host-memory-gb")) o.overrides.host_memory_gib = host_mem;
  if (args.given("--host-bandwidth-gbs")) o.overrides.host_bandwidth_gbs = host_bw;
  if (args.given("--link-bandwidth-gbs")) o.overrides.link_bandwidth_gbs = link_bw;
  if (args.given("--cpu-offload-gb")) o.cpu_offload_gib = offload;
  if (args.given("--runtime-overhead-gb")) o.runtime_overhead_gib = overhead;
  if (args.given("--max-model-len")) {
    auto v = parse_token_count("--max-model-len", max_model_len);
    if (!v.ok()) return fail(v.message());
    o.max_model_len = *v;
  }
  if (args.given("--kv-cache-memory-bytes")) {
    auto v = parse_byte_size("--kv-cache-memory-bytes", kv_cache_memory);
    if (!v.ok()) return fail(v.message());
    o.kv_cache_memory_bytes = *v;
  }
  if (args.given("--decode-context")) {
    auto v = parse_token_count("--decode-context", decode_context);
    if (!v.ok()) return fail(v.message());
    o.decode_context = *v;
  }
  for (const auto& item : offload_params) {
    size_t start = 0;
    while (start <= item.size()) {
      size_t comma = item.find(',', start);
      if (comma == std::string::npos) comma = item.size();
      std::string seg = item.substr(start, comma - start);
      if (seg.empty()) return fail("--cpu-offload-params: empty name segment in '" + item + "'");
      o.cpu_offload_params.push_back(seg);
      start = comma + 1;
    }
  }
  if (o.model.empty()) return fail("--model is required (" + models + ", or a config.json)");

  auto plan = plan::make_plan(o);
  if (!plan.ok()) return fail(plan.message());
  if (json) {
    std::printf("%s\n", plan::plan_to_json(*plan).dump(JsonDumpOptions::python(2, false)).c_str());
  } else {
    std::printf("%s", plan::plan_to_table(*plan).c_str());
  }
  if (!plan->fits) {
    for (const auto& s : plan->problems) std::fprintf(stderr, "muse plan: %s\n", s.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

MUSE_COMMAND("plan", "size a deployment: memory, offload, pinned host memory, decode ceiling", plan_command, 40);

}  // namespace muse::tool
