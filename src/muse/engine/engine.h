// The engine's narrow API (the ds4 shape): an Engine holds the immutable
// model (weights on a backend) and the KV pool; a Session is one sequence:
// its tokens, its place in the KV cache, its position. `Engine::step` runs
// one forward pass over several sessions at once (prefill chunks and decode
// tokens mixed) and returns logits for the positions asked for. The
// scheduler and the server build on this; they never touch tensors.
//
// Not thread-safe: one thread drives an Engine (the scheduler's).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "muse/backends/factory/backend_factory.h"
#include "muse/kv/kv_cache.h"
#include "muse/loading/checkpoint.h"
#include "muse/model/config.h"
#include "muse/model/muse_model.h"
#include "muse/parallel/communicator.h"
#include "muse/sampling/row_sampling.h"

namespace muse {

struct EngineOptions {
  BackendOptions backend;         // --device, threads, ISA
  LoadOptions load;               // --language-model-only, ignore patterns
  int64_t max_batch_tokens = 256; // rows per forward step (prefill chunk size)
  int64_t max_sequences = 1;      // sessions alive at once
  int64_t max_model_len = 0;      // positions per sequence; 0: min(max_position_embeddings, 8192)
  int64_t kv_block_size = 64;     // positions per KV block (both layer kinds)
  // Pages in the KV pool (kv_cache.h); 0: enough for max_sequences ×
  // max_model_len plus one step's transient.
  int64_t kv_pages = 0;
  int64_t kv_max_rollback = kDefaultKvMaxRollback;  // positions Session::truncate can always drop
  bool prefix_caching = false;    // share complete blocks between sequences (kv_cache.h)
  std::optional<DType> kv_cache_dtype;  // default: the backend's kv_dtype()
  double gpu_memory_utilization = 0.9;  // GPU: share of the device's memory muse may take (vLLM's meaning)
  int64_t kv_cache_memory_bytes = 0;    // GPU: a fixed KV budget instead (0: what the share leaves)
  // Rows whose logits one step can return (one per decoding sequence, the
  // last row of each prefill chunk, every row of a prompt-logprobs chunk);
  // 0: min(max_batch_tokens, max_sequences + 256). The logits buffer is
  // [max_logit_rows, vocab], not [max_batch_tokens, vocab].
  int64_t max_logit_rows = 0;
  // --quantization: quantize a BF16 checkpoint's experts (and, per format,
  // attention) while loading (model/weight_table.h quantized_at_load).
  QuantKind quantization = QuantKind::None;
  // --tensor-parallel-size / --enable-expert-parallel: the model split over
  // ranks (model/sharding.h), stepped together (engine/rank_group.h).
  ParallelOptions parallel;
  // Hidden-state taps for a speculative drafter (model/muse_model.h
  // ModelOptions::tap_layers): captured at every row of every step.
  std::vector<int> tap_layers;
  bool tap_final = false;
  bool record_experts = false;  // count the distinct experts each step routes to
  // Items with a `sample` are drawn by the backend, where the logits are
  // (sampling/row_sampling.h), so that a decode step sends down token ids
  // instead of logits. Default: on GPUs. Off, the engine downloads the
  // logits and draws those rows on the host (the same definition).
  std::optional<bool> sample_on_device;
};

enum class LogitsWanted { None, Last, All };

// Loading progress: called after each weight slot is read (bytes are the
// slot's stored size in the checkpoint).
struct EngineLoadProgress {
  uint64_t bytes_done = 0, bytes_total = 0;
  uint64_t tensors_done = 0, tensors_total = 0;
};
using EngineLoadProgressFn = std::function<void(const EngineLoadProgress&)>;

class Session;
class RankGroup;

struct StepItem {
  Session* session = nullptr;
  std::span<const int32_t> tokens;  // appended at the session's current position
  LogitsWanted logits = LogitsWanted::Last;
  // With logits Last: the engine draws the token itself (Engine::sampled),
  // by this spec (SequenceSampler::plan_row; edit_begin indexes
  // sample_edits), and logits(i) is empty.
  std::optional<RowSampleSpec> sample;
  std::span<const RowEdit> sample_edits;
  // Rows of logits this item produces.
  int64_t logit_rows() const {
    return logits == LogitsWanted::All ? int64_t(tokens.size()) : logits == LogitsWanted::Last ? 1 : 0;
  }
};

class Engine {
 public:
  // Opens a Hugging Face model directory (config.json + safetensors).
  static Result<std::unique_ptr<Engine>> open(const std::string& model_dir, const EngineOptions& options = {},
                                              const EngineLoadProgressFn& progress = {});
  // From any weight source (random weights in tests and `muse bench`).
  static Result<std::unique_ptr<Engine>> create(const ModelConfig& config, std::unique_ptr<WeightSource> source,
                                                const EngineOptions& options = {});
  ~Engine();

  const ModelConfig& config() const { return config_; }
  const EngineOptions& options() const { return options_; }
  int64_t max_model_len() const { return max_model_len_; }
  int64_t max_logit_rows() const { return plan_.capacity().max_logit_rows; }
  Backend& backend() { return *backend_; }
  const MuseModel& model() const { return *model_; }
  const KvCache& kv_cache() const { return *kv_; }
  // Tensor parallelism: each rank's collective traffic so far (docs/parallel.md); empty on one rank.
  std::vector<CollectiveTraffic> parallel_traffic() const;

  // A new sequence; an error when max_sequences are alive. With prefix
  // caching it starts with the longest cached prefix of `tokens` (at most
  // tokens.size() - 1 positions, so there is always a token left to feed):
  // length() then says where to continue. The session must not outlive the
  // engine.
  Result<std::unique_ptr<Session>> new_session(std::span<const int32_t> tokens = {});

  // One forward step. Each session appears at most once; at most
  // max_batch_tokens tokens, max_logit_rows logit rows. On success every
  // session has advanced by its tokens and logits(i) holds item i's logits;
  // on error nothing has advanced. After warm-up a step allocates nothing:
  // the plan, the activations and the logits live in buffers kept from
  // step to step.
  Status step(std::span<const StepItem> items);
  // Item i's logits from the last successful step, [rows × vocab_size]
  // (1 row for Last, one per token for All), in the engine's buffer: valid
  // until the next step, and the caller may modify them in place (logits
  // processors do).
  std::span<float> logits(size_t item);
  // Item i's drawn token from the last successful step when it had a
  // sample spec; null otherwise.
  const RowSampleResult* sampled(size_t item) const {
    return item < item_sampled_.size() && item_sampled_[item] ? &item_result_[item] : nullptr;
  }
  // Whether items with a sample spec are drawn on the backend (else on the host, after the logits come down).
  bool samples_on_device() const { return sample_on_device_; }
  // Item i's hidden-state taps from the last successful step, one row per
  // token, [tokens × num_taps·hidden] (the taps of a row side by side, in
  // tap_layers order); empty without taps.
  std::span<const float> taps(size_t item) const;
  int64_t tap_width() const { return model_->num_taps() * config_.hidden_size; }
  // With record_experts on a MoE model: the distinct experts the last step's
  // rows routed to, the mean over its sparse layers (0 otherwise).
  double distinct_experts() const { return distinct_experts_; }
  // A weight slot of the target in fp32 (the drafter shares the embedding and lm_head).
  Result<std::vector<float>> read_weight_f32(const std::string& slot) const;

 private:
  friend class Session;
  Engine() = default;
  // `reader`, when given, is read from instead of source_ (a wrapper over it).
  Status init(const ModelConfig& config, const EngineOptions& options, const WeightSource* reader = nullptr);
  void close(Session& s);
  Status size_device_kv(const Backend::Memory& before, uint64_t requested, const KvGeometry& geo, KvCacheOptions* ko);

  EngineOptions options_;
  ModelConfig config_;
  int64_t max_model_len_ = 0;
  std::unique_ptr<Checkpoint> checkpoint_;
  std::unique_ptr<WeightSource> source_;  // must outlive the model: weights may point into it
  std::unique_ptr<Backend> backend_;
  std::unique_ptr<MuseModel> model_;
  std::unique_ptr<KvCache> kv_;
  std::unique_ptr<RankGroup> group_;  // tensor parallelism: the other ranks (backend_/model_/kv_ are rank 0)
  StepPlanBuilder plan_;
  std::vector<float> logits_;            // [max_logit_rows, vocab]
  std::vector<int64_t> item_logit_row_;  // first logit row of each item, and the end
  std::vector<int64_t> item_row_;        // first token row of each item, and the end
  std::vector<float> taps_raw_;          // [num_taps, max_batch_tokens, hidden] as the model writes them
  std::vector<float> taps_;              // [max_batch_tokens, num_taps·hidden], row-major
  uint64_t step_serial_ = 0;             // marks sessions seen in the current step
  double distinct_experts_ = 0;
  bool sample_on_device_ = false;
  std::vector<std::byte> sample_buf_;          // StepSampling's buffer, rebuilt each step
  std::vector<RowSampleSpec> sample_specs_;
  std::vector<RowEdit> sample_edits_;
  std::vector<RowSampleResult> sample_results_, item_result_;
  std::vector<uint8_t> item_sampled_;
  std::vector<int32_t> sample_item_;           // scratch of step(): item -> its row among sample_specs_ (-1: on the host)
  std::vector<uint8_t> expert_seen_;     // scratch: [num_experts]
};

class Session {
 public:
  ~Session();
  Session(const Session&) = delete;
  Session& operator=(const Session&) = delete;

  int64_t length() const { return int64_t(tokens_.size()); }  // positions in the cache
  const SequenceKv& kv() const { return kv_; }  // its pages
  int64_t cached_tokens() const { return kv_.cached_tokens; }  // adopted from the prefix cache
  const std::vector<int32_t>& tokens() const { return tokens_; }

  // Rollback: drops positions [n, length()) of every layer kind, exactly, so
  // that continuing from n is bitwise what never having gone further gives.
  // Always possible for n >= length() - max_rollback (EngineOptions
  // kv_max_rollback); further back while the sliding layers still hold the
  // window before n. An error, nothing changed, otherwise (or when the block
  // n falls inside is shared through the prefix cache).
  Status truncate(int64_t n);
  bool can_truncate(int64_t n) const { return engine_->kv_->can_truncate(kv_, n); }

  // Feeds tokens in steps of max_batch_tokens; returns the logits of the
  // last position (Last), of every fed position (All), or nothing.
  Result<std::vector<float>> feed(std::span<const int32_t> tokens, LogitsWanted want = LogitsWanted::Last);

  // Benchmarks only: advances the sequence by `n` positions (token id
  // `filler`) without running the model, so decode at a long context can be
  // timed without first prefilling it. Those positions' KV rows hold
  // whatever the cache held (zeros when fresh): the attention reads the same
  // bytes a real context would, but the logits mean nothing.
  Status extend_uncomputed(int64_t n, int32_t filler = 0);

 private:
  friend class Engine;
  explicit Session(Engine* engine) : engine_(engine) {}
  Engine* engine_;
  uint64_t step_serial_ = 0;  // last step that included this session
  SequenceKv kv_;
  std::vector<int32_t> tokens_;
};

}  // namespace muse
