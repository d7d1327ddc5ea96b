#include "muse/loading/checkpoint.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <random>

#include "muse/loading/random_model.h"

using namespace muse;
namespace fs = std::filesystem;

namespace {

Json layer_lists(Json text, int layers, bool spark) {
  Json types = Json::array(), thetas = Json::array();
  for (int i = 0; i < layers; ++i) {
    bool full = (layers - 1 - i) % 4 == 0;
    types.push_back(full ? "full_attention" : "sliding_attention");
    thetas.push_back(full ? Json(0) : Json(500000.0));
  }
  text.set("layer_types", types);
  text.set("layer_rope_theta", thetas);
  if (spark) {
    Json mlp = Json::array();
    for (int i = 0; i < layers; ++i) mlp.push_back("sparse");
    text.set("mlp_layer_types", mlp);
  }
  return text;
}

Json glimmer_config(int layers = 3) {
  auto text = Json::parse(R"({"model_type": "muse_glimmer_text", "vocab_size": 96, "hidden_size": 32,
    "intermediate_size": 48, "num_hidden_layers": 3, "num_attention_heads": 4, "num_key_value_heads": 2,
    "head_dim": 8, "sliding_window": 8, "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": null,
    "rope_parameters": {"rope_theta": 500000.0, "rope_type": "default"}, "tie_word_embeddings": false})");
  Json t = layer_lists(*text, layers, false);
  t.set("num_hidden_layers", layers);
  Json root = Json::object();
  root.set("architectures", Json(JsonArray{Json("MuseGlimmerForConditionalGeneration")}));
  root.set("model_type", "muse_glimmer");
  root.set("text_config", t);
  return root;
}

Json spark_config(int layers = 2) {
  auto text = Json::parse(R"({"model_type": "muse_spark_text", "vocab_size": 80, "hidden_size": 32,
    "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 8,
    "num_local_experts": 4, "num_experts_per_tok": 2, "moe_hidden_size": 16, "moe_intermediate_size": 12,
    "residual_gate_temperature": 0.3, "sliding_window": 8, "eos_token_id": 2})");
  Json t = layer_lists(*text, layers, true);
  t.set("num_hidden_layers", layers);
  Json root = Json::object();
  root.set("model_type", "muse_spark");
  root.set("text_config", t);
  return root;
}

class CheckpointTest : public testing::Test {
 protected:
  void SetUp() override {
    dir_ = testing::TempDir() + "/muse_ck_" + testing::UnitTest::GetInstance()->current_test_info()->name();
    fs::remove_all(dir_);
  }
  void TearDown() override { fs::remove_all(dir_); }

  void write(const Json& config, RandomModelOptions o = {}) {
    Status s = write_random_model(dir_, config, o);
    ASSERT_TRUE(s.ok()) << s.message();
  }

  struct Owned {
    std::string name;
    DType dtype;
    std::vector<int64_t> shape;
    std::string data;
  };
  // Reads a safetensors file of the model, lets `edit` change it, writes it back.
  void rewrite(const std::string& file, const std::function<void(std::vector<Owned>&)>& edit) {
    std::string path = dir_ + "/" + file;
    std::vector<Owned> tensors;
    {
      auto f = SafetensorsFile::open(path);
      ASSERT_TRUE(f.ok()) << f.message();
      for (const TensorInfo& t : f->tensors())
        tensors.push_back({t.name, t.dtype, t.shape, std::string(reinterpret_cast<const char*>(f->data(t)), t.nbytes())});
    }
    edit(tensors);
    std::vector<TensorToWrite> out;
    for (const Owned& t : tensors) out.push_back({t.name, t.dtype, t.shape, t.data});
    Status s = write_safetensors(path, out);
    ASSERT_TRUE(s.ok()) << s.message();
  }
  static Owned* by_name(std::vector<Owned>& ts, const std::string& name) {
    for (auto& t : ts)
      if (t.name == name) return &t;
    return nullptr;
  }

  // A fresh random Spark model whose config.json carries this quantization_config.
  void write_quantized(const char* quantization_config);

  void expect_open_error(std::vector<std::string> fragments, const LoadOptions& options = {}) {
    auto r = Checkpoint::open(dir_, options);
    ASSERT_FALSE(r.ok()) << "expected an error mentioning " << fragments[0];
    for (const auto& f : fragments) EXPECT_NE(r.message().find(f), std::string::npos) << r.message();
  }

  std::string dir_;
};

const std::string P = "model.language_model.";

}  // namespace

TEST_F(CheckpointTest, OpensGlimmerAndReadsValues) {
  write(glimmer_config());
  std::vector<float> q(32 * 32);
  for (size_t i = 0; i < q.size(); ++i) q[i] = float(int(i % 256) - 128) * 0.125f;  // exact in bf16
  rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
    by_name(ts, P + "layers.1.self_attn.q_proj.weight")->data = tensor_bytes_f32(q, DType::BF16);
  });
  auto ck = Checkpoint::open(dir_);
  ASSERT_TRUE(ck.ok()) << ck.message();
  EXPECT_EQ(ck->config().num_layers, 3);
  EXPECT_EQ(ck->num_files(), 1u);
  EXPECT_EQ(ck->resolved().size(), ck->weights().size());

  auto view = ck->tensor("attn.q", 1);
  ASSERT_TRUE(view.ok()) << view.message();
  EXPECT_EQ(view->name, P + "layers.1.self_attn.q_proj.weight");
  EXPECT_EQ(view->dtype, DType::BF16);
  EXPECT_EQ(view->shape, (std::vector<int64_t>{32, 32}));
  EXPECT_EQ(view->nbytes, 32u * 32u * 2u);
  std::vector<float> got(q.size());
  ASSERT_TRUE(read_f32(*view, got.data()).ok());
  EXPECT_EQ(got, q);
  ASSERT_TRUE(ck->read_f32("attn.q", 1, got.data()).ok());
  EXPECT_EQ(got, q);
  std::vector<uint16_t> bf(q.size());
  ASSERT_TRUE(ck->read_bf16("attn.q", 1, bf.data()).ok());
  EXPECT_EQ(bf16_to_f32(bf[5]), q[5]);

  EXPECT_EQ(ck->find("norm.post_attn", 2)->transform, WeightTransform::NormOffset);
  EXPECT_EQ(ck->find("final_norm")->transform, WeightTransform::None);
  EXPECT_EQ(ck->find("moe.router", 0), nullptr);
  EXPECT_FALSE(ck->tensor("moe.router", 0).ok());
  EXPECT_EQ(ck->tensor("lm_head")->name, "lm_head.weight");
  EXPECT_EQ(ck->config().eos_token_ids, std::vector<int64_t>{2});
}

TEST_F(CheckpointTest, OpensSparkShardedAndPerExpertMatchesFused) {
  RandomModelOptions o;
  o.max_shard_bytes = 4096;
  write(spark_config(), o);
  auto fused = Checkpoint::open(dir_);
  ASSERT_TRUE(fused.ok()) << fused.message();
  EXPECT_GT(fused->num_files(), 2u);
  EXPECT_EQ(fused->tensor("moe.router", 1)->dtype, DType::F32);
  EXPECT_EQ(fused->find("resid_gate.ffn", 0)->transform, WeightTransform::ResidualGate);
  const int64_t E = 4, I2 = 24, Hm = 16, I = 12;
  std::vector<float> gate_up(size_t(E * I2 * Hm)), down(size_t(E * Hm * I));
  ASSERT_TRUE(fused->read_f32("moe.experts.gate_up", 1, gate_up.data()).ok());
  ASSERT_TRUE(fused->read_f32("moe.experts.down", 1, down.data()).ok());
  std::vector<float> e2(size_t(I2 * Hm));
  ASSERT_TRUE(fused->read_expert_f32("moe.experts.gate_up", 1, 2, e2.data()).ok());
  EXPECT_TRUE(std::equal(e2.begin(), e2.end(), gate_up.begin() + 2 * I2 * Hm));

  // The same weights stored one expert at a time (per-expert alias path).
  std::string dir2 = dir_ + "_per_expert";
  fs::remove_all(dir2);
  fs::create_directories(dir2);
  fs::copy_file(dir_ + "/config.json", dir2 + "/config.json");
  std::vector<TensorToWrite> out;
  std::vector<std::string> keep;
  keep.reserve(1000);
  for (const ResolvedWeight& w : fused->resolved()) {
    const TensorView& v = w.tensor;
    std::string data(reinterpret_cast<const char*>(v.data), v.nbytes);
    if (w.spec.slot == "moe.experts.gate_up" || w.spec.slot == "moe.experts.down") {
      bool gu = w.spec.slot == "moe.experts.gate_up";
      int64_t rows = gu ? I : Hm, cols = gu ? Hm : I;
      size_t piece = size_t(rows * cols * 2);
      for (int64_t e = 0; e < E; ++e) {
        std::string base = P + "layers." + std::to_string(w.spec.layer) + ".mlp.experts." + std::to_string(e) + ".";
        if (gu) {
          keep.push_back(data.substr(size_t(e) * 2 * piece, piece));
          out.push_back({base + "gate_proj.weight", v.dtype, {rows, cols}, keep.back()});
          keep.push_back(data.substr(size_t(e) * 2 * piece + piece, piece));
          out.push_back({base + "up_proj.weight", v.dtype, {rows, cols}, keep.back()});
        } else {
          keep.push_back(data.substr(size_t(e) * piece, piece));
          out.push_back({base + "down_proj.weight", v.dtype, {rows, cols}, keep.back()});
        }
      }
      continue;
    }
    keep.push_back(data);
    out.push_back({v.name, v.dtype, v.shape, keep.back()});
  }
  ASSERT_TRUE(write_safetensors(dir2 + "/model.safetensors", out).ok());
  auto split = Checkpoint::open(dir2);
  ASSERT_TRUE(split.ok()) << split.message();
  EXPECT_TRUE(split->find("moe.experts.gate_up", 1)->per_expert);
  EXPECT_FALSE(split->tensor("moe.experts.gate_up", 1).ok());
  std::vector<float> gate_up2(gate_up.size()), down2(down.size());
  ASSERT_TRUE(split->read_f32("moe.experts.gate_up", 1, gate_up2.data()).ok());
  ASSERT_TRUE(split->read_f32("moe.experts.down", 1, down2.data()).ok());
  EXPECT_EQ(gate_up, gate_up2);
  EXPECT_EQ(down, down2);
  auto pieces = split->expert_pieces("moe.experts.gate_up", 1, 3);
  ASSERT_TRUE(pieces.ok());
  ASSERT_EQ(pieces->size(), 2u);
  EXPECT_EQ((*pieces)[1].name, P + "layers.1.mlp.experts.3.up_proj.weight");
  ASSERT_TRUE(split->read_expert_f32("moe.experts.gate_up", 1, 2, e2.data()).ok());
  EXPECT_TRUE(std::equal(e2.begin(), e2.end(), gate_up.begin() + 2 * I2 * Hm));

  // Drop one expert's piece: an error naming it.
  out.erase(std::remove_if(out.begin(), out.end(),
                           [](const TensorToWrite& t) { return t.name == P + "layers.0.mlp.experts.2.up_proj.weight"; }),
            out.end());
  ASSERT_TRUE(write_safetensors(dir2 + "/model.safetensors", out).ok());
  auto broken = Checkpoint::open(dir2);
  ASSERT_FALSE(broken.ok());
  EXPECT_NE(broken.message().find("layers.0.mlp.experts.2.up_proj.weight"), std::string::npos) << broken.message();
  fs::remove_all(dir2);
}

TEST_F(CheckpointTest, FlatPrefixAliasesAndTiedEmbeddings) {
  Json cfg = glimmer_config();
  cfg.find("text_config")->set("tie_word_embeddings", true);
  write(cfg);
  rewrite("model.safetensors", [](std::vector<Owned>& ts) {
    for (auto& t : ts)
      if (t.name.rfind(P, 0) == 0) t.name = "model." + t.name.substr(P.size());
  });
  auto ck = Checkpoint::open(dir_);
  ASSERT_TRUE(ck.ok()) << ck.message();
  EXPECT_EQ(ck->tensor("attn.o", 0)->name, "model.layers.0.self_attn.o_proj.weight");
  EXPECT_TRUE(ck->find("lm_head")->tied);
  EXPECT_EQ(ck->tensor("lm_head")->data, ck->tensor("embed_tokens")->data);
}

TEST_F(CheckpointTest, AliasSpellingsResolve) {
  write(spark_config());
  rewrite("model.safetensors", [](std::vector<Owned>& ts) {
    by_name(ts, P + "layers.0.mlp.pre_expert_proj.weight")->name = P + "layers.0.mlp.pooler.weight";
    by_name(ts, P + "layers.1.mlp.gate.weight")->name = P + "layers.1.mlp.router.weight";
    by_name(ts, P + "layers.1.self_attn.gate_proj.weight")->name = P + "layers.1.self_attn.g_proj.weight";
  });
  auto ck = Checkpoint::open(dir_);
  ASSERT_TRUE(ck.ok()) << ck.message();
  EXPECT_EQ(ck->tensor("moe.pre_expert_proj", 0)->name, P + "layers.0.mlp.pooler.weight");
  EXPECT_EQ(ck->tensor("moe.router", 1)->name, P + "layers.1.mlp.router.weight");
}

TEST_F(CheckpointTest, MissingTensor) {
  write(glimmer_config());
  rewrite("model.safetensors", [](std::vector<Owned>& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](const Owned& t) { return t.name == P + "layers.2.mlp.up_proj.weight"; }),
             ts.end());
  });
  expect_open_error({"missing tensor model.language_model.layers.2.mlp.up_proj.weight", "[48, 32]", "mlp.up", "layer 2"});
}

TEST_F(CheckpointTest, MissingLmHeadMentionsTying) {
  write(glimmer_config());
  rewrite("model.safetensors", [](std::vector<Owned>& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](const Owned& t) { return t.name == "lm_head.weight"; }), ts.end());
  });
  expect_open_error({"lm_head.weight", "tie_word_embeddings = false"});
}

TEST_F(CheckpointTest, UnconsumedTensorAndIgnorePatterns) {
  write(spark_config());
  rewrite("model.safetensors", [](std::vector<Owned>& ts) {
    ts.push_back({P + "layers.0.self_attn.q_norm.weight", DType::BF16, {8}, std::string(16, '\0')});
    ts.push_back({"mtp.layers.0.eh_proj.weight", DType::BF16, {2}, std::string(4, '\0')});
  });
  expect_open_error({"2 tensors are in the checkpoint but not used", "layers.0.self_attn.q_norm.weight",
                     "mtp.layers.0.eh_proj.weight", "model.safetensors"});
  LoadOptions o;
  o.ignore_patterns = {"mtp.*"};
  expect_open_error({"1 tensor is", "q_norm"}, o);
  o.ignore_patterns.push_back("*.q_norm.weight");
  auto ck = Checkpoint::open(dir_, o);
  ASSERT_TRUE(ck.ok()) << ck.message();
  EXPECT_EQ(ck->skipped().size(), 2u);
}

TEST_F(CheckpointTest, VisionTensorsNeedLanguageModelOnly) {
  write(glimmer_config());
  rewrite("model.safetensors", [](std::vector<Owned>& ts) {
    ts.push_back({"model.vision_tower.ln_pre.weight", DType::BF16, {4}, std::string(8, '\0')});
    ts.push_back({"model.vision_adapter.fc1.weight", DType::BF16, {2, 2}, std::string(8, '\0')});
  });
  expect_open_error({"model.vision_tower.ln_pre.weight", "--language-model-only"});
  LoadOptions o;
  o.language_model_only = true;
  auto ck = Checkpoint::open(dir_, o);
  ASSERT_TRUE(ck.ok()) << ck.message();
  EXPECT_EQ(ck->skipped().size(), 2u);
}

TEST_F(CheckpointTest, MisShapedTensor) {
  write(spark_config());
  rewrite("model.safetensors", [](std::vector<Owned>& ts) {
    Owned* k = by_name(ts, P + "layers.1.self_attn.k_proj.weight");
    k->shape = {16, 16};  // same bytes, wrong shape
  });
  expect_open_error({"tensor model.language_model.layers.1.self_attn.k_proj.weight", "model.safetensors",
                     "has shape [16, 16]", "expects [8, 32]", "num_key_value_heads*head_dim, hidden_size"});
}

TEST_F(CheckpointTest, WrongDtype) {
  write(spark_config());
  rewrite("model.safetensors", [](std::vector<Owned>& ts) {
    Owned* r = by_name(ts, P + "layers.0.mlp.gate.weight");
    std::vector<float> v(size_t(4 * 32), 0.5f);
    r->dtype = DType::BF16;
    r->data = tensor_bytes_f32(v, DType::BF16);
    Owned* q = by_name(ts, P + "layers.0.self_attn.q_proj.weight");
    q->dtype = DType::I16;
  });
  expect_open_error({"2 problems", "layers.0.mlp.gate.weight", "is BF16", "F32 (the router stays FP32)",
                     "layers.0.self_attn.q_proj.weight", "is I16", "BF16, F16 or F32"});
}

TEST_F(CheckpointTest, AmbiguousSpellings) {
  write(glimmer_config());
  rewrite("model.safetensors", [](std::vector<Owned>& ts) {
    Owned copy = *by_name(ts, P + "layers.0.self_attn.v_proj.weight");
    copy.name = "model.layers.0.self_attn.v_proj.weight";
    ts.push_back(copy);
  });
  expect_open_error({"ambiguous", "model.layers.0.self_attn.v_proj.weight"});
}

TEST_F(CheckpointTest, TruncatedFile) {
  write(glimmer_config());
  fs::resize_file(dir_ + "/model.safetensors", fs::file_size(dir_ + "/model.safetensors") - 100);
  expect_open_error({"model.safetensors", "truncated"});
}

TEST_F(CheckpointTest, CorruptHeader) {
  write(glimmer_config());
  std::string path = dir_ + "/model.safetensors";
  auto bytes = read_file(path);
  ASSERT_TRUE(bytes.ok());
  std::string b = *bytes;
  b[20] = '#';
  ASSERT_TRUE(write_file(path, b).ok());
  expect_open_error({"model.safetensors", "corrupt header"});
}

TEST_F(CheckpointTest, OversizedHeader) {
  write(glimmer_config());
  std::string path = dir_ + "/model.safetensors";
  auto bytes = read_file(path);
  ASSERT_TRUE(bytes.ok());
  std::string b = *bytes;
  b[5] = '\x01';  // header length += 2^40
  ASSERT_TRUE(write_file(path, b).ok());
  expect_open_error({"model.safetensors", "exceeds the 100,000,000-byte limit"});
}

TEST_F(CheckpointTest, InconsistentConfig) {
  write(glimmer_config());
  // The checkpoint was written for intermediate_size 48; the config now says 64.
  Json cfg = glimmer_config();
  cfg.find("text_config")->set("intermediate_size", 64);
  ASSERT_TRUE(write_file(dir_ + "/config.json", cfg.dump()).ok());
  expect_open_error({"mlp.gate_proj.weight", "has shape [48, 32]", "expects [64, 32]", "intermediate_size",
                     "does not match its config"});
  // A config that contradicts itself is refused before any tensor is read.
  cfg.find("text_config")->find("layer_types")->as_array()[0] = Json("full_attention");
  ASSERT_TRUE(write_file(dir_ + "/config.json", cfg.dump()).ok());
  expect_open_error({"config.json", "layer_types[0]", "layer 0"});
}

TEST_F(CheckpointTest, ShardIndexProblems) {
  RandomModelOptions o;
  o.max_shard_bytes = 8192;
  write(glimmer_config(), o);
  std::string index = dir_ + "/model.safetensors.index.json";
  auto original = read_file(index);
  ASSERT_TRUE(original.ok());
  ASSERT_TRUE(Checkpoint::open(dir_).ok());

  // A shard the index names is missing.
  std::string second;
  for (const auto& e : fs::directory_iterator(dir_))
    if (e.path().filename().string().find("-00002-of-") != std::string::npos) second = e.path().filename().string();
  ASSERT_FALSE(second.empty());
  fs::rename(dir_ + "/" + second, dir_ + "/moved");
  expect_open_error({"model.safetensors.index.json names shard " + second, "incomplete download"});
  fs::rename(dir_ + "/moved", dir_ + "/" + second);

  // The index places a tensor in a shard that does not have it.
  auto idx = Json::parse(*original);
  ASSERT_TRUE(idx.ok());
  Json edited = *idx;
  edited.find("weight_map")->set("model.language_model.layers.9.extra.weight", second);
  ASSERT_TRUE(write_file(index, edited.dump()).ok());
  expect_open_error({"places tensor model.language_model.layers.9.extra.weight in " + second, "does not contain it"});

  // A shard holds a tensor the index does not list.
  edited = *idx;
  edited.find("weight_map")->erase(P + "layers.0.self_attn.k_proj.weight");
  ASSERT_TRUE(write_file(index, edited.dump()).ok());
  expect_open_error({"contains tensor " + P + "layers.0.self_attn.k_proj.weight", "does not list"});

  // Files outside the index are ignored.
  ASSERT_TRUE(write_file(index, *original).ok());
  ASSERT_TRUE(write_file(dir_ + "/stray.safetensors", "garbage").ok());
  EXPECT_TRUE(Checkpoint::open(dir_).ok());
}

TEST_F(CheckpointTest, EmptyDirectory) {
  fs::create_directories(dir_);
  expect_open_error({"no config.json"});
  ASSERT_TRUE(write_file(dir_ + "/config.json", glimmer_config().dump()).ok());
  expect_open_error({"neither model.safetensors nor model.safetensors.index.json"});
}

namespace {

// Random NVFP4 codes and E4M3 block scales for `rows` × `cols`, packed the
// ModelOpt way (even element in the low nibble), with the dequantized values
// for the given per-row global scale.
struct Nvfp4Sample {
  std::string packed, scales;
  std::vector<float> values;
};
Nvfp4Sample make_nvfp4(int64_t rows, int64_t cols, const std::function<float(int64_t row)>& global, uint32_t seed) {
  std::mt19937 rng(seed);
  Nvfp4Sample s;
  s.packed.resize(size_t(rows * cols / 2));
  s.scales.resize(size_t(rows * cols / 16));
  for (auto& b : s.scales) b = char(0x30 + rng() % 0x20);
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t k = 0; k < cols; ++k) {
      uint8_t code = uint8_t(rng() & 15);
      char& byte = s.packed[size_t((r * cols + k) / 2)];
      byte = char(uint8_t(byte) | (k % 2 ? code << 4 : code));
      float sc = f8_e4m3_to_f32(uint8_t(s.scales[size_t((r * cols + k) / 16)]));
      s.values.push_back(e2m1_to_f32(code) * (sc * global(r)));
    }
  return s;
}

}  // namespace

TEST_F(CheckpointTest, Nvfp4ModelOptDequantizesPerTensor) {
  Json cfg = spark_config();
  cfg.find("text_config")->set("moe_intermediate_size", 16);
  auto qc = Json::parse(R"({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16})");
  cfg.set("quantization_config", *qc);
  write(cfg);
  // attn.q of layer 0 as a quantized Linear; the layer-1 experts as fused 3-D
  // NVFP4 parameters, gate_up with separate gate/up global scales [E, 2].
  const int64_t E = 4, R = 32, C = 16;
  std::vector<float> gu_global = {0.5f, 0.25f, 1.0f, 2.0f, 0.125f, 4.0f, 1.5f, 0.75f};
  Nvfp4Sample q = make_nvfp4(32, 32, [](int64_t) { return 0.5f; }, 1);
  Nvfp4Sample gu = make_nvfp4(E * R, C, [&](int64_t row) { return gu_global[size_t(row / R * 2 + (row % R) / 16)]; }, 2);
  Nvfp4Sample dn = make_nvfp4(E * 16, 16, [](int64_t row) { return float(1 + row / 16) * 0.25f; }, 3);
  rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
    Owned* w = by_name(ts, P + "layers.0.self_attn.q_proj.weight");
    *w = {w->name, DType::U8, {32, 16}, q.packed};
    ts.push_back({P + "layers.0.self_attn.q_proj.weight_scale", DType::F8_E4M3, {32, 2}, q.scales});
    ts.push_back({P + "layers.0.self_attn.q_proj.weight_scale_2", DType::F32, {}, tensor_bytes_f32({0.5f}, DType::F32)});
    ts.push_back({P + "layers.0.self_attn.q_proj.input_scale", DType::F32, {}, tensor_bytes_f32({1.0f}, DType::F32)});
    std::string x = P + "layers.1.mlp.experts.";
    *by_name(ts, x + "gate_up_proj") = {x + "gate_up_proj", DType::U8, {E, R, C / 2}, gu.packed};
    ts.push_back({x + "gate_up_proj_weight_scale", DType::F8_E4M3, {E, R, 1}, gu.scales});
    ts.push_back({x + "gate_up_proj_weight_scale_2", DType::F32, {E, 2}, tensor_bytes_f32(gu_global, DType::F32)});
    ts.push_back({x + "gate_up_proj_input_scale", DType::F32, {E, 2}, tensor_bytes_f32(gu_global, DType::F32)});
    *by_name(ts, x + "down_proj") = {x + "down_proj", DType::U8, {E, 16, 8}, dn.packed};
    ts.push_back({x + "down_proj_weight_scale", DType::F8_E4M3, {E, 16, 1}, dn.scales});
    ts.push_back({x + "down_proj_weight_scale_2", DType::F32, {E},
                  tensor_bytes_f32({0.25f, 0.5f, 0.75f, 1.0f}, DType::F32)});
  });
  auto ck = Checkpoint::open(dir_);
  ASSERT_TRUE(ck.ok()) << ck.message();
  EXPECT_TRUE(ck->find("attn.q", 0)->quantized());
  EXPECT_FALSE(ck->find("attn.q", 1)->quantized());  // decided per tensor
  std::vector<float> got(32 * 32);
  ASSERT_TRUE(ck->read_f32("attn.q", 0, got.data()).ok());
  EXPECT_EQ(got, q.values);
  std::vector<float> g2(size_t(E * R * C));
  ASSERT_TRUE(ck->read_f32("moe.experts.gate_up", 1, g2.data()).ok());
  EXPECT_EQ(g2, gu.values);
  std::vector<float> e3(size_t(R * C));
  ASSERT_TRUE(ck->read_expert_f32("moe.experts.gate_up", 1, 3, e3.data()).ok());
  EXPECT_TRUE(std::equal(e3.begin(), e3.end(), gu.values.begin() + 3 * R * C));
  std::vector<float> d2(size_t(E * 16 * 16));
  ASSERT_TRUE(ck->read_f32("moe.experts.down", 1, d2.data()).ok());
  EXPECT_EQ(d2, dn.values);
  std::vector<uint16_t> bf(32 * 32);
  ASSERT_TRUE(ck->read_bf16("attn.q", 0, bf.data()).ok());
  EXPECT_EQ(bf16_to_f32(bf[7]), round_bf16(q.values[7]));
}

TEST_F(CheckpointTest, Nvfp4CompressedTensorsAndMissingScale) {
  Json cfg = spark_config();
  auto qc = Json::parse(R"({"quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized"})");
  cfg.set("quantization_config", *qc);
  write(cfg);
  Nvfp4Sample o = make_nvfp4(32, 32, [](int64_t) { return 0.5f; }, 4);
  rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
    Owned* w = by_name(ts, P + "layers.1.self_attn.o_proj.weight");
    *w = {P + "layers.1.self_attn.o_proj.weight_packed", DType::U8, {32, 16}, o.packed};
    ts.push_back({P + "layers.1.self_attn.o_proj.weight_scale", DType::F8_E4M3, {32, 2}, o.scales});
    // The reciprocal convention: global scale 2 means multiply by 0.5.
    ts.push_back({P + "layers.1.self_attn.o_proj.weight_global_scale", DType::F32, {1}, tensor_bytes_f32({2.0f}, DType::F32)});
  });
  auto ck = Checkpoint::open(dir_);
  ASSERT_TRUE(ck.ok()) << ck.message();
  std::vector<float> got(32 * 32);
  ASSERT_TRUE(ck->read_f32("attn.o", 1, got.data()).ok());
  EXPECT_EQ(got, o.values);

  rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [](const Owned& t) { return t.name.find("weight_global_scale") != std::string::npos; }),
             ts.end());
  });
  expect_open_error({"layers.1.self_attn.o_proj.weight_packed", "is U8 (NVFP4 codes) but", "weight_global_scale is missing"});
}

void CheckpointTest::write_quantized(const char* quantization_config) {
  Json cfg = spark_config();
  cfg.set("quantization_config", *Json::parse(quantization_config));
  fs::remove_all(dir_);
  write(cfg);
}

// ---------------------------------------------------------------------------
// Strict per-format checks: every failure names the tensor.
// ---------------------------------------------------------------------------
TEST_F(CheckpointTest, QuantizedFormatsStrictChecksNameTheTensor) {
  const std::string q = P + "layers.0.self_attn.q_proj.";
  auto drop = [](std::vector<Owned>& ts, const std::string& name) {
    ts.erase(std::remove_if(ts.begin(), ts.end(), [&](const Owned& t) { return t.name == name; }), ts.end());
  };
  // FP8 (Quark PTPC) with I32 channel scales: a float is required.
  write_quantized(R"({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "fp8_e4m3", "qscheme": "per_channel"}}})");
  rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
    *by_name(ts, q + "weight") = {q + "weight", DType::F8_E4M3, {32, 32}, std::string(32 * 32, '\x38')};
    ts.push_back({q + "weight_scale", DType::I32, {32}, std::string(32 * 4, '\0')});
  });
  expect_open_error({q + "weight_scale", "I32 [32]", "FP8", "F32 (or F16 / BF16) scales"});
  // With BF16 scales (as compressed-tensors writes them) it loads, widened.
  rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
    *by_name(ts, q + "weight_scale") = {q + "weight_scale", DType::BF16, {32, 1},
                                        tensor_bytes_f32(std::vector<float>(32, 0.25f), DType::BF16)};
  });
  {
    auto ck = Checkpoint::open(dir_);
    ASSERT_TRUE(ck.ok()) << ck.message();
    std::vector<float> v(32 * 32);
    ASSERT_TRUE(ck->read_f32("attn.q", 0, v.data()).ok());
    EXPECT_EQ(v[5], 0.25f);
  }
  // ... and with F32 scales it loads, per channel.
  rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
    *by_name(ts, q + "weight_scale") = {q + "weight_scale", DType::F32, {32}, tensor_bytes_f32(std::vector<float>(32, 0.5f), DType::F32)};
  });
  {
    auto ck = Checkpoint::open(dir_);
    ASSERT_TRUE(ck.ok()) << ck.message();
    const ResolvedWeight* w = ck->find("attn.q", 0);
    ASSERT_TRUE(w->quantized());
    EXPECT_EQ(w->quant.format.block_rows, 1);
    EXPECT_EQ(w->quant.format.block_cols, 32);
    std::vector<float> v(32 * 32);
    ASSERT_TRUE(ck->read_f32("attn.q", 0, v.data()).ok());
    EXPECT_EQ(v[5], 0.5f);  // e4m3 0x38 = 1.0, times 0.5
  }

  // MXFP4 (Quark) without its E8M0 scales.
  write_quantized(R"({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "fp4", "group_size": 32}}})");
  rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
    *by_name(ts, q + "weight") = {q + "weight", DType::U8, {32, 16}, std::string(32 * 16, '\x22')};
  });
  expect_open_error({q + "weight", "MXFP4 codes", q + "weight_scale is missing"});

  // GPTQ with an act-order g_idx, and with mis-shaped scales.
  write_quantized(R"({"quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": false})");
  auto gptq = [&](bool permuted, std::vector<int64_t> scale_shape) {
    rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
      drop(ts, q + "weight");
      ts.push_back({q + "qweight", DType::I32, {4, 32}, std::string(4 * 32 * 4, '\x88')});
      ts.push_back({q + "qzeros", DType::I32, {2, 4}, std::string(2 * 4 * 4, '\x77')});
      int64_t n = 1;
      for (int64_t d : scale_shape) n *= d;
      ts.push_back({q + "scales", DType::F16, scale_shape, tensor_bytes_f32(std::vector<float>(size_t(n), 0.01f), DType::F16)});
      std::vector<uint32_t> g(32);
      for (int k = 0; k < 32; ++k) g[size_t(k)] = uint32_t(permuted ? (k % 2) : k / 16);
      std::string gb(32 * 4, '\0');
      std::memcpy(gb.data(), g.data(), gb.size());
      ts.push_back({q + "g_idx", DType::I32, {32}, gb});
    });
  };
  gptq(true, {2, 32});
  expect_open_error({q + "g_idx", "act-order", "desc_act"});
  write_quantized(R"({"quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": false})");
  gptq(false, {32, 2});
  expect_open_error({q + "scales", "F16 [2, 32]"});
  write_quantized(R"({"quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": true})");
  expect_open_error({"desc_act"});

  // A quantized tensor inside a module the config excludes.
  write_quantized(R"({"quant_method": "modelopt", "quant_algo": "NVFP4", "group_size": 16,
                  "ignore": ["model.language_model.layers.0.self_attn*"]})");
  rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
    *by_name(ts, q + "weight") = {q + "weight", DType::U8, {32, 16}, std::string(32 * 16, '\x22')};
    ts.push_back({q + "weight_scale", DType::F8_E4M3, {32, 2}, std::string(64, '\x38')});
    ts.push_back({q + "weight_scale_2", DType::F32, {}, tensor_bytes_f32({1.0f}, DType::F32)});
  });
  expect_open_error({q + "weight", "excludes", "layers.0.self_attn*"});

  // An unknown method is refused by name.
  write_quantized(R"({"quant_method": "bitsandbytes"})");
  expect_open_error({"bitsandbytes", "not a format muse reads"});
}

// The checks added after an audit of malformed quantized checkpoints
// (2026-12-04): exclusion lists in the forms configs use, the activation
// scale, quantized embeddings, compressed-tensors' weight_shape, FP4 codes
// in F4 of the logical shape, FP8 block configs, and config.json against
// hf_quant_config.json.
TEST_F(CheckpointTest, QuantizedCheckpointAuditCases) {
  const std::string q = P + "layers.0.self_attn.q_proj.";
  // Replaces the tensor of that name (the random writer may have made it), or adds it.
  auto put = [](std::vector<Owned>& ts, Owned t) {
    if (Owned* o = by_name(ts, t.name)) *o = std::move(t);
    else ts.push_back(std::move(t));
  };
  Nvfp4Sample s = make_nvfp4(32, 32, [](int64_t) { return 0.5f; }, 7);
  auto nvfp4_q = [&](DType codes_dtype, std::vector<int64_t> codes_shape) {
    rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
      put(ts, {q + "weight", codes_dtype, codes_shape, s.packed});
      put(ts, {q + "weight_scale", DType::F8_E4M3, {32, 2}, s.scales});
      put(ts, {q + "weight_scale_2", DType::F32, {}, tensor_bytes_f32({0.5f}, DType::F32)});
    });
  };
  // Exclusions: a glob of a module above (gpt-oss style), a bare component
  // name, a compressed-tensors regex, a single string.
  for (const char* excl : {R"("ignore": ["model.language_model.layers.*.self_attn"])", R"("ignore": ["self_attn"])",
                           R"("ignore": ["re:.*layers\\.0\\.self_attn\\.q_proj$"])",
                           R"("exclude_modules": "model.language_model.layers.0.self_attn.q_proj")"}) {
    write_quantized(("{\"quant_method\": \"modelopt\", \"quant_algo\": \"NVFP4\", " + std::string(excl) + "}").c_str());
    nvfp4_q(DType::U8, {32, 16});
    expect_open_error({q + "weight", "is stored quantized but quantization_config excludes"});
  }
  // The same exclusion naming another module, and the codes as F4 of the
  // logical shape: loads, the same values as the packed bytes.
  write_quantized(R"({"quant_method": "modelopt", "quant_algo": "NVFP4", "ignore": ["self_attn.k_proj", "lm_head"]})");
  nvfp4_q(DType::F4, {32, 32});
  {
    auto ck = Checkpoint::open(dir_);
    ASSERT_TRUE(ck.ok()) << ck.message();
    std::vector<float> got(32 * 32);
    ASSERT_TRUE(ck->read_f32("attn.q", 0, got.data()).ok());
    EXPECT_EQ(got, s.values);
  }
  rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
    put(ts, {q + "weight", DType::F4, {32, 16}, s.packed.substr(0, 32 * 8)});  // F4 of the packed shape
  });
  expect_open_error({q + "weight", "F4 [32, 32]"});
  // An activation scale that is not one float value.
  write_quantized(R"({"quant_method": "modelopt", "quant_algo": "NVFP4"})");
  nvfp4_q(DType::U8, {32, 16});
  rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
    put(ts, {q + "input_scale", DType::BF16, {7}, tensor_bytes_f32(std::vector<float>(7, 1.0f), DType::BF16)});
  });
  expect_open_error({q + "input_scale", "BF16 [7]", "activation scale"});
  // FP8 token embeddings are refused at load, not at the first step.
  write_quantized(R"({"quant_method": "modelopt", "quant_algo": "FP8"})");
  rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
    Owned* e = by_name(ts, P + "embed_tokens.weight");
    const int64_t n = e->shape[0] * e->shape[1];
    *e = {e->name, DType::F8_E4M3, e->shape, std::string(size_t(n), '\x38')};
    put(ts, {P + "embed_tokens.weight_scale", DType::F32, {}, tensor_bytes_f32({1.0f}, DType::F32)});
  });
  expect_open_error({P + "embed_tokens.weight", "quantized token embeddings are not supported"});
  // quant_method fp8 (128 x 128 blocks) with per-channel scales.
  write_quantized(R"({"quant_method": "fp8", "weight_block_size": [128, 128]})");
  rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
    put(ts, {q + "weight", DType::F8_E4M3, {32, 32}, std::string(32 * 32, '\x38')});
    put(ts, {q + "weight_scale_inv", DType::F32, {32}, tensor_bytes_f32(std::vector<float>(32, 1.0f), DType::F32)});
  });
  expect_open_error({q + "weight_scale_inv", "per 128x128 block [1, 1]", "weight_block_size"});
  // compressed-tensors INT4 with a weight_shape that is not the slot's.
  write_quantized(R"({"quant_method": "compressed-tensors", "format": "pack-quantized",
                  "config_groups": {"group_0": {"weights": {"num_bits": 4, "group_size": 16}}}})");
  auto ct_int4 = [&](std::vector<int64_t> logical) {
    rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
      ts.erase(std::remove_if(ts.begin(), ts.end(), [&](const Owned& t) { return t.name.rfind(q, 0) == 0; }), ts.end());
      put(ts, {q + "weight_packed", DType::I32, {32, 4}, std::string(32 * 4 * 4, '\x88')});
      put(ts, {q + "weight_scale", DType::F16, {32, 2}, tensor_bytes_f32(std::vector<float>(64, 0.01f), DType::F16)});
      std::string shape(16, '\0');
      std::memcpy(shape.data(), logical.data(), 16);
      put(ts, {q + "weight_shape", DType::I64, {2}, shape});
    });
  };
  ct_int4({32, 32});
  EXPECT_TRUE(Checkpoint::open(dir_).ok());
  ct_int4({999, 7});
  expect_open_error({q + "weight_shape", "holding [32, 32]"});
  // GPTQ scales in BF16 (a BF16 model's export) load; F32 ones do not.
  write_quantized(R"({"quant_method": "gptq", "bits": 4, "group_size": 16, "desc_act": false})");
  auto gptq_scales = [&](DType dt) {
    rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
      ts.erase(std::remove_if(ts.begin(), ts.end(), [&](const Owned& t) { return t.name.rfind(q, 0) == 0; }), ts.end());
      put(ts, {q + "qweight", DType::I32, {4, 32}, std::string(4 * 32 * 4, '\x99')});
      put(ts, {q + "qzeros", DType::I32, {2, 4}, std::string(2 * 4 * 4, '\x77')});
      put(ts, {q + "scales", dt, {2, 32}, tensor_bytes_f32(std::vector<float>(64, 0.5f), dt)});
    });
  };
  gptq_scales(DType::BF16);
  {
    auto ck = Checkpoint::open(dir_);
    ASSERT_TRUE(ck.ok()) << ck.message();
    std::vector<float> v(32 * 32);
    ASSERT_TRUE(ck->read_f32("attn.q", 0, v.data()).ok());
    EXPECT_EQ(v[3], 0.5f);  // (9 - (7 + 1)) * 0.5
  }
  gptq_scales(DType::F32);
  expect_open_error({q + "scales", "F16 [2, 32]"});
  // config.json and hf_quant_config.json that disagree.
  write_quantized(R"({"quant_method": "modelopt", "quant_algo": "FP8"})");
  ASSERT_TRUE(write_file(dir_ + "/hf_quant_config.json",
                         R"({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "NVFP4"}})").ok());
  expect_open_error({"hf_quant_config.json (modelopt NVFP4) disagree"});
  // KV-cache scales in each spelling; absent ones are 1.0.
  write_quantized(R"({"quant_method": "modelopt", "quant_algo": "FP8", "kv_cache_quant_algo": "FP8"})");
  auto kv_scale = [&](const std::string& name, DType dt, std::vector<int64_t> shape, float value) {
    rewrite("model.safetensors", [&](std::vector<Owned>& ts) {
      int64_t n = 1;
      for (int64_t d : shape) n *= d;
      put(ts, {name, dt, shape, tensor_bytes_f32(std::vector<float>(size_t(n), value), dt)});
    });
  };
  kv_scale(P + "layers.0.self_attn.k_proj.k_scale", DType::F32, {}, 2.0f);     // ModelOpt, K only
  kv_scale(P + "layers.1.self_attn.v_proj.output_scale", DType::BF16, {1}, 3.0f);  // Quark, V only
  {
    auto ck = Checkpoint::open(dir_);
    ASSERT_TRUE(ck.ok()) << ck.message();
    ASSERT_EQ(ck->kv_scales().size(), size_t(ck->config().num_layers));
    ASSERT_GE(ck->kv_scales().size(), 2u);
    EXPECT_EQ(ck->kv_scales()[0], (std::array<float, 2>{2.0f, 1.0f}));
    EXPECT_EQ(ck->kv_scales()[1], (std::array<float, 2>{1.0f, 3.0f}));
  }
  kv_scale(P + "layers.1.self_attn.kv_scale", DType::F32, {}, 0.5f);  // legacy: both, so V twice
  expect_open_error({"ambiguous checkpoint", "layer 1's V-cache scale"});
  write_quantized(R"({"quant_method": "modelopt", "quant_algo": "FP8"})");
  kv_scale(P + "layers.0.self_attn.k_scale", DType::F32, {4}, 2.0f);
  expect_open_error({P + "layers.0.self_attn.k_scale", "per-head scales"});
  kv_scale(P + "layers.0.self_attn.k_scale", DType::F32, {}, 0.0f);
  expect_open_error({P + "layers.0.self_attn.k_scale", "finite and positive"});
  // A known method with an unknown variant names the file the settings came from.
  Json cfg = spark_config();
  fs::remove_all(dir_);
  write(cfg);
  ASSERT_TRUE(write_file(dir_ + "/hf_quant_config.json",
                         R"({"producer": {"name": "modelopt"}, "quantization": {"quant_algo": "W4A8_AWQ"}})").ok());
  expect_open_error({"hf_quant_config.json: modelopt quant_algo \"W4A8_AWQ\" is not supported"});
}
