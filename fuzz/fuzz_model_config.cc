// libFuzzer target: config.json parsing and validation (parse_model_config),
// generation_config.json, and the weight table built from what validates.
// Properties: never crashes, hangs or overflows (ASan/UBSan); a config that
// validates is self-consistent (per-layer lists sized num_hidden_layers and
// agreeing with the Muse full-layer rule) and yields a weight table whose
// shapes are positive and whose parameter count fits in int64.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "muse/model/config.h"
#include "muse/model/weight_table.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muse;
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = parse_model_config(text, "fuzz.json");
  if (!parsed.ok()) {
    if (parsed.message().empty()) std::abort();
    return 0;
  }
  ModelConfig c = *parsed;
  const size_t n = size_t(c.num_layers);
  if (c.layer_types.size() != n || c.layer_rope_theta.size() != n || c.mlp_layer_types.size() != n) std::abort();
  for (int64_t i = 0; i < c.num_layers; ++i) {
    if (c.is_full(i) != muse_full_layer_rule(i, c.num_layers)) std::abort();
    if ((c.layer_rope_theta[size_t(i)] == 0) != c.is_full(i)) std::abort();
  }
  if (c.num_heads % c.num_kv_heads != 0 || c.hidden_size % c.num_heads != 0) std::abort();
  if (c.is_spark() && (c.num_experts_per_tok < 1 || c.num_experts_per_tok > c.num_experts)) std::abort();
  if (c.sampled_vocab_size < 1 || c.sampled_vocab_size > c.vocab_size) std::abort();

  auto weights = describe_weights(c);
  __int128 total = 0;
  for (const WeightSpec& w : weights) {
    __int128 numel = 1;
    for (int64_t d : w.shape) {
      if (d <= 0) std::abort();
      numel *= d;
    }
    total += numel;
  }
  if (total >= (__int128(1) << 62)) std::abort();
  (void)count_parameters(weights);

  // The same document as a generation_config.json.
  auto json = Json::parse(text);
  if (json.ok()) (void)apply_generation_config(c, *json, "fuzz.json");
  return 0;
}
