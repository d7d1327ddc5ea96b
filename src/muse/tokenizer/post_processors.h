// tokenizer.json post-processors, applied to a single sequence's ids when
// the caller asks for special tokens (TemplateProcessing's "single"
// template, RoBERTa/BERT's [CLS] … [SEP]; ByteLevel changes no ids).
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"

namespace muse::tok {

class PostProcessor {
 public:
  virtual ~PostProcessor() = default;
  virtual void process(std::vector<int32_t>& ids) const = 0;
};

// nullptr for JSON null.
Result<std::unique_ptr<PostProcessor>> make_post_processor(const Json& j);

}  // namespace muse::tok
