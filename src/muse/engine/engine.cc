#include "muse/engine/engine.h"

#include <algorithm>
#include <cstring>
#include <unordered_set>

#include "muse/engine/checkpoint_source.h"

namespace muse {

namespace {

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
  MUSE_ASSIGN_OR_RETURN(backend_, create_cpu_backend(options.cpu));
  ModelOptions mo;
  mo.max_rows = options.max_batch_tokens;
  MUSE_ASSIGN_OR_RETURN(model_, MuseModel::create(*backend_, config_, reader ? *reader : *source_, mo));
  KvCacheOptions ko;
  ko.max_sequences = options.max_sequences;
  ko.block_size = options.kv_block_size;
  ko.num_blocks = options.kv_blocks > 0
                      ? options.kv_blocks
                      : options.max_sequences * ((max_model_len_ + ko.block_size - 1) / ko.block_size);
  MUSE_ASSIGN_OR_RETURN(kv_, KvCache::create(*backend_, config_, ko));
  return Status::Ok();
}

Engine::~Engine() = default;

Result<std::unique_ptr<Session>> Engine::new_session() {
  MUSE_ASSIGN_OR_RETURN(SequenceKv kv, kv_->open_sequence());
  std::unique_ptr<Session> s(new Session(this));
  s->kv_ = std::move(kv);
  return s;
}

void Engine::close(Session& s) { kv_->close_sequence(s.kv_); }

Status Engine::step(std::span<const StepItem> items, std::vector<std::vector<float>>* logits) {
  const int64_t V = config_.vocab_size;
  int64_t total = 0;
  std::unordered_set<const Session*> seen;
  for (const StepItem& it : items) {
    if (!it.session || it.session->engine_ != this) return make_error("step: session does not belong to this engine");
    if (!seen.insert(it.session).second) return make_error("step: a session appears twice in one step");
    if (it.tokens.empty()) return make_error("step: an item has no tokens");
    total += int64_t(it.tokens.size());
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

  StepInput in;
  auto batch = std::make_shared<AttentionBatch>();
  batch->window = config_.sliding_window;
  batch->block_size = kv_->block_size();
  std::vector<int64_t> first_logit(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& it = items[i];
    SequenceSlice sl;
    sl.row_begin = int64_t(in.tokens.size());
    sl.num_rows = int64_t(it.tokens.size());
    sl.pos_begin = it.session->length();
    sl.ring_slot = it.session->kv_.ring_slot;
    sl.blocks = it.session->kv_.blocks;
    first_logit[i] = int64_t(in.logit_rows.size());
    for (int64_t r = 0; r < sl.num_rows; ++r) {
      in.tokens.push_back(it.tokens[size_t(r)]);
      in.positions.push_back(int32_t(sl.pos_begin + r));
      if (it.logits == LogitsWanted::All || (it.logits == LogitsWanted::Last && r == sl.num_rows - 1))
        in.logit_rows.push_back(int32_t(sl.row_begin + r));
    }
    batch->seqs.push_back(std::move(sl));
  }
  in.batch = batch;
  MUSE_RETURN_IF_ERROR(model_->forward(in, kv_->layers(), &step_logits_));

  if (logits) logits->resize(items.size());
  for (size_t i = 0; i < items.size(); ++i) {
    const StepItem& it = items[i];
    Session& s = *it.session;
    s.tokens_.insert(s.tokens_.end(), it.tokens.begin(), it.tokens.end());
    s.kv_.length = s.length();
    if (logits) {
      const int64_t rows = (i + 1 < items.size() ? first_logit[i + 1] : int64_t(in.logit_rows.size())) - first_logit[i];
      (*logits)[i].assign(step_logits_.begin() + first_logit[i] * V, step_logits_.begin() + (first_logit[i] + rows) * V);
    }
  }
  return Status::Ok();
}

Session::~Session() {
  if (engine_) engine_->close(*this);
}

Result<std::vector<float>> Session::feed(std::span<const int32_t> tokens, LogitsWanted want) {
  std::vector<float> out;
  const int64_t chunk = engine_->options().max_batch_tokens;
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
  std::vector<std::vector<float>> step_logits;
  for (size_t done = 0; done < tokens.size();) {
    const size_t n = std::min<size_t>(size_t(chunk), tokens.size() - done);
    const bool last_chunk = done + n == tokens.size();
    StepItem it{this, tokens.subspan(done, n),
                want == LogitsWanted::All ? LogitsWanted::All
                : (want == LogitsWanted::Last && last_chunk) ? LogitsWanted::Last
                                                              : LogitsWanted::None};
    MUSE_RETURN_IF_ERROR(engine_->step(std::span<const StepItem>(&it, 1), &step_logits));
    out.insert(out.end(), step_logits[0].begin(), step_logits[0].end());
    done += n;
  }
  return out;
}

}  // namespace muse
