#include "muse/tokenizer/added_vocabulary.h"

#include <algorithm>

#include "muse/tokenizer/normalizers.h"
#include "muse/tokenizer/unicode.h"

namespace muse::tok {

void TokenTrie::add(std::string_view key, int32_t value) {
  if (key.empty()) return;
  first_[static_cast<unsigned char>(key[0])] = true;
  int32_t node = 0;
  for (unsigned char c : key) {
    auto& ch = nodes_[size_t(node)].children;
    auto it = std::lower_bound(ch.begin(), ch.end(), c,
                               [](const std::pair<uint8_t, int32_t>& e, unsigned char b) { return e.first < b; });
    if (it != ch.end() && it->first == c) {
      node = it->second;
    } else {
      int32_t fresh = int32_t(nodes_.size());
      ch.insert(it, {c, fresh});
      nodes_.push_back(Node{});
      node = fresh;
    }
  }
  nodes_[size_t(node)].value = value;
}

size_t TokenTrie::longest_at(std::string_view text, size_t pos, int32_t* value) const {
  size_t best = 0;
  int32_t node = 0;
  for (size_t i = pos; i < text.size(); ++i) {
    unsigned char c = static_cast<unsigned char>(text[i]);
    const auto& ch = nodes_[size_t(node)].children;
    auto it = std::lower_bound(ch.begin(), ch.end(), c,
                               [](const std::pair<uint8_t, int32_t>& e, unsigned char b) { return e.first < b; });
    if (it == ch.end() || it->first != c) break;
    node = it->second;
    if (nodes_[size_t(node)].value >= 0) {
      best = i + 1 - pos;
      *value = nodes_[size_t(node)].value;
    }
  }
  return best;
}

Status parse_added_token(const Json& j, size_t index, AddedToken* out) {
  std::string where = "added_tokens[" + std::to_string(index) + "]";
  if (!j.is_object()) return make_error(where + " must be an object");
  const Json* content = j.find("content");
  if (!content || !content->is_string()) return make_error(where + ".content must be a string");
  out->content = content->as_string();
  MUSE_ASSIGN_OR_RETURN(out->special, j.bool_member("special", false));
  // Hugging Face's default for a missing "normalized" is true (AddedToken::default).
  MUSE_ASSIGN_OR_RETURN(out->normalized, j.bool_member("normalized", true));
  MUSE_ASSIGN_OR_RETURN(out->single_word, j.bool_member("single_word", false));
  MUSE_ASSIGN_OR_RETURN(out->lstrip, j.bool_member("lstrip", false));
  MUSE_ASSIGN_OR_RETURN(out->rstrip, j.bool_member("rstrip", false));
  return Status::Ok();
}

Status AddedVocabulary::add(const AddedToken& t, int32_t id, const Normalizer* normalizer) {
  normalized_content_.erase(id);
  if (t.normalized && normalizer) {
    std::string normed = t.content;
    normalizer->normalize(normed);
    if (normed != t.content) normalized_content_[id] = normed;
  }
  by_content_[t.content] = id;
  if (t.special) special_.insert(t.content);
  by_id_[id] = t;
  return Status::Ok();
}

void AddedVocabulary::build_tries() {
  raw_trie_ = TokenTrie();
  normalized_trie_ = TokenTrie();
  for (const auto& [id, t] : by_id_) {
    if (t.normalized) {
      auto it = normalized_content_.find(id);
      normalized_trie_.add(it != normalized_content_.end() ? it->second : t.content, id);
    } else {
      raw_trie_.add(t.content, id);
    }
  }
}

namespace {

// Rust regex \w at the last / first character (approximated by Oniguruma's
// word class: Alphabetic, marks, decimal digits, connector punctuation).
bool ends_with_word(std::string_view s) {
  if (s.empty()) return false;
  size_t i = s.size() - 1;
  while (i > 0 && (static_cast<unsigned char>(s[i]) & 0xC0) == 0x80) --i;
  int len;
  return char_classes(decode_utf8(s.data(), i, &len)) & kWord;
}
bool starts_with_word(std::string_view s) {
  if (s.empty()) return false;
  int len;
  return char_classes(decode_utf8(s.data(), 0, &len)) & kWord;
}
// Start of the trailing whitespace run of s (Rust `\s*$`).
size_t trailing_space_start(std::string_view s) {
  size_t i = s.size();
  while (i > 0) {
    size_t j = i - 1;
    while (j > 0 && (static_cast<unsigned char>(s[j]) & 0xC0) == 0x80) --j;
    int len;
    if (!is_white_space(decode_utf8(s.data(), j, &len))) break;
    i = j;
  }
  return i;
}
// Length of the leading whitespace run of s (Rust `^\s*`).
size_t leading_space_len(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    int len;
    if (!is_white_space(decode_utf8(s.data(), i, &len))) break;
    i += size_t(len);
  }
  return i;
}

}  // namespace

void AddedVocabulary::split(std::string_view text, bool normalized_tokens, std::vector<Piece>& out) const {
  out.clear();
  const TokenTrie& trie = normalized_tokens ? normalized_trie_ : raw_trie_;
  if (text.empty() || trie.empty()) {
    out.push_back({0, uint32_t(text.size()), -1});
    return;
  }
  // Hugging Face's AddedVocabulary::find_matches over a leftmost-longest
  // Aho-Corasick iteration (non-overlapping, resuming after each match).
  size_t start_offset = 0;
  size_t pos = 0;
  while (pos < text.size()) {
    if (!trie.may_start(static_cast<unsigned char>(text[pos]))) {
      ++pos;
      continue;
    }
    int32_t id = -1;
    size_t len = trie.longest_at(text, pos, &id);
    if (len == 0) {
      ++pos;
      continue;
    }
    size_t start = pos, stop = pos + len;
    pos = stop;  // the automaton resumes after the match either way
    const AddedToken& t = by_id_.at(id);
    if (t.single_word) {
      bool start_space = start == 0 || !ends_with_word(text.substr(0, start));
      bool stop_space = stop == text.size() || !starts_with_word(text.substr(stop));
      if (!start_space || !stop_space) continue;
    }
    if (t.lstrip) start = std::max(trailing_space_start(text.substr(0, start)), start_offset);
    if (t.rstrip) stop += leading_space_len(text.substr(stop));
    if (start_offset < start) out.push_back({uint32_t(start_offset), uint32_t(start), -1});
    out.push_back({uint32_t(start), uint32_t(stop), id});
    start_offset = stop;
  }
  if (start_offset != text.size()) out.push_back({uint32_t(start_offset), uint32_t(text.size()), -1});
}

int32_t AddedVocabulary::token_to_id(std::string_view content) const {
  auto it = by_content_.find(std::string(content));
  return it == by_content_.end() ? -1 : it->second;
}

const std::string* AddedVocabulary::id_to_token(int32_t id) const {
  auto n = normalized_content_.find(id);
  if (n != normalized_content_.end()) return &n->second;
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second.content;
}

const AddedToken* AddedVocabulary::token(int32_t id) const {
  auto it = by_id_.find(id);
  return it == by_id_.end() ? nullptr : &it->second;
}

std::vector<int32_t> AddedVocabulary::ids() const {
  std::vector<int32_t> out;
  for (const auto& [id, t] : by_id_) out.push_back(id);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace muse::tok
