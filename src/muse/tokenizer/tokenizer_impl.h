// The pieces of a loaded tokenizer.json and the encode/decode pipeline:
// added tokens (raw) -> normalizer -> added tokens (normalized) ->
// pre-tokenizer -> BPE -> [post-processor]; ids -> tokens -> decoder.
// Internal to the tokenizer library (Tokenizer is the public face).
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"
#include "muse/tokenizer/added_vocabulary.h"
#include "muse/tokenizer/bpe.h"
#include "muse/tokenizer/decoders.h"
#include "muse/tokenizer/normalizers.h"
#include "muse/tokenizer/post_processors.h"
#include "muse/tokenizer/pre_tokenizers.h"

namespace muse::tok {

class TokenizerImpl {
 public:
  static Result<std::unique_ptr<TokenizerImpl>> from_json(const Json& root);

  void encode(std::string_view text, bool add_special_tokens, std::vector<int32_t>& out) const;
  // `raw`: keep the bytes ByteLevel/ByteFallback produce without U+FFFD
  // substitution (the streaming detokenizer decides where characters end).
  std::string decode(const int32_t* ids, size_t n, bool skip_special_tokens, bool raw) const;

  int32_t token_to_id(std::string_view token) const;
  const std::string* id_to_token(int32_t id) const;
  bool is_special(int32_t id) const { return id >= 0 && size_t(id) < special_.size() && special_[size_t(id)]; }
  // Whether decode with skip_special_tokens drops this id.
  bool skipped_when_skipping_specials(int32_t id) const {
    return id >= 0 && size_t(id) < skip_.size() && skip_[size_t(id)];
  }
  // A token of ByteFallback's "<0xAB>" form.
  bool is_byte_fallback_token(int32_t id) const;
  size_t vocab_size() const { return vocab_size_; }
  int32_t id_limit() const { return id_limit_; }
  const std::string& description() const { return description_; }

 private:
  void encode_segment(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  void encode_normalized(std::string_view text, bool at_start, std::vector<int32_t>& out) const;
  void encode_words(std::string_view text, bool at_start, std::vector<int32_t>& out) const;

  std::unique_ptr<Normalizer> normalizer_;
  std::unique_ptr<PreTokenizer> pre_tokenizer_;
  std::unique_ptr<BpeModel> model_;
  std::unique_ptr<PostProcessor> post_processor_;
  std::unique_ptr<Decoder> decoder_;
  AddedVocabulary added_;

  // Per id, for decoding: ByteLevel bytes (plain ByteLevel decoder), and
  // special / skip flags.
  bool plain_byte_level_decoder_ = false;
  std::vector<std::string> byte_level_bytes_;
  std::vector<uint8_t> special_, skip_;
  size_t vocab_size_ = 0;
  int32_t id_limit_ = 0;
  std::string description_;
};

}  // namespace muse::tok
