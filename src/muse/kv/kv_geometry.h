// The KV pool's arithmetic (kv_cache.h describes the pool): page size, the
// pages a sequence holds at a given length, how many tokens a pool holds.
// Header-only and free of backends, so that the engine, the server's sizing
// and `muse plan` compute the same numbers from the same code.
#pragma once

#include <algorithm>
#include <cstdint>

#include "muse/model/config.h"

namespace muse {

// Positions Session::truncate can always drop (EngineOptions::kv_max_rollback's default).
inline constexpr int64_t kDefaultKvMaxRollback = 16;

struct KvGeometry {
  int64_t block_size = 64, window = 0, max_rollback = 0;
  int64_t full_layers = 0, sliding_layers = 0;
  int64_t page_layers = 1;  // layers per page: the smaller kind's count
  int64_t full_pages_per_block = 0, sliding_pages_per_block = 0;
  int64_t kv_dim = 0;
  int64_t bytes_per_value = 4;

  static KvGeometry of(const ModelConfig& config, int64_t block_size, int64_t max_rollback, int64_t bytes_per_value) {
    KvGeometry g;
    g.block_size = block_size;
    g.window = config.sliding_window;
    g.max_rollback = max_rollback;
    g.full_layers = config.num_full_layers();
    g.sliding_layers = config.num_sliding_layers();
    g.kv_dim = config.kv_dim();
    g.bytes_per_value = bytes_per_value;
    if (g.full_layers > 0 && g.sliding_layers > 0) g.page_layers = std::min(g.full_layers, g.sliding_layers);
    else g.page_layers = std::max<int64_t>(1, std::max(g.full_layers, g.sliding_layers));
    g.full_pages_per_block = (g.full_layers + g.page_layers - 1) / g.page_layers;
    g.sliding_pages_per_block = (g.sliding_layers + g.page_layers - 1) / g.page_layers;
    return g;
  }
  int64_t page_bytes() const { return 2 * page_layers * block_size * kv_dim * bytes_per_value; }
  int64_t blocks_covering(int64_t length) const { return (length + block_size - 1) / block_size; }
  // First position a sequence of `length` keeps in its sliding layers.
  int64_t keep_from(int64_t length) const { return std::max<int64_t>(0, length - window + 1 - max_rollback); }
  // Pages a sequence of `length` holds between steps: every full block, and
  // the sliding blocks covering [keep_from(length), length).
  int64_t pages_for(int64_t length) const {
    if (length <= 0) return 0;
    const int64_t blocks = blocks_covering(length);
    int64_t pages = full_pages_per_block * blocks;
    if (sliding_layers > 0) pages += sliding_pages_per_block * (blocks - keep_from(length) / block_size);
    return pages;
  }
  int64_t bytes_for(int64_t length) const { return pages_for(length) * page_bytes(); }
  // Extra sliding pages one step of `rows` new positions of a sequence may
  // hold before the old ones are released.
  int64_t step_transient_pages(int64_t rows) const {
    return sliding_layers > 0 ? sliding_pages_per_block * (blocks_covering(rows) + 1) : 0;
  }
  // Longest sequence whose pages_for fits in `pages` (0 if none).
  int64_t tokens_fitting(int64_t pages) const {
    if (pages_for(1) > pages) return 0;
    int64_t lo = 1, hi = 2;
    while (pages_for(hi) <= pages && hi < (int64_t(1) << 40)) lo = hi, hi *= 2;
    while (hi - lo > 1) {
      const int64_t mid = lo + (hi - lo) / 2;
      (pages_for(mid) <= pages ? lo : hi) = mid;
    }
    return lo;
  }
  // The pool for a memory budget: every sequence at full length (plus a
  // block of slack each and one step's transient), at most what the budget holds.
  int64_t pool_pages(int64_t max_seqs, int64_t max_model_len, int64_t step_rows, int64_t budget_bytes) const {
    const int64_t all = std::max<int64_t>(1, max_seqs) * (pages_for(max_model_len) + sliding_pages_per_block) +
                        step_transient_pages(std::min(step_rows, max_model_len));
    return std::min(all, budget_bytes / page_bytes());
  }
};

}  // namespace muse
