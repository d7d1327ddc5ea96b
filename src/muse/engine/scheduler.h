// The engine loop: a request queue and a continuous-batching scheduler on its
// own thread, driving one Engine.
//
// Each request has n sequences (choices) that share the prompt; each sequence
// is scheduled on its own. Every iteration builds one Engine::step:
//   1. running sequences first, in admission order: a decode token, or the
//      next chunk of a prompt (chunked prefill) or of a recompute; a sequence
//      whose chunk needs more KV blocks than are free preempts the most
//      recently admitted running sequence (its KV is freed; it waits at the
//      front of the queue and is recomputed from its tokens later), possibly
//      itself;
//   2. then, if nothing was preempted, waiting sequences in arrival order
//      while a sequence slot (--max-num-seqs), token budget
//      (--max-num-batched-tokens) and KV pages for their first chunk remain;
//      with prefix caching a sequence starts after the longest cached prefix
//      of its tokens (a preempted one usually finds its own blocks again),
//      and choices 1.. of a request wait until choice 0 has computed the
//      prompt, so that they reuse it.
// A sequence whose last fed chunk ends at its last token gets logits, samples
// one token, and is checked for stops. Cancellation is applied at the start
// of every iteration, so it takes effect within one step.
//
// Determinism: the CPU kernels are batch- and chunk-invariant and each
// sequence owns its sampler (and RNG), so a request's tokens do not depend on
// what else runs, nor on preemption.
#pragma once

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <thread>
#include <unordered_set>
#include <vector>

#include "muse/engine/engine.h"
#include "muse/engine/generation_request.h"
#include "muse/engine/speculation.h"
#include "muse/sampling/sequence_sampler.h"

namespace muse {

struct SchedulerOptions {
  std::vector<int32_t> eos_token_ids;  // stop unless ignore_eos
  int64_t sampled_vocab_size = 0;      // ids >= this are never sampled (0: the model's)
  LogprobsMode logprobs_mode = LogprobsMode::Processed;
  int64_t max_waiting_requests = 4096;  // beyond this, submit() says Overloaded
  int64_t max_logit_rows = 256;         // rows per sequence per step when every row's logits are needed
  // Speculative decoding (engine/speculation.h), when speculative.enabled:
  // the drafter (its target layers tapped by the engine: EngineOptions::
  // tap_layers) drafts a block per decoding sequence and one target step
  // verifies it. Greedy output is bitwise the same as without it.
  SpeculativeConfig speculative;
  std::shared_ptr<const Drafter> drafter;
};

enum class SeqFinish { None, Stop, Length, Abort, Error };

struct PromptTokenLogprob {
  int32_t id = 0;
  float logprob = 0;  // NaN for the first prompt token
  std::vector<TokenLogprobEntry> top;
};

// One sequence, one step.
struct SequenceUpdate {
  int index = 0;
  std::optional<SampledToken> token;  // absent on Abort/Error finishes
  SeqFinish finish = SeqFinish::None; // the engine's verdict (EOS, stop id, length)
  std::optional<int32_t> stop_token;  // set when a stop_token_ids entry (not EOS) stopped it
  int64_t generated = 0;              // tokens generated so far, this one included
  const std::vector<PromptTokenLogprob>* prompt_logprobs = nullptr;  // first update only, when asked
};

struct RequestSummary {
  int64_t prompt_tokens = 0;
  int64_t cached_tokens = 0;  // prompt positions the first admission took from the prefix cache
  std::vector<int64_t> completion_tokens;  // per choice
  double queue_seconds = 0, prefill_seconds = 0, decode_seconds = 0;
  int64_t preemptions = 0;
  std::string error;
};

// Receives one request's updates, on the scheduler thread (keep it quick).
class RequestObserver {
 public:
  virtual ~RequestObserver() = default;
  // Returns true to end this sequence now (e.g. a stop string matched); the
  // observer then reports the finish itself. Not called again for it after a
  // finish or a true return.
  virtual bool on_update(const SequenceUpdate& update) = 0;
  // Exactly once, after the last update of every sequence.
  virtual void on_complete(const RequestSummary& summary) = 0;
};

struct SchedulerStats {
  int64_t requests_running = 0, requests_waiting = 0;
  int64_t sequences_running = 0, sequences_waiting = 0;
  double kv_usage = 0;  // 0..1: KV pages held by sequences (cached, evictable ones not counted)
  uint64_t prefix_cache_queries = 0, prefix_cache_hits = 0;  // tokens looked up, tokens found
  uint64_t steps = 0, preemptions = 0;
  uint64_t prompt_tokens_computed = 0, tokens_generated = 0;
  double busy_seconds = 0;   // iterations with work, end to end
  double model_seconds = 0;  // inside Engine::step
  SpecDecodeStats spec;      // speculative decoding (all zero without a drafter)
};

class Scheduler {
 public:
  enum class SubmitStatus { Ok, Invalid, Overloaded, Stopped };
  struct SubmitResult {
    SubmitStatus status = SubmitStatus::Ok;
    std::string message;
  };

  Scheduler(Engine& engine, SchedulerOptions options);
  ~Scheduler();  // aborts what is left (observers get Abort and on_complete)
  Scheduler(const Scheduler&) = delete;
  Scheduler& operator=(const Scheduler&) = delete;

  // Checks what depends on the engine (prompt ids in the vocabulary, n,
  // context, KV pages) and queues; on anything but Ok nothing was queued and
  // the observer is never called. Thread-safe.
  SubmitResult submit(GenerationRequest request, std::shared_ptr<RequestObserver> observer);
  // Ends a request within one step (unknown or finished ids are ignored);
  // its observer still gets Abort updates and on_complete. Thread-safe.
  void cancel(const std::string& request_id);
  SchedulerStats stats() const;
  // Aborts everything and stops the thread (also done by the destructor).
  void stop();

  const Engine& engine() const { return engine_; }
  int64_t sampled_vocab_size() const { return sampled_vocab_; }

 private:
  struct Request;
  struct Sequence;

  void run();
  bool take_incoming(std::vector<std::unique_ptr<Request>>& fresh, std::unordered_set<std::string>& cancels, bool block);
  void admit(std::unique_ptr<Request> req);
  void apply_cancels(const std::unordered_set<std::string>& cancels);
  void iterate();
  void preempt(Sequence* s);
  // Speculation: drafts a block for each decoding sequence that can take one
  // and sets its verify width (fixed, or adaptive from the confidences).
  void plan_drafts();
  // Start-up: the cost of a target step of 1..max rows (for adaptive widths).
  void measure_step_costs(int64_t max_rows);
  // Reports one generated token (already accept()ed by its sampler); true
  // when the sequence finished.
  bool emit(Sequence* s, SampledToken token);
  void log_spec_stats(bool force);
  int64_t spec_context_window() const;  // context positions a draft block reads
  void finish_sequence(Sequence* s, SeqFinish why, const std::string& error = "");
  void release(Sequence* s);
  void complete_if_done(Request* r);
  void abort_all(const std::string& error);
  void publish_stats();

  Engine& engine_;
  SchedulerOptions opt_;
  int64_t sampled_vocab_ = 0;
  int64_t max_seqs_ = 0, max_tokens_per_step_ = 0;

  // Shared with submitters.
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::vector<std::unique_ptr<Request>> incoming_;
  std::unordered_set<std::string> cancel_ids_;
  bool stopping_ = false;
  int64_t queued_requests_ = 0;  // submitted, not yet scheduled (nor finished): for Overloaded
  SchedulerStats stats_;         // published under mu_

  // Scheduler thread only.
  std::vector<std::unique_ptr<Request>> requests_;  // alive, arrival order
  std::deque<Sequence*> waiting_;
  std::vector<Sequence*> running_;
  uint64_t next_arrival_ = 0;
  SchedulerStats local_;
  bool spec_ = false;        // speculative decoding on
  int spec_k_ = 0;           // most drafts verified per step
  StepCostModel step_cost_;  // adaptive verification's cost table
  double draft_seconds_ = 0; // EMA of drafting one block
  std::chrono::steady_clock::time_point spec_logged_;
  SpecDecodeStats spec_logged_stats_;

  std::thread thread_;
};

}  // namespace muse
