// Quantized checkpoint fixtures, written the way each published packer lays
// them out (checkpoint-formats.md §2–3), from a BF16 random model:
//   nvfp4  ModelOpt:   <m>.weight U8 [N, K/2], .weight_scale F8_E4M3 [N, K/16],
//                      .weight_scale_2 F32 []; fused experts <p>, <p>_weight_scale,
//                      <p>_weight_scale_2 ([E, 2] for gate_up, [E] for down);
//                      detected from hf_quant_config.json
//   mxfp4  Quark:      <m>.weight U8 [N, K/2], .weight_scale U8 (E8M0) [N, K/32];
//                      fused <p>, <p>_weight_scale
//   fp8    Quark PTPC: <m>.weight F8_E4M3 [N, K], .weight_scale F32 [N]; fused [E, N]
//   int4   AutoRound (auto_gptq packing, GPTQ v1 zeros): <m>.qweight I32 [K/8, N],
//          .qzeros I32 [K/G, N/8], .scales F16 [K/G, N], .g_idx I32 [K];
//          fused <p>_qweight, ... with a leading E
// With per_expert, the experts are written one by one instead
// (mlp.experts.{e}.{gate,up,down}_proj as 2-D modules, each quantized).
// Which slots are quantized: model/weight_table.h quantized_at_load (the rule
// `muse plan` sizes with). Also the "dequantized twin": the same model with
// every quantized slot replaced by its dequantized values (reference
// decoders), stored F32 under the BF16 names.
#pragma once

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>
#include <vector>

#include "muse/core/json.h"
#include "muse/loading/checkpoint.h"
#include "muse/loading/random_model.h"
#include "muse/loading/safetensors.h"
#include "muse/model/quantize.h"

namespace muse::testing {

// The fixtures' model (tests/engine/quant_model_test.cc, tests/model_cuda).
// Four layers (NVFP4 keeps layers 0 and 3's experts BF16, as the release
// does; layer 1's are NVFP4), layer 2 dense; every in-feature a multiple of 32 (MXFP4) and every
// out-feature of 8 (INT4).
inline constexpr const char* kQuantFixtureConfig = R"({"model_type": "muse_spark", "text_config": {
  "vocab_size": 97, "hidden_size": 128, "num_hidden_layers": 4, "num_attention_heads": 4,
  "num_key_value_heads": 2, "head_dim": 32, "rms_norm_eps": 1e-5, "post_norm_eps": 1e-8,
  "rope_parameters": {"rope_type": "default", "rope_theta": 500000.0}, "sliding_window": 8,
  "max_position_embeddings": 4096, "qk_scale_factor": 3.87, "output_multiplier": 0.25,
  "final_logit_softcapping": 20.0, "mlp_layer_types": ["sparse", "sparse", "dense", "sparse"],
  "num_local_experts": 4, "num_experts_per_tok": 2, "moe_hidden_size": 64, "moe_intermediate_size": 64,
  "intermediate_size": 96, "residual_gate_temperature": 0.3, "routed_scaling_factor": 1.0,
  "layer_types": ["sliding_attention", "sliding_attention", "sliding_attention", "full_attention"],
  "layer_rope_theta": [500000.0, 500000.0, 500000.0, 0.0],
  "bos_token_id": 1, "eos_token_id": 2, "pad_token_id": 0, "tie_word_embeddings": false}})";

inline std::string quant_config_text(QuantKind kind) {
  switch (kind) {
    case QuantKind::Nvfp4: return "";  // hf_quant_config.json instead
    case QuantKind::Mxfp4:
      return R"({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "fp4", "qscheme": "per_group",
        "group_size": 32, "ch_axis": -1, "scale_format": "e8m0", "is_dynamic": false}}, "exclude": ["lm_head"]})";
    case QuantKind::Fp8:
      return R"({"quant_method": "quark", "global_quant_config": {"weight": {"dtype": "fp8_e4m3", "qscheme":
        "per_channel", "is_dynamic": false}, "input_tensors": {"dtype": "fp8_e4m3", "qscheme": "per_channel",
        "is_dynamic": true}}, "exclude": ["lm_head"]})";
    case QuantKind::Int4:
      return R"({"quant_method": "auto-round", "bits": 4, "group_size": 128, "sym": true, "desc_act": false,
        "packing_format": "auto_round:auto_gptq", "data_type": "int"})";
    case QuantKind::None: break;
  }
  return "";
}

struct OwnedTensor {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  std::string data;
};

inline std::string bytes_of(const std::vector<uint8_t>& v) { return std::string(v.begin(), v.end()); }
inline std::string bytes_of(const std::vector<float>& v) {
  return std::string(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}

inline void write_tensors(const std::string& path, const std::vector<OwnedTensor>& ts) {
  std::vector<TensorToWrite> out;
  for (const auto& t : ts) out.push_back({t.name, t.dtype, t.shape, t.data});
  Status s = write_safetensors(path, out);
  ASSERT_TRUE(s.ok()) << s.message();
}

// Quantizes one matrix (set) and appends its tensors under `name` (a
// module's ".weight", or a fused 3-D parameter) in the format's layout.
inline void emit_quant(std::vector<OwnedTensor>& qt, QuantKind kind, const std::string& name, const float* f,
                       const std::vector<int64_t>& shape, int halves) {
  auto q = quantize_weight(kind, f, shape, halves);
  ASSERT_TRUE(q.ok()) << q.message();
  const bool module = name.size() > 7 && name.compare(name.size() - 7, 7, ".weight") == 0;
  const std::string base = module ? name.substr(0, name.size() - 7) : name;
  auto nm = [&](const char* suffix) { return base + (module ? "." : "_") + suffix; };
  const bool fused = shape.size() == 3;
  const int64_t E = fused ? shape[0] : 1, N = shape[fused ? 1 : 0], K = shape.back();
  auto lead = [&](std::vector<int64_t> s) {
    if (fused) s.insert(s.begin(), E);
    return s;
  };
  switch (kind) {
    case QuantKind::Nvfp4: {
      qt.push_back({name, DType::U8, lead({N, K / 2}), bytes_of(q->codes)});
      qt.push_back({nm("weight_scale"), DType::F8_E4M3, q->scale_shape, bytes_of(q->scales)});
      std::vector<int64_t> gshape = fused ? (halves == 2 ? std::vector<int64_t>{E, 2} : std::vector<int64_t>{E})
                                          : std::vector<int64_t>{};
      qt.push_back({nm("weight_scale_2"), DType::F32, gshape, bytes_of(q->global)});
      break;
    }
    case QuantKind::Mxfp4:
      qt.push_back({name, DType::U8, lead({N, K / 2}), bytes_of(q->codes)});
      qt.push_back({nm("weight_scale"), DType::U8, q->scale_shape, bytes_of(q->scales)});
      break;
    case QuantKind::Fp8:
      qt.push_back({name, DType::F8_E4M3, shape, bytes_of(q->codes)});
      qt.push_back({nm("weight_scale"), DType::F32, lead({N}), bytes_of(q->scales)});
      break;
    case QuantKind::Int4: {
      const std::string qname = module ? base + ".qweight" : base + "_qweight";
      qt.push_back({qname, DType::I32, lead({K / 8, N}), bytes_of(q->codes)});
      qt.push_back({nm("qzeros"), DType::I32, q->zero_shape, bytes_of(q->zeros)});
      qt.push_back({nm("scales"), DType::F16, q->scale_shape, bytes_of(q->scales)});
      std::vector<uint8_t> g(size_t(E * K * 4));
      for (int64_t e = 0; e < E; ++e)
        for (int64_t k = 0; k < K; ++k) {
          const int32_t gi = int32_t(k / q->format.block_cols);
          std::memcpy(g.data() + (e * K + k) * 4, &gi, 4);
        }
      qt.push_back({nm("g_idx"), DType::I32, lead({K}), bytes_of(g)});
      break;
    }
    case QuantKind::None: break;
  }
}

// Writes `qdir` (the quantized checkpoint) and `twin_dir` (its dequantized
// F32 twin) from the BF16 model in `bf16_dir`.
inline void write_quant_fixture(const std::string& bf16_dir, const std::string& qdir, const std::string& twin_dir,
                                QuantKind kind, bool per_expert = false) {
  namespace fs = std::filesystem;
  auto ck = Checkpoint::open(bf16_dir);
  ASSERT_TRUE(ck.ok()) << ck.message();
  const ModelConfig& cfg = ck->config();
  std::vector<OwnedTensor> qt;
  for (const ResolvedWeight& w : ck->resolved()) {
    if (w.tied) continue;
    const TensorView& v = w.tensor;
    if (!quantized_at_load(kind, w.spec, cfg.num_layers)) {
      qt.push_back({v.name, v.dtype, v.shape, std::string(reinterpret_cast<const char*>(v.data), v.nbytes)});
      continue;
    }
    std::vector<float> f(size_t(w.spec.numel()));
    ASSERT_TRUE(ck->read_f32(w.spec.slot, w.spec.layer, f.data()).ok());
    const bool gate_up = w.spec.slot == "moe.experts.gate_up";
    if (per_expert && w.spec.shape.size() == 3) {
      // Qwen3-MoE style: mlp.experts.{e}.{gate,up,down}_proj, each a 2-D module.
      const std::string prefix = v.name.substr(0, v.name.rfind('.') + 1);
      const std::vector<std::string> mods = gate_up ? std::vector<std::string>{"gate_proj", "up_proj"}
                                                    : std::vector<std::string>{"down_proj"};
      const int64_t E = w.spec.shape[0], Np = w.spec.shape[1] / int64_t(mods.size()), K = w.spec.shape[2];
      for (int64_t e = 0; e < E; ++e)
        for (size_t m = 0; m < mods.size(); ++m)
          emit_quant(qt, kind, prefix + std::to_string(e) + "." + mods[m] + ".weight",
                     f.data() + (e * int64_t(mods.size()) + int64_t(m)) * Np * K, {Np, K}, 1);
      continue;
    }
    emit_quant(qt, kind, v.name, f.data(), w.spec.shape, gate_up && kind == QuantKind::Nvfp4 ? 2 : 1);
  }
  fs::create_directories(qdir);
  for (const char* f : {"config.json", "generation_config.json"})
    if (fs::exists(bf16_dir + "/" + f)) fs::copy_file(bf16_dir + "/" + f, qdir + "/" + f, fs::copy_options::overwrite_existing);
  if (kind == QuantKind::Nvfp4) {
    FILE* f = std::fopen((qdir + "/hf_quant_config.json").c_str(), "w");
    std::fputs(R"({"producer": {"name": "modelopt", "version": "0.29.0"}, "quantization": {"quant_algo": "NVFP4",
      "kv_cache_quant_algo": null, "group_size": 16, "exclude_modules": ["lm_head"]}})", f);
    std::fclose(f);
  } else {
    auto text = read_file(qdir + "/config.json");
    ASSERT_TRUE(text.ok());
    auto j = Json::parse(*text);
    ASSERT_TRUE(j.ok());
    j->set("quantization_config", *Json::parse(quant_config_text(kind)));
    FILE* f = std::fopen((qdir + "/config.json").c_str(), "w");
    std::fputs(j->dump().c_str(), f);
    std::fclose(f);
  }
  write_tensors(qdir + "/model.safetensors", qt);

  // The twin: every slot as the quantized checkpoint decodes it, F32.
  auto qck = Checkpoint::open(qdir);
  ASSERT_TRUE(qck.ok()) << qck.message();
  std::vector<OwnedTensor> tt;
  for (size_t i = 0; i < ck->resolved().size(); ++i) {
    const ResolvedWeight& w = ck->resolved()[i];
    if (w.tied) continue;
    const ResolvedWeight& qw = qck->resolved()[i];
    if (!qw.quantized()) {
      tt.push_back({w.tensor.name, w.tensor.dtype, w.tensor.shape,
                    std::string(reinterpret_cast<const char*>(w.tensor.data), w.tensor.nbytes)});
      continue;
    }
    std::vector<float> f(size_t(w.spec.numel()));
    ASSERT_TRUE(qck->read_f32(w.spec.slot, w.spec.layer, f.data()).ok());
    tt.push_back({w.tensor.name, DType::F32, w.spec.shape, bytes_of(f)});
  }
  fs::create_directories(twin_dir);
  for (const char* f : {"config.json", "generation_config.json"})
    if (fs::exists(bf16_dir + "/" + f)) fs::copy_file(bf16_dir + "/" + f, twin_dir + "/" + f, fs::copy_options::overwrite_existing);
  write_tensors(twin_dir + "/model.safetensors", tt);
}

// The fixture set the quantized-model tests share, under `root`: bf16/ (a
// random model of kQuantFixtureConfig, seed 7), q/ (it quantized as `kind`'s
// published packer lays it out) and twin/ (the dequantized twin).
inline void write_quant_fixture_set(const std::string& root, QuantKind kind) {
  namespace fs = std::filesystem;
  fs::remove_all(root);
  fs::create_directories(root + "/bf16");
  auto cfg = Json::parse(kQuantFixtureConfig);
  ASSERT_TRUE(cfg.ok());
  RandomModelOptions ro;
  ro.seed = 7;
  Status st = write_random_model(root + "/bf16", *cfg, ro);
  ASSERT_TRUE(st.ok()) << st.message();
  write_quant_fixture(root + "/bf16", root + "/q", root + "/twin", kind);
}

}  // namespace muse::testing
