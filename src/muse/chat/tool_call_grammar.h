// Forced tool calls (tool_choice "required" or a named function; Anthropic
// "any" / "tool") as a grammar over Muse output. chat-format.md §4.6 item 8:
// forcing a call needs an ATEM grammar, not a JSON-array one. Generation
// starts after `<|start|>assistant`; the grammar admits exactly
//
//   [ " to=self<|message|>" REASONING "<|eom|><|start|>assistant" ]
//   " to=" NAME "<|message|>" CALL
//   ( "<|eom|><|start|>assistant to=" NAME "<|message|>" CALL )*   (required only)
//   "<|eot|>"
//
//   CALL = "<atem:function_calls>\n<atem:invoke name=\"" NAME "\">\n"
//          ( "<atem:parameter name=\"" KEY "\">" VALUE "</atem:parameter>\n" )*
//          "</atem:invoke>\n</atem:function_calls>"
//
// which is what the template renders for an assistant tool call (§2.3), so
// the model is steered along text it was trained on, and the response parser
// reads every admitted output as calls to NAME. Framing markers are special
// tokens and count only by id; the same characters from ordinary tokens are
// text. KEY is one of the tool's declared properties (each once; every
// required one before the call closes; any quote-free name when the schema
// declares none). VALUE is free text up to the first closing tag, except
// that integer and number parameters take number characters and boolean or
// string-enum parameters one of their values, so the parsed arguments have
// the declared types.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "muse/chat/chat_profile.h"
#include "muse/chat/tool_schema.h"
#include "muse/core/status.h"

namespace muse::chat {

enum class GrammarMarker : uint8_t { Start, Message, EndMessage, EndTurn, EndOfText };

// What a token's text contains, for the constraints' fast path: a grammar
// state names the classes that force simulating a token. Every text token
// has kTextAny, so kNoFastPath (all bits) simulates them all.
enum : uint8_t {
  kTextHasAngle = 1, kTextHasQuote = 2, kTextHasBackslash = 4, kTextHasControl = 8,
  kTextNotUtf8 = 16,  // not whole, valid UTF-8 characters (a byte-level token may hold part of one)
  kTextAny = 0x80, kNoFastPath = 0xFF
};

class ToolCallGrammar {
 public:
  // `names`: the functions a call may name (one: tool_choice names it, or
  // Anthropic "tool"; all declared tools: "required" / "any"). With
  // `single_call` exactly one call is made (named choice, as OpenAI does).
  static Result<ToolCallGrammar> make(const FramingFormat& framing, const ToolSet& tools,
                                      const std::vector<std::string>& names, bool single_call);

  // Where generation is in the grammar; plain data, cheap to copy (the
  // constraint tries every candidate token on a copy).
  struct State {
    uint8_t phase = 0;
    uint8_t literal = 0;     // which literal a Literal phase matches
    uint8_t next = 0;        // where a number value is in JSON's number grammar
    bool reasoning_done = false;
    uint16_t pos = 0;        // characters matched in the current piece
    int16_t tool = -1;       // index into the call names of the open call
    int16_t param = -1;      // index into that tool's properties
    uint16_t calls = 0;      // calls completed
    uint64_t candidates = 0; // options still matching (recipient, key, enum value)
    uint64_t seen = 0;       // properties given in the open call
  };

  State initial() const;
  bool feed_marker(State& s, GrammarMarker m) const;
  // False as soon as a byte leaves the grammar (s is then unspecified).
  bool feed_text(State& s, std::string_view bytes) const;
  // Text without '<' is admitted in reasoning and free values: lets the
  // constraint skip simulating most tokens.
  uint8_t fast_path_blockers(const State& s) const;
  bool finished(const State& s) const;

 private:
  struct Param {
    std::string name;
    enum class Kind : uint8_t { Text, Integer, Number, Options } kind = Kind::Text;
    std::vector<std::string> options;  // Options: the exact value spellings
  };
  struct Tool {
    std::string name;
    std::string call_open;  // "<atem:function_calls>\n<atem:invoke name=\"NAME\">\n"
    std::vector<Param> params;
    std::vector<std::string> param_names;  // params' names, for candidate matching
    bool free_keys = false;  // no declared properties: any key
    uint64_t required = 0;   // bits of params
  };

  bool feed_char(State& s, char c) const;
  std::string_view literal(const State& s) const;
  void after_literal(State& s) const;
  void start_value(State& s) const;
  uint64_t recipient_candidates(const State& s) const;

  FramingFormat f_;
  std::vector<std::string> recipients_;  // reasoning recipients, then tool names
  size_t reasoning_count_ = 0;
  std::vector<Tool> tools_;              // parallel to the names after the reasoning recipients
  bool single_call_ = false;
  std::string to_, assistant_to_, param_open_, calls_close_, param_close_;
};

}  // namespace muse::chat
