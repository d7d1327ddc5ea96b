// tokenizer.json decoders: token strings -> text, step by step as Hugging
// Face's decode_chain. In `raw` mode (the streaming detokenizer's) ByteLevel
// and ByteFallback keep the bytes they produce as they are, without the
// U+FFFD substitution, so a caller can hold back an incomplete character.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"

namespace muse::tok {

class Decoder {
 public:
  virtual ~Decoder() = default;
  virtual void decode_chain(std::vector<std::string>& tokens, bool raw) const = 0;
};

// nullptr for JSON null.
Result<std::unique_ptr<Decoder>> make_decoder(const Json& j);

// Whether the decoder is exactly one ByteLevel step (Tokenizer then decodes
// through a per-id byte table).
bool is_plain_byte_level_decoder(const Json& j);

// ByteLevel's per-token rule: the alphabet bytes of `token`, or its own
// UTF-8 bytes when any character is outside the alphabet.
void byte_level_token_bytes(std::string_view token, std::string& out);

}  // namespace muse::tok
