#include "muse/parallel/in_process.h"

#include <cstring>
#include <string>

namespace muse {
namespace {

// State shared by the ranks of one group.
struct Shared {
  explicit Shared(int n) : n(n), send(size_t(n)), recv(size_t(n)) {}
  const int n;
  std::mutex mu;
  std::condition_variable cv;
  int arrived = 0;
  uint64_t generation = 0;
  bool aborted = false;
  std::vector<const void*> send;  // each rank's posted buffer
  std::vector<void*> recv;

  // Every rank arrives before any leaves; false once the group is aborted.
  bool barrier() {
    std::unique_lock<std::mutex> lock(mu);
    if (aborted) return false;
    const uint64_t gen = generation;
    if (++arrived == n) {
      arrived = 0;
      ++generation;
      cv.notify_all();
      return true;
    }
    cv.wait(lock, [&] { return generation != gen || aborted; });
    return !aborted;
  }
  void abort() {
    std::lock_guard<std::mutex> lock(mu);
    aborted = true;
    cv.notify_all();
  }
};

class InProcessCommunicator final : public Communicator {
 public:
  InProcessCommunicator(std::shared_ptr<Shared> s, int rank) : s_(std::move(s)), rank_(rank) {}
  int rank() const override { return rank_; }
  int size() const override { return s_->n; }
  std::string name() const override { return "in-process (" + std::to_string(s_->n) + " ranks)"; }
  void abort() override { s_->abort(); }

  Status all_reduce_sum(void* data, int64_t count, DType dtype, void*) override {
    if (dtype != DType::F32) return make_error("in-process all_reduce_sum: F32 only");
    const int n = s_->n;
    if (scratch_.size() < size_t(count)) scratch_.resize(size_t(count));  // grows once, then reused
    s_->send[size_t(rank_)] = data;
    if (!s_->barrier()) return aborted();
    // The same order on every rank (rank 0 first), so every rank gets the same bits.
    float* acc = scratch_.data();
    std::memcpy(acc, s_->send[0], size_t(count) * 4);
    for (int r = 1; r < n; ++r) {
      const float* x = static_cast<const float*>(s_->send[size_t(r)]);
      for (int64_t i = 0; i < count; ++i) acc[i] += x[i];
    }
    if (!s_->barrier()) return aborted();  // everyone has read every input
    std::memcpy(data, acc, size_t(count) * 4);
    count_traffic(traffic_.all_reduce, 2 * uint64_t(count) * 4 * uint64_t(n - 1) / uint64_t(n));
    return Status::Ok();
  }

  Status all_gather(const void* send, void* recv, int64_t count, DType dtype, void*) override {
    const size_t bytes = size_t(count) * size_t(dtype_bits(dtype)) / 8;
    s_->send[size_t(rank_)] = send;
    if (!s_->barrier()) return aborted();
    for (int r = 0; r < s_->n; ++r)
      std::memcpy(static_cast<char*>(recv) + size_t(r) * bytes, s_->send[size_t(r)], bytes);
    if (!s_->barrier()) return aborted();
    count_traffic(traffic_.all_gather, uint64_t(bytes) * uint64_t(s_->n - 1));
    return Status::Ok();
  }

  Status all_to_all(const void* send, void* recv, int64_t count, DType dtype, void*) override {
    const size_t bytes = size_t(count) * size_t(dtype_bits(dtype)) / 8;
    s_->send[size_t(rank_)] = send;
    if (!s_->barrier()) return aborted();
    for (int r = 0; r < s_->n; ++r)
      std::memcpy(static_cast<char*>(recv) + size_t(r) * bytes,
                  static_cast<const char*>(s_->send[size_t(r)]) + size_t(rank_) * bytes, bytes);
    if (!s_->barrier()) return aborted();
    count_traffic(traffic_.all_to_all, uint64_t(bytes) * uint64_t(s_->n - 1));
    return Status::Ok();
  }

 private:
  static Status aborted() { return make_error(std::string(kAbortedMark) + ": another rank failed"); }
  void count_traffic(uint64_t& into, uint64_t bytes) {
    into += bytes;
    ++traffic_.calls;
  }
  std::shared_ptr<Shared> s_;
  int rank_;
  std::vector<float> scratch_;
};

}  // namespace

std::vector<std::unique_ptr<Communicator>> make_in_process_group(int ranks) {
  auto shared = std::make_shared<Shared>(ranks);
  std::vector<std::unique_ptr<Communicator>> out;
  for (int r = 0; r < ranks; ++r) out.push_back(std::make_unique<InProcessCommunicator>(shared, r));
  return out;
}

RankRunner::RankRunner(int ranks) : n_(ranks), results_(size_t(ranks)) {
  for (int r = 1; r < ranks; ++r) threads_.emplace_back([this, r] { worker(r); });
}

RankRunner::~RankRunner() {
  {
    std::lock_guard<std::mutex> lock(mu_);
    stop_ = true;
  }
  cv_.notify_all();
  for (auto& t : threads_) t.join();
}

void RankRunner::worker(int rank) {
  uint64_t seen = 0;
  for (;;) {
    std::unique_lock<std::mutex> lock(mu_);
    cv_.wait(lock, [&] { return stop_ || job_ != seen; });
    if (stop_) return;
    seen = job_;
    auto call = call_;
    void* fn = fn_;
    lock.unlock();
    Status s = call(fn, rank);
    lock.lock();
    results_[size_t(rank)] = std::move(s);
    if (--pending_ == 0) cv_.notify_all();
  }
}

Status RankRunner::run_erased(Status (*call)(void*, int), void* fn) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    call_ = call, fn_ = fn;
    pending_ = n_ - 1;
    ++job_;
  }
  cv_.notify_all();
  results_[0] = call(fn, 0);
  std::unique_lock<std::mutex> lock(mu_);
  cv_.wait(lock, [&] { return pending_ == 0; });
  for (auto& r : results_)
    if (!r.ok()) return r;
  return Status::Ok();
}

}  // namespace muse
