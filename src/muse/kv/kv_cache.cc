#include "muse/kv/kv_cache.h"

#include <algorithm>
#include <cmath>
#include <cstring>

namespace muse {

namespace {

uint64_t mix64(uint64_t x) {  // splitmix64's finalizer
  x ^= x >> 30;
  x *= 0xbf58476d1ce4e5b9ull;
  x ^= x >> 27;
  x *= 0x94d049bb133111ebull;
  x ^= x >> 31;
  return x;
}

uint64_t chain_hash(uint64_t parent, int64_t block, std::span<const int32_t> tokens) {
  uint64_t h = mix64(parent ^ 0x9e3779b97f4a7c15ull) ^ mix64(uint64_t(block) + 0x632be59bd9b4e019ull);
  for (int32_t t : tokens) h = mix64(h ^ (uint64_t(uint32_t(t)) + 0x2545f4914f6cdd1dull));
  return h;
}

}  // namespace

// ---------------------------------------------------------------------------
// Creation
// ---------------------------------------------------------------------------

Result<std::unique_ptr<KvCache>> KvCache::create(Backend& backend, const ModelConfig& config,
                                                 const KvCacheOptions& options) {
  if (options.max_sequences < 1) return make_error("KV cache: max_sequences must be at least 1");
  if (options.block_size < 1) return make_error("KV cache: block_size must be at least 1");
  if (options.max_rollback < 0) return make_error("KV cache: max_rollback must not be negative");
  if (options.num_pages < 1 || options.num_pages > (int64_t(1) << 30))
    return make_error("KV cache: num_pages out of range");
  if (config.num_sliding_layers() > 0 && config.sliding_window < 1)
    return make_error("KV cache: sliding layers need sliding_window >= 1");
  const DType dt = options.dtype ? *options.dtype : backend.kv_dtype();
  if (!backend.supports_kv_dtype(dt))
    return make_error(std::string("KV cache: the ") + backend.name() + " backend cannot store the KV cache as " +
                      std::string(dtype_name(dt)));
  std::unique_ptr<KvCache> kv(new KvCache(backend, options));
  kv->dtype_ = dt;
  kv->geo_ = KvGeometry::of(config, options.block_size, options.max_rollback, dtype_bits(dt) / 8);
  const KvGeometry& g = kv->geo_;
  const int64_t P = options.num_pages;
  auto k = backend.alloc(dt, {P, g.page_layers, g.block_size, g.kv_dim});
  if (!k.ok()) return make_error("KV cache: " + k.message());
  kv->pool_k_ = *k;
  auto v = backend.alloc(dt, {P, g.page_layers, g.block_size, g.kv_dim});
  if (!v.ok()) {
    backend.release(kv->pool_k_);
    kv->pool_k_ = Tensor{};
    return make_error("KV cache: " + v.message());
  }
  kv->pool_v_ = *v;
  kv->bytes_ = kv->pool_k_.bytes() + kv->pool_v_.bytes();
  int64_t nth[2] = {0, 0};
  for (int64_t l = 0; l < config.num_layers; ++l) {
    KvLayerStorage st;
    const bool full = config.is_full(l);
    const int64_t i = nth[full ? 0 : 1]++;
    st.layout = full ? KvLayout::Paged : KvLayout::Sliding;
    st.k = kv->pool_k_;
    st.v = kv->pool_v_;
    st.slot = int32_t(i % g.page_layers);
    st.group = int32_t(i / g.page_layers);
    st.pages_per_block = int32_t(full ? g.full_pages_per_block : g.sliding_pages_per_block);
    if (size_t(l) < options.layer_scales.size())
      st.k_scale = options.layer_scales[size_t(l)][0], st.v_scale = options.layer_scales[size_t(l)][1];
    kv->layers_.push_back(st);
  }
  kv->pages_.resize(size_t(P));
  for (int32_t p = 0; p < int32_t(P); ++p) kv->list_push(kv->free_head_, kv->free_tail_, p);
  kv->free_count_ = P;
  if (options.prefix_caching) {
    uint64_t cap = 16;
    while (cap < uint64_t(P) * 2) cap *= 2;
    kv->table_.assign(size_t(cap), -1);
    kv->table_mask_ = cap - 1;
    kv->page_tokens_.assign(size_t(P * g.block_size), 0);
  }
  return kv;
}

KvCache::~KvCache() {
  if (!pool_k_.empty()) backend_.release(pool_k_);
  if (!pool_v_.empty()) backend_.release(pool_v_);
}

// ---------------------------------------------------------------------------
// Pages, lists, hashes
// ---------------------------------------------------------------------------

void KvCache::list_push(int32_t& head, int32_t& tail, int32_t page) {
  Page& pg = pages_[size_t(page)];
  pg.prev = tail;
  pg.next = -1;
  if (tail >= 0) pages_[size_t(tail)].next = page;
  else head = page;
  tail = page;
}

void KvCache::list_remove(int32_t& head, int32_t& tail, int32_t page) {
  Page& pg = pages_[size_t(page)];
  if (pg.prev >= 0) pages_[size_t(pg.prev)].next = pg.next;
  else head = pg.next;
  if (pg.next >= 0) pages_[size_t(pg.next)].prev = pg.prev;
  else tail = pg.prev;
  pg.prev = pg.next = -1;
}

int32_t KvCache::take_page() {
  int32_t p = free_head_;
  if (p >= 0) {
    list_remove(free_head_, free_tail_, p);
    --free_count_;
  } else if ((p = lru_head_) >= 0) {  // evict the least recently released cached page
    list_remove(lru_head_, lru_tail_, p);
    --lru_count_;
    erase_hash(p);
    ++counters_.evictions;
  } else {
    return -1;
  }
  pages_[size_t(p)].ref = 1;
  return p;
}

void KvCache::hold_page(int32_t page) {
  Page& pg = pages_[size_t(page)];
  if (pg.ref++ == 0) {  // only hashed pages are found with no holder: they are on the LRU list
    list_remove(lru_head_, lru_tail_, page);
    --lru_count_;
  }
}

void KvCache::drop_page(int32_t page) {
  Page& pg = pages_[size_t(page)];
  if (--pg.ref > 0) return;
  if (pg.hashed) {
    list_push(lru_head_, lru_tail_, page);
    ++lru_count_;
  } else {
    list_push(free_head_, free_tail_, page);
    ++free_count_;
  }
}

uint64_t KvCache::key(uint64_t chain, int32_t kind, int32_t group) const {
  return mix64(chain ^ (uint64_t(kind) << 40) ^ (uint64_t(group) << 20) ^ 0x51afd7ed558ccd3bull);
}

int32_t KvCache::lookup(uint64_t chain, uint64_t parent, int64_t block, int32_t kind, int32_t group,
                        std::span<const int32_t> tokens) const {
  if (table_.empty()) return -1;
  const int64_t bs = geo_.block_size;
  for (uint64_t i = key(chain, kind, group) & table_mask_;; i = (i + 1) & table_mask_) {
    const int32_t p = table_[size_t(i)];
    if (p < 0) return -1;
    const Page& pg = pages_[size_t(p)];
    if (pg.chain == chain && pg.parent == parent && pg.block == block && pg.kind == kind && pg.group == group &&
        std::equal(tokens.begin(), tokens.end(), page_tokens_.begin() + p * bs))
      return p;
  }
}

void KvCache::insert_hash(int32_t page) {
  const Page& pg = pages_[size_t(page)];
  uint64_t i = key(pg.chain, pg.kind, pg.group) & table_mask_;
  while (table_[size_t(i)] >= 0) i = (i + 1) & table_mask_;
  table_[size_t(i)] = page;
}

void KvCache::erase_hash(int32_t page) {
  Page& pg = pages_[size_t(page)];
  if (!pg.hashed) return;
  pg.hashed = false;
  uint64_t i = key(pg.chain, pg.kind, pg.group) & table_mask_;
  while (table_[size_t(i)] != page) i = (i + 1) & table_mask_;
  // Backward-shift deletion keeps every probe chain unbroken.
  for (uint64_t j = i;;) {
    table_[size_t(i)] = -1;
    for (;;) {
      j = (j + 1) & table_mask_;
      const int32_t q = table_[size_t(j)];
      if (q < 0) return;
      const Page& qp = pages_[size_t(q)];
      const uint64_t home = key(qp.chain, qp.kind, qp.group) & table_mask_;
      // q may move to i when its home is not in the cyclic range (i, j].
      const bool in_range = i <= j ? (home > i && home <= j) : (home > i || home <= j);
      if (!in_range) {
        table_[size_t(i)] = q;
        i = j;
        break;
      }
    }
  }
}

bool KvCache::block_cached(uint64_t chain, uint64_t parent, int64_t block, int32_t kind,
                           std::span<const int32_t> tokens, int64_t* revived) const {
  const int64_t n = kind == kFull ? geo_.full_pages_per_block : geo_.sliding_pages_per_block;
  int64_t dead = 0;
  for (int32_t g = 0; g < int32_t(n); ++g) {
    const int32_t p = lookup(chain, parent, block, kind, g, tokens);
    if (p < 0) return false;
    if (pages_[size_t(p)].ref == 0) ++dead;
  }
  if (revived) *revived += dead;
  return true;
}

void KvCache::hash_blocks(SequenceKv& seq, std::span<const int32_t> tokens, int64_t upto_blocks) const {
  const int64_t bs = geo_.block_size;
  while (int64_t(seq.hashes.size()) < upto_blocks) {
    const int64_t j = int64_t(seq.hashes.size());
    const uint64_t parent = j ? seq.hashes.back() : 0;
    seq.hashes.push_back(chain_hash(parent, j, tokens.subspan(size_t(j * bs), size_t(bs))));
  }
}

int32_t* KvCache::sliding_pages(SequenceKv& seq, int64_t block) {
  const int64_t jj = block - seq.sliding_first, n = geo_.sliding_pages_per_block;
  if (jj < 0 || (jj + 1) * n > int64_t(seq.sliding.size())) return nullptr;
  return seq.sliding.data() + jj * n;
}

void KvCache::register_blocks(SequenceKv& seq, std::span<const int32_t> tokens, int64_t upto_blocks) {
  if (!options_.prefix_caching || upto_blocks <= seq.registered) return;
  const int64_t bs = geo_.block_size;
  hash_blocks(seq, tokens, upto_blocks);
  auto offer = [&](int32_t page, int32_t kind, int32_t group, int64_t j) {
    if (page < 0 || pages_[size_t(page)].hashed) return;
    const uint64_t parent = j ? seq.hashes[size_t(j - 1)] : 0;
    std::span<const int32_t> toks = tokens.subspan(size_t(j * bs), size_t(bs));
    // Another page with the same content registered first: this one stays private.
    if (lookup(seq.hashes[size_t(j)], parent, j, kind, group, toks) >= 0) return;
    Page& pg = pages_[size_t(page)];
    pg.hashed = true;
    pg.kind = kind, pg.group = group, pg.block = j, pg.chain = seq.hashes[size_t(j)], pg.parent = parent;
    std::copy(toks.begin(), toks.end(), page_tokens_.begin() + page * bs);
    insert_hash(page);
  };
  for (int64_t j = seq.registered; j < upto_blocks; ++j) {
    const int64_t nf = geo_.full_pages_per_block, ns = geo_.sliding_pages_per_block;
    if ((j + 1) * nf <= int64_t(seq.full.size()))
      for (int64_t g = 0; g < nf; ++g) offer(seq.full[size_t(j * nf + g)], kFull, int32_t(g), j);
    if (int32_t* sp = sliding_pages(seq, j))
      for (int64_t g = 0; g < ns; ++g) offer(sp[g], kSliding, int32_t(g), j);
  }
  seq.registered = upto_blocks;
}

void KvCache::release_sliding_below(SequenceKv& seq, int64_t block) {
  const int64_t n = geo_.sliding_pages_per_block;
  int64_t drop = std::min<int64_t>((block - seq.sliding_first) * n, int64_t(seq.sliding.size()));
  if (drop <= 0) return;
  for (int64_t i = 0; i < drop; ++i)
    if (seq.sliding[size_t(i)] >= 0) drop_page(seq.sliding[size_t(i)]);
  seq.sliding.erase(seq.sliding.begin(), seq.sliding.begin() + drop);
  seq.sliding_first += drop / n;
  if (seq.sliding.empty()) seq.sliding_first = block;
}

// ---------------------------------------------------------------------------
// Sequences
// ---------------------------------------------------------------------------

PrefixMatch KvCache::match(std::span<const int32_t> tokens, int64_t max_tokens) const {
  PrefixMatch m;
  if (!options_.prefix_caching) return m;
  const int64_t bs = geo_.block_size, W = geo_.window;
  const int64_t limit = std::min<int64_t>(max_tokens, int64_t(tokens.size())) / bs;
  const bool full = geo_.full_layers > 0, sliding = geo_.sliding_layers > 0;
  uint64_t parent = 0;
  int64_t last_sliding_miss = -1, best = 0;
  for (int64_t j = 0; j < limit; ++j) {
    std::span<const int32_t> toks = tokens.subspan(size_t(j * bs), size_t(bs));
    const uint64_t h = chain_hash(parent, j, toks);
    if (full && !block_cached(h, parent, j, kFull, toks, nullptr)) break;
    if (sliding && !block_cached(h, parent, j, kSliding, toks, nullptr)) last_sliding_miss = j;
    const int64_t B = (j + 1) * bs;
    // The sliding blocks continuing at B reads: [max(0, B - W + 1), B).
    if (!sliding || last_sliding_miss < std::max<int64_t>(0, B - W + 1) / bs) best = j + 1;
    parent = h;
  }
  m.tokens = best * bs;
  // Pages the adoption would revive.
  parent = 0;
  const int64_t first = sliding ? std::max<int64_t>(0, m.tokens - W + 1) / bs : best;
  for (int64_t j = 0; j < best; ++j) {
    std::span<const int32_t> toks = tokens.subspan(size_t(j * bs), size_t(bs));
    const uint64_t h = chain_hash(parent, j, toks);
    if (full) block_cached(h, parent, j, kFull, toks, &m.revived);
    if (sliding && j >= first) block_cached(h, parent, j, kSliding, toks, &m.revived);
    parent = h;
  }
  return m;
}

Result<SequenceKv> KvCache::open_sequence(std::span<const int32_t> tokens, int64_t max_cached) {
  if (open_sequences_ >= options_.max_sequences)
    return make_error("KV cache: all " + std::to_string(options_.max_sequences) + " sequence slots are in use");
  SequenceKv s;
  s.open = true;
  // The tables' capacity is taken now, so growing them in a step allocates nothing.
  const int64_t max_blocks = std::max<int64_t>(1, options_.max_blocks_per_sequence);
  s.full.reserve(size_t(geo_.full_pages_per_block * max_blocks));
  const int64_t slide_blocks = std::min(max_blocks, geo_.blocks_covering(geo_.window + geo_.max_rollback +
                                                                           options_.max_step_rows) + 2);
  s.sliding.reserve(size_t(geo_.sliding_pages_per_block * slide_blocks));
  if (options_.prefix_caching) s.hashes.reserve(size_t(max_blocks));
  ++open_sequences_;
  if (!options_.prefix_caching || tokens.empty()) return s;

  counters_.queries += uint64_t(tokens.size());
  const PrefixMatch m = match(tokens, max_cached);
  if (m.tokens == 0) return s;
  counters_.hits += uint64_t(m.tokens);
  const int64_t bs = geo_.block_size, blocks = m.tokens / bs;
  hash_blocks(s, tokens, blocks);
  const int64_t first = geo_.sliding_layers > 0 ? std::max<int64_t>(0, m.tokens - geo_.window + 1) / bs : blocks;
  s.sliding_first = first;
  for (int64_t j = 0; j < blocks; ++j) {
    const uint64_t parent = j ? s.hashes[size_t(j - 1)] : 0;
    std::span<const int32_t> toks = tokens.subspan(size_t(j * bs), size_t(bs));
    for (int32_t g = 0; g < int32_t(geo_.full_pages_per_block); ++g) {
      const int32_t p = lookup(s.hashes[size_t(j)], parent, j, kFull, g, toks);
      hold_page(p);
      s.full.push_back(p);
    }
    if (geo_.sliding_layers > 0 && j >= first) {
      for (int32_t g = 0; g < int32_t(geo_.sliding_pages_per_block); ++g) {
        const int32_t p = lookup(s.hashes[size_t(j)], parent, j, kSliding, g, toks);
        hold_page(p);
        s.sliding.push_back(p);
      }
    }
  }
  s.length = m.tokens;
  s.registered = blocks;
  s.cached_tokens = m.tokens;
  return s;
}

void KvCache::close_sequence(SequenceKv& seq, std::span<const int32_t> tokens) {
  if (!seq.open) return;
  // Nothing rolls back a closed sequence: every complete block may be shared.
  if (int64_t(tokens.size()) >= seq.length) register_blocks(seq, tokens, seq.length / geo_.block_size);
  // Last blocks first, so that under pressure a prefix is evicted from its
  // tail and its shared head (a system prompt) stays longest (as vLLM does).
  for (auto it = seq.sliding.rbegin(); it != seq.sliding.rend(); ++it)
    if (*it >= 0) drop_page(*it);
  for (auto it = seq.full.rbegin(); it != seq.full.rend(); ++it) drop_page(*it);
  --open_sequences_;
  seq = SequenceKv{};
}

int64_t KvCache::grow(int64_t length, int64_t full_blocks, int64_t slide_end, int64_t new_length) const {
  if (new_length <= length) return 0;
  const int64_t end = geo_.blocks_covering(new_length);
  int64_t pages = 0;
  if (geo_.full_layers > 0) pages += geo_.full_pages_per_block * std::max<int64_t>(0, end - full_blocks);
  if (geo_.sliding_layers > 0) {
    // With prefix caching every block of a step is written (and offered to
    // the cache before it is released), so that later prompts can reuse a
    // prefix ending anywhere; without, blocks the step already leaves behind get no page.
    const int64_t from =
        options_.prefix_caching ? slide_end : std::max(slide_end, geo_.keep_from(new_length) / geo_.block_size);
    pages += geo_.sliding_pages_per_block * std::max<int64_t>(0, end - from);
  }
  return pages;
}

int64_t KvCache::pages_to_grow(const SequenceKv& seq, int64_t new_length) const {
  const int64_t full_blocks = geo_.full_layers > 0 ? int64_t(seq.full.size()) / geo_.full_pages_per_block : 0;
  const int64_t slide_end =
      geo_.sliding_layers > 0 ? seq.sliding_first + int64_t(seq.sliding.size()) / geo_.sliding_pages_per_block : 0;
  return grow(seq.length, full_blocks, slide_end, new_length);
}

int64_t KvCache::pages_to_grow(const PrefixMatch& m, int64_t new_length) const {
  const int64_t blocks = m.tokens / geo_.block_size;
  return grow(m.tokens, blocks, blocks, new_length);
}

Status KvCache::reserve(SequenceKv& seq, int64_t new_length) {
  const int64_t need = pages_to_grow(seq, new_length);
  if (need == 0) return Status::Ok();
  if (need > available_pages()) {
    return make_error("KV cache full: " + std::to_string(new_length) + " positions need " + std::to_string(need) +
                      " more pages, " + std::to_string(available_pages()) + " available");
  }
  const int64_t end = geo_.blocks_covering(new_length);
  if (geo_.full_layers > 0)
    while (int64_t(seq.full.size()) < end * geo_.full_pages_per_block) seq.full.push_back(take_page());
  if (geo_.sliding_layers > 0) {
    const int64_t n = geo_.sliding_pages_per_block;
    // Without prefix caching, blocks of this step that will not be kept get
    // no page (-1): the step reads those rows from its own k/v, and kv_store
    // skips them.
    const int64_t keep = options_.prefix_caching ? 0 : geo_.keep_from(new_length) / geo_.block_size;
    if (seq.sliding.empty()) seq.sliding_first = std::max(seq.sliding_first, keep);
    while (seq.sliding_first + int64_t(seq.sliding.size()) / n < end) {
      const int64_t j = seq.sliding_first + int64_t(seq.sliding.size()) / n;
      for (int64_t g = 0; g < n; ++g) seq.sliding.push_back(j >= keep ? take_page() : -1);
    }
  }
  return Status::Ok();
}

void KvCache::advance(SequenceKv& seq, std::span<const int32_t> tokens) {
  seq.length = int64_t(tokens.size());
  const int64_t bs = geo_.block_size;
  register_blocks(seq, tokens, std::max<int64_t>(0, seq.length - geo_.max_rollback) / bs);
  if (geo_.sliding_layers > 0) release_sliding_below(seq, geo_.keep_from(seq.length) / bs);
}

bool KvCache::can_truncate(const SequenceKv& seq, int64_t m, std::string* why) const {
  auto no = [why](std::string w) {
    if (why) *why = std::move(w);
    return false;
  };
  if (m < 0 || m > seq.length)
    return no("truncate to " + std::to_string(m) + " positions: the sequence has " + std::to_string(seq.length));
  if (m == seq.length || m == 0) return true;
  const int64_t bs = geo_.block_size;
  if (geo_.sliding_layers > 0) {
    // Continuing at m reads sliding positions [m - window + 1, m).
    const int64_t n = geo_.sliding_pages_per_block;
    for (int64_t j = std::max<int64_t>(0, m - geo_.window + 1) / bs; j < geo_.blocks_covering(m); ++j) {
      const int64_t jj = j - seq.sliding_first;
      if (jj < 0 || (jj + 1) * n > int64_t(seq.sliding.size()) || seq.sliding[size_t(jj * n)] < 0)
        return no("truncate to " + std::to_string(m) + " positions: the sliding layers no longer hold position " +
                  std::to_string(std::max<int64_t>(j * bs, m - geo_.window + 1)) + " (they keep the last window + " +
                  std::to_string(geo_.max_rollback) + " positions)");
    }
  }
  // The block m falls inside is written again: it must not be shared.
  if (m % bs) {
    const int64_t j = m / bs;
    auto shared = [&](int32_t p) { return p >= 0 && pages_[size_t(p)].ref > 1; };
    for (int64_t g = 0; g < geo_.full_pages_per_block; ++g)
      if (shared(seq.full[size_t(j * geo_.full_pages_per_block + g)]))
        return no("truncate to " + std::to_string(m) + " positions: block " + std::to_string(j) +
                  " is shared with another sequence through the prefix cache");
    const int64_t jj = j - seq.sliding_first, n = geo_.sliding_pages_per_block;
    if (geo_.sliding_layers > 0 && jj >= 0)
      for (int64_t g = 0; g < n && (jj * n + g) < int64_t(seq.sliding.size()); ++g)
        if (shared(seq.sliding[size_t(jj * n + g)]))
          return no("truncate to " + std::to_string(m) + " positions: block " + std::to_string(j) +
                    " is shared with another sequence through the prefix cache");
  }
  return true;
}

Status KvCache::truncate(SequenceKv& seq, int64_t m) {
  std::string why;
  if (!can_truncate(seq, m, &why)) return make_error(why);
  // m == length still trims pages taken past the end (a failed step's).
  const int64_t bs = geo_.block_size, end = geo_.blocks_covering(m);
  // Blocks past the new end go (hashed ones stay cached: their content is
  // still that of their chain).
  const int64_t nf = geo_.full_pages_per_block;
  while (int64_t(seq.full.size()) > end * nf) {
    drop_page(seq.full.back());
    seq.full.pop_back();
  }
  if (geo_.sliding_layers > 0) {
    const int64_t n = geo_.sliding_pages_per_block;
    const int64_t keep_entries = std::max<int64_t>(0, (end - seq.sliding_first) * n);
    while (int64_t(seq.sliding.size()) > keep_entries) {
      if (seq.sliding.back() >= 0) drop_page(seq.sliding.back());
      seq.sliding.pop_back();
    }
    if (m == 0) seq.sliding_first = 0;
  }
  // The block m falls inside will be rewritten: it leaves the prefix cache.
  if (m % bs) {
    const int64_t j = m / bs;
    if (j * nf < int64_t(seq.full.size()))
      for (int64_t g = 0; g < nf; ++g) erase_hash(seq.full[size_t(j * nf + g)]);
    if (int32_t* sp = sliding_pages(seq, j))
      for (int64_t g = 0; g < geo_.sliding_pages_per_block; ++g)
        if (sp[g] >= 0) erase_hash(sp[g]);
  }
  seq.length = m;
  seq.registered = std::min(seq.registered, m / bs);
  if (int64_t(seq.hashes.size()) > m / bs) seq.hashes.resize(size_t(m / bs));
  seq.cached_tokens = std::min(seq.cached_tokens, m);
  return Status::Ok();
}

}  // namespace muse
