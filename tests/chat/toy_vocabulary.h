// A toy vocabulary for the output-grammar tests, and the framing whose
// marker ids it uses (the Glimmer spellings at ids 1000..1004): ids 0..94 are the printable
// ASCII characters (char c is id c - 32), then `pieces` in order; ids
// 1000..1004 are the framing markers (GrammarMarker order); 1005 is some
// other special token (refused); every other id is refused.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "muse/chat/grammar_constraint.h"

namespace muse::chat {

inline FramingFormat toy_framing() {
  FramingFormat f = muse_glimmer_profile().framing;
  f.start_id = 1000;
  f.message_id = 1001;
  f.end_message_id = 1002;
  f.end_turn_id = 1003;
  f.end_of_text_id = 1004;
  return f;
}

inline std::shared_ptr<GrammarVocabulary> make_toy_vocabulary(const std::vector<std::string>& pieces) {
  auto v = std::make_shared<GrammarVocabulary>();
  v->kind.assign(1006, GrammarVocabulary::kRefused);
  v->bytes.resize(1006);
  v->classes.assign(1006, 0);
  size_t id = 0;
  auto add = [&](const std::string& s) {
    v->kind[id] = GrammarVocabulary::kText;
    v->bytes[id] = s;
    v->classes[id] = GrammarVocabulary::classify(s);
    ++id;
  };
  for (char c = 32; c < 127; ++c) add(std::string(1, c));
  for (const auto& p : pieces) add(p);
  for (int m = 0; m < 5; ++m) v->kind[size_t(1000 + m)] = int8_t(m);
  v->index();
  return v;
}

}  // namespace muse::chat
