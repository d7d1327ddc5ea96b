#include "muse/loading/random_model.h"

#include <cmath>
#include <cstdio>
#include <cstring>
#include <sys/stat.h>

#include "muse/core/random.h"
#include "muse/core/mapped_file.h"
#include "muse/loading/name_map.h"
#include "muse/loading/safetensors.h"
#include "muse/model/config.h"
#include "muse/model/weight_table.h"

namespace muse {

namespace {

struct Planned {
  std::string name;
  DType dtype;
  std::vector<int64_t> shape;
  float scale;   // values are offset + scale·U(-1, 1)
  float offset;
  uint64_t seed;
  uint64_t bytes() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return uint64_t(n) * uint64_t(dtype_bits(dtype) / 8);
  }
};

std::string fill(const Planned& p) {
  int64_t n = 1;
  for (int64_t d : p.shape) n *= d;
  std::string out(size_t(n) * size_t(dtype_bits(p.dtype) / 8), '\0');
  SplitMix64 rng{p.seed};
  for (int64_t i = 0; i < n; ++i) {
    float v = p.offset + rng.uniform() * p.scale;
    if (p.dtype == DType::F32) {
      std::memcpy(&out[size_t(i) * 4], &v, 4);
    } else {
      uint16_t h = p.dtype == DType::BF16 ? f32_to_bf16(v) : f32_to_f16(v);
      std::memcpy(&out[size_t(i) * 2], &h, 2);
    }
  }
  return out;
}

std::string shard_name(size_t i, size_t n) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "model-%05zu-of-%05zu.safetensors", i + 1, n);
  return buf;
}

}  // namespace

Status write_random_model(const std::string& dir, const Json& config_json, const RandomModelOptions& options) {
  if (options.dtype != DType::BF16 && options.dtype != DType::F16 && options.dtype != DType::F32)
    return make_error("write_random_model: dtype must be BF16, F16 or F32");
  MUSE_ASSIGN_OR_RETURN(ModelConfig config, parse_model_config(config_json, dir + "/config.json"));
  ::mkdir(dir.c_str(), 0755);
  MUSE_RETURN_IF_ERROR(write_file(dir + "/config.json", config_json.dump(JsonDumpOptions::python(2, false)) + "\n"));
  Json gen = Json::object();
  if (config.bos_token_id >= 0) gen.set("bos_token_id", config.bos_token_id);
  if (!config.eos_token_ids.empty()) {
    Json eos = Json::array();
    for (int64_t id : config.eos_token_ids) eos.push_back(id);
    gen.set("eos_token_id", eos);
  }
  MUSE_RETURN_IF_ERROR(write_file(dir + "/generation_config.json", gen.dump(JsonDumpOptions::python(2, false)) + "\n"));

  std::vector<Planned> plan;
  uint64_t seed = options.seed * 0x100000001b3ull;
  for (const WeightSpec& w : describe_weights(config)) {
    if (w.slot == "lm_head" && config.tie_word_embeddings) continue;
    const SlotRule* rule = find_slot_rule(w.slot, config.family);
    if (!rule) return make_error("write_random_model: no name-table row for " + w.slot);
    DType dtype = rule->dtype_rule == DTypeRule::F32Only ? DType::F32 : options.dtype;
    // Matrices: unit-variance outputs for unit-variance inputs. Offset norm
    // gains small around 0 (gain 1 + w); the final norm's absolute gain 1 ± 0.5.
    float scale = 1.0f, offset = 0.0f;
    if (w.shape.size() >= 2 && w.slot != "embed_tokens") scale = std::sqrt(3.0f / float(w.shape.back()));
    if (rule->transform == WeightTransform::NormOffset) scale = options.norm_scale;
    if (w.slot == "final_norm") scale = 0.5f, offset = 1.0f;
    if (w.slot == "moe.router_bias") scale = 0.1f;
    const std::string prefix = kTextPrefixes[0];
    if (options.per_expert_layout && !rule->per_expert.empty()) {
      const int64_t E = w.shape[0], pieces = int64_t(rule->per_expert.size());
      for (int64_t e = 0; e < E; ++e)
        for (const char* pattern : rule->per_expert)
          plan.push_back({prefix + expand_name(pattern, w.layer, int(e)), dtype, {w.shape[1] / pieces, w.shape[2]},
                          scale, offset, ++seed});
      continue;
    }
    std::string name = rule->names.empty() ? expand_name(rule->absolute_names[0], w.layer)
                                           : prefix + expand_name(rule->names[0], w.layer);
    plan.push_back({name, dtype, w.shape, scale, offset, ++seed});
  }

  // Group into shards in table order.
  std::vector<std::vector<size_t>> shards(1);
  uint64_t in_shard = 0, total = 0;
  for (size_t i = 0; i < plan.size(); ++i) {
    uint64_t b = plan[i].bytes();
    if (options.max_shard_bytes && in_shard > 0 && in_shard + b > options.max_shard_bytes) {
      shards.emplace_back();
      in_shard = 0;
    }
    shards.back().push_back(i);
    in_shard += b;
    total += b;
  }
  std::vector<std::pair<std::string, std::string>> weight_map;
  for (size_t s = 0; s < shards.size(); ++s) {
    std::string file = options.max_shard_bytes ? shard_name(s, shards.size()) : "model.safetensors";
    std::vector<std::string> data;
    std::vector<TensorToWrite> tensors;
    data.reserve(shards[s].size());
    for (size_t i : shards[s]) {
      const Planned& p = plan[i];
      data.push_back(fill(p));
      tensors.push_back({p.name, p.dtype, p.shape, data.back()});
      weight_map.emplace_back(p.name, file);
    }
    MUSE_RETURN_IF_ERROR(write_safetensors(dir + "/" + file, tensors));
  }
  if (options.max_shard_bytes) {
    MUSE_RETURN_IF_ERROR(write_shard_index(dir + "/model.safetensors.index.json", weight_map, total));
  }
  return Status::Ok();
}

}  // namespace muse
