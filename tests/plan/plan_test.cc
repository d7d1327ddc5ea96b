// `muse plan` against the seeds' arithmetic (muse-architecture.md §1, §4;
// seeds 000, 002, 004) and its bad-input errors.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <string>

#include "muse/core/mapped_file.h"
#include "muse/plan/plan.h"

using namespace muse;
using namespace muse::plan;

namespace {

constexpr int64_t GiB = int64_t(1) << 30;
constexpr int64_t MiB = int64_t(1) << 20;

Plan make(PlanOptions o) {
  auto p = make_plan(o);
  EXPECT_TRUE(p.ok()) << (p.ok() ? "" : p.message());
  return p.ok() ? std::move(p).value() : Plan{};
}

PlanOptions spark(const std::string& model = "muse-spark-open", const std::string& hw = "b300x4") {
  PlanOptions o;
  o.model = model;
  o.hardware = hw;
  return o;
}

std::string error_of(const PlanOptions& o) {
  auto p = make_plan(o);
  EXPECT_FALSE(p.ok());
  return p.ok() ? "" : p.message();
}

std::string temp_file(const std::string& name, const std::string& text) {
  std::string path = testing::TempDir() + "/" + name;
  std::ofstream(path) << text;
  return path;
}

}  // namespace

// Seed 002 (vLLM day-0 blog): 799B experts, 13.5B attention, 4.2B latent,
// 3.3B embedding + output layer; muse-architecture.md §1 gives the arithmetic.
TEST(PlanParams, SparkBreakdownMatchesSeed002) {
  Plan p = make(spark());
  EXPECT_EQ(p.params.experts, int64_t(62) * 256 * (8192 * 4096 + 4096 * 4096));
  EXPECT_EQ(p.params.experts, 798'863'917'056);
  EXPECT_EQ(p.params.attention, int64_t(62) * (3 * 8192 * 8192 + 2 * 1024 * 8192));
  EXPECT_EQ(p.params.attention, 13'522'436'096);
  EXPECT_EQ(p.params.latent, int64_t(62) * 2 * 8192 * 4096);
  EXPECT_EQ(p.params.embeddings + p.params.head, int64_t(2) * 202048 * 8192);
  EXPECT_EQ(p.params.router, int64_t(62) * (256 * 8192 + 256));
  // Rounded as the blog prints them.
  EXPECT_EQ(std::lround(double(p.params.experts) / 1e9), 799);
  EXPECT_NEAR(double(p.params.attention) / 1e9, 13.5, 0.05);
  EXPECT_NEAR(double(p.params.latent) / 1e9, 4.2, 0.05);
  EXPECT_NEAR(double(p.params.embeddings + p.params.head) / 1e9, 3.3, 0.05);
  EXPECT_NEAR(double(p.params.total()) / 1e9, 820.0, 0.1);  // "≈ 820B (the release says ≈816B)"

  Json j = plan_to_json(p);
  const Json& params = *j.find("params");
  for (const char* key : {"experts", "attention", "latent", "embeddings", "total"}) {
    ASSERT_TRUE(params.find(key) && params.find(key)->is_int()) << key;
  }
  EXPECT_EQ(params.find("embeddings")->as_int(), 3'310'354'432);
  EXPECT_NEAR(double(params.find("active_per_token")->as_int()) / 1e9, 44.4, 0.05);  // checkpoint-formats §5.3
  // Towers: the vision tower from vision_config is ~1.9B (seed 002), audio 118M.
  EXPECT_NEAR(double(p.vision.params) / 1e9, 1.9, 0.1);
  EXPECT_EQ(p.audio.params, 118'000'000);
}

// Seed 004 / muse-architecture.md §4: the KV test vectors.
TEST(PlanKv, SparkVectorsMatchSeed004) {
  Plan p = make(spark());  // default max-model-len = 1,048,576
  EXPECT_EQ(p.options.max_model_len, 1'048'576);
  EXPECT_EQ(p.kv.full_layers, 16);
  EXPECT_EQ(p.kv.sliding_layers, 46);
  EXPECT_EQ(p.kv.values_per_token_all_full, 126'976);
  EXPECT_EQ(p.kv.bytes_per_token_all_full, 253'952);  // 248 KiB
  EXPECT_EQ(p.kv.bytes_per_token_all_full, 248 * 1024);
  EXPECT_EQ(p.kv.all_full_bytes_at_max_model_len, int64_t(253'952) * 1'048'576);
  EXPECT_NEAR(double(p.kv.all_full_bytes_at_max_model_len) / 1e9, 266.3, 0.05);  // "~266 GB"
  EXPECT_EQ(p.kv.bytes_per_token, 65'536);
  EXPECT_NEAR(double(p.kv.bytes_per_token) * 1'048'576 / 1e9, 68.7, 0.05);  // "~68 GB"
  EXPECT_EQ(p.kv.sliding_bytes_per_sequence, int64_t(46) * 2048 * 4096);
  EXPECT_NEAR(double(p.kv.sliding_bytes_per_sequence) / 1e6, 386, 0.5);  // "~386 MB"
  EXPECT_EQ(p.kv.bytes_at_max_model_len, int64_t(65'536) * 1'048'576 + 385'875'968);
  EXPECT_LT(double(p.kv.bytes_at_max_model_len) / double(p.kv.all_full_bytes_at_max_model_len), 0.27);  // "just over 1/4"
  EXPECT_GT(double(p.kv.bytes_at_max_model_len) / double(p.kv.all_full_bytes_at_max_model_len), 0.25);

  PlanOptions o = spark();
  o.max_model_len = 131072;
  Plan q = make(o);
  EXPECT_EQ(q.kv.all_full_bytes_at_max_model_len, 31 * GiB);  // "31 GiB"
  EXPECT_NEAR(double(q.kv.bytes_at_max_model_len) / double(GiB), 8.36, 0.005);  // "~8.4 GiB"
  EXPECT_NEAR(double(q.kv.all_full_bytes_at_max_model_len) / double(q.kv.bytes_at_max_model_len), 3.7, 0.02);

  o.kv_cache_dtype = "fp8_e4m3";  // vLLM spelling
  Plan f = make(o);
  EXPECT_EQ(f.kv.dtype, "fp8");
  EXPECT_EQ(f.kv.bytes_per_token, 32'768);
  EXPECT_EQ(f.kv.sliding_bytes_per_sequence, 385'875'968 / 2);

  Json j = plan_to_json(q);
  const Json& kv = *j.find("kv");
  for (const char* key : {"bytes_per_token_all_full", "bytes_per_token", "sliding_bytes_per_sequence", "bytes_at_max_model_len"})
    ASSERT_TRUE(kv.find(key) && kv.find(key)->is_int()) << key;
  EXPECT_EQ(kv.find("bytes_at_max_model_len")->as_int(), 8'975'810'560);
}

TEST(PlanKv, GlimmerFromTheRealConfig) {
  const std::string config = std::string(MUSE_SOURCE_DIR) + "/../shared/testdata/muse-glimmer/config.json";
  if (!file_exists(config)) GTEST_SKIP() << "shared test data absent: " << config;
  PlanOptions o;
  o.model = config;
  o.hardware = "h200";
  Plan p = make(o);
  EXPECT_EQ(p.model.scheme.format, WeightFormat::BF16);
  EXPECT_EQ(p.kv.full_layers, 13);
  EXPECT_EQ(p.kv.bytes_per_token_all_full, 52 * 2 * 2 * 128 * 2);
  EXPECT_EQ(p.kv.bytes_per_token, 13 * 1024);
  EXPECT_EQ(p.params.experts, 0);
  EXPECT_NEAR(double(p.params.total()) / 1e9, 27.9, 0.1);
  EXPECT_NEAR(double(p.params.total() + p.vision.params) / 1e9, 29.8, 0.2);  // "30B"
  // The built-in profile describes the same model.
  PlanOptions b = o;
  b.model = "muse-glimmer-30b";
  Plan q = make(b);
  EXPECT_EQ(q.params.total(), p.params.total());
  EXPECT_EQ(q.vision.params, p.vision.params);
  EXPECT_EQ(q.kv.bytes_per_token_all_full, p.kv.bytes_per_token_all_full);
  EXPECT_TRUE(p.fits);  // 56 GB of BF16 weights on a 141 GB H200
}

// checkpoint-formats.md §5.3 / expert-offload.md §1.1: 27 MiB per NVFP4
// expert, 96 MiB per BF16 expert in layers 0 and 61, 453.0 GiB of experts.
TEST(PlanBytes, SparkNvfp4ExpertsAsPublished) {
  Plan p = make(spark("muse-spark-open-nvfp4", "gb300"));
  EXPECT_EQ(quantized_matrix_bytes(WeightFormat::NVFP4, 1, 8192, 4096) +
                quantized_matrix_bytes(WeightFormat::NVFP4, 1, 4096, 4096),
            27 * MiB + 2 * 8);  // + F32 weight_scale_2 and input_scale per matrix
  const int64_t global_scales = 60 * int64_t(256 * 2 * 4 * 2 + 256 * 4 * 2);
  EXPECT_EQ(p.bytes.experts, int64_t(60) * 256 * 27 * MiB + int64_t(2) * 256 * 96 * MiB + global_scales);
  EXPECT_NEAR(double(p.bytes.experts) / double(GiB), 453.0, 0.05);
  EXPECT_NEAR(double(p.bytes.experts) / 1e9, 486.4, 0.05);
  EXPECT_EQ(p.bytes.latent, int64_t(62) * 2 * 8192 * 4096 * 2);  // BF16: 7.75 GiB
  EXPECT_NEAR(double(p.bytes.router) / double(GiB), 0.48, 0.005);
  // Experts + latent + router = seed 000's "461 GiB of experts".
  EXPECT_NEAR(double(p.bytes.experts + p.bytes.latent + p.bytes.router) / double(GiB), 461.2, 0.1);
  Json j = plan_to_json(p);
  EXPECT_EQ(j.find("model")->find("bf16_expert_layers")->dump(), "[0,61]");
}

// Seed 000: one GB300, --cpu-offload-gb 310 --cpu-offload-params experts.
// vLLM offloads layer by layer, tensor by tensor, checking the budget before
// each: layer 0's BF16 experts (16 + 8 GiB), layers 1-42 NVFP4 (6.75 GiB
// each), then layer 43's 4 GiB w13_weight crosses 310 GiB.
TEST(PlanOffload, Seed000Gb300PinnedPeak) {
  PlanOptions o = spark("muse-spark-open-nvfp4", "gb300");
  o.cpu_offload_gib = 310;
  o.cpu_offload_params = {"experts"};
  o.max_model_len = 131072;
  o.max_num_seqs = 4;
  o.gpu_memory_utilization = 0.92;
  Plan p = make(o);
  const int64_t nvfp4_layer = 4 * GiB + 2 * GiB + 512 * MiB + 256 * MiB + 2048 + 1024 + 2048 + 1024;
  const int64_t exact = 24 * GiB + 42 * nvfp4_layer + 4 * GiB;
  EXPECT_EQ(p.pinned.exact, exact);
  EXPECT_NEAR(double(exact) / double(GiB), 311.5, 0.001);  // the seed's title: "311 GiB of experts in Grace"
  EXPECT_EQ(p.offload.first_layer, 0);
  EXPECT_EQ(p.offload.last_layer, 43);
  EXPECT_EQ(p.offload.last_tensor, "layers.43.mlp.experts.w13_weight");
  EXPECT_EQ(p.pinned.buffers, 2 + 42 * 8 + 1);
  // Every Muse expert tensor is a power of two bytes long, so PyTorch's
  // rounding adds nothing: far from the ~446 GiB the seed's note predicted.
  EXPECT_EQ(p.pinned.power_of_two, exact);
  EXPECT_EQ(p.pinned.largest_buffer, 16 * GiB);
  EXPECT_TRUE(p.fits);
  // Host bytes per token: 8/256 of every offloaded expert tensor (≈ 10.45 GB,
  // expert-offload.md §5: "0.68 x 15.2 = 10.4 GB").
  const double host = double(24 * GiB + 42 * nvfp4_layer + 4 * GiB) * 8.0 / 256.0;
  EXPECT_NEAR(p.decode.host_link_bytes_per_token, host, 1.0);
  EXPECT_NEAR(p.decode.host_link_bytes_per_token / 1e9, 10.45, 0.01);
  EXPECT_EQ(p.decode.bound, "host link");
  // Ceiling: min(450 GB/s C2C, 396 GB/s LPDDR5X) reads; the seed measured 25.8-26.6.
  EXPECT_NEAR(p.decode.ceiling_tokens_per_s, 396e9 / host, 0.01);
  EXPECT_GT(p.decode.ceiling_tokens_per_s, 26.6);
  EXPECT_LT(p.decode.ceiling_tokens_per_s, 40);
  // HBM side: dense weights as released (expert-offload.md §1.1: D = 39.2 GB)
  // plus the resident experts' share (≈ 4.8 GB) plus KV reads.
  EXPECT_NEAR((p.decode.device_bytes_per_token - p.decode.kv_read_bytes_per_token) / 1e9, 44.0, 0.2);

  Json j = plan_to_json(p);
  const Json& pin = *j.find("pinned_host_bytes");
  EXPECT_EQ(pin.find("exact")->as_int(), exact);
  EXPECT_EQ(pin.find("power_of_two")->as_int(), exact);
  EXPECT_TRUE(j.find("decode_ceiling_tokens_per_s")->is_number());
}

// A tensor that is not a power of two long is rounded up: the dense Glimmer
// layers show the overhead the seed's team feared.
TEST(PlanOffload, PowerOfTwoRoundingOnDenseLayers) {
  PlanOptions o;
  o.model = "muse-glimmer-30b";
  o.hardware = "h200";
  o.cpu_offload_gib = 20;
  Plan p = make(o);
  EXPECT_GT(p.pinned.exact, 20 * GiB);
  EXPECT_GT(p.pinned.power_of_two, p.pinned.exact);
  // qkv_proj: (4096 + 2*256) x 6656 BF16 = 61.3 MB -> 64 MiB; gate_up: 2*19968 x 6656 -> 512 MiB.
  EXPECT_EQ(round_up_power_of_two((4096 + 512) * int64_t(6656) * 2), 64 * MiB);
  EXPECT_EQ(round_up_power_of_two(2 * 19968 * int64_t(6656) * 2), 512 * MiB);
  EXPECT_EQ(round_up_power_of_two(1), 1);
  EXPECT_EQ(round_up_power_of_two(27 * MiB), 32 * MiB);
}

TEST(PlanOffload, AutomaticMinimumAndHostLimits) {
  // NVFP4 Spark at 128K on one GB300: offload is required and the planner finds the minimum.
  PlanOptions o = spark("muse-spark-open-nvfp4", "gb300");
  o.max_model_len = 131072;
  Plan p = make(o);
  ASSERT_TRUE(p.fits) << (p.problems.empty() ? "" : p.problems[0]);
  ASSERT_TRUE(p.offload.automatic);
  ASSERT_TRUE(p.offload.minimum_gib_per_gpu.has_value());
  EXPECT_EQ(p.offload.gib_per_gpu, double(*p.offload.minimum_gib_per_gpu));
  PlanOptions less = o;
  less.cpu_offload_gib = double(*p.offload.minimum_gib_per_gpu - 1);
  less.cpu_offload_params = {"experts"};
  Plan l = make(less);
  EXPECT_FALSE(l.fits);
  ASSERT_FALSE(l.problems.empty());
  EXPECT_NE(l.problems[0].find("offload at least --cpu-offload-gb " + std::to_string(*p.offload.minimum_gib_per_gpu)),
            std::string::npos)
      << l.problems[0];

  // BF16 Spark on one H200 with 128 GiB of host memory cannot fit even with offload.
  PlanOptions h = spark("muse-spark-open", "h200");
  Plan q = make(h);
  EXPECT_FALSE(q.fits);
  ASSERT_FALSE(q.problems.empty());
  EXPECT_NE(q.problems[0].find("cannot fit even with offload"), std::string::npos) << q.problems[0];

  // NVFP4 (533 GB) does not fit one 512 GB M5 Ultra and unified memory cannot offload.
  Plan m = make(spark("muse-spark-open-nvfp4", "m5-ultra-512"));
  EXPECT_FALSE(m.fits);
  EXPECT_NE(m.problems[0].find("no separate host memory"), std::string::npos) << m.problems[0];
  // ...but two do (seed 003: "Two Mac Studio computers with M5 Ultra and 512 GB").
  PlanOptions two = spark("muse-spark-open-nvfp4", "m5-ultra-512");
  two.overrides.gpus = 2;
  two.max_model_len = 131072;
  EXPECT_TRUE(make(two).fits);
}

TEST(PlanHardware, ProfilesAndOverrides) {
  for (const std::string& name : hardware_profile_names()) {
    auto h = find_hardware_profile(name);
    ASSERT_TRUE(h.ok()) << name;
    EXPECT_GT(h->device_memory_bytes, 0) << name;
    EXPECT_GT(h->device_bandwidth, 0) << name;
  }
  HardwareOverrides o;
  o.gpus = 2;
  o.gpu_memory_gib = 80;
  o.gpu_bandwidth_gbs = 2000;
  o.host_memory_gib = 512;
  o.host_bandwidth_gbs = 300;
  o.link_bandwidth_gbs = 64;
  auto h = resolve_hardware("", o);
  ASSERT_TRUE(h.ok()) << h.message();
  EXPECT_EQ(h->devices, 2);
  EXPECT_EQ(h->device_memory_bytes, 80 * GiB);
  EXPECT_EQ(h->host_memory_bytes, 512 * GiB);
  EXPECT_DOUBLE_EQ(h->link_bandwidth, 64e9);
  // Seven built-in profiles as the issue names them.
  EXPECT_EQ(hardware_profile_names(),
            (std::vector<std::string>{"gb300", "b300x4", "h200", "h200x8", "mi355xx8", "m5-ultra-512", "xeon-6980p"}));
}

TEST(PlanErrors, BadInputIsAClearError) {
  PlanOptions o = spark("muse-spark-opne", "gb300");
  std::string e = error_of(o);
  EXPECT_NE(e.find("unknown model 'muse-spark-opne'"), std::string::npos) << e;
  EXPECT_NE(e.find("muse-spark-open-nvfp4"), std::string::npos) << e;  // lists the valid profiles

  e = error_of(spark("muse-spark-open", "gb3000"));
  EXPECT_NE(e.find("unknown hardware profile 'gb3000'"), std::string::npos) << e;
  EXPECT_NE(e.find("xeon-6980p"), std::string::npos) << e;

  o = spark();
  o.max_model_len = 2'000'000;
  EXPECT_NE(error_of(o).find("--max-model-len = 2000000 is impossible"), std::string::npos);
  o = spark();
  o.gpu_memory_utilization = 1.5;
  EXPECT_NE(error_of(o).find("--gpu-memory-utilization"), std::string::npos);
  o = spark();
  o.cpu_offload_gib = -1;
  EXPECT_NE(error_of(o).find("--cpu-offload-gb"), std::string::npos);
  o = spark();
  o.overrides.gpus = 0;
  EXPECT_NE(error_of(o).find("--gpus = 0 is impossible"), std::string::npos);
  o = spark();
  o.overrides.gpu_memory_gib = -80;
  EXPECT_NE(error_of(o).find("--gpu-memory-gb"), std::string::npos);
  o = spark();
  o.kv_cache_dtype = "int3";
  EXPECT_NE(error_of(o).find("--kv-cache-dtype 'int3'"), std::string::npos);
  o = spark();
  o.weight_format = "fp5";
  EXPECT_NE(error_of(o).find("unknown weight format 'fp5'"), std::string::npos);
  o = spark("muse-spark-open", "m5-ultra-512");
  o.cpu_offload_gib = 10;
  EXPECT_NE(error_of(o).find("no host memory to offload to"), std::string::npos);
  o = spark();
  o.hardware = "";
  o.cpu_offload_gib = 10;
  EXPECT_NE(error_of(o).find("need a machine"), std::string::npos);
  o = spark();
  o.speculative_config = "{\"method\": \"medusa\"}";
  EXPECT_NE(error_of(o).find("method 'medusa'"), std::string::npos);
  o = spark();
  o.drafter = "no-such-drafter";
  EXPECT_NE(error_of(o).find("unknown drafter"), std::string::npos);

  // A config missing a required field names the key and the file.
  const std::string path = temp_file("plan_missing_hidden.json",
                                     R"({"model_type": "muse_glimmer", "text_config": {"num_hidden_layers": 4,
                                     "num_attention_heads": 4, "num_key_value_heads": 2, "vocab_size": 1000,
                                     "intermediate_size": 64}})");
  o = spark(path, "h200");
  e = error_of(o);
  EXPECT_NE(e.find("hidden_size"), std::string::npos) << e;
  EXPECT_NE(e.find(path), std::string::npos) << e;
  o = spark(temp_file("plan_not_json.json", "{not json"), "h200");
  EXPECT_NE(error_of(o).find("invalid JSON"), std::string::npos);
}

TEST(PlanFormats, DetectionFromQuantizationConfig) {
  auto parse = [](const char* text) { return detect_weight_format(*Json::parse(text)); };
  EXPECT_EQ(*parse(R"({"quant_method": "modelopt", "quant_algo": "NVFP4"})"), WeightFormat::NVFP4);
  EXPECT_EQ(*parse(R"({"quant_method": "modelopt", "quantization": {"quant_algo": "FP8"}})"), WeightFormat::FP8);
  EXPECT_EQ(*parse(R"({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "fp4"}}})"),
            WeightFormat::MXFP4);
  EXPECT_EQ(*parse(R"({"quant_method": "gptq", "bits": 4, "group_size": 128})"), WeightFormat::INT4);
  EXPECT_EQ(*parse("null"), WeightFormat::BF16);
  auto bad = parse(R"({"quant_method": "bitsandbytes"})");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("--weight-format"), std::string::npos);
  EXPECT_TRUE(wildcard_match("model.layers.0.mlp.experts", "model.layers.0.mlp*"));
  EXPECT_FALSE(wildcard_match("model.layers.10.mlp.experts", "model.layers.1.*"));
}

TEST(PlanFormats, EveryProfileFitsSomewhereSensible) {
  // NVFP4 on 4 x B300 (seed 003: "4 GPUs for NVFP4"), BF16 on 8 x MI355X,
  // MXFP4/FP8 on 8 x MI355X, INT4 on two Xeon 6980P sockets.
  struct Case {
    const char* model;
    const char* hw;
  } cases[] = {{"muse-spark-open-nvfp4", "b300x4"}, {"muse-spark-open", "mi355xx8"},
               {"muse-spark-open-mxfp4", "mi355xx8"}, {"muse-spark-open-fp8", "mi355xx8"},
               {"muse-spark-open-int4", "xeon-6980p"}, {"muse-glimmer-30b", "h200"}};
  for (const auto& c : cases) {
    PlanOptions o = spark(c.model, c.hw);
    o.max_model_len = 131072;
    Plan p = make(o);
    EXPECT_TRUE(p.fits) << c.model << " on " << c.hw << ": " << (p.problems.empty() ? "" : p.problems[0]);
    EXPECT_EQ(p.pinned.exact, 0) << c.model;
    EXPECT_GT(p.decode.ceiling_tokens_per_s, 1.0) << c.model;
  }
  // Bytes per parameter of the expert formats, scales included.
  EXPECT_EQ(quantized_matrix_bytes(WeightFormat::MXFP4, 1, 4096, 4096), 4096 * 4096 / 2 + 4096 * 4096 / 32);
  EXPECT_EQ(quantized_matrix_bytes(WeightFormat::FP8, 1, 4096, 4096), 4096 * 4096 + 4096 * 4);
  EXPECT_EQ(quantized_matrix_bytes(WeightFormat::INT4, 1, 4096, 4096),
            4096 * 4096 / 2 + 32 * 4096 / 2 + 32 * 4096 * 2 + 4096 * 4);
}

TEST(PlanDrafter, DSparkSizeMatchesTheCard) {
  PlanOptions o = spark("muse-spark-open-nvfp4", "gb300");
  o.max_model_len = 131072;
  o.speculative_config = R"({"method":"dspark","model":"Inferact/Muse-Spark-Open-DSpark","num_speculative_tokens":2})";
  Plan p = make(o);
  ASSERT_TRUE(p.drafter.present);
  EXPECT_EQ(p.drafter.num_speculative_tokens, 2);
  EXPECT_NEAR(double(p.drafter_params) * 2 / 1e9, 10.6, 0.2);  // seed 000: "5 layers, 10.6 GB"
  EXPECT_EQ(p.kv.drafter_bytes_per_sequence, int64_t(5) * 2048 * 2 * 16 * 64 * 2);

  const std::string assistant = std::string(MUSE_SOURCE_DIR) + "/../shared/testdata/muse-glimmer/assistant-config.json";
  if (!file_exists(assistant)) GTEST_SKIP() << "shared test data absent: " << assistant;
  PlanOptions g;
  g.model = "muse-glimmer-30b";
  g.hardware = "h200";
  g.drafter = assistant;
  Plan q = make(g);
  ASSERT_TRUE(q.drafter.present);
  EXPECT_EQ(q.drafter.num_speculative_tokens, 15);
  PlanOptions g2 = g;
  g2.drafter = "muse-glimmer-30b-assistant";
  EXPECT_EQ(make(g2).drafter_params, q.drafter_params);
}

// Seed 000 measured 342,996 KV tokens without the drafter and 179,747 with
// it. One calibration (the non-KV memory vLLM measured, which our estimate
// cannot know) reproduces the first; the drafter's cost then follows from its
// size alone.
TEST(PlanKv, Seed000CapacityWithOneCalibration) {
  PlanOptions o = spark("muse-spark-open-nvfp4", "gb300");
  o.cpu_offload_gib = 310;
  o.cpu_offload_params = {"experts"};
  o.max_model_len = 131072;
  o.max_num_seqs = 4;
  o.gpu_memory_utilization = 0.92;
  o.runtime_overhead_gib = 40.52;
  Plan base = make(o);
  EXPECT_NEAR(double(base.kv.capacity_tokens), 342'996, 342'996 * 0.001);
  o.speculative_config = R"({"method":"dspark","num_speculative_tokens":2})";
  Plan with = make(o);
  EXPECT_NEAR(double(with.kv.capacity_tokens), 179'747, 179'747 * 0.01);
  EXPECT_NEAR(double(base.kv.capacity_tokens - with.kv.capacity_tokens), 163'249, 163'249 * 0.01);
}

// A model directory: config.json without quantization_config plus ModelOpt's
// legacy hf_quant_config.json, whose exclusion list decides per layer.
TEST(PlanFormats, ModelDirectoryWithExclusionList) {
  const std::string dir = testing::TempDir() + "/plan_tiny_spark";
  std::filesystem::create_directories(dir);
  std::ofstream(dir + "/config.json") << R"({"model_type": "muse_spark", "text_config": {
      "hidden_size": 256, "num_hidden_layers": 4, "num_attention_heads": 4, "num_key_value_heads": 2,
      "head_dim": 64, "vocab_size": 1000, "num_local_experts": 8, "num_experts_per_tok": 2,
      "moe_hidden_size": 128, "moe_intermediate_size": 128, "tie_word_embeddings": true}})";
  std::ofstream(dir + "/hf_quant_config.json") << R"({"producer": {"name": "modelopt"},
      "quantization": {"quant_algo": "NVFP4", "group_size": 16,
                       "exclude_modules": ["lm_head", "model.language_model.layers.2.mlp.experts*"]}})";
  PlanOptions o;
  o.model = dir;
  o.hardware = "h200";
  Plan p = make(o);
  EXPECT_EQ(p.model.scheme.format, WeightFormat::NVFP4);
  ASSERT_EQ(p.model.scheme.bf16_expert_layer.size(), 4u);
  EXPECT_EQ(p.model.scheme.bf16_expert_layer, (std::vector<bool>{false, false, true, false}));
  // Tied embeddings: the head is the embedding table, counted once.
  EXPECT_EQ(p.params.head, 0);
  EXPECT_EQ(p.params.embeddings, 1000 * 256);
  const int64_t nvfp4 = quantized_matrix_bytes(WeightFormat::NVFP4, 8, 256, 128) + 8 * 8 +  // gate_up: 2 shards
                        quantized_matrix_bytes(WeightFormat::NVFP4, 8, 128, 128);
  const int64_t bf16 = int64_t(8) * (256 * 128 + 128 * 128) * 2;
  EXPECT_EQ(p.bytes.experts, 3 * nvfp4 + bf16);
  EXPECT_TRUE(p.fits);
  // --weight-format overrides the checkpoint; --cpu-offload-params picks names.
  o.weight_format = "bf16";
  o.cpu_offload_gib = 1;
  o.cpu_offload_params = {"w2_weight"};
  Plan q = make(o);
  EXPECT_EQ(q.pinned.buffers, 4);  // one w2_weight per layer, nothing else
  EXPECT_EQ(q.pinned.exact, 4 * int64_t(8) * 128 * 128 * 2);
}

// The issue's interface makes --hardware optional: the model alone is sized.
TEST(PlanModelOnly, NoHardware) {
  PlanOptions o;
  o.model = "muse-spark-open";
  o.max_model_len = 131072;
  Plan p = make(o);
  EXPECT_FALSE(p.has_hardware);
  EXPECT_EQ(p.kv.bytes_at_max_model_len, 8'975'810'560);
  Json j = plan_to_json(p);
  EXPECT_TRUE(j.find("hardware")->is_null());
  EXPECT_EQ(j.find("params")->find("experts")->as_int(), 798'863'917'056);
  EXPECT_TRUE(j.find("pinned_host_bytes")->find("exact")->is_null());
  EXPECT_TRUE(j.find("decode_ceiling_tokens_per_s")->is_null());
  EXPECT_NE(plan_to_table(p).find("No hardware given"), std::string::npos);
}
