#include "muse/engine/engine.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "muse/backends/factory/backend_factory.h"
#include "muse/core/log.h"
#include "muse/model/weight_table.h"

#include "muse/engine/checkpoint_source.h"
#include "muse/engine/rank_group.h"
#include "muse/loading/quant.h"

namespace muse {

namespace {

constexpr double kGiB = double(uint64_t(1) << 30);
// GPU memory kept out of the KV budget: library workspaces (cuBLASLt),
// staging, graphs.
constexpr uint64_t kDeviceReserveBytes = uint64_t(512) << 20;

// Bytes of a matrix quantized to `kind` as model/quantize.h lays it out:
// codes plus scales (and zero points, globals).
uint64_t quantized_bytes(QuantKind kind, const WeightSpec& s) {
  const uint64_t n = uint64_t(s.numel()), rows = uint64_t(n / uint64_t(s.shape.back()));
  switch (kind) {
    case QuantKind::Nvfp4: return n / 2 + n / 16 + 8 * rows / uint64_t(s.shape[s.shape.size() - 2]);
    case QuantKind::Mxfp4: return n / 2 + n / 32;
    case QuantKind::Fp8: return n + 4 * rows;
    case QuantKind::Int4: return n / 2 + n / 64 + n / 256;
    case QuantKind::None: break;
  }
  return 2 * n;
}

// Bytes the weights take on `backend` (matrices in its matrix dtype, or as
// the source stores them quantized, or quantized as --quantization makes
// them; the rest F32), to refuse a model that cannot fit before uploading
// any of it. `source` (null under tensor parallelism, whose shards it does
// not describe: then stored-quantized slots count at BF16, an over-estimate).
uint64_t resident_weight_bytes(const ModelConfig& config, const Backend& backend, const ParallelRank& rank,
                               QuantKind quantize, const WeightSource* source) {
  uint64_t bytes = 0;
  for (const WeightSpec& s : shard_weights(config, rank)) {  // this rank's shard (the whole model on one rank)
    const bool matrix = s.shape.size() >= 2 && s.reference_dtype == DType::BF16;
    if (const uint64_t stored = matrix && source ? source->stored_quantized_bytes(s) : 0; stored > 0) {
      bytes += stored;
      continue;
    }
    if (matrix && quantize != QuantKind::None && quantized_at_load(quantize, s, config.num_layers)) {
      bytes += quantized_bytes(quantize, s);
      continue;
    }
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
  // Quantized slots too (without this the model would read them through
  // view()/read_f32, i.e. dequantized, whenever a progress callback is given).
  Result<HostQuantView> quantized(const WeightSpec& spec) const override {
    auto r = inner_.quantized(spec);
    if (r.ok() && r->format.kind != QuantKind::None) done(spec);
    return r;
  }
  uint64_t stored_quantized_bytes(const WeightSpec& spec) const override { return inner_.stored_quantized_bytes(spec); }

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
  if (options.kv_max_rollback < 0) return make_error("kv_max_rollback must not be negative");
  if (options.kv_pages < 0) return make_error("kv_pages must not be negative");
  BackendOptions backend_options = options.backend;
  if (options.parallel.tensor_parallel_size != 1 && (!options.tap_layers.empty() || options.tap_final))
    return make_error("speculative decoding with --tensor-parallel-size > 1 is not supported yet");
  if (options.parallel.tensor_parallel_size != 1) {
    MUSE_ASSIGN_OR_RETURN(group_, RankGroup::create(config, options.parallel, options.backend));
    backend_options = group_->backend_options();
  }
  MUSE_ASSIGN_OR_RETURN(backend_, create_backend(backend_options));
  KvCacheOptions ko;
  ko.max_sequences = options.max_sequences;
  ko.block_size = options.kv_block_size;
  ko.max_rollback = options.kv_max_rollback;
  ko.prefix_caching = options.prefix_caching;
  ko.dtype = options.kv_cache_dtype;
  ko.max_step_rows = std::min(options.max_batch_tokens, max_model_len_);  // rows one sequence feeds in a step
  const int64_t blocks_per_seq = (max_model_len_ + ko.block_size - 1) / ko.block_size;
  ko.max_blocks_per_sequence = blocks_per_seq;
  const DType kv_dt = ko.dtype ? *ko.dtype : backend_->kv_dtype();
  const KvGeometry geo = KvGeometry::of(config_, ko.block_size, ko.max_rollback, dtype_bits(kv_dt) / 8);
  ko.num_pages = options.kv_pages > 0 ? options.kv_pages
                                      : options.max_sequences * (geo.pages_for(max_model_len_) + geo.sliding_pages_per_block) +
                                            geo.step_transient_pages(ko.max_step_rows);

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
    const WeightSource* sizing = group_ ? nullptr : reader ? reader : source_.get();
    const uint64_t wb =
        resident_weight_bytes(config, *backend_, group_ ? group_->rank(0) : ParallelRank{}, options.quantization, sizing);
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
  // A step's page tables together: each sequence's full table and its
  // sliding one (the window, the rollback margin and one step's rows).
  // Pages may be shared, so the pool does not bound them.
  const int64_t slide_blocks =
      geo.sliding_layers > 0
          ? std::min(blocks_per_seq, geo.blocks_covering(geo.window + geo.max_rollback + cap.max_rows) + 2)
          : 0;
  cap.max_blocks = std::max<int64_t>(1, cap.max_seqs * (blocks_per_seq * geo.full_pages_per_block +
                                                        slide_blocks * geo.sliding_pages_per_block));
  ModelOptions mo;
  mo.plan = cap;
  mo.kv_block_size = ko.block_size;
  // --quantization, else what the checkpoint's config asks to be done at
  // load (vLLM's ptpc_fp8: a BF16 checkpoint quantized per channel).
  mo.weights.quantize = options.quantization;
  if (mo.weights.quantize == QuantKind::None)
    if (auto q = describe_quantization(config_.quantization_config); q.ok()) mo.weights.quantize = q->online;
  mo.tap_layers = options.tap_layers;
  mo.tap_final = options.tap_final;
  mo.record_experts = options.record_experts;
  const WeightSource& weights = reader ? *reader : *source_;
  // The checkpoint's KV-cache scales (ModelOpt, compressed-tensors, Quark
  // spellings): used by an FP8 cache, and said to be unused otherwise.
  ko.layer_scales = weights.kv_scales();
  const bool scaled = std::any_of(ko.layer_scales.begin(), ko.layer_scales.end(),
                                  [](const std::array<float, 2>& s) { return s[0] != 1.0f || s[1] != 1.0f; });
  if (scaled && kv_dt != DType::F8_E4M3)
    LOG_INFO("the checkpoint's KV-cache scales are not used: the KV cache is %s (they apply to --kv-cache-dtype fp8)",
             std::string(dtype_name(kv_dt)).c_str());
  if (group_) {  // rank 0 here, the other ranks in the group; each its own shard and KV heads
    mo.weights.shard = group_->rank(0);
    mo.comm = &group_->comm(0);
    MUSE_ASSIGN_OR_RETURN(model_, MuseModel::create(*backend_, config_, group_->shard_source(0, weights), mo));
    const ModelConfig kv_config = rank_kv_config(config_, mo.weights.shard);
    // GPUs: rank 0's budget sizes every rank's pool (the ranks are alike).
    if (device && options.kv_pages == 0)
      MUSE_RETURN_IF_ERROR(size_device_kv(mem0, requested, KvGeometry::of(kv_config, ko.block_size, ko.max_rollback,
                                                                          dtype_bits(kv_dt) / 8), &ko));
    MUSE_ASSIGN_OR_RETURN(kv_, KvCache::create(*backend_, kv_config, ko));
    MUSE_RETURN_IF_ERROR(group_->add_ranks(config_, weights, mo, ko));
  } else {
    MUSE_ASSIGN_OR_RETURN(model_, MuseModel::create(*backend_, config_, weights, mo));
    if (device && options.kv_pages == 0) MUSE_RETURN_IF_ERROR(size_device_kv(mem0, requested, geo, &ko));
    MUSE_ASSIGN_OR_RETURN(kv_, KvCache::create(*backend_, config_, ko));
  }
  plan_ = StepPlanBuilder(cap);
  sample_on_device_ = options.sample_on_device.value_or(options.backend.device != Device::Cpu) && !group_;
  logits_.assign(size_t(cap.max_logit_rows * config_.vocab_size), 0.0f);
  item_logit_row_.reserve(size_t(cap.max_seqs) + 1);
  item_row_.reserve(size_t(cap.max_seqs) + 1);
  if (model_->num_taps() > 0) {
    taps_raw_.assign(size_t(cap.max_rows * tap_width()), 0.0f);
    taps_.assign(size_t(cap.max_rows * tap_width()), 0.0f);
  }
  return Status::Ok();
}

// The KV pool on a device: what the budget leaves once weights and
// activations are resident (or --kv-cache-memory-bytes), in pages of the one
// pool both layer kinds share, capped at what every sequence at full length
// can use.
Status Engine::size_device_kv(const Backend::Memory& before, uint64_t requested, const KvGeometry& geo,
                              KvCacheOptions* ko) {
  const Backend::Memory now = backend_->memory();
  const uint64_t used = before.free > now.free ? before.free - now.free : 0;
  const uint64_t budget = options_.kv_cache_memory_bytes > 0 ? uint64_t(options_.kv_cache_memory_bytes)
                          : requested > used + kDeviceReserveBytes ? requested - used - kDeviceReserveBytes
                                                                  : 0;
  const int64_t budget_pages = int64_t(std::min<uint64_t>(budget / uint64_t(geo.page_bytes()), (uint64_t(1) << 31) - 1));
  ko->num_pages = std::min<int64_t>(ko->num_pages, budget_pages);
  const int64_t one_seq = geo.pages_for(max_model_len_) + geo.step_transient_pages(ko->max_step_rows);
  if (budget_pages < one_seq)
    return make_error("KV cache: " + std::to_string(double(budget) / kGiB) + " GiB hold " +
                      std::to_string(geo.tokens_fitting(budget_pages)) + " positions, fewer than one sequence of " +
                      "--max-model-len " + std::to_string(max_model_len_) +
                      " needs: lower it or --max-num-seqs, or raise --gpu-memory-utilization");
  LOG_INFO("KV cache on the GPU: %lld pages of %lld bytes (%.2f GiB; the budget holds %.2f GiB): one sequence of "
           "up to %lld tokens, %lld at full length; weights and activations %.2f GiB",
           (long long)ko->num_pages, (long long)geo.page_bytes(),
           double(uint64_t(ko->num_pages) * uint64_t(geo.page_bytes())) / kGiB, double(budget) / kGiB,
           (long long)geo.tokens_fitting(ko->num_pages), (long long)(ko->num_pages / std::max<int64_t>(1, one_seq)),
           double(used) / kGiB);
  return Status::Ok();
}

Engine::~Engine() = default;

std::vector<CollectiveTraffic> Engine::parallel_traffic() const {
  std::vector<CollectiveTraffic> t;
  for (int r = 0; group_ && r < group_->size(); ++r) t.push_back(group_->comm(r).traffic());
  return t;
}

Result<std::unique_ptr<Session>> Engine::new_session(std::span<const int32_t> tokens) {
  const int64_t max_cached = std::min<int64_t>(int64_t(tokens.size()) - 1, max_model_len_);
  MUSE_ASSIGN_OR_RETURN(SequenceKv kv, kv_->open_sequence(tokens, max_cached));
  std::unique_ptr<Session> s(new Session(this));
  s->kv_ = std::move(kv);
  // Capacity for the whole context now (virtual memory until used), so a
  // step never grows it.
  s->tokens_.reserve(size_t(max_model_len_));
  s->tokens_.assign(tokens.begin(), tokens.begin() + s->kv_.length);
  return s;
}

void Engine::close(Session& s) { kv_->close_sequence(s.kv_, s.tokens_); }

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
  int64_t new_pages = 0;
  for (const StepItem& it : items)
    new_pages += kv_->pages_to_grow(it.session->kv_, it.session->length() + int64_t(it.tokens.size()));
  if (new_pages > kv_->available_pages()) {
    return make_error("KV cache full: this step needs " + std::to_string(new_pages) + " more pages, " +
                      std::to_string(kv_->available_pages()) + " available");
  }
  // On any failure from here on, the pages taken for this step go back.
  auto undo = [&](Status st) {
    for (const StepItem& it : items) (void)kv_->truncate(it.session->kv_, it.session->length());
    return st;
  };
  for (const StepItem& it : items) {
    Status st = kv_->reserve(it.session->kv_, it.session->length() + int64_t(it.tokens.size()));
    if (!st.ok()) return undo(st);
  }

  // The step plan, in the buffer kept from the last step.
  plan_.reset();
  item_logit_row_.clear();
  item_row_.clear();
  for (const StepItem& it : items) {
    const Session& s = *it.session;
    const int64_t entries = int64_t(s.kv_.full.size() + s.kv_.sliding.size());
    if (!plan_.fits(int64_t(it.tokens.size()), it.logit_rows(), entries))
      return undo(make_error("step: the step plan's capacity is exceeded (engine bug)"));
    item_logit_row_.push_back(plan_.logit_rows());
    item_row_.push_back(plan_.rows());
    plan_.add(it.tokens, s.length(), s.kv_.full, s.kv_.sliding, s.kv_.sliding_first, it.logits == LogitsWanted::All,
              it.logits == LogitsWanted::Last);
  }
  item_logit_row_.push_back(plan_.logit_rows());
  item_row_.push_back(plan_.rows());
  // The rows the backend draws; the rest of the sampled items (no device
  // sampling, or past the edit capacity) are drawn here after the logits come down.
  sample_specs_.clear();
  sample_edits_.clear();
  item_sampled_.assign(items.size(), 0);
  item_result_.resize(items.size());
  std::vector<int32_t>& device_item = sample_item_;
  device_item.assign(items.size(), -1);
  bool logits_down = false;
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& it = items[i];
    if (!it.sample) {
      logits_down |= it.logit_rows() > 0;
      continue;
    }
    const RowSampleSpec& sp = *it.sample;
    if (it.logits != LogitsWanted::Last || sp.edit_begin < 0 || sp.edit_count < 0 ||
        size_t(sp.edit_begin) + size_t(sp.edit_count) > it.sample_edits.size())
      return undo(make_error("step: a sampled item must want its last row's logits and carry its edits"));
    if (sample_on_device_ &&
        int64_t(sample_edits_.size()) + sp.edit_count <= MuseModel::kMaxSampleEdits) {
      RowSampleSpec d = sp;
      d.logit_row = int32_t(item_logit_row_[i]);
      d.edit_begin = int32_t(sample_edits_.size());
      sample_edits_.insert(sample_edits_.end(), it.sample_edits.begin() + sp.edit_begin,
                           it.sample_edits.begin() + sp.edit_begin + sp.edit_count);
      device_item[i] = int32_t(sample_specs_.size());
      sample_specs_.push_back(d);
    } else {
      logits_down = true;
    }
  }
  StepSampling sampling;
  if (!sample_specs_.empty()) {
    RowSampleHeader h;
    h.rows = int32_t(sample_specs_.size());
    h.edits = int32_t(sample_edits_.size());
    h.vocab = int32_t(config_.vocab_size);
    const size_t specs = sample_specs_.size() * sizeof(RowSampleSpec), edits = sample_edits_.size() * sizeof(RowEdit);
    sample_buf_.resize(sizeof h + specs + edits);
    std::memcpy(sample_buf_.data(), &h, sizeof h);
    std::memcpy(sample_buf_.data() + sizeof h, sample_specs_.data(), specs);
    if (edits) std::memcpy(sample_buf_.data() + sizeof h + specs, sample_edits_.data(), edits);
    sample_results_.resize(sample_specs_.size());
    sampling = {sample_buf_, int64_t(sample_specs_.size()), int64_t(sample_edits_.size()), sample_results_.data(),
                logits_down};
  }
  const bool tapping = !taps_.empty();
  // (speculation, hence taps, is refused with tensor parallelism at create)
  Status st = group_ ? group_->forward(*model_, kv_->layers(), plan_, logits_.data())
                     : model_->forward(plan_, kv_->layers(), logits_.data(), tapping ? taps_raw_.data() : nullptr,
                                       sampling.rows > 0 ? &sampling : nullptr);
  if (!st.ok()) return undo(st);
  for (size_t i = 0; i < items.size(); ++i) {
    if (!items[i].sample) continue;
    item_sampled_[i] = 1;
    if (device_item[i] >= 0) {
      item_result_[i] = sample_results_[size_t(device_item[i])];
    } else {
      const RowSampleSpec& sp = *items[i].sample;
      item_result_[i] = sample_row_host(sp, items[i].sample_edits.subspan(size_t(sp.edit_begin), size_t(sp.edit_count)),
                                        logits(i));
    }
  }
  if (model_->sparse_layers() > 0 && !model_->routed_experts().empty()) {
    const int64_t T = plan_.rows(), K = config_.num_experts_per_tok, L = model_->sparse_layers();
    const std::vector<int32_t>& ids = model_->routed_experts();
    expert_seen_.resize(size_t(config_.num_experts));
    int64_t total = 0;
    for (int64_t l = 0; l < L; ++l) {
      std::fill(expert_seen_.begin(), expert_seen_.end(), 0);
      for (int64_t i = 0; i < T * K; ++i) {
        const int32_t e = ids[size_t(l * T * K + i)];
        if (e >= 0 && e < config_.num_experts && !expert_seen_[size_t(e)]) expert_seen_[size_t(e)] = 1, ++total;
      }
    }
    distinct_experts_ = double(total) / double(L);
  }
  if (tapping) {  // tap-major → row-major: a row's taps side by side, as the drafter's fc reads them
    const int64_t T = plan_.rows(), H = config_.hidden_size, m = model_->num_taps();
    for (int64_t r = 0; r < T; ++r)
      for (int64_t t = 0; t < m; ++t)
        std::memcpy(taps_.data() + (r * m + t) * H, taps_raw_.data() + (t * T + r) * H, size_t(H) * sizeof(float));
  }

  for (const StepItem& it : items) {
    Session& s = *it.session;
    s.tokens_.insert(s.tokens_.end(), it.tokens.begin(), it.tokens.end());
    kv_->advance(s.kv_, s.tokens_);
  }
  return Status::Ok();
}

std::span<float> Engine::logits(size_t item) {
  if (item + 1 >= item_logit_row_.size()) return {};
  if (sampled(item)) return {};  // drawn by the engine: the row is its workspace, or never came down
  const int64_t V = config_.vocab_size, r0 = item_logit_row_[item], r1 = item_logit_row_[item + 1];
  return std::span<float>(logits_.data() + r0 * V, size_t((r1 - r0) * V));
}

std::span<const float> Engine::taps(size_t item) const {
  if (taps_.empty() || item + 1 >= item_row_.size()) return {};
  const int64_t W = model_->num_taps() * config_.hidden_size, r0 = item_row_[item], r1 = item_row_[item + 1];
  return std::span<const float>(taps_.data() + r0 * W, size_t((r1 - r0) * W));
}

Result<std::vector<float>> Engine::read_weight_f32(const std::string& slot) const {
  for (const WeightSpec& s : describe_weights(config_)) {
    if (s.slot != slot || s.layer != -1) continue;
    std::vector<float> out(size_t(s.numel()));
    MUSE_RETURN_IF_ERROR(source_->read_f32(s, out.data()));
    return out;
  }
  return make_error("the model has no weight slot " + slot);
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

Status Session::truncate(int64_t n) {
  MUSE_RETURN_IF_ERROR(engine_->kv_->truncate(kv_, n));
  tokens_.resize(size_t(n));
  return Status::Ok();
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
