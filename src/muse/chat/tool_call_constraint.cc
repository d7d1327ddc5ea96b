#include "muse/chat/tool_call_constraint.h"

#include "muse/tokenizer/tokenizer_impl.h"

namespace muse::chat {

std::shared_ptr<const GrammarVocabulary> GrammarVocabulary::build(const Tokenizer& tok, const FramingFormat& f,
                                                                  int64_t vocab_size) {
  auto v = std::make_shared<GrammarVocabulary>();
  v->kind.assign(size_t(vocab_size), kRefused);
  v->bytes.resize(size_t(vocab_size));
  v->has_angle.assign(size_t(vocab_size), 0);
  const tok::TokenizerImpl* impl = tok.impl();
  const int64_t n = std::min<int64_t>(vocab_size, impl ? int64_t(tok.id_limit()) : 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = int32_t(i);
    if (tok.is_special(id)) continue;  // refused unless a framing marker (below)
    std::string b = impl->decode(&id, 1, false, /*raw=*/true);
    if (b.empty()) continue;  // no text: could stall the grammar forever
    v->has_angle[size_t(i)] = b.find('<') != std::string::npos;
    v->bytes[size_t(i)] = std::move(b);
    v->kind[size_t(i)] = kText;
  }
  auto mark = [&](int32_t id, GrammarMarker m) {
    if (id >= 0 && id < vocab_size) {
      v->kind[size_t(id)] = int8_t(m);
      v->bytes[size_t(id)].clear();
    }
  };
  mark(f.start_id, GrammarMarker::Start);
  mark(f.message_id, GrammarMarker::Message);
  mark(f.end_message_id, GrammarMarker::EndMessage);
  mark(f.end_turn_id, GrammarMarker::EndTurn);
  mark(f.end_of_text_id, GrammarMarker::EndOfText);
  return v;
}

ToolCallConstraint::ToolCallConstraint(std::shared_ptr<const ToolCallGrammar> grammar,
                                       std::shared_ptr<const GrammarVocabulary> vocab)
    : grammar_(std::move(grammar)), vocab_(std::move(vocab)), state_(grammar_->initial()) {}

bool ToolCallConstraint::feed(ToolCallGrammar::State& s, int32_t id) const {
  if (id < 0 || size_t(id) >= vocab_->kind.size()) return false;
  const int8_t k = vocab_->kind[size_t(id)];
  if (k == GrammarVocabulary::kRefused) return false;
  if (k == GrammarVocabulary::kText) return grammar_->feed_text(s, vocab_->bytes[size_t(id)]);
  return grammar_->feed_marker(s, GrammarMarker(k));
}

bool ToolCallConstraint::allows(int32_t id) const {
  if (broken_) return true;
  if (id < 0 || size_t(id) >= vocab_->kind.size()) return false;
  // Most of a call is free text (reasoning, string values): no simulation.
  if (vocab_->kind[size_t(id)] == GrammarVocabulary::kText && !vocab_->has_angle[size_t(id)] &&
      grammar_->admits_plain_text(state_))
    return true;
  ToolCallGrammar::State s = state_;
  return feed(s, id);
}

void ToolCallConstraint::accept(int32_t id) {
  if (broken_) return;
  ToolCallGrammar::State s = state_;
  if (feed(s, id)) state_ = s;
  else broken_ = true;
}

}  // namespace muse::chat
