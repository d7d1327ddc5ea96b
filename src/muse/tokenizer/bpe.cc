#include "muse/tokenizer/bpe.h"

#include <algorithm>
#include <atomic>
#include <climits>
#include <cstring>
#include <memory>
#include <cstdio>

#include "muse/tokenizer/unicode.h"

namespace muse::tok {
namespace {

struct ByteAlphabet {
  uint32_t to_cp[256];
  int16_t from_cp[512];
  ByteAlphabet() {
    std::fill(std::begin(from_cp), std::end(from_cp), int16_t(-1));
    uint32_t n = 0;
    for (int b = 0; b < 256; ++b) {
      bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
      to_cp[b] = printable ? uint32_t(b) : 256 + n++;
      from_cp[to_cp[b]] = int16_t(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

std::atomic<uint64_t> next_serial{1};

// Per-thread word -> ids cache (Hugging Face keeps one per thread too).
struct WordCache {
  uint64_t owner = 0;
  StringMap index;                                   // word -> entry
  std::vector<std::pair<uint32_t, uint32_t>> entries;  // (offset, count) in ids
  std::vector<int32_t> ids;
  void reset(uint64_t serial) {
    owner = serial;
    index.clear();
    entries.clear();
    ids.clear();
  }
};
// initial-exec: the library is linked into executables, and the default
// TLS model of position-independent code would call __tls_get_addr per word.
#define MUSE_FAST_TLS __attribute__((tls_model("initial-exec")))
constexpr size_t kMaxCachedWordBytes = 256;  // Hugging Face's MAX_LENGTH
constexpr size_t kMaxCacheEntries = 1 << 16;

// A small direct-mapped cache in front of everything, for the frequent short
// words: one probe into 128 KiB that stays in L2, instead of misses into the
// large vocabulary and word-cache tables.
struct FrontCache {
  static constexpr size_t kSlots = 2048, kMaxKey = 24, kMaxIds = 7;
  struct Entry {
    uint64_t hash;
    uint8_t len, n_ids;
    char key[kMaxKey];
    int32_t ids[kMaxIds];
  };
  uint64_t owner = 0;
  Entry entries[kSlots];
  void reset(uint64_t serial) {
    owner = serial;
    for (Entry& e : entries) e.len = 0xFF;  // no word has this length here
  }
};

// Character mode without prefix/suffix: one character (its UTF-8 bytes packed
// in a uint32) -> vocabulary id, direct-mapped. SentencePiece-style models
// (Gemma) look up every character of whole texts; most repeat.
struct CharCache {
  static constexpr size_t kSlots = 4096;
  uint64_t owner = 0;
  uint32_t key[kSlots];  // 0: empty (NUL is never cached)
  int32_t id[kSlots];
  void reset(uint64_t serial) {
    owner = serial;
    std::memset(key, 0, sizeof key);
  }
};

// Pair -> merge (or "none"), direct-mapped, 256 KiB: the merges table of a
// large vocabulary (Gemma: 515k merges, 32 MiB of slots) misses the CPU caches
// on nearly every probe, while text repeats the same pairs.
struct PairCache {
  static constexpr size_t kSlots = 1 << 14;
  uint64_t owner = 0;
  uint64_t key[kSlots];
  PairMap::Merge value[kSlots];
  void reset(uint64_t serial) {
    owner = serial;
    std::memset(key, 0xFF, sizeof key);  // ~0: no pair of valid ids
  }
};

struct HeapItem {
  int32_t rank;
  uint32_t pos;
  int32_t id;
  // Min-heap order: lower rank first, then the leftmost position.
  bool after(const HeapItem& o) const { return rank != o.rank ? rank > o.rank : pos > o.pos; }
};

// All per-thread state, on the heap: ~450 KiB in static TLS would be taken
// from every thread's stack in the process, whatever the thread does.
struct ThreadCaches {
  WordCache word;
  FrontCache front;
  CharCache chars;
  PairCache pairs;
  std::vector<int32_t> syms, prev, next;
  std::vector<HeapItem> heap;
};

ThreadCaches& thread_caches() {
  static thread_local ThreadCaches* fast MUSE_FAST_TLS = nullptr;
  if (__builtin_expect(fast != nullptr, 1)) return *fast;
  static thread_local std::unique_ptr<ThreadCaches> owner;  // freed at thread exit
  owner = std::make_unique<ThreadCaches>();
  fast = owner.get();
  return *fast;
}

Result<std::optional<std::string>> optional_string(const Json& j, const char* key) {
  const Json* v = j.find(key);
  if (!v || v->is_null()) return std::optional<std::string>();
  if (!v->is_string()) return make_error(std::string("model.") + key + " must be a string or null");
  return std::optional<std::string>(v->as_string());
}

}  // namespace

uint32_t byte_level_char(uint8_t b) { return alphabet().to_cp[b]; }
int byte_level_byte(uint32_t cp) { return cp < 512 ? alphabet().from_cp[cp] : -1; }

Result<std::unique_ptr<BpeModel>> BpeModel::from_json(const Json& model) {
  std::unique_ptr<BpeModel> m(new BpeModel);
  m->serial_ = next_serial.fetch_add(1);
  const Json* vocab = model.find("vocab");
  const Json* merges = model.find("merges");
  if (!vocab || !vocab->is_object()) return make_error("model.vocab must be an object of token -> id");
  if (!merges || !merges->is_array()) return make_error("model.merges must be an array");
  MUSE_ASSIGN_OR_RETURN(m->unk_token_, optional_string(model, "unk_token"));
  MUSE_ASSIGN_OR_RETURN(m->prefix_, optional_string(model, "continuing_subword_prefix"));
  MUSE_ASSIGN_OR_RETURN(m->suffix_, optional_string(model, "end_of_word_suffix"));
  for (const char* key : {"fuse_unk", "byte_fallback", "ignore_merges"}) {
    const Json* v = model.find(key);
    if (v && !v->is_null() && !v->is_bool()) return make_error(std::string("model.") + key + " must be a boolean");
  }
  m->fuse_unk_ = model.get_bool("fuse_unk", false);
  m->byte_fallback_ = model.get_bool("byte_fallback", false);
  m->ignore_merges_ = model.get_bool("ignore_merges", false);
  if (const Json* d = model.find("dropout"); d && !d->is_null()) {
    if (!d->is_number() || d->as_double() < 0.0 || d->as_double() > 1.0)
      return make_error("model.dropout must be a number in [0, 1] or null");
  }

  m->vocab_.reserve(vocab->size());
  int32_t max_id = -1;
  for (const auto& [token, idj] : vocab->as_object()) {
    if (!idj.is_int() || idj.as_int() < 0 || idj.as_int() > INT32_MAX - 1)
      return make_error("model.vocab['" + token + "'] must be a non-negative integer id");
    int32_t id = int32_t(idj.as_int());
    m->vocab_.insert(token, id);
    max_id = std::max(max_id, id);
  }
  // Ids index dense tables; real vocabularies are dense (gpt-4o: 200,000
  // entries, largest id 200,018).
  if (size_t(max_id) >= m->vocab_.size() + (1u << 20))
    return make_error("model.vocab ids are too sparse (" + std::to_string(m->vocab_.size()) + " entries, largest id " +
                      std::to_string(max_id) + ")");
  m->id_to_token_.resize(size_t(max_id + 1));
  m->has_token_.assign(size_t(max_id + 1), 0);
  for (const auto& [token, idj] : vocab->as_object()) {
    int32_t id = int32_t(idj.as_int());
    if (!m->has_token_[id]) {
      m->id_to_token_[id] = token;
      m->has_token_[id] = 1;
    }
  }

  // Merges: "a b" strings (legacy) or [a, b] pairs; the rank is the index.
  size_t prefix_len = m->prefix_ ? m->prefix_->size() : 0;
  m->merges_.reserve(merges->size());
  int32_t rank = 0;
  std::string merged;
  for (const Json& e : merges->as_array()) {
    std::string_view a, b;
    if (e.is_string()) {
      std::string_view line = e.as_string();
      if (line.starts_with("#version")) continue;
      size_t sp = line.find(' ');
      if (sp == std::string_view::npos || line.find(' ', sp + 1) != std::string_view::npos)
        return make_error("model.merges[" + std::to_string(rank) + "] '" + std::string(line) +
                          "' is not two tokens separated by one space");
      a = line.substr(0, sp);
      b = line.substr(sp + 1);
    } else if (e.is_array() && e.size() == 2 && e.as_array()[0].is_string() && e.as_array()[1].is_string()) {
      a = e.as_array()[0].as_string();
      b = e.as_array()[1].as_string();
    } else {
      return make_error("model.merges[" + std::to_string(rank) + "] must be \"a b\" or [\"a\", \"b\"]");
    }
    int32_t ia = m->vocab_.find(a), ib = m->vocab_.find(b);
    if (ia < 0 || ib < 0)
      return make_error("model.merges[" + std::to_string(rank) + "]: token '" + std::string(ia < 0 ? a : b) +
                        "' is not in the vocabulary");
    if (b.size() < prefix_len)
      return make_error("model.merges[" + std::to_string(rank) + "]: token '" + std::string(b) +
                        "' is shorter than the continuing_subword_prefix");
    merged.assign(a);
    merged.append(b.substr(prefix_len));
    int32_t inew = m->vocab_.find(merged);
    if (inew < 0)
      return make_error("model.merges[" + std::to_string(rank) + "]: merged token '" + merged +
                        "' is not in the vocabulary");
    m->merges_.insert(ia, ib, {rank, inew});
    ++rank;
  }

  if (m->unk_token_) m->unk_id_ = m->vocab_.find(*m->unk_token_);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    m->byte_fallback_ids_[b] = m->vocab_.find(name);
  }
  return m;
}

bool BpeModel::enable_byte_mode() {
  if ((prefix_ && !prefix_->empty()) || (suffix_ && !suffix_->empty())) return false;
  for (int b = 0; b < 256; ++b) {
    std::string ch;
    append_utf8_cp(ch, byte_level_char(uint8_t(b)));
    byte_ids_[b] = vocab_.find(ch);
    if (byte_ids_[b] < 0) return false;
  }
  byte_vocab_.reserve(vocab_.size());
  std::string raw;
  vocab_.for_each([&](std::string_view token, int32_t id) {
    raw.clear();
    for (size_t i = 0; i < token.size();) {
      int len;
      uint32_t cp = decode_utf8(token.data(), i, &len);
      int byte = byte_level_byte(cp);
      if (byte < 0) return;  // not byte-level text: a byte-level word can never equal it
      raw.push_back(char(byte));
      i += len;
    }
    byte_vocab_.insert(raw, id);
  });
  byte_mode_ = true;
  return true;
}

const std::string* BpeModel::id_to_token(int32_t id) const {
  if (id < 0 || size_t(id) >= id_to_token_.size() || !has_token_[id]) return nullptr;
  return &id_to_token_[id];
}

// Hugging Face's BPE::merge_word, before merging.
void BpeModel::encode_chars(std::string_view word, std::vector<int32_t>& syms) const {
  if (byte_mode_) {
    for (unsigned char c : word) syms.push_back(byte_ids_[c]);
    return;
  }
  int32_t pending_unk = -1;  // a run of unknown characters not yet emitted
  bool plain = !prefix_ && !suffix_;
  CharCache& cc = thread_caches().chars;
  if (plain && cc.owner != serial_) cc.reset(serial_);
  std::string piece;
  for (size_t i = 0; i < word.size();) {
    int len = utf8_len(static_cast<unsigned char>(word[i]));
    if (i + size_t(len) > word.size()) len = int(word.size() - i);  // cannot happen for valid UTF-8
    bool first = i == 0, last = i + size_t(len) >= word.size();
    int32_t id = -1;
    uint32_t key = 0;
    size_t slot = 0;
    if (plain) {
      std::memcpy(&key, word.data() + i, size_t(len));
      slot = (key * 0x9E3779B1u) >> 20;
      if (key != 0 && cc.key[slot] == key) id = cc.id[slot];
    }
    if (id < 0) {
      piece.clear();
      if (!first && prefix_) piece += *prefix_;
      piece.append(word.data() + i, size_t(len));
      if (last && suffix_) piece += *suffix_;
      id = vocab_.find(piece);
      if (plain && id >= 0 && key != 0) {
        cc.key[slot] = key;
        cc.id[slot] = id;
      }
    }
    i += size_t(len);
    if (id >= 0) {
      if (pending_unk >= 0) syms.push_back(pending_unk);
      pending_unk = -1;
      syms.push_back(id);
      continue;
    }
    if (byte_fallback_) {
      bool all = true;
      for (unsigned char c : piece) all = all && byte_fallback_ids_[c] >= 0;
      if (all) {
        for (unsigned char c : piece) syms.push_back(byte_fallback_ids_[c]);
        continue;
      }
    }
    // Hugging Face fails the whole encode when unk_token is set but missing
    // from the vocabulary; we drop the character instead (encode never fails).
    if (unk_token_ && unk_id_ >= 0) {
      if (pending_unk >= 0 && !fuse_unk_) syms.push_back(pending_unk);
      pending_unk = unk_id_;
    }
  }
  if (pending_unk >= 0) syms.push_back(pending_unk);
}

PairMap::Merge BpeModel::find_merge(int32_t a, int32_t b) const {
  PairCache& pc = thread_caches().pairs;
  uint64_t k = (uint64_t(uint32_t(a)) << 32) | uint32_t(b);
  size_t slot = size_t(((k * 0x9E3779B97F4A7C15ull) >> 40) & (PairCache::kSlots - 1));
  if (pc.key[slot] == k) return pc.value[slot];
  const PairMap::Merge* m = merges_.find(a, b);
  PairMap::Merge v = m ? *m : PairMap::Merge{};
  pc.key[slot] = k;
  pc.value[slot] = v;
  return v;
}

void BpeModel::merge(std::vector<int32_t>& syms) const {
  PairCache& pairs = thread_caches().pairs;
  if (pairs.owner != serial_) pairs.reset(serial_);
  size_t n = syms.size();
  if (n < 2) return;
  if (n > 96) {
    merge_long(syms);
    return;
  }
  // Short words: keep each adjacent pair's rank; merge the lowest, leftmost
  // first (what the heap in Hugging Face's Word::merge_all pops first).
  int32_t rank[96], merged_id[96];
  auto set_pair = [&](size_t i) {
    PairMap::Merge m = find_merge(syms[i], syms[i + 1]);
    rank[i] = m.rank >= 0 ? m.rank : INT32_MAX;
    merged_id[i] = m.id;
  };
  for (size_t i = 0; i + 1 < n; ++i) set_pair(i);
  while (n > 1) {
    size_t best = 0;
    for (size_t i = 1; i + 1 < n; ++i)
      if (rank[i] < rank[best]) best = i;
    if (rank[best] == INT32_MAX) break;
    syms[best] = merged_id[best];
    for (size_t i = best + 1; i + 1 < n; ++i) {
      syms[i] = syms[i + 1];
      rank[i] = rank[i + 1];
      merged_id[i] = merged_id[i + 1];
    }
    --n;
    if (best > 0) set_pair(best - 1);
    if (best + 1 < n) set_pair(best);
  }
  syms.resize(n);
}

// Long words (whole texts for tokenizers without a splitting pre-tokenizer,
// e.g. Gemma): the heap and linked list of Hugging Face's Word::merge_all.
void BpeModel::merge_long(std::vector<int32_t>& syms) const {
  using Item = HeapItem;
  // Per-thread scratch: long words come one after another, no allocation.
  ThreadCaches& tc = thread_caches();
  std::vector<int32_t>&prev = tc.prev, &next = tc.next;
  std::vector<Item>& heap = tc.heap;
  size_t n = syms.size();
  prev.resize(n);
  next.resize(n);
  heap.clear();
  auto cmp = [](const Item& a, const Item& b) { return a.after(b); };
  for (size_t i = 0; i < n; ++i) {
    prev[i] = int32_t(i) - 1;
    next[i] = i + 1 < n ? int32_t(i + 1) : -1;
    if (i + 1 < n)
      if (PairMap::Merge m = find_merge(syms[i], syms[i + 1]); m.rank >= 0) heap.push_back({m.rank, uint32_t(i), m.id});
  }
  std::make_heap(heap.begin(), heap.end(), cmp);
  auto push = [&](Item it) {
    heap.push_back(it);
    std::push_heap(heap.begin(), heap.end(), cmp);
  };
  constexpr int32_t kDead = -2;  // a symbol merged into its left neighbour
  while (!heap.empty()) {
    std::pop_heap(heap.begin(), heap.end(), cmp);
    Item top = heap.back();
    heap.pop_back();
    size_t p = top.pos;
    if (prev[p] == kDead || next[p] < 0) continue;
    size_t q = size_t(next[p]);
    if (find_merge(syms[p], syms[q]).id != top.id) continue;  // stale entry
    syms[p] = top.id;
    next[p] = next[q];
    prev[q] = kDead;
    if (next[q] >= 0) prev[size_t(next[q])] = int32_t(p);
    if (prev[p] >= 0)
      if (PairMap::Merge l = find_merge(syms[size_t(prev[p])], syms[p]); l.rank >= 0) push({l.rank, uint32_t(prev[p]), l.id});
    if (next[p] >= 0)
      if (PairMap::Merge r = find_merge(syms[p], syms[size_t(next[p])]); r.rank >= 0) push({r.rank, uint32_t(p), r.id});
  }
  size_t w = 0;
  for (size_t i = 0; i < n; ++i)
    if (prev[i] != kDead) syms[w++] = syms[i];
  syms.resize(w);
}

void BpeModel::encode_word(std::string_view word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  FrontCache& front = thread_caches().front;
  if (front.owner != serial_) front.reset(serial_);
  uint64_t h = 0;
  FrontCache::Entry* slot = nullptr;
  if (word.size() <= FrontCache::kMaxKey) {
    h = hash_bytes(word.data(), word.size());
    slot = &front.entries[h & (FrontCache::kSlots - 1)];
    if (slot->hash == h && slot->len == word.size() && std::memcmp(slot->key, word.data(), word.size()) == 0) {
      out.insert(out.end(), slot->ids, slot->ids + slot->n_ids);
      return;
    }
  }
  size_t first = out.size();
  encode_word_uncached(word, out);
  size_t n = out.size() - first;
  if (slot && n <= FrontCache::kMaxIds) {
    slot->hash = h;
    slot->len = uint8_t(word.size());
    slot->n_ids = uint8_t(n);
    std::memcpy(slot->key, word.data(), word.size());
    std::copy(out.begin() + long(first), out.end(), slot->ids);
  }
}

void BpeModel::encode_word_uncached(std::string_view word, std::vector<int32_t>& out) const {
  if (ignore_merges_) {
    int32_t id = byte_mode_ ? byte_vocab_.find(word) : vocab_.find(word);
    if (id >= 0) {
      out.push_back(id);
      return;
    }
  }
  ThreadCaches& tc = thread_caches();
  WordCache& cache = tc.word;
  bool cacheable = word.size() < kMaxCachedWordBytes;
  if (cacheable) {
    if (cache.owner != serial_) cache.reset(serial_);
    int32_t e = cache.index.find(word);
    if (e >= 0) {
      auto [offset, count] = cache.entries[size_t(e)];
      out.insert(out.end(), cache.ids.begin() + offset, cache.ids.begin() + offset + count);
      return;
    }
  }
  std::vector<int32_t>& syms = tc.syms;
  syms.clear();
  encode_chars(word, syms);
  merge(syms);
  out.insert(out.end(), syms.begin(), syms.end());
  if (cacheable) {
    if (cache.entries.size() >= kMaxCacheEntries) cache.reset(serial_);
    cache.entries.push_back({uint32_t(cache.ids.size()), uint32_t(syms.size())});
    cache.ids.insert(cache.ids.end(), syms.begin(), syms.end());
    cache.index.insert(word, int32_t(cache.entries.size() - 1));
  }
}

}  // namespace muse::tok
