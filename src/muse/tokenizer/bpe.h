// The BPE model of tokenizer.json, as Hugging Face tokenizers runs it:
// a word is split into characters (each looked up in the vocabulary, with
// byte fallback or the unknown token for misses), then the adjacent pair of
// lowest merge rank is merged, leftmost first, until no pair has a merge.
// `ignore_merges` (Llama 3, gpt-oss) emits a word found whole in the
// vocabulary directly; dropout is ignored (we always encode
// deterministically). Results are cached per thread, word -> ids.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"
#include "muse/tokenizer/flat_map.h"

namespace muse::tok {

// GPT-2's byte-level alphabet: byte -> code point, and back (-1: not in it).
uint32_t byte_level_char(uint8_t b);
int byte_level_byte(uint32_t cp);

class BpeModel {
 public:
  static Result<std::unique_ptr<BpeModel>> from_json(const Json& model);

  // Byte mode: words arrive as raw bytes, each byte standing for its
  // byte-level alphabet character (the ByteLevel pre-tokenizer's mapping,
  // skipped). Equivalent and faster; possible only when every alphabet
  // character is in the vocabulary and no subword prefix/suffix is set.
  bool enable_byte_mode();
  bool byte_mode() const { return byte_mode_; }

  // Appends the ids of one pre-tokenized word.
  void encode_word(std::string_view word, std::vector<int32_t>& out) const;

  int32_t token_to_id(std::string_view token) const { return vocab_.find(token); }
  // nullptr when no vocabulary entry has this id.
  const std::string* id_to_token(int32_t id) const;
  size_t vocab_entries() const { return vocab_.size(); }
  int32_t max_id() const { return int32_t(id_to_token_.size()) - 1; }

 private:
  BpeModel() = default;
  void encode_word_uncached(std::string_view word, std::vector<int32_t>& out) const;
  void encode_chars(std::string_view word, std::vector<int32_t>& syms) const;
  PairMap::Merge find_merge(int32_t a, int32_t b) const;  // through the per-thread pair cache
  void merge(std::vector<int32_t>& syms) const;
  void merge_long(std::vector<int32_t>& syms) const;

  StringMap vocab_;
  std::vector<std::string> id_to_token_;
  std::vector<uint8_t> has_token_;
  PairMap merges_;
  std::optional<std::string> unk_token_, prefix_, suffix_;
  int32_t unk_id_ = -1;
  bool fuse_unk_ = false, byte_fallback_ = false, ignore_merges_ = false;
  int32_t byte_fallback_ids_[256];

  bool byte_mode_ = false;
  StringMap byte_vocab_;  // raw bytes -> id (byte mode)
  int32_t byte_ids_[256];
  uint64_t serial_ = 0;  // identifies this model's entries in the per-thread cache
};

}  // namespace muse::tok
