// The forced-tool-call grammar (tool_call_grammar.h) over a tokenizer's
// vocabulary, as the sampler's TokenConstraint: framing markers are fed by
// id, other special tokens are refused, every other id is its raw bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "muse/chat/tool_call_grammar.h"
#include "muse/sampling/token_constraint.h"
#include "muse/tokenizer/tokenizer.h"

namespace muse::chat {

// Built once per model (the adapter keeps it); shared by every constrained
// sequence.
struct GrammarVocabulary {
  static constexpr int8_t kText = -1, kRefused = -2;
  std::vector<int8_t> kind;         // kText, kRefused, or a GrammarMarker
  std::vector<std::string> bytes;   // kText ids: the raw bytes
  std::vector<uint8_t> has_angle;   // kText ids: the bytes contain '<'

  // `vocab_size`: the model's rows (ids past the tokenizer are refused).
  static std::shared_ptr<const GrammarVocabulary> build(const Tokenizer& tok, const FramingFormat& framing,
                                                        int64_t vocab_size);
};

class ToolCallConstraint : public TokenConstraint {
 public:
  ToolCallConstraint(std::shared_ptr<const ToolCallGrammar> grammar, std::shared_ptr<const GrammarVocabulary> vocab);
  bool allows(int32_t id) const override;
  void accept(int32_t id) override;
  bool finished() const { return grammar_->finished(state_); }

 private:
  bool feed(ToolCallGrammar::State& s, int32_t id) const;

  std::shared_ptr<const ToolCallGrammar> grammar_;
  std::shared_ptr<const GrammarVocabulary> vocab_;
  ToolCallGrammar::State state_;
  bool broken_ = false;  // a refused id was accepted (sampler fallback): allow anything from now on
};

}  // namespace muse::chat
