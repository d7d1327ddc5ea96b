// A small fixed pool of threads for the per-request work that can be long
// (JSON parsing, validation, chat-template rendering, tokenizing), so that
// the I/O thread, which serves /health and every running stream, never waits
// on it. Bounded: a full queue refuses new work (the caller answers 503)
// instead of buffering it.
#pragma once

#include <condition_variable>
#include <deque>
#include <functional>
#include <mutex>
#include <thread>
#include <vector>

namespace muse::server {

class RequestPool {
 public:
  RequestPool(int threads, size_t max_queued);
  ~RequestPool();  // finishes the running tasks, drops the queued ones, joins
  RequestPool(const RequestPool&) = delete;
  RequestPool& operator=(const RequestPool&) = delete;

  // Thread-safe. False when max_queued tasks are already waiting.
  bool try_submit(std::function<void()> task);
  size_t queued() const;

 private:
  void run();
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::function<void()>> queue_;
  size_t max_queued_;
  bool stopping_ = false;
  std::vector<std::thread> threads_;
};

}  // namespace muse::server
