#include "muse/server/engine_service.h"

#include <atomic>
#include <cmath>
#include <mutex>
#include <random>

#include "muse/core/log.h"
#include "muse/server/stop_matcher.h"
#include "muse/tokenizer/streaming_detokenizer.h"
#include "muse/tokenizer/tokenizer_impl.h"

namespace muse::server {

namespace {

FinishReason finish_of(SeqFinish f) {
  switch (f) {
    case SeqFinish::Stop: return FinishReason::Stop;
    case SeqFinish::Length: return FinishReason::Length;
    case SeqFinish::Abort: return FinishReason::Abort;
    case SeqFinish::Error: return FinishReason::Error;
    case SeqFinish::None: break;
  }
  return FinishReason::None;
}

// A token's bytes as the model produced them (may be partial UTF-8; the
// writers escape them and report `bytes`).
std::string token_bytes(const Tokenizer& tok, int32_t id) {
  if (const tok::TokenizerImpl* impl = tok.impl()) return impl->decode(&id, 1, false, /*raw=*/true);
  return {};
}

double logprob_value(float x) { return std::isnan(x) ? std::nan("") : double(x); }

// One request's outputs: engine updates -> GenerationOutputs for the sink.
class SinkObserver : public RequestObserver {
 public:
  SinkObserver(const Tokenizer& tok, const GenerationRequest& req, std::shared_ptr<GenerationSink> sink)
      : tok_(tok), sink_(std::move(sink)), logprobs_(req.logprobs), min_tokens_(req.sampling.min_tokens),
        include_stop_(req.include_stop_str_in_output) {
    for (int i = 0; i < req.n; ++i)
      choices_.push_back(Choice{StreamingDetokenizer(tok, req.skip_special_tokens),
                                StopStringMatcher(req.stop_strings, req.include_stop_str_in_output)});
  }

  bool on_update(const SequenceUpdate& u) override {
    Choice& c = choices_[size_t(u.index)];
    GenerationOutput out;
    out.index = u.index;
    if (u.prompt_logprobs)
      for (const auto& p : *u.prompt_logprobs) out.prompt_logprobs.push_back(convert(p.id, p.logprob, p.top));
    if (!u.token) {  // aborted or failed: whatever is held back is dropped
      out.finish = finish_of(u.finish);
      sink_->on_output(std::move(out));
      return false;
    }
    const int32_t id = u.token->id;
    out.token_ids.push_back(id);
    if (logprobs_ >= 0 && u.token->has_logprobs) out.logprobs.push_back(convert(id, u.token->logprob, u.token->top));
    // The token that stopped generation (EOS or a stop id) is not text,
    // unless include_stop_str_in_output (vLLM).
    const bool stopped_by_token = u.finish == SeqFinish::Stop;
    std::string piece = stopped_by_token && !include_stop_ ? std::string() : c.detok.feed(id);
    if (u.finish != SeqFinish::None) piece += c.detok.flush();
    // Stop strings count only once more than min_tokens tokens exist (vLLM).
    out.text = c.stops.push(piece, /*match=*/u.generated > min_tokens_);
    if (c.stops.matched()) {
      out.finish = FinishReason::Stop;
      out.stop_string = c.stops.matched_string();
    } else if (u.finish != SeqFinish::None) {
      out.text += c.stops.flush();
      out.finish = finish_of(u.finish);
      out.stop_token = u.stop_token;
    }
    const bool matched = c.stops.matched();
    sink_->on_output(std::move(out));
    return matched;
  }

  void on_complete(const RequestSummary& s) override {
    GenerationSummary g;
    g.prompt_tokens = int(s.prompt_tokens);
    g.cached_prompt_tokens = int(s.cached_tokens);
    for (int64_t c : s.completion_tokens) g.completion_tokens.push_back(int(c));
    g.queue_seconds = s.queue_seconds;
    g.prefill_seconds = s.prefill_seconds;
    g.decode_seconds = s.decode_seconds;
    g.error = s.error;
    sink_->on_complete(std::move(g));
  }

 private:
  struct Choice {
    StreamingDetokenizer detok;
    StopStringMatcher stops;
  };

  TokenLogprob convert(int32_t id, float logprob, const std::vector<TokenLogprobEntry>& top) const {
    TokenLogprob t;
    t.token_id = id;
    t.token = token_bytes(tok_, id);
    t.logprob = logprob_value(logprob);
    for (const auto& e : top) t.top.push_back({e.id, token_bytes(tok_, e.id), double(e.logprob)});
    return t;
  }

  const Tokenizer& tok_;
  std::shared_ptr<GenerationSink> sink_;
  int logprobs_;
  int64_t min_tokens_;
  bool include_stop_;
  std::vector<Choice> choices_;
};

class SchedulerService final : public EngineService {
 public:
  explicit SchedulerService(EngineServiceOptions o) : opt_(std::move(o)) {
    if (opt_.seed != 0) seeds_.seed(uint64_t(opt_.seed));
    else seeds_.seed(std::random_device{}() ^ (uint64_t(std::random_device{}()) << 32));
  }
  ~SchedulerService() override {
    // Aborts what is left (sinks get their completions) before the engine goes.
    if (scheduler_) scheduler_->stop();
    scheduler_.reset();
    engine_.reset();
  }

  Status load(const LoadProgressFn& progress) override {
    MUSE_RETURN_IF_ERROR(prepare_speculation(opt_.scheduler.speculative, opt_.model_dir, &opt_.engine));
    auto engine = Engine::open(opt_.model_dir, opt_.engine, [&](const EngineLoadProgress& p) {
      if (progress) progress({p.bytes_done, p.bytes_total, p.tensors_done, p.tensors_total});
    });
    if (!engine.ok()) return engine.error();
    engine_ = std::move(engine).value();
    const KvCache& kv = engine_->kv_cache();
    const KvGeometry& g = kv.geometry();
    LOG_INFO("engine: %s backend, context %lld, %lld sequences, %lld tokens per step", engine_->backend().name().c_str(),
             (long long)engine_->max_model_len(), (long long)opt_.engine.max_sequences,
             (long long)opt_.engine.max_batch_tokens);
    LOG_INFO("KV cache: %s, %.1f MiB = %lld pages of %lld bytes (blocks of %lld positions; %lld full + %lld sliding layers, "
             "window %lld, rollback %lld); one sequence of %lld tokens holds %lld pages (%.2f MiB); the pool holds one "
             "sequence of up to %lld tokens; prefix caching %s",
             std::string(dtype_name(kv.dtype())).c_str(), double(kv.bytes()) / (1 << 20), (long long)kv.total_pages(),
             (long long)g.page_bytes(), (long long)g.block_size, (long long)g.full_layers, (long long)g.sliding_layers,
             (long long)g.window, (long long)g.max_rollback, (long long)engine_->max_model_len(),
             (long long)g.pages_for(engine_->max_model_len()), double(g.bytes_for(engine_->max_model_len())) / (1 << 20),
             (long long)g.tokens_fitting(kv.total_pages() - kv.step_transient_pages()),
             kv.prefix_caching() ? "on" : "off");
    if (opt_.scheduler.speculative.enabled) {
      auto drafter = load_drafter(opt_.scheduler.speculative, *engine_);
      if (!drafter.ok()) return drafter.error();
      opt_.scheduler.drafter = std::move(drafter).value();
    }
    auto sched = std::make_unique<Scheduler>(*engine_, opt_.scheduler);
    std::lock_guard lock(mu_);
    scheduler_ = std::move(sched);
    ready_ = true;
    return Status::Ok();
  }

  std::optional<SubmitError> submit(GenerationRequest req, std::shared_ptr<GenerationSink> sink) override {
    Scheduler* sched = scheduler();
    if (!sched) return SubmitError{SubmitError::Kind::Unavailable, "the model is not loaded"};
    // What only the engine service knows: the grammar factory and serve's seeds.
    if (!req.constraint.is_null()) {
      if (!opt_.constraints) return SubmitError{SubmitError::Kind::Invalid, "constrained generation is not available"};
      auto make = opt_.constraints(req.constraint);
      if (!make.ok()) return SubmitError{SubmitError::Kind::Invalid, make.message()};
      req.make_constraint = std::move(make).value();
    }
    if (!req.sampling.seed) req.sampling.seed = next_seed();
    auto observer = std::make_shared<SinkObserver>(opt_.tokenizer, req, std::move(sink));
    auto r = sched->submit(std::move(req), std::move(observer));
    switch (r.status) {
      case Scheduler::SubmitStatus::Ok: return std::nullopt;
      case Scheduler::SubmitStatus::Invalid: return SubmitError{SubmitError::Kind::Invalid, r.message};
      case Scheduler::SubmitStatus::Overloaded: return SubmitError{SubmitError::Kind::Overloaded, r.message};
      case Scheduler::SubmitStatus::Stopped: return SubmitError{SubmitError::Kind::Unavailable, r.message};
    }
    return std::nullopt;
  }

  std::string backend_name() const override {
    std::lock_guard lock(mu_);
    return ready_ ? engine_->backend().name() : std::string();
  }

  void cancel(const std::string& request_id) override {
    if (Scheduler* s = scheduler()) s->cancel(request_id);
  }

  EngineStats stats() const override {
    EngineStats e;
    Scheduler* s = scheduler();
    if (!s) return e;
    SchedulerStats st = s->stats();
    e.num_requests_running = int(st.requests_running);
    e.num_requests_waiting = int(st.requests_waiting);
    e.kv_cache_usage = st.kv_usage;
    e.prefix_cache_queries = st.prefix_cache_queries;
    e.prefix_cache_hits = st.prefix_cache_hits;
    e.num_preemptions = st.preemptions;
    e.engine_steps = st.steps;
    e.engine_busy_seconds = st.busy_seconds;
    e.engine_model_seconds = st.model_seconds;
    e.spec_decode = opt_.scheduler.speculative.enabled;
    e.spec_drafts = st.spec.drafts;
    e.spec_draft_tokens = st.spec.draft_tokens;
    e.spec_accepted_tokens = st.spec.accepted_tokens;
    e.spec_accepted_per_pos = st.spec.accepted_per_pos;
    return e;
  }

 private:
  Scheduler* scheduler() const {
    std::lock_guard lock(mu_);
    return ready_ ? scheduler_.get() : nullptr;
  }
  uint64_t next_seed() {
    std::lock_guard lock(mu_);
    return seeds_();
  }

  EngineServiceOptions opt_;
  std::unique_ptr<Engine> engine_;
  std::unique_ptr<Scheduler> scheduler_;
  mutable std::mutex mu_;
  bool ready_ = false;
  std::mt19937_64 seeds_;
};

}  // namespace

std::shared_ptr<EngineService> make_engine_service(EngineServiceOptions options) {
  return std::make_shared<SchedulerService>(std::move(options));
}

}  // namespace muse::server
