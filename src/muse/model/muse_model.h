// The text decoder of both Muse models, written once against the backend
// interface: MuseModel owns the uploaded weights and the step's activation
// buffers and enqueues a whole step (embedding, every layer, head) before
// executing it. Glimmer's layer is in glimmer_forward.cc, Spark's in
// spark_forward.cc (muse-architecture.md §3.1 and §3.2). KV storage is
// passed in (kv/ owns it), so one model serves many sequences.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "muse/backends/backend.h"
#include "muse/sampling/row_sampling.h"
#include "muse/model/config.h"
#include "muse/model/sharding.h"
#include "muse/model/weights.h"

namespace muse {

struct ModelOptions {
  // Rows, sequences, logit rows and block-table entries per step: the
  // activation buffers, the plan buffer and the logits are sized for it.
  StepPlanCapacity plan{256, 256, 256, 1};
  int64_t kv_block_size = 64;  // positions per full-layer KV block
  WeightLoadOptions weights;   // load-time quantization; weights.shard: this rank's part
  // Tensor/expert parallelism (weights.shard active): the rank's group. The
  // forward pass then computes with the rank's heads, MLP rows, experts and
  // vocabulary shard, and meets the other ranks in collectives
  // (docs/parallel.md).
  Communicator* comm = nullptr;
  // Hidden-state taps for a speculative drafter (dspark.md §2.1): the
  // residual-stream output of these layers at every row of a step, and,
  // with tap_final, the final post-norm state after them. Empty: none (the
  // step is unchanged).
  std::vector<int> tap_layers;
  bool tap_final = false;
  // Record the experts every row of a step routes to (the MoE-aware verify
  // width counts the distinct experts a step touches).
  bool record_experts = false;
};

// Steps whose sequences have at most this many rows each (decode, and
// speculative verification) run their layers and head as a recorded region
// (Backend::begin_graph: CUDA graphs), keyed by the step's shape; longer
// runs of rows (prefill chunks) are launched op by op.
constexpr int64_t kGraphMaxSeqRows = 16;

// Rows the backend samples itself (sampling/row_sampling.h), so that only
// their results come down: `buffer` is a RowSampleHeader, `rows` specs
// (logit_row set) and `edits` edits, as bytes.
struct StepSampling {
  std::span<const std::byte> buffer;
  int64_t rows = 0, edits = 0;
  RowSampleResult* results = nullptr;  // [rows]
  bool logits_too = false;             // the logits come down as well (other rows sample on the host)
};

class MuseModel {
 public:
  // Edits one step's sampled rows may carry (StepSampling).
  static constexpr int64_t kMaxSampleEdits = int64_t(1) << 18;

  static Result<std::unique_ptr<MuseModel>> create(Backend& backend, const ModelConfig& config,
                                                   const WeightSource& source, const ModelOptions& options = {});
  ~MuseModel();
  MuseModel(const MuseModel&) = delete;
  MuseModel& operator=(const MuseModel&) = delete;

  const ModelConfig& config() const { return config_; }
  const ModelWeights& weights() const { return weights_; }
  Backend& backend() { return backend_; }
  int64_t max_rows() const { return cap_.max_rows; }
  const StepPlanCapacity& capacity() const { return cap_; }

  // Runs the step `plan` describes (its host image, uploaded with one copy);
  // `logits` receives [plan.logit_rows(), vocab_size] floats (the only
  // download). `kv` has one entry per layer. Allocates nothing. Under
  // tensor parallelism every rank runs forward on the same plan at once;
  // `logits` may then be null (a rank other than the one sampling). With taps
  // configured, `taps` (when given) receives them tap-major:
  // [num_taps(), plan.rows(), hidden_size] floats.
  // With `sampling` (one rank only), its rows are drawn on the backend and
  // `logits` is filled only when sampling->logits_too.
  Status forward(const StepPlanBuilder& plan, std::span<const KvLayerStorage> kv, float* logits, float* taps = nullptr,
                 const StepSampling* sampling = nullptr);
  // With record_experts: the expert ids of the last forward, [sparse layers, rows, top-k].
  int64_t sparse_layers() const { return sparse_layers_; }
  const std::vector<int32_t>& routed_experts() const { return routed_host_; }
  int64_t num_taps() const { return int64_t(tap_layers_.size()) + (tap_final_ ? 1 : 0); }

 private:
  MuseModel(Backend& backend, const ModelConfig& config) : backend_(backend), config_(config) {}
  Status allocate(const ModelOptions& options);
  // Row views of the activation buffers for a step of T rows.
  struct Step;
  void attention_block(const Step& s, int64_t layer, const KvLayerStorage& kv);
  void glimmer_layer(const Step& s, int64_t layer, const KvLayerStorage& kv);  // glimmer_forward.cc
  void spark_layer(const Step& s, int64_t layer, const KvLayerStorage& kv);    // spark_forward.cc
  void dense_mlp(const Step& s, const LayerWeights& w);
  // Sums a row-split product's partial sums over the ranks (nothing on one rank).
  void reduce(const Tensor& t) {
    if (comm_) backend_.all_reduce_sum(t, *comm_);
  }

  // The recorded-region key of a step (begin_graph): what decides its ops.
  uint64_t graph_key(int64_t rows, int64_t logit_rows, bool taps, std::span<const KvLayerStorage> kv) const;

  Backend& backend_;
  ModelConfig config_;
  uint64_t instance_ = 0;          // unique per model in the process: part of every graph key
  int64_t graphs_logged_ = 0;      // recordings logged at info level (the first few)
  ModelWeights weights_;
  StepPlanCapacity cap_;
  ParallelRank parallel_;
  Communicator* comm_ = nullptr;  // set only when parallel_ is active
  RankWidths widths_;
  std::vector<float> gathered_host_;  // [ranks, max_logit_rows, vocab shard], reordered into [rows, vocab]
  StepPlanView plan_;  // the plan buffer in backend memory
  // Activation buffers, [max_rows, ...]; head_in and logits [max_logit_rows, ...].
  struct Buffers {
    Tensor cos, sin;
    Tensor x;         // Glimmer hidden state / Spark residual stream (fp32)
    Tensor h;         // normed input of a sub-layer
    Tensor q, k, v, g, o, a;
    Tensor mlp_gate, mlp_up;
    Tensor router_logits, expert_ids, expert_weights, latent, moe_out;
    Tensor head_in, logits;
    Tensor gathered_logits;  // every rank's logits shard (tensor parallelism)
    Tensor sample_specs, sample_results;  // U8: StepSampling's buffer (+ the op's scratch), its results
  } buf_;
  std::vector<Tensor> owned_;
  std::vector<int> tap_layers_;
  bool tap_final_ = false;
  Tensor tap_index_;          // I32 [max_rows]: 0, 1, 2, ... (gather_rows copies rows through it)
  bool record_experts_ = false;
  int64_t sparse_layers_ = 0;
  std::vector<int64_t> sparse_index_;  // per layer: its index among the sparse layers, -1 dense
  Tensor routed_;                      // I32 [sparse layers · max_rows, top-k]
  std::vector<int32_t> routed_host_;
  std::vector<Tensor> taps_;  // [max_rows, H] per tap, in the stream's dtype
  std::vector<int32_t> zero_ids_;  // [max_rows] zeros: the token ids of a step's padding rows
};

}  // namespace muse
