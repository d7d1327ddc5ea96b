#include "muse/model/sharding.h"

#include <algorithm>
#include <string>

namespace muse {

const char* weight_split_name(WeightSplit split) {
  switch (split) {
    case WeightSplit::Replicated: return "replicated";
    case WeightSplit::Column: return "column";
    case WeightSplit::Row: return "row";
    case WeightSplit::Vocab: return "vocab";
    case WeightSplit::Expert: return "expert";
  }
  return "?";
}

WeightSplit weight_split(const WeightSpec& s) {
  const std::string& n = s.slot;
  if (n == "lm_head") return WeightSplit::Vocab;
  if (n == "attn.q" || n == "attn.k" || n == "attn.v" || n == "attn.gate" || n == "mlp.gate" || n == "mlp.up")
    return WeightSplit::Column;
  if (n == "attn.o" || n == "mlp.down") return WeightSplit::Row;
  if (n == "moe.experts.gate_up" || n == "moe.experts.down") return WeightSplit::Expert;
  return WeightSplit::Replicated;  // embedding, norms, gates, router, pooler/unpooler
}

Status check_parallel(const ModelConfig& c, const ParallelOptions& p) {
  const int64_t N = p.tensor_parallel_size;
  if (N < 1) return make_error("--tensor-parallel-size must be at least 1");
  if (N == 1) return Status::Ok();
  const std::string tp = "--tensor-parallel-size " + std::to_string(N) + ": ";
  if (c.num_heads % N)
    return make_error(tp + "the model's " + std::to_string(c.num_heads) + " attention heads do not divide by it");
  if (c.num_kv_heads % N && N % c.num_kv_heads)
    return make_error(tp + "the model's " + std::to_string(c.num_kv_heads) +
                      " KV heads neither divide by it nor divide it (vLLM's rule for splitting or replicating them)");
  bool dense = false, sparse = false;
  for (int64_t l = 0; l < c.num_layers; ++l) (c.is_sparse(l) ? sparse : dense) = true;
  if (dense && c.intermediate_size % N)
    return make_error(tp + "the dense MLP width " + std::to_string(c.intermediate_size) + " does not divide by it");
  if (sparse) {
    if (!p.expert_parallel)
      return make_error(tp + "Spark's routed experts need --enable-expert-parallel: each expert ends in an RMSNorm "
                             "over its whole latent output, so splitting one expert's intermediate over ranks would "
                             "cost an all-reduce per routed expert");
    if (c.num_experts % N)
      return make_error(tp + "the model's " + std::to_string(c.num_experts) + " experts do not divide by it");
  }
  return Status::Ok();
}

RankWidths rank_widths(const ModelConfig& c, const ParallelRank& r) {
  RankWidths w;
  const int64_t N = std::max<int64_t>(1, r.size);
  w.q_heads = c.num_heads / N;
  if (c.num_kv_heads >= N) {
    w.kv_heads = c.num_kv_heads / N;
    w.kv_head_begin = r.rank * w.kv_heads;
  } else {  // replicated: the one KV head this rank's query heads read
    w.kv_heads = 1;
    w.kv_head_begin = r.rank * c.num_kv_heads / N;
  }
  w.intermediate = c.intermediate_size / N;
  w.experts = c.num_experts / N;
  w.expert_begin = r.rank * w.experts;
  w.vocab = (c.vocab_size + N - 1) / N;
  w.vocab_begin = r.rank * w.vocab;
  return w;
}

ShardSlice shard_of(const WeightSpec& spec, const ModelConfig& c, const ParallelRank& r) {
  ShardSlice s;
  s.shape = spec.shape;
  s.split = weight_split(spec);
  if (!r.active() || s.split == WeightSplit::Replicated) {
    s.split = WeightSplit::Replicated;
    return s;
  }
  const RankWidths w = rank_widths(c, r);
  const int64_t hd = c.head_dim;
  auto along = [&](int dim, int64_t begin, int64_t count) {
    s.dim = dim;
    s.extent = spec.shape[size_t(dim)];
    s.begin = begin, s.count = count, s.padded = count;
    s.shape[size_t(dim)] = count;
  };
  const std::string& n = spec.slot;
  if (n == "attn.q" || n == "attn.gate") along(0, r.rank * w.q_heads * hd, w.q_heads * hd);
  else if (n == "attn.k" || n == "attn.v") along(0, w.kv_head_begin * hd, w.kv_heads * hd);
  else if (n == "attn.o") along(1, r.rank * w.q_heads * hd, w.q_heads * hd);
  else if (n == "mlp.gate" || n == "mlp.up") along(0, r.rank * w.intermediate, w.intermediate);
  else if (n == "mlp.down") along(1, r.rank * w.intermediate, w.intermediate);
  else if (s.split == WeightSplit::Expert) along(0, w.expert_begin, w.experts);
  else if (s.split == WeightSplit::Vocab) {
    const int64_t V = spec.shape[0];
    const int64_t count = std::max<int64_t>(0, std::min(V, w.vocab_begin + w.vocab) - w.vocab_begin);
    along(0, std::min(w.vocab_begin, V), count);
    s.padded = w.vocab;
    s.shape[0] = w.vocab;
  }
  return s;
}

std::vector<WeightSpec> shard_weights(const ModelConfig& config, const ParallelRank& r) {
  std::vector<WeightSpec> specs = describe_weights(config);
  if (!r.active()) return specs;
  for (WeightSpec& s : specs) s.shape = shard_of(s, config, r).shape;
  return specs;
}

ModelConfig rank_kv_config(const ModelConfig& config, const ParallelRank& r) {
  ModelConfig c = config;
  if (r.active()) c.num_kv_heads = rank_widths(config, r).kv_heads;
  return c;
}

}  // namespace muse
