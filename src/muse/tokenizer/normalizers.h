// tokenizer.json normalizers. Each rewrites one piece of text (the input
// between raw added tokens) in place, as Hugging Face's NormalizedString
// does (we do not track offsets).
#pragma once

#include <memory>
#include <string>

#include "muse/core/json.h"
#include "muse/core/status.h"

namespace muse::tok {

class Normalizer {
 public:
  virtual ~Normalizer() = default;
  virtual void normalize(std::string& text) const = 0;
};

// nullptr for a JSON null; an error naming the type for unknown/unsupported
// normalizers (Precompiled, BertNormalizer).
Result<std::unique_ptr<Normalizer>> make_normalizer(const Json& j);

}  // namespace muse::tok
