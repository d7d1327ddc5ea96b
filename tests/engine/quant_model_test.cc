// Model level, per format: a small Spark checkpoint written in the format's
// published layout (quant_fixture.h) loads with its weights quantized in
// memory, at the bytes `muse plan` predicts (within 2%), and its logits match
// its dequantized twin (the same values stored F32) within a stated
// tolerance; quantizing the BF16 model while loading (--quantization) gives
// the same bytes and the same logits as loading the fixture.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <random>

#include "engine_test_util.h"
#include "muse/backends/cpu/cpu_backend.h"
#include "muse/engine/checkpoint_source.h"
#include "muse/plan/weight_format.h"
#include "quant_fixture.h"

namespace muse::testing {
namespace {

namespace fs = std::filesystem;

const char* const kConfig = kQuantFixtureConfig;

struct Loaded {
  std::unique_ptr<Engine> engine;
  std::vector<float> logits;  // every position of the prompt
};

Loaded run(const std::string& dir, QuantKind quantize = QuantKind::None) {
  EngineOptions o;
  o.backend.cpu.threads = 2;
  o.max_model_len = 64;
  o.kv_block_size = 4;
  o.quantization = quantize;
  auto e = Engine::open(dir, o);
  EXPECT_TRUE(e.ok()) << (e.ok() ? "" : e.message());
  if (!e.ok()) return {};
  Loaded l;
  l.engine = std::move(e).value();
  auto s = l.engine->new_session();
  EXPECT_TRUE(s.ok());
  const std::vector<int32_t> prompt = some_tokens(12);
  auto lg = (*s)->feed(prompt, LogitsWanted::All);
  EXPECT_TRUE(lg.ok()) << (lg.ok() ? "" : lg.message());
  if (lg.ok()) l.logits = *lg;
  s->reset();
  return l;
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

plan::WeightFormat plan_format(QuantKind k) {
  switch (k) {
    case QuantKind::Nvfp4: return plan::WeightFormat::NVFP4;
    case QuantKind::Mxfp4: return plan::WeightFormat::MXFP4;
    case QuantKind::Fp8: return plan::WeightFormat::FP8;
    case QuantKind::Int4: return plan::WeightFormat::INT4;
    case QuantKind::None: break;
  }
  return plan::WeightFormat::BF16;
}

class QuantModel : public ::testing::TestWithParam<QuantKind> {
 protected:
  void SetUp() override {
    root_ = ::testing::TempDir() + "/muse_qm_" + quant_kind_name(GetParam());
    write_quant_fixture_set(root_, GetParam());
  }
  void TearDown() override { fs::remove_all(root_); }
  std::string root_;
};

TEST_P(QuantModel, FixtureLoadsQuantizedMatchesTwinAndPlan) {
  const QuantKind kind = GetParam();
  Loaded q = run(root_ + "/q"), twin = run(root_ + "/twin"), bf16 = run(root_ + "/bf16");
  ASSERT_TRUE(q.engine && twin.engine && bf16.engine);

  // Quantized in memory: the slots quantized_at_load names carry QuantParts.
  const ModelWeights& w = q.engine->model().weights();
  EXPECT_FALSE(w.quant.empty());
  EXPECT_NE(w.layers[1].experts_gate_up.quant, nullptr);
  EXPECT_NE(w.layers[1].experts_down.quant, nullptr);
  EXPECT_EQ(w.layers[0].experts_gate_up.quant != nullptr, kind != QuantKind::Nvfp4);
  EXPECT_EQ(w.layers[2].mlp_gate.quant != nullptr, kind == QuantKind::Fp8 || kind == QuantKind::Int4);
  EXPECT_EQ(w.layers[0].gate.quant != nullptr, kind == QuantKind::Fp8);  // attn.gate keeps >= 8 bits
  EXPECT_EQ(w.layers[0].pre_expert_proj.quant != nullptr, kind == QuantKind::Fp8);
  EXPECT_EQ(w.layers[0].router.quant, nullptr);

  // Resident bytes against `muse plan`'s arithmetic for the same scheme.
  const ModelConfig& c = q.engine->config();
  const plan::QuantScheme scheme = plan::make_quant_scheme(c, plan_format(kind), Json(), "test");
  int64_t planned = 0;
  for (const plan::StoredTensor& t : plan::stored_tensors(c, describe_weights(c), scheme)) planned += t.bytes;
  const double resident = double(w.resident_bytes());
  EXPECT_NEAR(resident / double(planned), 1.0, 0.02) << "resident " << resident << " planned " << planned;
  // Well below the BF16 model's bytes.
  EXPECT_LT(resident, double(bf16.engine->model().weights().resident_bytes()));

  // Logits against the dequantized twin: the same weight values, so only
  // summation order differs (INT4's factored groups, per-ISA trees):
  // |Δlogit| <= 2e-3 on logits softcapped to ±20.
  const double d_twin = max_abs_diff(q.logits, twin.logits);
  EXPECT_LE(d_twin, 2e-3) << quant_kind_name(kind);
  // And against the BF16 original: the quantization error itself (reported).
  const double d_bf16 = max_abs_diff(q.logits, bf16.logits);
  std::printf("[ %s ] max |logit - twin| = %.3g, max |logit - bf16| = %.3g, resident %.0f B (plan %lld B, bf16 %llu B)\n",
              quant_kind_name(kind), d_twin, d_bf16, resident, (long long)planned,
              (unsigned long long)bf16.engine->model().weights().resident_bytes());
  EXPECT_LT(d_bf16, 5.0);

  // --quantization on the BF16 checkpoint: the same bytes, the same logits
  // (same quantizer, same layout) as loading the fixture.
  Loaded at_load = run(root_ + "/bf16", kind);
  ASSERT_TRUE(at_load.engine);
  EXPECT_EQ(at_load.engine->model().weights().resident_bytes(), w.resident_bytes());
  EXPECT_LE(max_abs_diff(at_load.logits, q.logits), 1e-6);
}

// With a loading-progress callback (muse run / serve pass one) the slots
// stay quantized: the counting wrapper forwards quantized() to the checkpoint.
TEST_P(QuantModel, StaysQuantizedWithAProgressCallback) {
  EngineOptions o;
  o.backend.cpu.threads = 2;
  o.max_model_len = 64;
  o.kv_block_size = 4;
  int calls = 0;
  auto e = Engine::open(root_ + "/q", o, [&](const EngineLoadProgress&) { ++calls; });
  ASSERT_TRUE(e.ok()) << e.message();
  EXPECT_NE((*e)->model().weights().layers[1].experts_gate_up.quant, nullptr) << quant_kind_name(GetParam());
  Loaded plain = run(root_ + "/q");
  ASSERT_TRUE(plain.engine);
  EXPECT_EQ((*e)->model().weights().resident_bytes(), plain.engine->model().weights().resident_bytes());
  EXPECT_GT(calls, 0);
}

// Experts stored one by one (mlp.experts.{e}.{gate,up,down}_proj, each
// piece quantized as a module, e.g. an AutoRound export of per-expert
// Linears): stacked into the fused quantized layout at load, same bytes, and
// logits equal to the fused fixture's.
TEST_P(QuantModel, PerExpertPiecesStackIntoTheFusedLayout) {
  const QuantKind kind = GetParam();
  write_quant_fixture(root_ + "/bf16", root_ + "/qp", root_ + "/twinp", kind, /*per_expert=*/true);
  auto ck = Checkpoint::open(root_ + "/qp");
  ASSERT_TRUE(ck.ok()) << ck.message();
  const ResolvedWeight* gu = ck->find("moe.experts.gate_up", 1);
  ASSERT_TRUE(gu && gu->per_expert && gu->quantized());
  Loaded pe = run(root_ + "/qp"), twin = run(root_ + "/twinp"), fused = run(root_ + "/q");
  ASSERT_TRUE(pe.engine && twin.engine && fused.engine);
  EXPECT_NE(pe.engine->model().weights().layers[1].experts_gate_up.quant, nullptr);
  EXPECT_LE(max_abs_diff(pe.logits, twin.logits), 2e-3);
  // Per-piece quantization differs from the fused one only in NVFP4's global
  // scales (per piece vs per half: the same here) and FP8/INT4 not at all.
  EXPECT_LE(max_abs_diff(pe.logits, fused.logits), 1e-6) << quant_kind_name(kind);
  EXPECT_EQ(pe.engine->model().weights().resident_bytes(), fused.engine->model().weights().resident_bytes());
}

INSTANTIATE_TEST_SUITE_P(Formats, QuantModel,
                         ::testing::Values(QuantKind::Nvfp4, QuantKind::Mxfp4, QuantKind::Fp8, QuantKind::Int4),
                         [](const ::testing::TestParamInfo<QuantKind>& i) { return std::string(quant_kind_name(i.param)); });

}  // namespace
}  // namespace muse::testing

namespace muse::testing {
namespace {

// A random model written with this quantization_config, layer 0's q_proj
// replaced by `tensors` (the other tensors as written); then the product on
// the loaded quantized weight against the one on the reference decoder's
// matrix (Checkpoint::read_f32), 3 rows of x.
void expect_q_proj_matches_reference_decoder(const char* quantization_config, std::vector<OwnedTensor> tensors,
                                             int64_t N, int64_t K, DType want_scale_dtype, uint32_t seed) {
  const std::string dir = ::testing::TempDir() + "/muse_q_proj_formats";
  fs::remove_all(dir);
  fs::create_directories(dir);
  auto cfg = Json::parse(kConfig);
  ASSERT_TRUE(cfg.ok());
  cfg->set("quantization_config", *Json::parse(quantization_config));
  ASSERT_TRUE(write_random_model(dir, *cfg, {}).ok());
  const std::string q = "model.language_model.layers.0.self_attn.q_proj.";
  {
    auto f = SafetensorsFile::open(dir + "/model.safetensors");
    ASSERT_TRUE(f.ok());
    std::vector<OwnedTensor> ts;
    for (const TensorInfo& t : f->tensors()) {
      if (t.name == q + "weight") continue;
      ts.push_back({t.name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(f->data(t)), t.nbytes())});
    }
    for (OwnedTensor& t : tensors) ts.push_back({q + t.name, t.dtype, t.shape, t.data});
    f = Result<SafetensorsFile>(make_error("closed"));
    write_tensors(dir + "/model.safetensors", ts);
  }
  auto ck = Checkpoint::open(dir);
  ASSERT_TRUE(ck.ok()) << ck.message();
  ASSERT_TRUE(ck->find("attn.q", 0)->quantized());
  std::vector<float> ref(size_t(N * K));
  ASSERT_TRUE(ck->read_f32("attn.q", 0, ref.data()).ok());  // the reference decoders
  CheckpointWeightSource src(*ck);
  const WeightSpec* spec = nullptr;
  for (const WeightSpec& s : ck->weights())
    if (s.slot == "attn.q" && s.layer == 0) spec = &s;
  auto view = src.quantized(*spec);
  ASSERT_TRUE(view.ok()) << view.message();
  EXPECT_EQ(view->format.scale_dtype, want_scale_dtype);
  CpuBackendOptions bo;
  bo.threads = 2;
  auto b = std::move(create_cpu_backend(bo)).value();
  ModelWeights owner;
  auto tq = import_quantized(*b, {N, K}, *view, true, owner);
  ASSERT_TRUE(tq.ok()) << tq.message();
  std::mt19937 rng(seed);
  std::vector<float> x(size_t(3 * K));
  for (auto& v : x) v = float(int(rng() % 200) - 100) * 0.01f;
  Tensor tx = *b->import_weight(DType::F32, {3, K}, x.data(), false);
  Tensor tf = *b->import_weight(DType::F32, {N, K}, ref.data(), false);
  Tensor oq = *b->alloc(DType::F32, {3, N}), of = *b->alloc(DType::F32, {3, N});
  b->matmul(oq, tx, *tq);
  b->matmul(of, tx, tf);
  ASSERT_TRUE(b->execute().ok());
  std::vector<float> got(size_t(3 * N)), want(size_t(3 * N));
  ASSERT_TRUE(b->download(oq, got.data()).ok());
  ASSERT_TRUE(b->download(of, want.data()).ok());
  for (size_t i = 0; i < got.size(); ++i) ASSERT_NEAR(got[i], want[i], 1e-4 * (1.0 + std::fabs(want[i]))) << i;
  release_weights(*b, owner);
  fs::remove_all(dir);
}

std::string bytes_of(const void* p, size_t n) { return std::string(static_cast<const char*>(p), n); }

// compressed-tensors pack-quantized INT4 ([N, K/8] words, value + 8, BF16
// scales [N, K/G]) is transposed at load into the GPTQ layout the kernels
// read: the product equals the one on the reference decoder's matrix.
TEST(QuantCompressedTensorsInt4, TransposedAtLoadMatchesReferenceDecoder) {
  const int64_t N = 128, K = 128, G = 32;
  std::mt19937 rng(5);
  std::vector<uint32_t> words(size_t(N * K / 8));
  for (auto& w : words) w = uint32_t(rng());
  std::vector<float> sc(size_t(N * K / G));
  for (auto& v : sc) v = 0.001f * float(1 + rng() % 50);
  const int64_t dims[2] = {N, K};
  expect_q_proj_matches_reference_decoder(
      R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
          "config_groups": {"group_0": {"weights": {"num_bits": 4, "type": "int", "strategy": "group", "group_size": 32,
          "symmetric": true}, "targets": ["Linear"]}}, "ignore": ["lm_head"]})",
      {{"weight_packed", DType::I32, {N, K / 8}, bytes_of(words.data(), words.size() * 4)},
       {"weight_scale", DType::BF16, {N, K / G}, tensor_bytes_f32(sc, DType::BF16)},
       {"weight_shape", DType::I64, {2}, bytes_of(dims, 16)}},
      N, K, DType::BF16, 6);
}

// Scales stored in the model's BF16 where the kernels take another dtype:
// GPTQ scales in BF16 (the INT4 kernels read them as BF16) and FP8
// per-channel scales in BF16 (widened to F32 at load).
TEST(QuantStoredScales, Bf16ScalesMatchReferenceDecoder) {
  const int64_t N = 128, K = 128, G = 32;
  std::mt19937 rng(6);
  std::vector<uint32_t> words(size_t(K / 8 * N)), zeros(size_t(K / G * N / 8));
  for (auto& w : words) w = uint32_t(rng());
  for (auto& z : zeros) z = uint32_t(rng());
  std::vector<float> sc(size_t(K / G * N));
  for (auto& v : sc) v = 0.001f * float(1 + rng() % 50);
  expect_q_proj_matches_reference_decoder(
      R"({"quant_method": "gptq", "bits": 4, "group_size": 32, "desc_act": false})",
      {{"qweight", DType::I32, {K / 8, N}, bytes_of(words.data(), words.size() * 4)},
       {"qzeros", DType::I32, {K / G, N / 8}, bytes_of(zeros.data(), zeros.size() * 4)},
       {"scales", DType::BF16, {K / G, N}, tensor_bytes_f32(sc, DType::BF16)}},
      N, K, DType::BF16, 7);

  std::string codes(size_t(N * K), '\0');
  for (size_t i = 0; i < codes.size(); ++i) codes[i] = char((rng() % 0x7E) | (i % 3 ? 0 : 0x80));  // finite E4M3
  std::vector<float> ch(static_cast<size_t>(N));
  for (auto& v : ch) v = 0.01f * float(1 + rng() % 50);
  expect_q_proj_matches_reference_decoder(
      R"({"quant_method": "compressed-tensors", "format": "float-quantized"})",
      {{"weight", DType::F8_E4M3, {N, K}, codes}, {"weight_scale", DType::BF16, {N, 1}, tensor_bytes_f32(ch, DType::BF16)}},
      N, K, DType::F32, 8);
}

}  // namespace
}  // namespace muse::testing
