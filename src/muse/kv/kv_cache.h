// The hybrid KV cache (muse-architecture.md §3.3, §4): sliding-window
// layers keep a ring of exactly `sliding_window` positions per sequence;
// full-attention layers keep every position in fixed-size blocks, found
// through a per-sequence block table (one table serves every full layer:
// block b is row b of each full layer's pool). Storage is backend memory
// (KvLayerStorage); this class owns only the bookkeeping, which is what the
// scheduler needs for admission, paging and preemption.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <vector>

#include "muse/backends/backend.h"
#include "muse/model/config.h"

namespace muse {

struct KvCacheOptions {
  int64_t max_sequences = 1;  // ring slots (sequences alive at once)
  int64_t num_blocks = 0;     // full-layer blocks shared by all sequences
  int64_t block_size = 64;    // positions per block
  int64_t max_blocks_per_sequence = 0;  // block-table capacity reserved per sequence (0: grow)
};

// Free block ids. Lowest id first, so allocation is deterministic.
class BlockAllocator {
 public:
  explicit BlockAllocator(int64_t num_blocks = 0);
  int64_t capacity() const { return capacity_; }
  int64_t free_count() const { return int64_t(free_.size()); }
  std::optional<int32_t> allocate();
  void release(int32_t block);

 private:
  int64_t capacity_ = 0;
  std::vector<int32_t> free_;  // kept sorted descending: back() is the lowest id
};

// One sequence's place in the cache.
struct SequenceKv {
  int32_t ring_slot = -1;
  std::vector<int32_t> blocks;  // covers [0, blocks.size() * block_size)
  int64_t length = 0;           // positions written
};

class KvCache {
 public:
  static Result<std::unique_ptr<KvCache>> create(Backend& backend, const ModelConfig& config,
                                                 const KvCacheOptions& options);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // One entry per layer (rings for sliding layers, pools for full layers).
  std::span<const KvLayerStorage> layers() const { return layers_; }
  int64_t window() const { return window_; }
  int64_t block_size() const { return options_.block_size; }
  int64_t max_sequences() const { return options_.max_sequences; }
  int64_t free_blocks() const { return blocks_.free_count(); }
  int64_t total_blocks() const { return blocks_.capacity(); }
  int64_t free_sequences() const { return int64_t(free_slots_.size()); }
  bool has_full_layers() const { return has_full_; }
  uint64_t bytes() const { return bytes_; }
  // Blocks a sequence of `length` positions needs.
  int64_t blocks_for(int64_t length) const;

  // A new, empty sequence (takes a ring slot); an error when all are in use.
  Result<SequenceKv> open_sequence();
  // Returns the sequence's ring slot and blocks.
  void close_sequence(SequenceKv& seq);
  // Grows the block table to hold `length` positions; an error (and no
  // change) when the pool has too few free blocks.
  Status reserve(SequenceKv& seq, int64_t length);

 private:
  KvCache(Backend& backend, const KvCacheOptions& options) : backend_(backend), options_(options) {}

  Backend& backend_;
  KvCacheOptions options_;
  int64_t window_ = 0;
  bool has_full_ = false;
  uint64_t bytes_ = 0;
  std::vector<KvLayerStorage> layers_;
  BlockAllocator blocks_;
  std::vector<int32_t> free_slots_;  // descending; back() is the lowest
};

}  // namespace muse
