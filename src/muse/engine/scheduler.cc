#include "muse/engine/scheduler.h"

#include <algorithm>
#include <chrono>
#include <cmath>

#include "muse/core/log.h"

namespace muse {

using Clock = std::chrono::steady_clock;

namespace {
double seconds(Clock::duration d) { return std::chrono::duration<double>(d).count(); }
bool contains(const std::vector<int32_t>& v, int32_t x) { return std::find(v.begin(), v.end(), x) != v.end(); }
}  // namespace

struct Scheduler::Sequence {
  Request* req = nullptr;
  int index = 0;
  std::vector<int32_t> tokens;  // prompt, then generated tokens
  int64_t prompt_len = 0;
  std::unique_ptr<Session> session;  // null while waiting (new or preempted)
  SequenceSampler sampler;
  bool finished = false;
  // Prompt logprobs: collected during the first prefill, sent with the first token.
  bool want_prompt_logprobs = false, prompt_logprobs_done = false, prompt_logprobs_sent = false;
  std::vector<PromptTokenLogprob> prompt_logprobs;
  // The logits observer: positions whose rows it has seen (not again after a preemption).
  bool observed = false;
  int64_t rows_observed = 0;
  // Speculation: the drafter's context over committed positions, this
  // step's block, and what is verified ([anchor, d_1..d_n]).
  std::unique_ptr<DraftContext> draft;
  DraftBlock block;
  std::vector<int32_t> verify;
  int n_verify = 0;
  std::vector<RowEdit> sample_edits;  // this step's draw on the device (Engine::samples_on_device)

  Sequence(SamplingConfig config, int64_t vocab) : sampler(std::move(config), vocab) {}
  int64_t generated() const { return int64_t(tokens.size()) - prompt_len; }
  // Every row's logits are wanted while prompt logprobs are being collected,
  // and while the observer has not seen every prompt row.
  bool all_rows() const {
    return (want_prompt_logprobs && !prompt_logprobs_done) || (observed && rows_observed < prompt_len);
  }
};

struct Scheduler::Request {
  GenerationRequest r;
  std::shared_ptr<RequestObserver> observer;
  std::vector<std::unique_ptr<Sequence>> seqs;
  Clock::time_point arrival, scheduled, first_token, last_token;
  bool has_scheduled = false, has_first_token = false, completed = false;
  int unfinished = 0;
  int64_t cached_tokens = 0;  // of the first admission
  int64_t preemptions = 0;
  std::string error;
};

Scheduler::Scheduler(Engine& engine, SchedulerOptions options) : engine_(engine), opt_(std::move(options)) {
  const ModelConfig& c = engine_.config();
  const int64_t model_limit = c.sampled_vocab_size > 0 ? c.sampled_vocab_size : c.vocab_size;
  sampled_vocab_ = opt_.sampled_vocab_size > 0 ? std::min(opt_.sampled_vocab_size, model_limit) : model_limit;
  max_seqs_ = engine_.options().max_sequences;
  max_tokens_per_step_ = engine_.options().max_batch_tokens;
  if (opt_.max_logit_rows < 1) opt_.max_logit_rows = 1;
  if (opt_.speculative.enabled && opt_.drafter) {
    const DrafterConfig& dc = opt_.drafter->config();
    if (engine_.tap_width() != dc.tap_width()) {
      LOG_ERROR("speculative decoding off: the engine taps %lld values per row, the drafter reads %lld",
                (long long)engine_.tap_width(), (long long)dc.tap_width());
    } else {
      spec_ = true;
      const int64_t block = dc.drafts_per_block();
      spec_k_ = int(opt_.speculative.num_speculative_tokens > 0 ? std::min<int64_t>(opt_.speculative.num_speculative_tokens, block)
                                                                : block);
      // A rejected draft is rolled back through Session::truncate, which is
      // exact for up to kv_max_rollback positions.
      spec_k_ = int(std::min<int64_t>(spec_k_, engine_.options().kv_max_rollback));
      local_.spec.accepted_per_pos.assign(size_t(spec_k_), 0);
      if (opt_.speculative.enable_adaptive_verification)
        measure_step_costs(std::min<int64_t>({max_tokens_per_step_, max_seqs_ * (spec_k_ + 1), 64}));
      spec_logged_ = Clock::now();
      LOG_INFO("speculative decoding: %s drafter %s, block %lld, verifying up to %d drafts (%s drafts, %s acceptance%s)",
               to_string(opt_.speculative.method), opt_.speculative.model.c_str(), (long long)dc.block_size, spec_k_,
               to_string(opt_.speculative.draft_sample_method), to_string(opt_.speculative.rejection_sample_method),
               opt_.speculative.enable_adaptive_verification ? ", adaptive width" : "");
    }
  }
  thread_ = std::thread([this] { run(); });
}

Scheduler::~Scheduler() { stop(); }

void Scheduler::stop() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
  }
  cv_.notify_all();
  if (thread_.joinable()) thread_.join();
}

Scheduler::SubmitResult Scheduler::submit(GenerationRequest req, std::shared_ptr<RequestObserver> observer) {
  auto invalid = [](std::string m) { return SubmitResult{SubmitStatus::Invalid, std::move(m)}; };
  const int64_t V = engine_.config().vocab_size;
  const int64_t P = int64_t(req.prompt.size());
  if (!observer) return invalid("no observer");
  if (P == 0) return invalid("the prompt is empty");
  for (int32_t t : req.prompt)
    if (t < 0 || t >= V)
      return invalid("prompt token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  for (const auto& [t, bias] : req.sampling.logit_bias)
    if (t < 0 || t >= V)
      return invalid("logit_bias: token id " + std::to_string(t) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
  if (req.n < 1 || req.n > max_seqs_)
    return invalid("n=" + std::to_string(req.n) + " must be between 1 and --max-num-seqs (" + std::to_string(max_seqs_) + ")");
  if (req.max_tokens < 1) return invalid("max_tokens must be at least 1");
  const int64_t ctx = engine_.max_model_len();
  if (P + req.max_tokens > ctx)
    return invalid("prompt (" + std::to_string(P) + " tokens) + max_tokens (" + std::to_string(req.max_tokens) +
                   ") exceeds the context of " + std::to_string(ctx) + " tokens");
  // The last generated token is never fed back, so the KV cache holds at
  // most prompt + max_tokens - 1 positions of one sequence.
  const KvCache& kv = engine_.kv_cache();
  const int64_t need = kv.pages_for_sequence(P + req.max_tokens - 1);
  if (need > kv.total_pages())
    return invalid("this request needs " + std::to_string(need) + " KV-cache pages (blocks of " +
                   std::to_string(kv.block_size()) + " positions) for one sequence, more than the whole cache (" +
                   std::to_string(kv.total_pages()) +
                   " pages); shorten the prompt or max_tokens, or give the server a larger KV cache");

  auto r = std::make_unique<Request>();
  r->arrival = Clock::now();
  r->observer = std::move(observer);
  r->r = std::move(req);
  std::lock_guard lock(mu_);
  if (stopping_) return {SubmitStatus::Stopped, "the engine is shutting down"};
  if (queued_requests_ >= opt_.max_waiting_requests)
    return {SubmitStatus::Overloaded, "too many requests are waiting (" + std::to_string(opt_.max_waiting_requests) + ")"};
  ++queued_requests_;
  incoming_.push_back(std::move(r));
  cv_.notify_all();
  return {};
}

void Scheduler::cancel(const std::string& request_id) {
  {
    std::lock_guard lock(mu_);
    cancel_ids_.insert(request_id);
  }
  cv_.notify_all();
}

SchedulerStats Scheduler::stats() const {
  std::lock_guard lock(mu_);
  SchedulerStats s = stats_;
  s.requests_waiting += int64_t(incoming_.size());
  return s;
}

// ---------------------------------------------------------------------------
// The scheduler thread
// ---------------------------------------------------------------------------

bool Scheduler::take_incoming(std::vector<std::unique_ptr<Request>>& fresh, std::unordered_set<std::string>& cancels,
                              bool block) {
  std::unique_lock lock(mu_);
  if (block) cv_.wait(lock, [&] { return stopping_ || !incoming_.empty() || !cancel_ids_.empty(); });
  if (stopping_) return false;
  fresh.swap(incoming_);
  cancels.swap(cancel_ids_);
  return true;
}

void Scheduler::run() {
  for (;;) {
    std::vector<std::unique_ptr<Request>> fresh;
    std::unordered_set<std::string> cancels;
    if (!take_incoming(fresh, cancels, requests_.empty())) break;
    for (auto& r : fresh) admit(std::move(r));
    if (!cancels.empty()) apply_cancels(cancels);
    if (!running_.empty() || !waiting_.empty()) iterate();
    std::erase_if(requests_, [](const std::unique_ptr<Request>& r) { return r->completed; });
    publish_stats();
  }
  // Stopping: requests never taken in are aborted as well.
  std::vector<std::unique_ptr<Request>> rest;
  {
    std::lock_guard lock(mu_);
    rest.swap(incoming_);
  }
  for (auto& r : rest) admit(std::move(r));
  abort_all("");
  publish_stats();
}

void Scheduler::admit(std::unique_ptr<Request> req) {
  Request* r = req.get();
  for (int i = 0; i < r->r.n; ++i) {
    SamplingConfig sc = r->r.sampling;
    sc.seed = r->r.sampling.seed.value_or(0) + uint64_t(i);
    sc.min_tokens_blocked = r->r.stop_token_ids;
    if (!r->r.ignore_eos) sc.min_tokens_blocked.insert(sc.min_tokens_blocked.end(), opt_.eos_token_ids.begin(),
                                                       opt_.eos_token_ids.end());
    auto s = std::make_unique<Sequence>(std::move(sc), sampled_vocab_);
    s->req = r;
    s->index = i;
    s->tokens = r->r.prompt;
    s->tokens.reserve(r->r.prompt.size() + size_t(r->r.max_tokens));
    s->prompt_len = int64_t(r->r.prompt.size());
    s->sampler.set_prompt(r->r.prompt);
    if (r->r.make_constraint) s->sampler.set_constraint(r->r.make_constraint());
    if (spec_) s->draft = std::make_unique<DraftContext>(opt_.drafter->new_context(engine_.max_model_len()));
    s->want_prompt_logprobs = r->r.prompt_logprobs >= 0;
    s->observed = bool(r->r.logits_observer);
    waiting_.push_back(s.get());
    r->seqs.push_back(std::move(s));
  }
  r->unfinished = r->r.n;
  requests_.push_back(std::move(req));
}

void Scheduler::apply_cancels(const std::unordered_set<std::string>& cancels) {
  for (auto& r : requests_) {
    if (r->completed || !cancels.count(r->r.id)) continue;
    for (auto& s : r->seqs)
      if (!s->finished) finish_sequence(s.get(), SeqFinish::Abort);
  }
}

void Scheduler::release(Sequence* s) {
  s->session.reset();  // returns its pages (complete blocks stay in the prefix cache)
  if (auto it = std::find(running_.begin(), running_.end(), s); it != running_.end()) running_.erase(it);
  if (auto it = std::find(waiting_.begin(), waiting_.end(), s); it != waiting_.end()) waiting_.erase(it);
}

void Scheduler::finish_sequence(Sequence* s, SeqFinish why, const std::string& error) {
  if (s->finished) return;
  if (why == SeqFinish::Abort || why == SeqFinish::Error) {
    SequenceUpdate u;
    u.index = s->index;
    u.finish = why;
    u.generated = s->generated();
    s->req->observer->on_update(u);
    if (why == SeqFinish::Error && s->req->error.empty()) s->req->error = error;
  }
  s->finished = true;
  release(s);
  --s->req->unfinished;
  complete_if_done(s->req);
}

void Scheduler::complete_if_done(Request* r) {
  if (r->unfinished > 0 || r->completed) return;
  r->completed = true;
  if (!r->has_scheduled) {
    std::lock_guard lock(mu_);
    --queued_requests_;
  }
  const auto now = Clock::now();
  RequestSummary sum;
  sum.prompt_tokens = int64_t(r->r.prompt.size());
  sum.cached_tokens = r->cached_tokens;
  for (const auto& s : r->seqs) sum.completion_tokens.push_back(s->generated());
  const auto scheduled = r->has_scheduled ? r->scheduled : now;
  sum.queue_seconds = seconds(scheduled - r->arrival);
  sum.prefill_seconds = r->has_first_token ? seconds(r->first_token - scheduled) : seconds(now - scheduled);
  sum.decode_seconds = r->has_first_token ? seconds(r->last_token - r->first_token) : 0.0;
  sum.preemptions = r->preemptions;
  sum.error = r->error;
  r->observer->on_complete(sum);
}

void Scheduler::abort_all(const std::string& error) {
  for (auto& r : requests_)
    for (auto& s : r->seqs)
      if (!s->finished) finish_sequence(s.get(), error.empty() ? SeqFinish::Abort : SeqFinish::Error, error);
  requests_.clear();
}

void Scheduler::preempt(Sequence* s) {
  s->session.reset();
  if (s->draft) s->draft->clear();  // rebuilt from the recompute's taps
  s->n_verify = 0;
  if (auto it = std::find(running_.begin(), running_.end(), s); it != running_.end()) running_.erase(it);
  if (s->all_rows()) s->prompt_logprobs.clear();  // collected again from the start
  waiting_.push_front(s);
  ++s->req->preemptions;
  ++local_.preemptions;
  LOG_DEBUG("[%s] choice %d preempted at %lld tokens (KV cache full); it will be recomputed", s->req->r.id.c_str(),
            s->index, (long long)s->tokens.size());
}

void Scheduler::iterate() {
  const auto t0 = Clock::now();
  const KvCache& kv = engine_.kv_cache();
  int64_t budget = max_tokens_per_step_, reserved = 0;
  // Logit rows the engine can return in one step; a sequence that would pass
  // it waits for the next step (only prompt-logprobs chunks can).
  int64_t logit_budget = engine_.max_logit_rows();
  bool preempted = false;
  struct Planned {
    Sequence* s;
    int64_t start, take;
  };
  std::vector<Planned> plan;
  if (spec_) plan_drafts();

  // 1. Running sequences, oldest admission first; preempt from the newest.
  for (size_t i = 0; i < running_.size() && budget > 0;) {
    Sequence* s = running_[i];
    const int64_t len = s->session->length();
    int64_t take = std::min<int64_t>(int64_t(s->tokens.size()) - len, budget);
    if (s->all_rows()) take = std::min({take, opt_.max_logit_rows, logit_budget});
    int64_t rows = s->all_rows() ? take : len + take == int64_t(s->tokens.size()) ? 1 : 0;
    if (s->n_verify > 0) {  // a verify: [anchor, d_1..d_n], every row's logits
      s->n_verify = int(std::max<int64_t>(0, std::min<int64_t>({s->n_verify, budget - 1, logit_budget - 1})));
      s->verify.resize(size_t(s->n_verify) + 1);
      take = rows = 1 + s->n_verify;
    }
    if (take < 1 || rows > logit_budget) {
      ++i;
      continue;
    }
    const int64_t need = kv.pages_to_grow(s->session->kv(), len + take);
    bool self = false;
    while (need > kv.available_pages() - reserved) {
      Sequence* victim = running_.back();
      self = victim == s;
      preempt(victim);
      preempted = true;
      if (self) break;
    }
    if (self) break;  // s was the last running sequence
    reserved += need;
    budget -= take;
    logit_budget -= rows;
    plan.push_back({s, len, take});
    ++i;
  }
  // 2. Waiting sequences in order, unless this step had to preempt.
  while (!preempted && budget > 0 && !waiting_.empty() && int64_t(running_.size()) < max_seqs_) {
    Sequence* s = waiting_.front();
    const int64_t n_tokens = int64_t(s->tokens.size());
    // n > 1 with prefix caching: the other choices wait while choice 0 is
    // still computing the shared prompt, then find it in the cache instead of
    // each prefilling it (it always progresses: it runs, and a preempted one
    // goes to the front of the queue).
    if (kv.prefix_caching() && s->index > 0 && !s->all_rows()) {
      const Sequence* first = s->req->seqs[0].get();
      if (!first->finished && first->session && first->session->length() < first->prompt_len) break;
    }
    // Prompt logprobs need every row computed: no prefix reuse then.
    // With a drafter, positions the drafter's window will read are computed
    // again (their taps are not cached), so at most the rest is adopted.
    const int64_t adopt_max = spec_ ? std::max<int64_t>(0, n_tokens - 1 - spec_context_window()) : n_tokens - 1;
    const PrefixMatch m = s->all_rows() ? PrefixMatch{} : kv.match(s->tokens, adopt_max);
    int64_t take = std::min<int64_t>(n_tokens - m.tokens, budget);
    if (s->all_rows()) take = std::min({take, opt_.max_logit_rows, logit_budget});
    const int64_t rows = s->all_rows() ? take : m.tokens + take == n_tokens ? 1 : 0;
    if (take < 1 || rows > logit_budget) break;
    const int64_t need = m.revived + kv.pages_to_grow(m, m.tokens + take);
    if (need > kv.available_pages() - reserved) break;  // first come, first served: no overtaking
    auto session = s->all_rows() ? engine_.new_session()
                                 : engine_.new_session(std::span<const int32_t>(s->tokens).first(size_t(adopt_max + 1)));
    if (!session.ok()) break;
    s->session = std::move(session).value();
    const int64_t start = s->session->length();
    if (start != m.tokens) {  // match() and new_session() look at the same cache: cannot differ
      LOG_ERROR("[%s] prefix cache: matched %lld tokens, adopted %lld", s->req->r.id.c_str(), (long long)m.tokens,
                (long long)start);
      take = std::min<int64_t>(n_tokens - start, take);
    }
    waiting_.pop_front();
    running_.push_back(s);
    Request* r = s->req;
    if (!r->has_scheduled) {
      r->has_scheduled = true;
      r->scheduled = t0;
      r->cached_tokens = std::min<int64_t>(start, s->prompt_len);
      std::lock_guard lock(mu_);
      --queued_requests_;
    }
    reserved += need;
    budget -= take;
    logit_budget -= rows;
    plan.push_back({s, start, take});
  }
  if (plan.empty()) return;

  std::vector<StepItem> items;
  items.reserve(plan.size());
  for (const Planned& p : plan) {
    Sequence* s = p.s;
    if (s->n_verify > 0) {
      items.push_back({s->session.get(), std::span<const int32_t>(s->verify), LogitsWanted::All});
      continue;
    }
    const bool last = p.start + p.take == int64_t(s->tokens.size());
    LogitsWanted want = s->all_rows() ? LogitsWanted::All : last ? LogitsWanted::Last : LogitsWanted::None;
    StepItem item{s->session.get(), std::span<const int32_t>(s->tokens.data() + p.start, size_t(p.take)), want};
    // Drawn where the logits are, when the sampler can say how (no
    // grammar, at most kRowSampleMaxTop top logprobs) and nobody watches the logits.
    if (want == LogitsWanted::Last && engine_.samples_on_device() && !s->observed) {
      RowSampleSpec spec;
      s->sample_edits.clear();
      if (s->sampler.plan_row(engine_.config().vocab_size, s->req->r.logprobs, opt_.logprobs_mode, &spec,
                              &s->sample_edits)) {
        item.sample = spec;
        item.sample_edits = s->sample_edits;
      }
    }
    items.push_back(item);
  }
  const auto m0 = Clock::now();
  Status st = engine_.step(items);
  const auto m1 = Clock::now();
  // The experts this step's rows touched: what a wider verify costs on a MoE target.
  if (st.ok() && spec_) {
    int64_t rows = 0;
    for (const StepItem& it : items) rows += int64_t(it.tokens.size());
    if (engine_.distinct_experts() > 0) step_cost_.observe_experts(rows, engine_.distinct_experts());
  }
  local_.model_seconds += seconds(m1 - m0);
  ++local_.steps;
  if (!st.ok()) {
    LOG_ERROR("engine step failed (%zu sequences): %s", plan.size(), st.message().c_str());
    for (const Planned& p : plan) finish_sequence(p.s, SeqFinish::Error, "engine step failed: " + st.message());
    local_.busy_seconds += seconds(Clock::now() - t0);
    return;
  }

  const int64_t V = engine_.config().vocab_size;
  for (size_t k = 0; k < plan.size(); ++k) {
    Sequence* s = plan[k].s;
    Request* r = s->req;
    const int64_t start = plan[k].start, take = plan[k].take;
    std::span<float> rows = engine_.logits(k);
    if (s->n_verify > 0) {
      const int n = s->n_verify;
      s->n_verify = 0;
      auto ends = [&](int32_t id) {
        return (!r->r.ignore_eos && contains(opt_.eos_token_ids, id)) || contains(r->r.stop_token_ids, id);
      };
      VerifyOutcome v = verify_drafts(s->sampler, rows, V, std::span<const int32_t>(s->verify).subspan(1),
                                      s->block, opt_.speculative, start + 1, r->r.logprobs, opt_.logprobs_mode, ends);
      // Keep the KV of the anchor and the accepted drafts; the rejected
      // rows go (exact for both layer kinds: kv/kv_cache.h).
      if (Status ts = s->session->truncate(start + v.accepted + 1); !ts.ok()) {
        finish_sequence(s, SeqFinish::Error, "speculative rollback failed: " + ts.message());
        continue;
      }
      opt_.drafter->append_context(*s->draft, engine_.taps(k).data(), v.accepted + 1, start);
      local_.prompt_tokens_computed += uint64_t(v.accepted + 1);
      SpecDecodeStats& st = local_.spec;
      ++st.drafts;
      st.draft_tokens += uint64_t(n);
      st.accepted_tokens += uint64_t(v.accepted);
      for (int i = 0; i < v.accepted; ++i) ++st.accepted_per_pos[size_t(i)];
      for (SampledToken& t : v.tokens)
        if (emit(s, std::move(t))) break;
      continue;
    }
    local_.prompt_tokens_computed += uint64_t(take);
    if (s->draft) opt_.drafter->append_context(*s->draft, engine_.taps(k).data(), take, start);
    if (const RowSampleResult* drawn = engine_.sampled(k)) {
      SampledToken token = to_sampled_token(*drawn, *items[k].sample);
      s->sampler.accept(token.id);
      emit(s, std::move(token));
      continue;
    }
    if (s->observed && !rows.empty()) {
      // The rows end at the chunk's last position; skip any seen before a preemption.
      const int64_t n = int64_t(rows.size()) / V, first = start + take - n;
      const int64_t skip = std::max<int64_t>(0, s->rows_observed - first);
      if (skip < n) {
        r->r.logits_observer(s->index, std::span<const float>(rows.data() + skip * V, size_t((n - skip) * V)));
        s->rows_observed = first + n;
      }
    }
    if (s->all_rows()) {
      // Row j predicts position start + j + 1.
      if (start == 0) s->prompt_logprobs.push_back({s->tokens[0], std::nanf(""), {}});
      for (int64_t j = 0; j < take; ++j) {
        const int64_t target = start + j + 1;
        if (target >= s->prompt_len) break;
        const int32_t id = s->tokens[size_t(target)];
        SampledToken lp = compute_logprobs(std::span<const float>(rows.data() + j * V, size_t(V)), sampled_vocab_, id,
                                           r->r.prompt_logprobs);
        PromptTokenLogprob e{id, lp.logprob, std::move(lp.top)};
        s->prompt_logprobs.push_back(std::move(e));
      }
      if (start + take >= s->prompt_len) s->prompt_logprobs_done = true;
    }
    if (start + take != int64_t(s->tokens.size())) continue;  // a prefill chunk: no token yet

    std::span<float> row(rows.data() + rows.size() - size_t(V), size_t(V));
    SampledToken token = s->sampler.sample(row, r->r.logprobs, opt_.logprobs_mode);
    s->sampler.accept(token.id);
    emit(s, std::move(token));
  }
  if (spec_) log_spec_stats(false);
  local_.busy_seconds += seconds(Clock::now() - t0);
}

bool Scheduler::emit(Sequence* s, SampledToken token) {
  Request* r = s->req;
  SequenceUpdate u;
  u.index = s->index;
  u.token = std::move(token);
  const int32_t id = u.token->id;
  s->tokens.push_back(id);
  ++local_.tokens_generated;
  u.generated = s->generated();
  if (!r->r.ignore_eos && contains(opt_.eos_token_ids, id)) {
    u.finish = SeqFinish::Stop;
  } else if (contains(r->r.stop_token_ids, id)) {
    u.finish = SeqFinish::Stop;
    u.stop_token = id;
  } else if (u.generated >= r->r.max_tokens || int64_t(s->tokens.size()) >= engine_.max_model_len()) {
    u.finish = SeqFinish::Length;
  }
  if (s->want_prompt_logprobs && !s->prompt_logprobs_sent) {
    s->prompt_logprobs_sent = true;
    u.prompt_logprobs = &s->prompt_logprobs;
  }
  const auto now = Clock::now();
  if (!r->has_first_token) {
    r->has_first_token = true;
    r->first_token = now;
  }
  r->last_token = now;
  const bool observer_stop = r->observer->on_update(u);
  if (u.finish != SeqFinish::None || observer_stop) {
    finish_sequence(s, SeqFinish::None);
    return true;
  }
  return false;
}

int64_t Scheduler::spec_context_window() const {
  const int64_t reach = opt_.drafter->config().context_reach();
  return reach > 0 ? reach : engine_.max_model_len();
}

void Scheduler::plan_drafts() {
  std::vector<Sequence*> eligible;
  std::vector<int> caps;
  for (Sequence* s : running_) {
    s->n_verify = 0;
    const int64_t len = s->session->length();
    if (s->all_rows() || s->observed || len + 1 != int64_t(s->tokens.size()) || s->draft->next_pos != len) continue;
    const int64_t left = s->req->r.max_tokens - s->generated() - 1;  // the bonus always comes
    const int64_t room = engine_.max_model_len() - int64_t(s->tokens.size());
    const int cap = int(std::min<int64_t>({spec_k_, left, room}));
    if (cap < 1) continue;
    eligible.push_back(s);
    caps.push_back(cap);
  }
  if (eligible.empty()) return;
  const auto t0 = Clock::now();
  std::vector<std::vector<float>> conf;
  for (Sequence* s : eligible) {
    const SamplingConfig& sc = s->sampler.config();
    DraftSampling ds;
    ds.probabilistic = opt_.speculative.draft_sample_method == DraftSampleMethod::Probabilistic && !s->sampler.greedy();
    ds.temperature = sc.temperature;
    ds.top_k = sc.top_k;
    ds.top_p = sc.top_p;
    ds.seed = sc.seed.value_or(0);
    const int64_t anchor_pos = s->session->length();
    opt_.drafter->draft(*s->draft, s->tokens.back(), anchor_pos, ds, &s->block);
    conf.push_back(s->block.confidence);
  }
  const double drafting = seconds(Clock::now() - t0);
  local_.spec.draft_seconds += drafting;
  draft_seconds_ = draft_seconds_ == 0 ? drafting : 0.8 * draft_seconds_ + 0.2 * drafting;
  std::vector<int> width = caps;
  if (opt_.speculative.enable_adaptive_verification) {
    const int64_t others = int64_t(running_.size()) - int64_t(eligible.size());
    width = pick_widths(conf, caps, others, step_cost_, draft_seconds_);
  }
  for (size_t i = 0; i < eligible.size(); ++i) {
    Sequence* s = eligible[i];
    s->n_verify = width[i];
    s->verify.assign(1, s->tokens.back());
    s->verify.insert(s->verify.end(), s->block.tokens.begin(), s->block.tokens.begin() + width[i]);
  }
}

void Scheduler::measure_step_costs(int64_t max_rows) {
  // One fresh session per width over a short uncomputed context; the median
  // of three steps each (the first run of a width warms it).
  std::vector<int32_t> tokens(size_t(max_rows), 0);
  step_cost_.seconds.clear();
  for (int64_t rows = 1; rows <= max_rows; ++rows) {
    std::vector<double> t;
    for (int rep = 0; rep < 4; ++rep) {
      auto s = engine_.new_session();
      if (!s.ok() || !(*s)->extend_uncomputed(64).ok()) return;
      StepItem it{s->get(), std::span<const int32_t>(tokens).first(size_t(rows)), LogitsWanted::All};
      const auto a = Clock::now();
      if (!engine_.step(std::span<const StepItem>(&it, 1)).ok()) return;
      if (rep > 0) t.push_back(seconds(Clock::now() - a));
      step_cost_.observe_experts(rows, engine_.distinct_experts(), rep == 1 ? 1.0 : 0.5);
    }
    std::sort(t.begin(), t.end());
    step_cost_.seconds.push_back(t[t.size() / 2]);
  }
  step_cost_.finish();
  std::string table;
  for (size_t i = 0; i < step_cost_.seconds.size(); ++i)
    if (i < 9 || i + 1 == step_cost_.seconds.size())
      table += " " + std::to_string(i + 1) + ":" + std::to_string(int64_t(step_cost_.seconds[i] * 1e6)) + "us" +
               (i < step_cost_.distinct_experts.size()
                    ? "/" + std::to_string(step_cost_.distinct_experts[i]).substr(0, 4) + "e"
                    : "");
  LOG_INFO("speculative decoding: step cost by rows (time/distinct experts per MoE layer)%s", table.c_str());
}

void Scheduler::log_spec_stats(bool force) {
  const auto now = Clock::now();
  if (!force && now - spec_logged_ < std::chrono::seconds(10)) return;
  const SpecDecodeStats& a = local_.spec;
  const SpecDecodeStats& b = spec_logged_stats_;
  spec_logged_ = now;
  if (a.drafts == b.drafts) return;
  const double drafts = double(a.drafts - b.drafts), accepted = double(a.accepted_tokens - b.accepted_tokens);
  const double proposed = double(a.draft_tokens - b.draft_tokens);
  std::string per_pos;
  for (size_t i = 0; i < a.accepted_per_pos.size(); ++i)
    per_pos += (i ? ", " : "") +
               std::to_string(double(a.accepted_per_pos[i] - (i < b.accepted_per_pos.size() ? b.accepted_per_pos[i] : 0)) / drafts).substr(0, 5);
  LOG_INFO("SpecDecoding metrics: Mean acceptance length: %.2f, Accepted: %.0f tokens, Drafted: %.0f tokens, "
           "Draft acceptance rate: %.1f%%, Per-position acceptance rate: %s",
           1.0 + accepted / drafts, accepted, proposed, proposed > 0 ? 100.0 * accepted / proposed : 0.0, per_pos.c_str());
  spec_logged_stats_ = a;
}

void Scheduler::publish_stats() {
  SchedulerStats s = local_;
  for (const auto& r : requests_) {
    if (r->completed) continue;
    bool running = false;
    for (const auto& q : r->seqs) running |= q->session != nullptr;
    ++(running ? s.requests_running : s.requests_waiting);
  }
  s.sequences_running = int64_t(running_.size());
  s.sequences_waiting = int64_t(waiting_.size());
  const KvCache& kv = engine_.kv_cache();
  s.kv_usage = double(kv.used_pages()) / double(std::max<int64_t>(1, kv.total_pages()));
  s.prefix_cache_queries = kv.counters().queries;
  s.prefix_cache_hits = kv.counters().hits;
  std::lock_guard lock(mu_);
  stats_ = s;
}

}  // namespace muse
