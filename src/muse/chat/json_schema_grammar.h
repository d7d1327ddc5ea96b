// Structured output (`response_format` json_object / json_schema) as a
// grammar: a character automaton for compact JSON directed by a JSON schema,
// and the Muse answer around it (chat-format.md §4.6 item 8: the schema
// applies to the answer body only):
//
//   [ " to=self<|message|>" REASONING "<|eom|><|start|>assistant" ]
//   " to=user<|message|>" JSON "<|eot|>"
//
// The supported schema subset is enforced exactly: `type` (one or a list),
// `properties`, `required`, `additionalProperties` (false, true or a schema),
// `items`, `enum`, `const`; annotations (`title`, `description`, `default`,
// `examples`, `$schema`, `$id`, `$comment`, `format`) are ignored. Any other
// keyword (`$ref`, `anyOf`, `pattern`, `minimum`, ...) is refused with an
// error naming it, rather than silently not enforced. JSON is written without
// insignificant whitespace; object keys come in any order, each once.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "muse/chat/chat_profile.h"
#include "muse/chat/tool_call_grammar.h"
#include "muse/core/json.h"
#include "muse/core/status.h"

namespace muse::chat {

class JsonSchemaGrammar {
 public:
  static constexpr int kMaxDepth = 24;

  // `schema` null: any JSON object (json_object). Errors name the keyword.
  static Result<JsonSchemaGrammar> make(const Json* schema);

  struct Frame {
    uint16_t node = 0;
    uint8_t phase = 0;
    uint8_t aux = 0;      // number state, \u digits left
    uint16_t pos = 0;     // characters matched in a key / option / number
    int16_t prop = -1;    // the property whose value is open
    bool free_key = false;
    uint64_t candidates = 0;
    uint64_t seen = 0;
  };
  struct State {
    uint8_t depth = 0;    // frames in use
    bool started = false;
    bool done = false;    // the root value is complete
    Frame stack[kMaxDepth];
  };

  State initial() const { return State{}; }
  bool feed_text(State& s, std::string_view bytes) const;
  // The JSON may end here (a number or an enum value ends only when
  // something after it arrives: the end of the answer).
  bool can_end(const State& s) const;
  // Inside a string, outside an escape: text without '"', '\\' or control
  // characters needs no simulation.
  bool in_plain_string(const State& s) const;

 private:
  struct Node {
    uint8_t types = 0;                 // TypeBits; 0 with options: enum/const only
    std::vector<std::string> prop_names;  // declared properties, in order
    std::vector<uint16_t> prop_nodes;     // their schemas
    uint64_t required = 0;
    int32_t additional = -1;           // node index for undeclared keys, -1: none
    uint16_t items = 0;
    std::vector<std::string> options;  // enum / const: compact JSON spellings
  };
  enum class Step { Consumed, Refused, Done };

  Result<uint16_t> compile(const Json& schema, int depth);
  uint16_t any_node();
  bool feed_char(State& s, char c) const;
  bool start_value(State& s, uint16_t node, char c) const;
  Step step(Frame& f, char c) const;

  std::vector<Node> nodes_;
  int32_t any_ = -1;
};

// The answer around the JSON, with the framing of `framing` (see above).
class StructuredAnswerGrammar {
 public:
  // `framed` false (the completions endpoint): the output is the JSON alone,
  // ended by <|eot|> or <|end_of_text|>.
  static Result<StructuredAnswerGrammar> make(const FramingFormat& framing, const Json* schema, bool framed = true);

  struct State {
    uint8_t phase = 0;
    uint16_t pos = 0;
    uint64_t candidates = 0;
    bool reasoning_done = false;
    JsonSchemaGrammar::State json;
  };
  State initial() const;
  bool feed_marker(State& s, GrammarMarker m) const;
  bool feed_text(State& s, std::string_view bytes) const;
  // Which characters stop a token from being admitted without simulation
  // (GrammarVocabulary classes); kNoFastPath: always simulate.
  uint8_t fast_path_blockers(const State& s) const;
  bool finished(const State& s) const;

 private:
  JsonSchemaGrammar json_;
  std::vector<std::string> recipients_;  // reasoning recipients, then content ones
  size_t reasoning_count_ = 0;
  std::string to_, assistant_to_;
  bool framed_ = true;
};

}  // namespace muse::chat
