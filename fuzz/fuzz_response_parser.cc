// libFuzzer target: the streaming Muse response parser.
// The input is generated output: parsed whole as text, byte by byte, in
// pieces chosen by the input's own bytes, and as tokens (marker spellings as
// their special ids).
// Properties: never crashes or leaks; every way of feeding the same output
// gives the same reasoning, content, calls and finish reason; the deltas add
// up to the result; calls carry valid JSON objects as arguments.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "muse/chat/response_parser.h"

namespace {

using namespace muse::chat;

const ToolSet& tools() {
  static const ToolSet set = *ToolSet::from_json(*muse::Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "description": "", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "opt": {"type": ["string", "null"]}}}}},
    {"type": "function", "function": {"name": "weather.get_forecast", "description": "", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "details": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "read", "description": "", "parameters": {"type": "object",
      "properties": {"path": {"type": "string"}, "filePath": {"type": "string"}}}}}])"));
  return set;
}

struct Outcome {
  std::string reasoning, content, finish;
  std::vector<std::pair<std::string, std::string>> calls;
  std::string streamed_reasoning, streamed_content;
  size_t streamed_calls = 0;
};

ResponseParserOptions options() {
  ResponseParserOptions o;
  o.tools = tools();
  o.make_call_id = [](size_t i) { return "call_" + std::to_string(i); };
  return o;
}

void add(const ResponseDelta& d, Outcome& o) {
  o.streamed_reasoning += d.reasoning;
  o.streamed_content += d.content;
  o.streamed_calls += d.tool_calls.size();
}

Outcome done(ResponseParser& p, FinishCause cause, Outcome o) {
  add(p.finish(cause), o);
  const auto& r = p.result();
  o.reasoning = r.reasoning;
  o.content = r.content;
  o.finish = r.finish_reason;
  for (const auto& c : r.tool_calls) {
    auto args = muse::Json::parse(c.arguments);
    if (!args.ok() || !args->is_object()) std::abort();
    o.calls.emplace_back(c.name, args->dump());
  }
  if (o.streamed_reasoning != o.reasoning || o.streamed_content != o.content || o.streamed_calls != o.calls.size())
    std::abort();
  return o;
}

bool same(const Outcome& a, const Outcome& b) {
  return a.reasoning == b.reasoning && a.content == b.content && a.finish == b.finish && a.calls == b.calls;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  FinishCause cause = (data[0] & 1) ? FinishCause::Length : FinishCause::Stop;
  std::string text(reinterpret_cast<const char*>(data) + 1, size - 1);
  const FramingFormat& f = (data[0] & 2) ? muse_spark_profile().framing : muse_glimmer_profile().framing;

  // Text input: whole, byte by byte, and in pieces sized by the input.
  ResponseParser whole_parser(f, options());
  Outcome whole;
  add(whole_parser.push_text(text), whole);
  whole = done(whole_parser, cause, whole);

  ResponseParser bytes_parser(f, options());
  Outcome bytes;
  for (char c : text) add(bytes_parser.push_text(std::string_view(&c, 1)), bytes);
  if (!same(whole, done(bytes_parser, cause, bytes))) std::abort();

  ResponseParser pieces_parser(f, options());
  Outcome pieces;
  for (size_t i = 0; i < text.size();) {
    size_t n = 1 + static_cast<unsigned char>(text[i]) % 7;
    add(pieces_parser.push_text(std::string_view(text).substr(i, n)), pieces);
    i += n;
  }
  if (!same(whole, done(pieces_parser, cause, pieces))) std::abort();

  // Token input: marker spellings become ids, other bytes single tokens.
  const std::pair<std::string, int32_t> markers[] = {{f.start, f.start_id},
                                                     {f.message, f.message_id},
                                                     {f.end_message, f.end_message_id},
                                                     {f.end_turn, f.end_turn_id},
                                                     {f.end_of_text, f.end_of_text_id}};
  ResponseParser token_parser(f, options());
  Outcome tokens;
  for (size_t i = 0; i < text.size();) {
    bool marker = false;
    for (const auto& [spelling, id] : markers) {
      if (text.compare(i, spelling.size(), spelling) == 0) {
        add(token_parser.push_token(id, spelling, true), tokens);
        i += spelling.size();
        marker = true;
        break;
      }
    }
    if (!marker) add(token_parser.push_token(7, std::string_view(text).substr(i++, 1)), tokens);
  }
  done(token_parser, cause, tokens);
  return 0;
}
