#include "muse/kv/kv_cache.h"

#include <algorithm>

namespace muse {

BlockAllocator::BlockAllocator(int64_t num_blocks) : capacity_(num_blocks) {
  free_.reserve(size_t(num_blocks));
  for (int64_t b = num_blocks - 1; b >= 0; --b) free_.push_back(int32_t(b));
}

std::optional<int32_t> BlockAllocator::allocate() {
  if (free_.empty()) return std::nullopt;
  int32_t b = free_.back();
  free_.pop_back();
  return b;
}

void BlockAllocator::release(int32_t block) {
  // Keep descending order so the lowest free id is reused first.
  free_.insert(std::upper_bound(free_.begin(), free_.end(), block, std::greater<int32_t>()), block);
}

Result<std::unique_ptr<KvCache>> KvCache::create(Backend& backend, const ModelConfig& config,
                                                 const KvCacheOptions& options) {
  if (options.max_sequences < 1) return make_error("KV cache: max_sequences must be at least 1");
  if (options.block_size < 1) return make_error("KV cache: block_size must be at least 1");
  if (options.num_blocks < 0 || options.num_blocks > (int64_t(1) << 31) - 1)
    return make_error("KV cache: num_blocks out of range");
  std::unique_ptr<KvCache> kv(new KvCache(backend, options));
  kv->window_ = config.sliding_window;
  kv->blocks_ = BlockAllocator(options.num_blocks);
  for (int64_t s = options.max_sequences - 1; s >= 0; --s) kv->free_slots_.push_back(int32_t(s));
  const int64_t kv_dim = config.kv_dim();
  for (int64_t l = 0; l < config.num_layers; ++l) {
    KvLayerStorage st;
    int64_t rows, per;
    if (config.is_full(l)) {
      kv->has_full_ = true;
      st.layout = KvLayout::Paged;
      rows = std::max<int64_t>(options.num_blocks, 1), per = options.block_size;
    } else {
      if (config.sliding_window < 1) return make_error("KV cache: sliding layers need sliding_window >= 1");
      st.layout = KvLayout::Ring;
      rows = options.max_sequences, per = config.sliding_window;
    }
    auto k = backend.alloc(backend.kv_dtype(), {rows, per, kv_dim});
    if (!k.ok()) return make_error("KV cache (layer " + std::to_string(l) + "): " + k.message());
    st.k = *k;
    auto v = backend.alloc(backend.kv_dtype(), {rows, per, kv_dim});
    if (!v.ok()) {
      backend.release(st.k);
      return make_error("KV cache (layer " + std::to_string(l) + "): " + v.message());
    }
    st.v = *v;
    kv->bytes_ += st.k.bytes() + st.v.bytes();
    kv->layers_.push_back(st);
  }
  return kv;
}

KvCache::~KvCache() {
  for (auto& l : layers_) {
    backend_.release(l.k);
    backend_.release(l.v);
  }
}

int64_t KvCache::blocks_for(int64_t length) const {
  return has_full_ ? (length + options_.block_size - 1) / options_.block_size : 0;
}

Result<SequenceKv> KvCache::open_sequence() {
  if (free_slots_.empty())
    return make_error("KV cache: all " + std::to_string(options_.max_sequences) + " sequence slots are in use");
  SequenceKv s;
  // The table's capacity is taken now, so growing it in a step allocates nothing.
  if (has_full_ && options_.max_blocks_per_sequence > 0) s.blocks.reserve(size_t(options_.max_blocks_per_sequence));
  s.ring_slot = free_slots_.back();
  free_slots_.pop_back();
  return s;
}

void KvCache::close_sequence(SequenceKv& seq) {
  for (int32_t b : seq.blocks) blocks_.release(b);
  if (seq.ring_slot >= 0) {
    free_slots_.insert(std::upper_bound(free_slots_.begin(), free_slots_.end(), seq.ring_slot, std::greater<int32_t>()),
                       seq.ring_slot);
  }
  seq = SequenceKv{};
}

Status KvCache::reserve(SequenceKv& seq, int64_t length) {
  const int64_t need = blocks_for(length) - int64_t(seq.blocks.size());
  if (need <= 0) return Status::Ok();
  if (need > blocks_.free_count()) {
    return make_error("KV cache full: " + std::to_string(length) + " positions need " + std::to_string(need) +
                      " more blocks of " + std::to_string(options_.block_size) + ", " +
                      std::to_string(blocks_.free_count()) + " free");
  }
  for (int64_t i = 0; i < need; ++i) seq.blocks.push_back(*blocks_.allocate());
  return Status::Ok();
}

}  // namespace muse
