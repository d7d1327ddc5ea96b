// Streaming parser for Muse output: generated text/tokens -> reasoning,
// content and tool calls (chat-format.md §4).
//
// Generation starts right after `<|start|>assistant`. Each frame is a header
// (` to=R<|message|>`, later `<|start|>assistant to=R<|message|>`) and a
// body ended by <|eom|>, <|eot|>, <|end_of_text|> or the next <|start|>.
// R = self is reasoning; user (or none) is the answer; anything else is a
// tool channel carrying an ATEM block, decoded with the request's tool
// schemas. Invokes echoed inside reasoning or an answer stay text. Framing
// markers never reach reasoning or content.
//
// Token input recognises markers by id (the same characters from ordinary
// tokens are text); text input recognises them by spelling, except inside
// an ATEM parameter value, where only </atem:parameter> ends the value.
// Feeding the same output whole or piece by piece gives the same result.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "muse/chat/atem_parser.h"
#include "muse/chat/chat_profile.h"
#include "muse/chat/tool_schema.h"

namespace muse::chat {

struct ToolCall {
  std::string id;
  std::string name;
  std::string arguments;  // a JSON object, compact
};

struct ToolCallDelta {
  size_t index = 0;
  std::string id, name, arguments;  // a call is emitted whole, once its </atem:invoke> arrives
};

struct ResponseDelta {
  std::string reasoning, content;
  std::vector<ToolCallDelta> tool_calls;
  bool empty() const { return reasoning.empty() && content.empty() && tool_calls.empty(); }
};

struct ParsedResponse {
  std::string reasoning, content;
  std::vector<ToolCall> tool_calls;
  std::string finish_reason;          // "stop", "tool_calls" or "length"; empty until finish()
  std::vector<std::string> warnings;  // recovered or refused misbehaviours
};

enum class FinishCause { Stop, Length };

// What the current body is, for callers that constrain generation (a JSON
// schema applies only to the answer body, §4.6 item 8).
enum class Channel { Header, Reasoning, Content, ToolCall, Ignored, Done };

struct ResponseParserOptions {
  ToolSet tools;
  // Tool-call ids; default "call_" + 24 random characters.
  std::function<std::string(size_t index)> make_call_id;
};

class ResponseParser {
 public:
  explicit ResponseParser(const FramingFormat& format, ResponseParserOptions options = {});

  // One generated token. Framing markers are recognised by id; other special
  // tokens (`special`) are dropped; everything else is text.
  ResponseDelta push_token(int32_t id, std::string_view text, bool special = false);
  // Generated text without ids: markers are recognised by spelling.
  ResponseDelta push_text(std::string_view text);
  // End of generation: Stop (a stop token or string) or Length (max_tokens).
  ResponseDelta finish(FinishCause cause);

  const ParsedResponse& result() const { return result_; }
  Channel channel() const;
  bool turn_ended() const { return state_ == State::Done; }

 private:
  enum class State { Header, Body, Done };
  enum class BodyKind { Reasoning, Content, Tool, Fumbled, Ignored };
  enum class Marker { Start, Message, EndMessage, EndTurn, EndOfText };

  void on_marker(Marker m, ResponseDelta& d);
  void on_text(std::string_view text, ResponseDelta& d);
  void scan_text(bool final, ResponseDelta& d);
  bool markers_active() const;

  void header_text(std::string_view text, ResponseDelta& d);
  void complete_header();
  void open_body(bool role_ok, const std::string& recipient);
  void body_text(std::string_view text, ResponseDelta& d);
  void end_frame(bool by_length, ResponseDelta& d);
  void begin_header(bool role_expected);

  void content_text(std::string_view text, ResponseDelta& d);
  void to_content(size_t raw_offset, ResponseDelta& d, const std::string& why);
  void atem_events(ResponseDelta& d);
  void settle_pending_invoke(const AtemEvent* next, ResponseDelta& d);
  void emit_call(ResponseDelta& d);
  void warn(std::string message);

  const FramingFormat& f_;
  ResponseParserOptions opt_;
  ParsedResponse result_;
  State state_ = State::Header;
  bool text_mode_ = false;
  std::string pending_;  // text input not yet scanned for markers

  // Header of the current frame.
  bool role_expected_ = false;
  std::string header_;

  // Body of the current frame.
  BodyKind body_ = BodyKind::Content;
  bool sniffing_ = false;         // content body: leading spaces held while deciding "solely ATEM"
  std::string sniff_;
  std::unique_ptr<AtemParser> atem_;
  std::vector<AtemEvent> events_;
  size_t events_done_ = 0;
  const ToolInfo* header_tool_ = nullptr;
  struct Invoke {
    bool active = false, settled = false;
    std::string name;
    const ToolInfo* tool = nullptr;
    size_t at = 0;
    JsonObject args;
  } invoke_;
  std::vector<ToolCall> fumbled_calls_;
  size_t frame_calls_ = 0;  // calls emitted from the current body  // held until a fumbled body proves to be solely ATEM
};

// Whole-output conveniences (text input).
ParsedResponse parse_response_text(std::string_view text, const FramingFormat& format, const ToolSet& tools,
                                   FinishCause cause = FinishCause::Stop);

}  // namespace muse::chat
