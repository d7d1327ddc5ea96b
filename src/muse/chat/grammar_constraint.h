// The output grammars (tool_call_grammar.h: forced tool calls;
// json_schema_grammar.h: structured output) over a tokenizer's vocabulary,
// as the sampler's TokenConstraint: framing markers are fed by id, other
// special tokens are refused, every other id is its raw bytes.
#pragma once

#include <algorithm>
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
  std::vector<int32_t> by_first_byte[256];  // kText ids, grouped by their first byte
  std::vector<int32_t> markers;             // ids of the framing markers

  static uint8_t classify(std::string_view bytes);
  // Fills by_first_byte and markers from kind/bytes (build() calls it;
  // hand-made vocabularies call it themselves).
  void index();
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

  // A whole mask at once: a group of ids sharing a first byte the state
  // refuses is skipped without simulating any of them (in structural states
  // only a few first bytes are admitted, so most of a 200k vocabulary goes).
  void fill_mask(std::span<uint8_t> allowed) const override {
    if (broken_) {
      std::fill(allowed.begin(), allowed.end(), uint8_t(1));
      return;
    }
    std::fill(allowed.begin(), allowed.end(), uint8_t(0));
    const uint8_t blockers = grammar_->fast_path_blockers(state_);
    for (int b = 0; b < 256; ++b) {
      const auto& group = vocab_->by_first_byte[b];
      if (group.empty()) continue;
      typename Grammar::State after_first = state_;
      const char c = char(b);
      if (!grammar_->feed_text(after_first, std::string_view(&c, 1))) continue;
      for (int32_t id : group) {
        if (size_t(id) >= allowed.size()) continue;
        if ((vocab_->classes[size_t(id)] & blockers) == 0) {
          allowed[size_t(id)] = 1;
          continue;
        }
        typename Grammar::State s = after_first;
        allowed[size_t(id)] = grammar_->feed_text(s, std::string_view(vocab_->bytes[size_t(id)]).substr(1));
      }
    }
    for (int32_t id : vocab_->markers)
      if (size_t(id) < allowed.size()) allowed[size_t(id)] = allows(id);
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
