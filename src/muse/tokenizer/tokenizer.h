// Hugging Face tokenizer.json, in C++: the ids `tokenizers` would produce
// for the same file and text, and the text its decode would produce.
//
//   auto tok = muse::Tokenizer::from_file("model/tokenizer.json");
//   if (!tok.ok()) { report(tok.message()); }
//   std::vector<int32_t> ids = tok->encode("Hello <|eot|>");
//   std::string text = tok->decode(ids);
//
// Supported: BPE models (byte-level and SentencePiece-style with byte
// fallback), added/special tokens with lstrip/rstrip/single_word/normalized,
// the normalizers, pre-tokenizers, decoders and post-processors real files
// use (see docs/tokenizer.md for the list and for deviations). A Tokenizer
// is immutable and cheap to copy; encode/decode may run on many threads.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "muse/core/status.h"

namespace muse {

namespace tok {
class TokenizerImpl;
}

class Tokenizer {
 public:
  Tokenizer();  // empty: encodes to nothing, has no tokens
  static Result<Tokenizer> from_file(const std::string& tokenizer_json_path);
  static Result<Tokenizer> from_json(std::string_view tokenizer_json_text);

  // Never fails. Text that is not valid UTF-8 is first decoded as Python's
  // bytes.decode("utf-8", errors="replace") and WHATWG TextDecoder do (each
  // maximal invalid subpart becomes U+FFFD): the ids are those Hugging Face
  // gives for the string a caller holding these bytes would pass it.
  std::vector<int32_t> encode(std::string_view text, bool add_special_tokens = false) const;
  // Appends to `out` (no allocation of a fresh vector per call).
  void encode_to(std::string_view text, std::vector<int32_t>& out, bool add_special_tokens = false) const;

  // Ids without a token are skipped (as Hugging Face does); the result is
  // always valid UTF-8.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special_tokens = false) const;

  int32_t token_to_id(std::string_view token) const;  // -1 if absent
  std::string id_to_token(int32_t id) const;           // "" if no token has this id
  // Distinct tokens, added ones included (Hugging Face's
  // get_vocab_size(with_added_tokens=True)).
  size_t vocab_size() const;
  // One past the largest id of any token (the logits rows that can occur).
  int32_t id_limit() const;
  bool is_special(int32_t id) const;  // an added token marked special
  bool empty() const { return impl_ == nullptr; }

  // One line for logs: model kind, sizes, and whether fast paths are used.
  std::string describe() const;

  const tok::TokenizerImpl* impl() const { return impl_.get(); }

 private:
  std::shared_ptr<const tok::TokenizerImpl> impl_;
};

}  // namespace muse
