// How the weight table splits over tensor-parallel (TP) and expert-parallel
// (EP) ranks: one rule per slot (weight_split), and the slice a rank holds
// (shard_of). The loader (model/shard_source.h), the forward pass (local
// widths, where the collectives go) and `muse plan` (per-GPU bytes) all read
// these, so a deployment is sized by the same table that loads it.
// docs/parallel.md has the table and the reasons.
//
// Splits, in Megatron's names ([out, in] matrices):
//   Column      rows (output features) split: attn.q/gate by query head,
//               attn.k/v by KV head (a KV head is replicated when TP >
//               num_kv_heads, as vLLM does), mlp.gate/up by intermediate row.
//   Row         columns (input features) split: attn.o, mlp.down; their
//               products are partial sums, all-reduced across the ranks.
//   Vocab       lm_head rows split (padded to ceil(V / TP) per rank); the
//               logits' shards are all-gathered.
//   Expert      fused experts split along E (EP); the router is replicated,
//               so every rank routes every token the same way.
//   Replicated  every rank holds all of it: norms, residual gates, router,
//               the embedding (a lookup costs no compute, so splitting it
//               would only add an all-reduce), and Spark's pooler/unpooler
//               (pre/post_expert_proj): vLLM's latent MoE keeps them
//               ReplicatedLinear so the experts' partial sums are reduced at
//               the latent width, half of the hidden width.
#pragma once

#include <cstdint>
#include <vector>

#include "muse/core/status.h"
#include "muse/model/config.h"
#include "muse/model/weight_table.h"

namespace muse {

// The typed parallel options (`muse serve --tensor-parallel-size N
// [--enable-expert-parallel]`, vLLM's flags).
struct ParallelOptions {
  int64_t tensor_parallel_size = 1;
  bool expert_parallel = false;  // split routed experts by expert over the TP ranks
};

// One rank of a parallel group.
struct ParallelRank {
  int64_t size = 1, rank = 0;
  bool expert_parallel = false;
  bool active() const { return size > 1; }
};

enum class WeightSplit { Replicated, Column, Row, Vocab, Expert };
const char* weight_split_name(WeightSplit split);

// The split rule of a slot (independent of the rank count).
WeightSplit weight_split(const WeightSpec& spec);

// Whether `config` can run over `p.tensor_parallel_size` ranks: query heads
// and the dense intermediate divide by TP, KV heads divide TP or TP divides
// them, experts divide by TP; Spark's routed experts need expert
// parallelism (each expert ends in an RMSNorm over its own full output, so
// splitting an expert's intermediate would need one all-reduce per routed
// expert). An error says which condition fails.
Status check_parallel(const ModelConfig& config, const ParallelOptions& p);

// The part of a logical tensor one rank holds: `count` of the `extent`
// entries along dimension `dim` starting at `begin`, in a tensor `padded`
// long along that dimension (Vocab only: the last rank's padding rows are
// zeros). Replicated: dim = -1, the whole tensor.
struct ShardSlice {
  WeightSplit split = WeightSplit::Replicated;
  int dim = -1;
  int64_t begin = 0, count = 0, padded = 0, extent = 0;
  std::vector<int64_t> shape;  // the rank's tensor
  bool whole() const { return dim < 0; }
  int64_t numel() const {
    int64_t n = 1;
    for (int64_t d : shape) n *= d;
    return n;
  }
};
ShardSlice shard_of(const WeightSpec& spec, const ModelConfig& config, const ParallelRank& r);

// The rank's weight table: describe_weights(config) with local shapes.
std::vector<WeightSpec> shard_weights(const ModelConfig& config, const ParallelRank& r);

// Widths one rank computes with.
struct RankWidths {
  int64_t q_heads = 0, kv_heads = 0;   // attention heads held
  int64_t kv_head_begin = 0;           // first KV head held
  int64_t intermediate = 0;            // dense SwiGLU rows held
  int64_t experts = 0, expert_begin = 0;  // routed experts held
  int64_t vocab = 0, vocab_begin = 0;  // lm_head rows (padded) and the first
};
RankWidths rank_widths(const ModelConfig& config, const ParallelRank& r);

// The config the rank's KV cache is sized from: its KV heads only (pages,
// blocks and layers are the same on every rank, so one page table serves all).
ModelConfig rank_kv_config(const ModelConfig& config, const ParallelRank& r);

}  // namespace muse
