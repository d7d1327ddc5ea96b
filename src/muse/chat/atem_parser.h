// Incremental parser for one ATEM tool-call body (chat-format.md §2.3, §4.2):
//
//   <atem:function_calls>
//   <atem:invoke name="N">
//   <atem:parameter name="K">V</atem:parameter>
//   </atem:invoke>
//   </atem:function_calls>
//
// Text arrives in pieces; events come out as soon as they are decidable.
// Values are raw bytes up to the first </atem:parameter> (no escaping, so
// they may hold '<', quotes or marker text). Tolerated misbehaviours: a
// stray <|message|> inside or instead of the invoke name's `">` (§4.6 item
// 3); a value right after the invoke tag whose <atem:parameter> opener was
// swallowed (item 5; reported with an empty parameter name for the caller
// to recover or refuse); several invokes or blocks in one body.
#pragma once

#include <string>
#include <string_view>
#include <vector>

#include "muse/chat/chat_profile.h"

namespace muse::chat {

struct AtemEvent {
  enum class Kind {
    InvokeStart,  // name
    Parameter,    // name (empty: swallowed opener), value
    InvokeEnd,
    NotAtem,      // the body does not start with a function_calls block
    Malformed,    // unexpected text inside a block (at raw offset `at`)
    Trailing,     // non-space text after a closed block (at `at`)
  };
  Kind kind;
  std::string name, value;
  size_t at = 0;  // raw offset where the event's text starts
};

class AtemParser {
 public:
  explicit AtemParser(const FramingFormat& format) : f_(format) {}

  void feed(std::string_view text, std::vector<AtemEvent>& out);
  // A <|message|> special token inside the body (token input): dropped.
  void stray_message_marker() {}
  // Inside a parameter value only </atem:parameter> ends it, so marker
  // spellings there are text (for text-only input).
  bool inside_value() const { return state_ == State::Value; }
  bool done() const { return state_ == State::NotAtem || state_ == State::Malformed || state_ == State::Trailing; }
  // Whether the body so far is one or more complete blocks (plus spaces).
  bool complete() const { return state_ == State::AfterBlock; }
  bool in_invoke() const { return state_ == State::InvokeTag || state_ == State::InInvoke || state_ == State::ParamTag || state_ == State::Value; }
  bool value_open() const { return state_ == State::Value || state_ == State::ParamTag; }
  size_t invoke_start() const { return invoke_at_; }
  const std::string& raw() const { return raw_; }

 private:
  enum class State { Start, InBlock, InvokeTag, InInvoke, ParamTag, Value, AfterBlock, NotAtem, Malformed, Trailing };

  void advance(std::vector<AtemEvent>& out);
  bool skip_space();
  // 1: `s` is at pos_; 0: not; -1: undecided (only a prefix has arrived).
  int match(std::string_view s) const;
  bool parse_attribute(std::string* key, std::string* value, bool* need_more, bool in_invoke_tag);
  void fail(State s, std::vector<AtemEvent>& out);

  const FramingFormat& f_;
  std::string raw_;
  size_t pos_ = 0;
  State state_ = State::Start;
  std::string name_, param_;
  bool have_name_ = false;
  size_t value_start_ = 0, search_from_ = 0, invoke_at_ = 0;
  int params_in_invoke_ = 0;
};

}  // namespace muse::chat
