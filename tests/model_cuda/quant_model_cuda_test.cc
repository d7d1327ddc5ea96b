// Quantized models on the CUDA backend, per format (NVFP4, MXFP4, FP8, INT4):
// the small Spark checkpoint of tests/engine/quant_model_test.cc written in
// each format's published layout (quant_fixture.h)
//  - loads on the GPU with its weights quantized, at the same resident bytes
//    as on the CPU (codes and scales imported as stored);
//  - gives logits as close to the CPU backend's quantized run as the GPU's
//    own run of the dequantized twin (the same values stored F32, so BF16 on
//    the GPU) is to the CPU's twin: within twice that gap, which is what the
//    GPU's bf16 activations alone make;
//  - quantized while loading (--quantization on the BF16 checkpoint), the
//    same bytes and the same logits as the fixture;
//  - decodes a sequence alone and inside a batch with bitwise equal logits.
// Without a GPU (or without the CUDA backend built in) every test skips.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>

#include "../engine/quant_fixture.h"
#include "muse/backends/factory/backend_factory.h"
#include "muse/engine/engine.h"

namespace muse::testing {
namespace {

namespace fs = std::filesystem;

std::vector<int32_t> prompt_ids(size_t n, int32_t salt) {
  std::vector<int32_t> t;
  for (size_t i = 0; i < n; ++i) t.push_back(int32_t((i * 31 + 5 + size_t(salt) * 17) % 90 + 3));
  return t;
}

std::unique_ptr<Engine> open_engine(const std::string& dir, Device device, QuantKind quantize = QuantKind::None) {
  EngineOptions o;
  o.backend.device = device;
  o.backend.cpu.threads = 2;
  o.max_model_len = 64;
  o.kv_block_size = 4;
  o.max_sequences = 8;
  o.gpu_memory_utilization = 0.5;
  o.quantization = quantize;
  auto e = Engine::open(dir, o);
  EXPECT_TRUE(e.ok()) << dir << ": " << (e.ok() ? "" : e.message());
  return e.ok() ? std::move(e).value() : nullptr;
}

std::vector<float> prompt_logits(Engine& e, const std::vector<int32_t>& prompt) {
  auto s = e.new_session();
  EXPECT_TRUE(s.ok());
  if (!s.ok()) return {};
  auto lg = (*s)->feed(prompt, LogitsWanted::All);
  EXPECT_TRUE(lg.ok()) << (lg.ok() ? "" : lg.message());
  return lg.ok() ? *lg : std::vector<float>{};
}

double max_abs_diff(const std::vector<float>& a, const std::vector<float>& b) {
  EXPECT_EQ(a.size(), b.size());
  double m = 0;
  for (size_t i = 0; i < a.size() && i < b.size(); ++i) m = std::max(m, std::fabs(double(a[i]) - b[i]));
  return m;
}

int32_t argmax_id(std::span<const float> l) {
  return int32_t(std::max_element(l.begin(), l.end()) - l.begin());
}

class CudaQuantModel : public ::testing::TestWithParam<QuantKind> {
 protected:
  void SetUp() override {
    if (Status st = check_device(Device::Cuda); !st.ok()) GTEST_SKIP() << st.message();
    root_ = ::testing::TempDir() + "/muse_cqm_" + quant_kind_name(GetParam());
    write_quant_fixture_set(root_, GetParam());
  }
  void TearDown() override {
    if (!root_.empty()) fs::remove_all(root_);
  }
  std::string root_;
};

TEST_P(CudaQuantModel, LoadsQuantizedAndTracksTheCpuAsTheTwinDoes) {
  const QuantKind kind = GetParam();
  const auto prompt = prompt_ids(12, 0);
  auto gq = open_engine(root_ + "/q", Device::Cuda), cq = open_engine(root_ + "/q", Device::Cpu);
  auto gt = open_engine(root_ + "/twin", Device::Cuda), ct = open_engine(root_ + "/twin", Device::Cpu);
  ASSERT_TRUE(gq && cq && gt && ct);
  const ModelWeights& w = gq->model().weights();
  EXPECT_NE(w.layers[1].experts_gate_up.quant, nullptr) << "layer 1's experts are stored " << quant_kind_name(kind);
  EXPECT_NE(w.layers[1].experts_down.quant, nullptr);
  EXPECT_EQ(w.resident_bytes(), cq->model().weights().resident_bytes()) << "GPU and CPU hold different bytes";

  const auto lgq = prompt_logits(*gq, prompt), lcq = prompt_logits(*cq, prompt);
  const auto lgt = prompt_logits(*gt, prompt), lct = prompt_logits(*ct, prompt);
  ASSERT_FALSE(lgq.empty() || lcq.empty() || lgt.empty() || lct.empty());
  const double d_q = max_abs_diff(lgq, lcq), d_twin = max_abs_diff(lgt, lct);
  std::printf("[ %s ] max |GPU - CPU| quantized %.3g, dequantized twin %.3g (logits softcapped to ±20)\n",
              quant_kind_name(kind), d_q, d_twin);
  EXPECT_LE(d_q, 2 * d_twin + 1e-3) << quant_kind_name(kind)
                                    << ": the quantized GPU run strays further from the CPU than the twin's";

  // --quantization on the BF16 checkpoint, on the GPU: the fixture's bytes and logits.
  auto ga = open_engine(root_ + "/bf16", Device::Cuda, kind);
  ASSERT_TRUE(ga);
  EXPECT_EQ(ga->model().weights().resident_bytes(), w.resident_bytes());
  EXPECT_LE(max_abs_diff(prompt_logits(*ga, prompt), lgq), 1e-6);
}

TEST_P(CudaQuantModel, DecodeIsBatchInvariant) {
  auto e = open_engine(root_ + "/q", Device::Cuda);
  ASSERT_TRUE(e);
  constexpr int kSteps = 6, kBatch = 8;
  const auto prompt = prompt_ids(10, 1);
  std::vector<std::vector<float>> alone;
  {
    auto s = e->new_session();
    ASSERT_TRUE(s.ok());
    auto l = (*s)->feed(prompt);
    ASSERT_TRUE(l.ok()) << l.message();
    for (int k = 0; k < kSteps; ++k) {
      const int32_t id = argmax_id(*l);
      l = (*s)->feed(std::span<const int32_t>(&id, 1));
      ASSERT_TRUE(l.ok()) << l.message();
      alone.push_back(*l);
    }
  }
  std::vector<std::unique_ptr<Session>> sessions;
  std::vector<int32_t> next(kBatch);
  for (int i = 0; i < kBatch; ++i) {
    auto s = e->new_session();
    ASSERT_TRUE(s.ok()) << s.message();
    auto l = (*s)->feed(i == 0 ? prompt : prompt_ids(size_t(3 + i * 5), i + 1));
    ASSERT_TRUE(l.ok()) << l.message();
    next[size_t(i)] = argmax_id(*l);
    sessions.push_back(std::move(s).value());
  }
  for (int k = 0; k < kSteps; ++k) {
    std::vector<StepItem> items;
    for (int i = 0; i < kBatch; ++i)
      items.push_back({sessions[size_t(i)].get(), std::span<const int32_t>(&next[size_t(i)], 1)});
    ASSERT_TRUE(e->step(items).ok());
    for (int i = 0; i < kBatch; ++i) {
      auto l = e->logits(size_t(i));
      if (i == 0) {
        ASSERT_EQ(l.size(), alone[size_t(k)].size());
        EXPECT_EQ(0, std::memcmp(l.data(), alone[size_t(k)].data(), l.size() * 4))
            << quant_kind_name(GetParam()) << " step " << k << ": the batched row differs from the row decoded alone";
      }
      next[size_t(i)] = argmax_id(l);
    }
  }
}

std::string kind_name(const ::testing::TestParamInfo<QuantKind>& i) { return quant_kind_name(i.param); }

INSTANTIATE_TEST_SUITE_P(Formats, CudaQuantModel,
                         ::testing::Values(QuantKind::Nvfp4, QuantKind::Mxfp4, QuantKind::Fp8, QuantKind::Int4),
                         kind_name);

}  // namespace
}  // namespace muse::testing
