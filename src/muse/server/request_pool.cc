#include "muse/server/request_pool.h"

#include <exception>

#include "muse/core/log.h"

namespace muse::server {

RequestPool::RequestPool(int threads, size_t max_queued) : max_queued_(max_queued) {
  for (int i = 0; i < std::max(1, threads); ++i) threads_.emplace_back([this] { run(); });
}

RequestPool::~RequestPool() {
  {
    std::lock_guard lock(mu_);
    stopping_ = true;
    queue_.clear();
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

bool RequestPool::try_submit(std::function<void()> task) {
  {
    std::lock_guard lock(mu_);
    if (stopping_ || queue_.size() >= max_queued_) return false;
    queue_.push_back(std::move(task));
  }
  cv_.notify_one();
  return true;
}

size_t RequestPool::queued() const {
  std::lock_guard lock(mu_);
  return queue_.size();
}

void RequestPool::run() {
  for (;;) {
    std::function<void()> task;
    {
      std::unique_lock lock(mu_);
      cv_.wait(lock, [this] { return stopping_ || !queue_.empty(); });
      if (stopping_) return;
      task = std::move(queue_.front());
      queue_.pop_front();
    }
    // Tasks catch their own errors (and answer 500); this only keeps the
    // worker alive should one slip through.
    try {
      task();
    } catch (const std::exception& e) {
      LOG_ERROR("request pool: a task threw: %s", e.what());
    } catch (...) {
      LOG_ERROR("request pool: a task threw an unknown exception");
    }
  }
}

}  // namespace muse::server
