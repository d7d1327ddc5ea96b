#include "muse/engine/engine.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "muse/backends/factory/backend_factory.h"
#include "muse/core/log.h"
#include "muse/model/weight_table.h"

#include "muse/engine/checkpoint_source.h"

namespace muse {

namespace {

constexpr double kGiB = double(uint64_t(1) << 30);
// GPU memory kept out of the KV budget: library workspaces (cuBLASLt),
// staging, graphs.
constexpr uint64_t kDeviceReserveBytes = uint64_t(512) << 20;

// Bytes the weights take on `backend` (matrices in its matrix dtype, the
// rest F32), to refuse a model that cannot fit before uploading any of it.
uint64_t resident_weight_bytes(const ModelConfig& config, const Backend& backend) {
  uint64_t bytes = 0;
  for (const WeightSpec& s : describe_weights(config)) {
    const bool matrix = s.shape.size() >= 2 && s.reference_dtype == DType::BF16;
    const DType dt = matrix ? backend.matrix_dtype(DType::BF16) : DType::F32;
    bytes += uint64_t(s.numel()) * uint64_t(dtype_bits(dt) / 8);
  }
  return bytes;
}

// Counts weight slots as the model reads them, for loading progress.
class ProgressWeightSource final : public WeightSource {
 public:
  ProgressWeightSource(const Checkpoint& ck, const WeightSource& inner, const EngineLoadProgressFn& fn)
      : ck_(ck), inner_(inner), fn_(fn) {
    p_.bytes_total = ck.tensor_bytes();
    p_.tensors_total = ck.weights().size();
  }
  Result<HostTensor> view(const WeightSpec& spec) const override {
    auto r = inner_.view(spec);
    done(spec);
    return r;
  }
  Status read_f32(const WeightSpec& spec, float* dst) const override {
    Status s = inner_.read_f32(spec, dst);
    done(spec);
    return s;
  }

 private:
  void done(const WeightSpec& spec) const {
    if (!seen_.insert(spec.slot + "#" + std::to_string(spec.layer)).second) return;
    if (const ResolvedWeight* w = ck_.find(spec.slot, spec.layer)) {
      p_.bytes_done += w->tensor.nbytes;
      for (const auto& pieces : w->experts)
        for (const auto& t : pieces) p_.bytes_done += t.nbytes;
    }
    p_.tensors_done = std::min<uint64_t>(p_.tensors_done + 1, p_.tensors_total);
    p_.bytes_done = std::min(p_.bytes_done, p_.bytes_total);
    fn_(p_);
  }
  const Checkpoint& ck_;
  const WeightSource& inner_;
  const EngineLoadProgressFn& fn_;
  mutable EngineLoadProgress p_;
  mutable std::unordered_set<std::string> seen_;
};

}  // namespace

Result<std::unique_ptr<Engine>> Engine::open(const std::string& model_dir, const EngineOptions& options,
                                             const EngineLoadProgressFn& progress) {
  auto ck = Checkpoint::open(model_dir, options.load);
  if (!ck.ok()) return ck.error();
  std::unique_ptr<Engine> e(new Engine());
  e->checkpoint_ = std::make_unique<Checkpoint>(std::move(ck).value());
  e->source_ = std::make_unique<CheckpointWeightSource>(*e->checkpoint_);
  if (!progress) {
    MUSE_RETURN_IF_ERROR(e->init(e->checkpoint_->config(), options));
    return e;
  }
  // The model keeps pointers into the checkpoint's mappings, not into the
  // counting wrapper, so the wrapper may go once init is done.
  ProgressWeightSource counting(*e->checkpoint_, *e->source_, progress);
  MUSE_RETURN_IF_ERROR(e->init(e->checkpoint_->config(), options, &counting));
  EngineLoadProgress last;
  last.bytes_done = last.bytes_total = e->checkpoint_->tensor_bytes();
  last.tensors_done = last.tensors_total = e->checkpoint_->weights().size();
  progress(last);
  return e;
}

Result<std::unique_ptr<Engine>> Engine::create(const ModelConfig& config, std::unique_ptr<WeightSource> source,
                                               const EngineOptions& options) {
  std::unique_ptr<Engine> e(new Engine());
  e->source_ = std::move(source);
  MUSE_RETURN_IF_ERROR(e->init(config, options));
  return e;
}

Status Engine::init(const ModelConfig& config, const EngineOptions& options, const WeightSource* reader) {
  config_ = config;
  options_ = options;
  if (options.max_batch_tokens < 1) return make_error("max_batch_tokens must be at least 1");
  if (options.max_sequences < 1) return make_error("max_sequences must be at least 1");
  if (options.kv_block_size < 1) return make_error("kv_block_size must be at least 1");
  const int64_t model_max = config.max_position_embeddings > 0 ? config.max_position_embeddings : (int64_t(1) << 31) - 1;
  max_model_len_ = options.max_model_len > 0 ? options.max_model_len : std::min<int64_t>(model_max, 8192);
  if (max_model_len_ > model_max) {
    return make_error("max_model_len " + std::to_string(max_model_len_) + " exceeds the model's " +
                      "max_position_embeddings (" + std::to_string(model_max) + ")");
  }
  if (options.max_logit_rows < 0) return make_error("max_logit_rows must not be negative");
  if (!(options.gpu_memory_utilization > 0 && options.gpu_memory_utilization <= 1))
    return make_error("gpu_memory_utilization must be in (0, 1]");
  MUSE_ASSIGN_OR_RETURN(backend_, create_backend(options.backend));
  KvCacheOptions ko;
  ko.max_sequences = options.max_sequences;
  ko.block_size = options.kv_block_size;
  const int64_t blocks_per_seq = (max_model_len_ + ko.block_size - 1) / ko.block_size;
  ko.num_blocks = options.kv_blocks > 0 ? options.kv_blocks : options.max_sequences * blocks_per_seq;
  ko.max_blocks_per_sequence = blocks_per_seq;

  // A device backend: muse takes gpu_memory_utilization of the device in
  // all (vLLM's meaning); a model whose weights do not fit is refused before
  // anything is uploaded.
  const Backend::Memory mem0 = backend_->memory();
  const bool device = mem0.total > 0;
  const uint64_t requested = device ? uint64_t(options.gpu_memory_utilization * double(mem0.total)) : 0;
  if (device) {
    if (mem0.free < requested)
      return make_error("--gpu-memory-utilization " + std::to_string(options.gpu_memory_utilization) + " asks for " +
                        std::to_string(double(requested) / kGiB) + " GiB, but only " +
                        std::to_string(double(mem0.free) / kGiB) + " GiB of the GPU's " +
                        std::to_string(double(mem0.total) / kGiB) +
                        " GiB are free (another process holds the rest): lower it");
    const uint64_t wb = resident_weight_bytes(config, *backend_);
    if (wb + kDeviceReserveBytes > requested)
      return make_error("the model's weights need " + std::to_string(double(wb) / kGiB) + " GiB on the GPU; " +
                        "--gpu-memory-utilization " + std::to_string(options.gpu_memory_utilization) + " of " +
                        std::to_string(double(mem0.total) / kGiB) + " GiB gives " +
                        std::to_string(double(requested) / kGiB) + " GiB (short by " +
                        std::to_string(double(wb + kDeviceReserveBytes - requested) / kGiB) +
                        " GiB). `muse plan` sizes deployments that fit");
  }

  // The step's capacity: every buffer of a step is sized from it, once.
  StepPlanCapacity cap;
  cap.max_rows = options.max_batch_tokens;
  cap.max_seqs = std::min(options.max_sequences, options.max_batch_tokens);
  cap.max_logit_rows = options.max_logit_rows > 0
                           ? std::min(options.max_logit_rows, options.max_batch_tokens)
                           : std::min(options.max_batch_tokens, options.max_sequences + 256);
  // A step's block tables together: each sequence's, at most the pool (no
  // block is in two tables yet).
  // (On a device the pool is sized after the weights load: bound by the tables.)
  cap.max_blocks = std::max<int64_t>(1, device && options.kv_blocks == 0 ? cap.max_seqs * blocks_per_seq
                                                                         : std::min(cap.max_seqs * blocks_per_seq, ko.num_blocks));
  ModelOptions mo;
  mo.plan = cap;
  mo.kv_block_size = ko.block_size;
  mo.weights.quantize = options.quantization;
  MUSE_ASSIGN_OR_RETURN(model_, MuseModel::create(*backend_, config_, reader ? *reader : *source_, mo));
  if (device && options.kv_blocks == 0) MUSE_RETURN_IF_ERROR(size_device_kv(mem0, requested, &ko));
  MUSE_ASSIGN_OR_RETURN(kv_, KvCache::create(*backend_, config_, ko));
  plan_ = StepPlanBuilder(cap);
  logits_.assign(size_t(cap.max_logit_rows * config_.vocab_size), 0.0f);
  item_logit_row_.reserve(size_t(cap.max_seqs) + 1);
  return Status::Ok();
}

// The KV pool on a device: what the budget leaves once weights and
// activations are resident (or --kv-cache-memory-bytes), less the sliding
// rings every sequence slot holds.
Status Engine::size_device_kv(const Backend::Memory& before, uint64_t requested, KvCacheOptions* ko) {
  const Backend::Memory now = backend_->memory();
  const uint64_t used = before.free > now.free ? before.free - now.free : 0;
  const uint64_t kv_bytes = uint64_t(dtype_bits(backend_->kv_dtype()) / 8);
  int64_t full = 0, sliding = 0;
  for (int64_t l = 0; l < config_.num_layers; ++l) (config_.is_full(l) ? full : sliding) += 1;
  const uint64_t row = uint64_t(config_.kv_dim()) * 2 * kv_bytes;  // K and V of one position, one layer
  const uint64_t rings = uint64_t(sliding) * uint64_t(ko->max_sequences) * uint64_t(config_.sliding_window) * row;
  const uint64_t per_block = uint64_t(full) * uint64_t(ko->block_size) * row;
  const uint64_t budget = options_.kv_cache_memory_bytes > 0 ? uint64_t(options_.kv_cache_memory_bytes)
                          : requested > used + kDeviceReserveBytes ? requested - used - kDeviceReserveBytes
                                                                  : 0;
  if (budget < rings)
    return make_error("KV cache: the sliding-window rings of " + std::to_string(ko->max_sequences) +
                      " sequences need " + std::to_string(double(rings) / kGiB) + " GiB, but only " +
                      std::to_string(double(budget) / kGiB) +
                      " GiB are left after the weights: lower --max-num-seqs or raise --gpu-memory-utilization");
  const int64_t blocks_per_seq = ko->max_blocks_per_sequence;
  if (per_block == 0) {
    ko->num_blocks = 0;
  } else {
    const int64_t fit = int64_t(std::min<uint64_t>((budget - rings) / per_block, (uint64_t(1) << 31) - 1));
    // No more than every sequence at full length can use: a pool beyond that
    // would hold memory (and a free list) nothing can ever fill.
    ko->num_blocks = std::min(fit, ko->max_sequences * blocks_per_seq);
    if (fit < blocks_per_seq)
      return make_error("KV cache: " + std::to_string(double(budget - rings) / kGiB) + " GiB hold " +
                        std::to_string(fit * ko->block_size) + " positions, fewer than one sequence of " +
                        "--max-model-len " + std::to_string(max_model_len_) +
                        ": lower it, or raise --gpu-memory-utilization");
  }
  LOG_INFO("KV cache on the GPU: %lld blocks of %lld positions = %lld tokens in full-attention layers (%.2f GiB; "
           "the budget holds %.2f GiB) + sliding rings for %lld sequences (%.2f GiB); weights and activations %.2f GiB",
           (long long)ko->num_blocks, (long long)ko->block_size, (long long)(ko->num_blocks * ko->block_size),
           double(uint64_t(ko->num_blocks) * per_block) / kGiB, double(budget - rings) / kGiB,
           (long long)ko->max_sequences, double(rings) / kGiB, double(used) / kGiB);
  return Status::Ok();
}

Engine::~Engine() = default;

Result<std::unique_ptr<Session>> Engine::new_session() {
  MUSE_ASSIGN_OR_RETURN(SequenceKv kv, kv_->open_sequence());
  std::unique_ptr<Session> s(new Session(this));
  s->kv_ = std::move(kv);
  // Capacity for the whole context now (virtual memory until used), so a
  // step never grows it.
  s->tokens_.reserve(size_t(max_model_len_));
  return s;
}

void Engine::close(Session& s) { kv_->close_sequence(s.kv_); }

Status Engine::step(std::span<const StepItem> items) {
  const int64_t V = config_.vocab_size;
  const StepPlanCapacity& cap = plan_.capacity();
  ++step_serial_;
  int64_t total = 0, logit_rows = 0;
  if (int64_t(items.size()) > cap.max_seqs)
    return make_error("step of " + std::to_string(items.size()) + " sequences exceeds " + std::to_string(cap.max_seqs));
  for (const StepItem& it : items) {
    if (!it.session || it.session->engine_ != this) return make_error("step: session does not belong to this engine");
    if (it.session->step_serial_ == step_serial_) return make_error("step: a session appears twice in one step");
    it.session->step_serial_ = step_serial_;
    if (it.tokens.empty()) return make_error("step: an item has no tokens");
    total += int64_t(it.tokens.size());
    logit_rows += it.logit_rows();
    const int64_t end = it.session->length() + int64_t(it.tokens.size());
    if (end > max_model_len_) {
      return make_error("sequence of " + std::to_string(end) + " tokens exceeds max_model_len " +
                        std::to_string(max_model_len_));
    }
    for (int32_t t : it.tokens)
      if (t < 0 || t >= V)
        return make_error("token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  }
  if (total == 0) return make_error("step: nothing to do");
  if (total > options_.max_batch_tokens) {
    return make_error("step of " + std::to_string(total) + " tokens exceeds max_batch_tokens " +
                      std::to_string(options_.max_batch_tokens));
  }
  if (logit_rows > cap.max_logit_rows) {
    return make_error("step wants logits for " + std::to_string(logit_rows) + " rows, more than max_logit_rows " +
                      std::to_string(cap.max_logit_rows));
  }
  // All or nothing: check the pool covers every item before growing any table.
  int64_t new_blocks = 0;
  for (const StepItem& it : items)
    new_blocks += std::max<int64_t>(0, kv_->blocks_for(it.session->length() + int64_t(it.tokens.size())) -
                                           int64_t(it.session->kv_.blocks.size()));
  if (new_blocks > kv_->free_blocks()) {
    return make_error("KV cache full: this step needs " + std::to_string(new_blocks) + " more blocks of " +
                      std::to_string(kv_->block_size()) + " positions, " + std::to_string(kv_->free_blocks()) +
                      " free");
  }
  for (const StepItem& it : items)
    MUSE_RETURN_IF_ERROR(kv_->reserve(it.session->kv_, it.session->length() + int64_t(it.tokens.size())));

  // The step plan, in the buffer kept from the last step.
  plan_.reset();
  item_logit_row_.clear();
  for (const StepItem& it : items) {
    const Session& s = *it.session;
    const int64_t blocks = kv_->blocks_for(s.length() + int64_t(it.tokens.size()));
    if (!plan_.fits(int64_t(it.tokens.size()), it.logit_rows(), blocks))
      return make_error("step: the step plan's capacity is exceeded (engine bug)");
    item_logit_row_.push_back(plan_.logit_rows());
    plan_.add(it.tokens, s.length(), s.kv_.ring_slot,
              std::span<const int32_t>(s.kv_.blocks.data(), size_t(blocks)), it.logits == LogitsWanted::All,
              it.logits == LogitsWanted::Last);
  }
  item_logit_row_.push_back(plan_.logit_rows());
  MUSE_RETURN_IF_ERROR(model_->forward(plan_, kv_->layers(), logits_.data()));

  for (const StepItem& it : items) {
    Session& s = *it.session;
    s.tokens_.insert(s.tokens_.end(), it.tokens.begin(), it.tokens.end());
    s.kv_.length = s.length();
  }
  return Status::Ok();
}

std::span<float> Engine::logits(size_t item) {
  if (item + 1 >= item_logit_row_.size()) return {};
  const int64_t V = config_.vocab_size, r0 = item_logit_row_[item], r1 = item_logit_row_[item + 1];
  return std::span<float>(logits_.data() + r0 * V, size_t((r1 - r0) * V));
}

Status Session::extend_uncomputed(int64_t n, int32_t filler) {
  if (n < 0) return make_error("extend_uncomputed: negative length");
  const int64_t end = length() + n;
  if (end > engine_->max_model_len())
    return make_error("sequence of " + std::to_string(end) + " tokens exceeds max_model_len " +
                      std::to_string(engine_->max_model_len()));
  MUSE_RETURN_IF_ERROR(engine_->kv_->reserve(kv_, end));
  tokens_.insert(tokens_.end(), size_t(n), filler);
  kv_.length = length();
  return Status::Ok();
}

Session::~Session() {
  if (engine_) engine_->close(*this);
}

Result<std::vector<float>> Session::feed(std::span<const int32_t> tokens, LogitsWanted want) {
  std::vector<float> out;
  // Every row of an All chunk needs a logits row.
  const int64_t chunk = want == LogitsWanted::All ? engine_->max_logit_rows() : engine_->options().max_batch_tokens;
  // Check the whole feed first so a bad one advances nothing (each step
  // checks again, but a later chunk failing would leave earlier ones fed).
  const int64_t end = length() + int64_t(tokens.size());
  if (end > engine_->max_model_len()) {
    return make_error("sequence of " + std::to_string(end) + " tokens exceeds max_model_len " +
                      std::to_string(engine_->max_model_len()));
  }
  const int64_t V = engine_->config().vocab_size;
  for (int32_t t : tokens)
    if (t < 0 || t >= V)
      return make_error("token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  for (size_t done = 0; done < tokens.size();) {
    const size_t n = std::min<size_t>(size_t(chunk), tokens.size() - done);
    const bool last_chunk = done + n == tokens.size();
    StepItem it{this, tokens.subspan(done, n),
                want == LogitsWanted::All ? LogitsWanted::All
                : (want == LogitsWanted::Last && last_chunk) ? LogitsWanted::Last
                                                              : LogitsWanted::None};
    MUSE_RETURN_IF_ERROR(engine_->step(std::span<const StepItem>(&it, 1)));
    std::span<const float> rows = engine_->logits(0);
    out.insert(out.end(), rows.begin(), rows.end());
    done += n;
  }
  return out;
}

}  // namespace muse
