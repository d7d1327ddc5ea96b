// TokenCollector: a RequestObserver that keeps a single-choice request's
// sampled token ids (and their logprobs, when the request asks for them) and
// lets the caller wait for the request to finish. What callers that drive the
// Scheduler directly need (muse bench's speculative mode, the engine and
// speculative-decoding tests); the server's observer is engine_service.cc's.
#pragma once

#include <chrono>
#include <condition_variable>
#include <mutex>
#include <vector>

#include "muse/engine/scheduler.h"

namespace muse {

class TokenCollector : public RequestObserver {
 public:
  bool on_update(const SequenceUpdate& u) override {
    std::lock_guard lock(mu_);
    if (u.token) tokens.push_back(u.token->id);
    if (u.token && u.token->has_logprobs) logprobs.push_back(u.token->logprob);
    return false;
  }
  void on_complete(const RequestSummary& s) override {
    std::lock_guard lock(mu_);
    summary = s;
    done_ = true;
    cv_.notify_all();
  }
  // For a request the scheduler refused: no on_complete will come.
  void finish_without_running() {
    std::lock_guard lock(mu_);
    done_ = true;
    cv_.notify_all();
  }
  // True once the request has finished; false when `limit` passed first.
  bool wait(std::chrono::milliseconds limit = std::chrono::minutes(5)) {
    std::unique_lock lock(mu_);
    return cv_.wait_for(lock, limit, [&] { return done_; });
  }

  // Read after wait() returned true.
  std::vector<int32_t> tokens;
  std::vector<float> logprobs;
  RequestSummary summary;

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool done_ = false;
};

}  // namespace muse
