// Open-addressing hash maps for the tokenizer's hot lookups: byte string ->
// id (vocabulary, word cache) and token-id pair -> merge. Keys of the string
// map live in one arena, so a lookup is a hash, one probe sequence and a
// memcmp, with no allocation.
#pragma once

#include <cstdint>
#include <cstring>
#include <string>
#include <string_view>
#include <vector>

namespace muse::tok {

inline uint64_t hash_bytes(const char* p, size_t n) {
  // A multiply-mix over 8-byte words: fast for the short keys (words,
  // tokens) the tokenizer hashes; quality is ample for linear probing.
  constexpr uint64_t k = 0x9E3779B97F4A7C15ull;
  uint64_t h = 0x243F6A8885A308D3ull ^ (n * k);
  while (n >= 8) {
    uint64_t w;
    std::memcpy(&w, p, 8);
    h = (h ^ w) * k;
    h ^= h >> 29;
    p += 8;
    n -= 8;
  }
  if (n) {
    uint64_t w = 0;
    std::memcpy(&w, p, n);
    h = (h ^ w ^ (uint64_t(n) << 56)) * k;
  }
  h ^= h >> 32;
  h *= 0xD6E8FEB86659FD93ull;
  h ^= h >> 32;
  return h;
}

// byte string -> int32 value. Insert-only (plus clear).
class StringMap {
 public:
  static constexpr int32_t kAbsent = -1;

  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    if (cap > slots_.size()) rehash(cap);
  }
  size_t size() const { return count_; }
  size_t arena_bytes() const { return arena_.size(); }
  void clear() {
    slots_.assign(slots_.size(), Slot{});
    arena_.clear();
    count_ = 0;
  }

  // Sets key -> value (replacing a present key's value). Returns true when new.
  bool insert(std::string_view key, int32_t value) {
    if ((count_ + 1) * 2 > slots_.size()) rehash(slots_.empty() ? 16 : slots_.size() * 2);
    uint64_t h = hash_bytes(key.data(), key.size());
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      Slot& s = slots_[i];
      if (s.len == kEmpty) {
        s.hash = uint32_t(h >> 32);
        s.offset = uint32_t(arena_.size());
        s.len = uint32_t(key.size());
        s.value = value;
        arena_.append(key.data(), key.size());
        ++count_;
        return true;
      }
      if (s.hash == uint32_t(h >> 32) && s.len == key.size() &&
          std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0) {
        s.value = value;
        return false;
      }
    }
  }

  int32_t find(std::string_view key) const {
    if (slots_.empty()) return kAbsent;
    uint64_t h = hash_bytes(key.data(), key.size());
    size_t mask = slots_.size() - 1;
    for (size_t i = h & mask;; i = (i + 1) & mask) {
      const Slot& s = slots_[i];
      if (s.len == kEmpty) return kAbsent;
      if (s.hash == uint32_t(h >> 32) && s.len == key.size() &&
          std::memcmp(arena_.data() + s.offset, key.data(), key.size()) == 0)
        return s.value;
    }
  }

  // Calls f(key, value) for every entry.
  template <class F>
  void for_each(F&& f) const {
    for (const Slot& s : slots_)
      if (s.len != kEmpty) f(std::string_view(arena_.data() + s.offset, s.len), s.value);
  }

 private:
  static constexpr uint32_t kEmpty = 0xFFFFFFFFu;
  struct Slot {
    uint32_t hash = 0, offset = 0, len = kEmpty;
    int32_t value = 0;
  };
  void rehash(size_t cap) {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(cap, Slot{});
    size_t mask = cap - 1;
    for (const Slot& s : old) {
      if (s.len == kEmpty) continue;
      uint64_t h = hash_bytes(arena_.data() + s.offset, s.len);
      size_t i = h & mask;
      while (slots_[i].len != kEmpty) i = (i + 1) & mask;
      slots_[i] = s;
    }
  }
  std::vector<Slot> slots_;
  std::string arena_;
  size_t count_ = 0;
};

// (left id, right id) -> (rank, merged id).
class PairMap {
 public:
  struct Merge {
    int32_t rank = -1, id = -1;
  };
  void reserve(size_t n) {
    size_t cap = 16;
    while (cap < n * 2) cap <<= 1;
    slots_.assign(cap, Slot{});
    count_ = 0;
  }
  // Later inserts of the same pair replace earlier ones (a Rust HashMap
  // collected from the merges list keeps the last duplicate).
  void insert(int32_t a, int32_t b, Merge m) {
    if ((count_ + 1) * 2 > slots_.size()) grow();
    uint64_t key = pack(a, b);
    size_t mask = slots_.size() - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
      if (slots_[i].key == kEmpty) {
        slots_[i] = {key, m};
        ++count_;
        return;
      }
      if (slots_[i].key == key) {
        slots_[i].merge = m;
        return;
      }
    }
  }
  const Merge* find(int32_t a, int32_t b) const {
    if (slots_.empty()) return nullptr;
    uint64_t key = pack(a, b);
    size_t mask = slots_.size() - 1;
    for (size_t i = mix(key) & mask;; i = (i + 1) & mask) {
      if (slots_[i].key == key) return &slots_[i].merge;
      if (slots_[i].key == kEmpty) return nullptr;
    }
  }
  size_t size() const { return count_; }

 private:
  static constexpr uint64_t kEmpty = ~0ull;
  static uint64_t pack(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }
  static uint64_t mix(uint64_t k) {
    k ^= k >> 31;
    k *= 0x7FB5D329728EA185ull;
    k ^= k >> 27;
    return k;
  }
  void grow() {
    std::vector<Slot> old = std::move(slots_);
    slots_.assign(old.empty() ? 16 : old.size() * 2, Slot{});
    count_ = 0;
    for (const Slot& s : old)
      if (s.key != kEmpty) insert(int32_t(s.key >> 32), int32_t(s.key & 0xFFFFFFFFu), s.merge);
  }
  struct Slot {
    uint64_t key = kEmpty;
    Merge merge;
  };
  std::vector<Slot> slots_;
  size_t count_ = 0;
};

}  // namespace muse::tok
