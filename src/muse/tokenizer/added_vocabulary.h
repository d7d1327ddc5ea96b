// Added tokens (special and not): matched in the raw text before
// normalization (normalized=false) or in the normalized pieces
// (normalized=true), leftmost-longest, with single_word/lstrip/rstrip, and
// given ids exactly as Hugging Face's AddedVocabulary assigns them.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"
#include "muse/tokenizer/flat_map.h"

namespace muse::tok {

class Normalizer;

struct AddedToken {
  std::string content;
  bool single_word = false, lstrip = false, rstrip = false, normalized = true, special = false;
};

// A byte trie answering "longest token starting here".
class TokenTrie {
 public:
  void add(std::string_view key, int32_t value);
  bool empty() const { return nodes_.size() <= 1; }
  // Length of the longest key starting at text[pos], 0 if none; *value set.
  size_t longest_at(std::string_view text, size_t pos, int32_t* value) const;
  bool may_start(unsigned char c) const { return first_[c]; }

 private:
  struct Node {
    std::vector<std::pair<uint8_t, int32_t>> children;  // sorted by byte
    int32_t value = -1;
  };
  std::vector<Node> nodes_{Node{}};
  bool first_[256] = {};
};

class AddedVocabulary {
 public:
  // One piece of a split: text [start, end), or an added token's id.
  struct Piece {
    uint32_t start, end;
    int32_t id;  // -1: text
  };

  // `model_token_to_id` / `model_vocab_size`: the model's lookup and entry
  // count (ids of tokens absent from the model continue after it).
  template <class ModelLookup>
  Status load(const Json& added_tokens, const ModelLookup& model_token_to_id, size_t model_vocab_size,
              const Normalizer* normalizer);

  // Splits `text` on the non-normalized (raw) or normalized tokens.
  void split(std::string_view text, bool normalized_tokens, std::vector<Piece>& out) const;
  bool has_normalized_tokens() const { return !normalized_trie_.empty(); }
  bool has_raw_tokens() const { return !raw_trie_.empty(); }

  int32_t token_to_id(std::string_view content) const;
  // The added token with this id (its normalized form for normalized ones,
  // as Hugging Face's simple_id_to_token), or nullptr.
  const std::string* id_to_token(int32_t id) const;
  const AddedToken* token(int32_t id) const;
  bool is_special_content(std::string_view content) const { return special_.count(std::string(content)) > 0; }
  size_t size() const { return by_content_.size(); }
  // Ids in ascending order.
  std::vector<int32_t> ids() const;

 private:
  Status add(const AddedToken& t, int32_t id, const Normalizer* normalizer);
  void build_tries();

  std::unordered_map<std::string, int32_t> by_content_;
  std::unordered_map<int32_t, AddedToken> by_id_;
  std::unordered_map<int32_t, std::string> normalized_content_;
  std::unordered_set<std::string> special_;
  TokenTrie raw_trie_, normalized_trie_;
};

Status parse_added_token(const Json& j, size_t index, AddedToken* out);

template <class ModelLookup>
Status AddedVocabulary::load(const Json& added_tokens, const ModelLookup& model_token_to_id,
                             size_t model_vocab_size, const Normalizer* normalizer) {
  if (added_tokens.is_null()) return Status::Ok();
  if (!added_tokens.is_array()) return make_error("added_tokens must be an array");
  // Hugging Face ignores the "id" fields: a token gets its id from the
  // model's vocabulary, else the next id after the model's entry count.
  int32_t next_id = int32_t(model_vocab_size);
  size_t index = 0;
  for (const Json& j : added_tokens.as_array()) {
    AddedToken t;
    MUSE_RETURN_IF_ERROR(parse_added_token(j, index++, &t));
    if (t.content.empty()) continue;
    auto present = by_content_.find(t.content);
    int32_t id;
    if (present != by_content_.end()) {
      id = present->second;
    } else {
      id = model_token_to_id(t.content);
      if (id < 0) id = next_id++;
    }
    MUSE_RETURN_IF_ERROR(add(t, id, normalizer));
  }
  build_tries();
  return Status::Ok();
}

}  // namespace muse::tok
