// The hybrid KV cache (muse-architecture.md §3.3, §4): one pool of pages
// serves both layer kinds.
//
// Pages. A page holds `block_size` positions of K and V for `page_layers`
// layers of one kind (the smaller kind's layer count, so a page is never
// mostly empty; vLLM groups hybrid layers the same way). A logical block of
// a kind (block_size positions of every layer of that kind) is
// `pages_per_block(kind)` pages: layer i of a kind lives in page i /
// page_layers of the block, slot i % page_layers. Pages are taken from one
// free list whatever their kind, so memory moves between kinds as needed.
//
// Full layers keep every block of a sequence. Sliding layers keep only the
// blocks that can still be read, plus a rollback margin: after a step a
// sequence of length n holds the sliding blocks covering
// [keep_from(n), n), keep_from(n) = max(0, n - window + 1 - max_rollback);
// older ones are released (to the prefix cache when hashed). Memory per
// sequence grows with its length (full layers) and is bounded by
// window + max_rollback for sliding ones, never with max_model_len.
//
// Rollback. Session::truncate(m) is always possible for m >= n - max_rollback
// (the sliding blocks needed to continue at m, [m - window + 1, m), are still
// held). Further back it works when those blocks are still held (an error
// otherwise, nothing changed).
//
// Prefix caching. A complete logical block j has a chain hash over
// (hash of block j-1, j, its tokens); its pages are registered under (chain
// hash, kind, page index) once the sequence is max_rollback positions past
// the block's end (so a rollback never rewrites a registered page), and
// when the sequence closes (preemption included). Pages are reference
// counted; a page nobody holds but whose hash is registered stays cached,
// least recently released first to be evicted when the free list is empty.
// A prefix of B tokens (B a multiple of block_size) is reusable only when
// every layer kind has what continuing at B needs: every full block below B
// and the sliding blocks covering [max(0, B - window + 1), B), each with all
// its pages. Bookkeeping uses fixed arrays allocated at creation (an
// open-addressing hash table, intrusive LRU lists): a step allocates nothing.
#pragma once

#include <cstdint>
#include <memory>
#include <array>
#include <optional>
#include <span>
#include <vector>

#include "muse/backends/backend.h"
#include "muse/kv/kv_geometry.h"
#include "muse/model/config.h"

namespace muse {

struct KvCacheOptions {
  int64_t max_sequences = 1;  // sequences alive at once
  int64_t num_pages = 0;      // pages in the pool, both kinds
  int64_t block_size = 64;    // positions per block
  int64_t max_rollback = 16;  // positions truncate can always drop (sliding layers keep them)
  int64_t max_blocks_per_sequence = 0;  // logical blocks of one sequence (table capacity reserved up front)
  int64_t max_step_rows = 1;            // rows of one step (sliding table capacity)
  bool prefix_caching = false;
  std::optional<DType> dtype;  // storage dtype; default: the backend's kv_dtype()
  // Per layer {k_scale, v_scale} of an F8 cache (stored = fp8(x / scale));
  // empty or shorter than the layers: 1.0. Other dtypes ignore them.
  std::vector<std::array<float, 2>> layer_scales;
};

// One sequence's place in the cache.
struct SequenceKv {
  bool open = false;
  std::vector<int32_t> full;     // pages of full blocks 0.., full_pages_per_block each
  std::vector<int32_t> sliding;  // pages of sliding blocks sliding_first.., -1 where not kept
  int64_t sliding_first = 0;     // logical block of sliding[0]
  int64_t length = 0;            // positions written
  std::vector<uint64_t> hashes;  // chain hash of each complete block
  int64_t registered = 0;        // blocks [0, registered) were offered to the prefix cache
  int64_t cached_tokens = 0;     // positions adopted from the prefix cache at open
};

struct PrefixMatch {
  int64_t tokens = 0;  // positions reusable (a multiple of block_size)
  int64_t revived = 0; // cached pages nobody holds that adopting them takes out of the evictable set
};

struct PrefixCacheCounters {
  uint64_t queries = 0, hits = 0;  // tokens looked up, tokens found (vLLM's meaning)
  uint64_t evictions = 0;          // pages evicted
};

class KvCache {
 public:
  static Result<std::unique_ptr<KvCache>> create(Backend& backend, const ModelConfig& config,
                                                 const KvCacheOptions& options);
  ~KvCache();
  KvCache(const KvCache&) = delete;
  KvCache& operator=(const KvCache&) = delete;

  // One entry per layer (all views of the one pool).
  std::span<const KvLayerStorage> layers() const { return layers_; }
  const KvGeometry& geometry() const { return geo_; }
  DType dtype() const { return dtype_; }
  int64_t window() const { return geo_.window; }
  int64_t block_size() const { return geo_.block_size; }
  int64_t max_rollback() const { return geo_.max_rollback; }
  int64_t max_sequences() const { return options_.max_sequences; }
  bool prefix_caching() const { return options_.prefix_caching; }
  int64_t total_pages() const { return int64_t(pages_.size()); }
  int64_t free_pages() const { return free_count_; }          // on the free list
  int64_t cached_pages() const { return lru_count_; }         // held by nobody, hashed: evictable
  int64_t available_pages() const { return free_count_ + lru_count_; }
  int64_t used_pages() const { return total_pages() - available_pages(); }
  int64_t free_sequences() const { return options_.max_sequences - open_sequences_; }
  uint64_t bytes() const { return bytes_; }
  const PrefixCacheCounters& counters() const { return counters_; }
  // Pages one sequence of `length` positions needs at most (its steady
  // state plus one step's transient).
  int64_t pages_for_sequence(int64_t length) const { return geo_.pages_for(length) + step_transient_pages(); }
  int64_t step_transient_pages() const { return geo_.step_transient_pages(options_.max_step_rows); }

  // The longest reusable prefix of `tokens`, at most `max_tokens` (no change).
  PrefixMatch match(std::span<const int32_t> tokens, int64_t max_tokens) const;
  // A new sequence; with prefix caching, adopts the longest reusable prefix
  // of `tokens` up to `max_cached` positions (the caller then continues at
  // seq.length). Counts the query. An error when max_sequences are open.
  Result<SequenceKv> open_sequence(std::span<const int32_t> tokens = {}, int64_t max_cached = 0);
  // Offers the complete blocks to the prefix cache (`tokens`: the sequence's
  // tokens, at least seq.length) and releases every page.
  void close_sequence(SequenceKv& seq, std::span<const int32_t> tokens);
  // Pages reserve(seq, new_length) would take.
  int64_t pages_to_grow(const SequenceKv& seq, int64_t new_length) const;
  // ... for a sequence opened on `m` (before it is opened).
  int64_t pages_to_grow(const PrefixMatch& m, int64_t new_length) const;
  // Takes the pages positions [seq.length, new_length) are written to (the
  // sliding blocks that will be kept only); evicts cached pages when the free
  // list runs out. An error, nothing changed, when too few are available.
  Status reserve(SequenceKv& seq, int64_t new_length);
  // After a step wrote up to `tokens.size()` positions: records the new
  // length, registers blocks max_rollback behind, releases sliding blocks
  // below keep_from.
  void advance(SequenceKv& seq, std::span<const int32_t> tokens);
  // Whether truncate(seq, m) would succeed.
  bool can_truncate(const SequenceKv& seq, int64_t m, std::string* why = nullptr) const;
  // Drops positions [m, length) of every layer kind; an error, nothing changed, when it cannot.
  Status truncate(SequenceKv& seq, int64_t m);

 private:
  enum Kind : int32_t { kFull = 0, kSliding = 1 };
  struct Page {
    int32_t ref = 0;
    bool hashed = false;
    int32_t kind = 0, group = 0;
    int64_t block = 0;        // logical block index
    uint64_t chain = 0, parent = 0;
    int32_t prev = -1, next = -1;  // LRU list (ref == 0 && hashed) or free list
  };

  KvCache(Backend& backend, const KvCacheOptions& options) : backend_(backend), options_(options) {}
  int64_t grow(int64_t length, int64_t full_blocks, int64_t slide_end, int64_t new_length) const;
  int32_t take_page();                  // free list first, then the LRU head; -1 if none
  void drop_page(int32_t page);         // one reference fewer
  void hold_page(int32_t page);         // one reference more (revives a cached page)
  void list_push(int32_t& head, int32_t& tail, int32_t page);
  void list_remove(int32_t& head, int32_t& tail, int32_t page);
  uint64_t key(uint64_t chain, int32_t kind, int32_t group) const;
  int32_t lookup(uint64_t chain, uint64_t parent, int64_t block, int32_t kind, int32_t group,
                 std::span<const int32_t> tokens) const;
  void insert_hash(int32_t page);
  void erase_hash(int32_t page);
  bool block_cached(uint64_t chain, uint64_t parent, int64_t block, int32_t kind, std::span<const int32_t> tokens,
                    int64_t* revived) const;
  void hash_blocks(SequenceKv& seq, std::span<const int32_t> tokens, int64_t upto_blocks) const;
  void register_blocks(SequenceKv& seq, std::span<const int32_t> tokens, int64_t upto_blocks);
  int32_t* sliding_pages(SequenceKv& seq, int64_t block);
  void release_sliding_below(SequenceKv& seq, int64_t block);

  Backend& backend_;
  KvCacheOptions options_;
  KvGeometry geo_;
  DType dtype_ = DType::F32;
  uint64_t bytes_ = 0;
  Tensor pool_k_, pool_v_;
  std::vector<KvLayerStorage> layers_;
  std::vector<Page> pages_;
  std::vector<int32_t> page_tokens_;  // block_size tokens per hashed page (verification)
  int32_t free_head_ = -1, free_tail_ = -1, lru_head_ = -1, lru_tail_ = -1;
  int64_t free_count_ = 0, lru_count_ = 0;
  std::vector<int32_t> table_;  // open addressing, linear probing; -1 empty
  uint64_t table_mask_ = 0;
  int64_t open_sequences_ = 0;
  PrefixCacheCounters counters_;
};


}  // namespace muse
