#include "muse/chat/grammar_constraint.h"

#include "muse/core/json.h"
#include "muse/tokenizer/tokenizer_impl.h"

namespace muse::chat {

uint8_t GrammarVocabulary::classify(std::string_view b) {
  uint8_t c = kTextAny;
  for (char ch : b) {
    if (ch == '<') c |= kTextHasAngle;
    else if (ch == '"') c |= kTextHasQuote;
    else if (ch == '\\') c |= kTextHasBackslash;
    else if (uint8_t(ch) < 0x20) c |= kTextHasControl;
  }
  if (!is_valid_utf8(b)) c |= kTextNotUtf8;
  return c;
}

void GrammarVocabulary::index() {
  for (auto& g : by_first_byte) g.clear();
  markers.clear();
  for (size_t i = 0; i < kind.size(); ++i) {
    if (kind[i] == kText && !bytes[i].empty()) by_first_byte[uint8_t(bytes[i][0])].push_back(int32_t(i));
    else if (kind[i] >= 0) markers.push_back(int32_t(i));
  }
}

std::shared_ptr<const GrammarVocabulary> GrammarVocabulary::build(const Tokenizer& tok, const FramingFormat& f,
                                                                  int64_t vocab_size) {
  auto v = std::make_shared<GrammarVocabulary>();
  v->kind.assign(size_t(vocab_size), kRefused);
  v->bytes.resize(size_t(vocab_size));
  v->classes.assign(size_t(vocab_size), 0);
  const tok::TokenizerImpl* impl = tok.impl();
  const int64_t n = std::min<int64_t>(vocab_size, impl ? int64_t(tok.id_limit()) : 0);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t id = int32_t(i);
    if (tok.is_special(id)) continue;  // refused unless a framing marker (below)
    std::string b = impl->decode(&id, 1, false, /*raw=*/true);
    if (b.empty()) continue;  // no text: could stall a grammar forever
    v->classes[size_t(i)] = classify(b);
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
  v->index();
  return v;
}

}  // namespace muse::chat
