// The output grammars (tool_call_grammar.h: forced tool calls;
// json_schema_grammar.h: structured output) over a tokenizer's vocabulary,
// as the sampler's TokenConstraint: framing markers are fed by id, other
// special tokens are refused, every other id is its raw bytes.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "muse/chat/json_schema_grammar.h"
#include "muse/chat/tool_call_grammar.h"
#include "muse/sampling/token_constraint.h"
#include "muse/tokenizer/tokenizer.h"

namespace muse::chat {

// Built once per model (the adapter keeps it); shared by every constrained
// sequence.
struct GrammarVocabulary {
  static constexpr int8_t kText = -1, kRefused = -2;
  std::vector<int8_t> kind;        // kText, kRefused, or a GrammarMarker
  std::vector<std::string> bytes;  // kText ids: the raw bytes
  std::vector<uint8_t> classes;    // kText ids: kTextHas* bits of the bytes

  static uint8_t classify(std::string_view bytes);
  // `vocab_size`: the model's rows (ids past the tokenizer are refused).
  static std::shared_ptr<const GrammarVocabulary> build(const Tokenizer& tok, const FramingFormat& framing,
                                                        int64_t vocab_size);
};

// Grammar: ToolCallGrammar or StructuredAnswerGrammar (State, initial,
// feed_text, feed_marker, fast_path_blockers, finished).
template <class Grammar>
class GrammarConstraint : public TokenConstraint {
 public:
  GrammarConstraint(std::shared_ptr<const Grammar> grammar, std::shared_ptr<const GrammarVocabulary> vocab)
      : grammar_(std::move(grammar)), vocab_(std::move(vocab)), state_(grammar_->initial()) {}

  bool allows(int32_t id) const override {
    if (broken_) return true;
    if (id < 0 || size_t(id) >= vocab_->kind.size()) return false;
    // Most of an output is free text (reasoning, string values): a token
    // whose characters the state takes as they come needs no simulation.
    if (vocab_->kind[size_t(id)] == GrammarVocabulary::kText &&
        (vocab_->classes[size_t(id)] & grammar_->fast_path_blockers(state_)) == 0)
      return true;
    typename Grammar::State s = state_;
    return feed(s, id);
  }

  // A refused id can only arrive through the sampler's fallback (nothing
  // admitted was possible); the constraint then stands aside.
  void accept(int32_t id) override {
    if (broken_) return;
    typename Grammar::State s = state_;
    if (feed(s, id)) state_ = s;
    else broken_ = true;
  }

  bool finished() const { return grammar_->finished(state_); }

 private:
  bool feed(typename Grammar::State& s, int32_t id) const {
    if (id < 0 || size_t(id) >= vocab_->kind.size()) return false;
    const int8_t k = vocab_->kind[size_t(id)];
    if (k == GrammarVocabulary::kRefused) return false;
    if (k == GrammarVocabulary::kText) return grammar_->feed_text(s, vocab_->bytes[size_t(id)]);
    return grammar_->feed_marker(s, GrammarMarker(k));
  }

  std::shared_ptr<const Grammar> grammar_;
  std::shared_ptr<const GrammarVocabulary> vocab_;
  typename Grammar::State state_;
  bool broken_ = false;
};

using ToolCallConstraint = GrammarConstraint<ToolCallGrammar>;
using StructuredAnswerConstraint = GrammarConstraint<StructuredAnswerGrammar>;

}  // namespace muse::chat
