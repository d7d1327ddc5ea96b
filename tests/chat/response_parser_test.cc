// Muse response parsing: the spec's parse vectors P1-P13 (chat-format.md
// §5), each checked whole, byte by byte, and as tokens (framing markers as
// their special ids), plus the misbehaviours of §4.6.
#include <gtest/gtest.h>

#include <random>

#include "muse/chat/response_parser.h"

namespace muse::chat {
namespace {

const FramingFormat& glimmer() { return muse_glimmer_profile().framing; }

ToolSet tools_from(const char* json) {
  auto j = Json::parse(json);
  EXPECT_TRUE(j.ok()) << j.message();
  auto t = ToolSet::from_json(*j);
  EXPECT_TRUE(t.ok()) << t.message();
  return *t;
}

ToolSet default_tools() {
  return tools_from(R"([
    {"type": "function", "function": {"name": "weather.get_forecast", "description": "", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "days": {"type": "integer"}, "details": {"type": "object"}}}}},
    {"type": "function", "function": {"name": "get_weather", "description": "", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "report", "description": "", "parameters": {"type": "object",
      "properties": {"sections": {"type": "array"}, "limit": {"type": "integer"}, "title": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "pick", "description": "", "parameters": {"type": "object",
      "properties": {"text": {"type": "string"}, "choice": {"type": ["string", "null"]}}}}},
    {"type": "function", "function": {"name": "read", "description": "", "parameters": {"type": "object",
      "properties": {"path": {"type": "string"}, "filePath": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "echo", "description": "", "parameters": {"type": "object",
      "properties": {"value": {"type": "string"}}}}},
    {"type": "function", "function": {"name": "ha_config_set_script", "description": "", "parameters": {"type": "object",
      "properties": {"alias": {"type": "string"}, "sequence": {"type": "array"}}}}}
  ])");
}

std::string atem(const std::string& fn, const std::vector<std::pair<std::string, std::string>>& params) {
  std::string s = "<atem:function_calls>\n<atem:invoke name=\"" + fn + "\">\n";
  for (const auto& [k, v] : params) s += "<atem:parameter name=\"" + k + "\">" + v + "</atem:parameter>\n";
  return s + "</atem:invoke>\n</atem:function_calls>";
}

struct Outcome {
  std::string reasoning, content, finish;
  std::vector<std::pair<std::string, Json>> calls;
  // What the deltas added up to.
  std::string streamed_reasoning, streamed_content;
  std::vector<std::pair<std::string, std::string>> streamed_calls;
};

ResponseParserOptions options(const ToolSet& tools) {
  ResponseParserOptions o;
  o.tools = tools;
  o.make_call_id = [](size_t i) { return "call_" + std::to_string(i); };
  return o;
}

void collect(const ResponseDelta& d, Outcome& out) {
  out.streamed_reasoning += d.reasoning;
  out.streamed_content += d.content;
  for (const auto& c : d.tool_calls) out.streamed_calls.emplace_back(c.name, c.arguments);
}

Outcome finish(ResponseParser& p, FinishCause cause, Outcome out) {
  collect(p.finish(cause), out);
  const auto& r = p.result();
  out.reasoning = r.reasoning;
  out.content = r.content;
  out.finish = r.finish_reason;
  for (const auto& c : r.tool_calls) {
    auto args = Json::parse(c.arguments);
    EXPECT_TRUE(args.ok()) << c.arguments;
    out.calls.emplace_back(c.name, args.ok() ? *args : Json());
  }
  return out;
}

Outcome run_text(const std::vector<std::string>& pieces, const ToolSet& tools, FinishCause cause) {
  ResponseParser p(glimmer(), options(tools));
  Outcome out;
  for (const auto& piece : pieces) collect(p.push_text(piece), out);
  return finish(p, cause, out);
}

// Token input: markers become their special ids, other text arrives in
// pieces of `chunk` bytes (1: every byte is a token).
Outcome run_tokens(const std::string& text, const ToolSet& tools, FinishCause cause, size_t chunk) {
  const FramingFormat& f = glimmer();
  const std::pair<std::string, int32_t> markers[] = {{f.start, f.start_id},
                                                     {f.message, f.message_id},
                                                     {f.end_message, f.end_message_id},
                                                     {f.end_turn, f.end_turn_id},
                                                     {f.end_of_text, f.end_of_text_id}};
  ResponseParser p(f, options(tools));
  Outcome out;
  size_t i = 0;
  std::string run;
  auto flush = [&] {
    for (size_t k = 0; k < run.size(); k += chunk) collect(p.push_token(1, run.substr(k, chunk)), out);
    run.clear();
  };
  while (i < text.size()) {
    bool marker = false;
    for (const auto& [spelling, id] : markers) {
      if (text.compare(i, spelling.size(), spelling) == 0) {
        flush();
        collect(p.push_token(id, spelling, true), out);
        i += spelling.size();
        marker = true;
        break;
      }
    }
    if (!marker) run.push_back(text[i++]);
  }
  flush();
  return finish(p, cause, out);
}

void expect_same(const Outcome& a, const Outcome& b, const std::string& how) {
  EXPECT_EQ(a.reasoning, b.reasoning) << how;
  EXPECT_EQ(a.content, b.content) << how;
  EXPECT_EQ(a.finish, b.finish) << how;
  ASSERT_EQ(a.calls.size(), b.calls.size()) << how;
  for (size_t i = 0; i < a.calls.size(); ++i) {
    EXPECT_EQ(a.calls[i].first, b.calls[i].first) << how;
    EXPECT_EQ(a.calls[i].second, b.calls[i].second) << how;
  }
}

void expect_consistent(const Outcome& o, const std::string& how) {
  EXPECT_EQ(o.streamed_reasoning, o.reasoning) << how;
  EXPECT_EQ(o.streamed_content, o.content) << how;
  ASSERT_EQ(o.streamed_calls.size(), o.calls.size()) << how;
}

// Parses `text` whole, then byte by byte, in random text pieces, and as
// tokens (unless `text_only`), requiring the same result every time.
Outcome parse_all_ways(const std::string& text, const ToolSet& tools, FinishCause cause = FinishCause::Stop,
                       bool tokens = true) {
  Outcome whole = run_text({text}, tools, cause);
  expect_consistent(whole, "whole");
  std::vector<std::string> bytes;
  for (char c : text) bytes.emplace_back(1, c);
  Outcome by_byte = run_text(bytes, tools, cause);
  expect_same(whole, by_byte, "text byte by byte");
  expect_consistent(by_byte, "text byte by byte");
  std::mt19937 rng(42);
  for (int trial = 0; trial < 5; ++trial) {
    std::vector<std::string> pieces;
    for (size_t i = 0; i < text.size();) {
      size_t n = 1 + rng() % 9;
      pieces.push_back(text.substr(i, n));
      i += n;
    }
    expect_same(whole, run_text(pieces, tools, cause), "text in random pieces");
  }
  if (tokens) {
    for (size_t chunk : {size_t(1), size_t(3), size_t(1000)}) {
      Outcome t = run_tokens(text, tools, cause, chunk);
      expect_same(whole, t, "tokens of " + std::to_string(chunk) + " bytes");
      expect_consistent(t, "tokens");
    }
  }
  return whole;
}

Json J(const char* s) { return *Json::parse(s); }

TEST(ResponseParser, P1_ReasoningThenAnswer) {
  auto o = parse_all_ways(
      " to=self<|message|>Think about it.<|eom|><|start|>assistant to=user<|message|>The answer is 42.<|eot|>",
      default_tools());
  EXPECT_EQ(o.reasoning, "Think about it.");
  EXPECT_EQ(o.content, "The answer is 42.");
  EXPECT_TRUE(o.calls.empty());
  EXPECT_EQ(o.finish, "stop");
}

TEST(ResponseParser, P2_ToolCallWithSchemaTypes) {
  auto o = parse_all_ways(" to=self<|message|>I need the forecast.<|eom|><|start|>assistant to=weather.get_forecast<|message|>" +
                              atem("weather.get_forecast", {{"city", "New York"}, {"days", "3"}, {"details", "{\"hourly\":true}"}}) +
                              "<|eot|>",
                          default_tools());
  EXPECT_EQ(o.reasoning, "I need the forecast.");
  EXPECT_EQ(o.content, "");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].first, "weather.get_forecast");
  EXPECT_EQ(o.calls[0].second, J(R"({"city":"New York","days":3,"details":{"hourly":true}})"));
  EXPECT_EQ(o.finish, "tool_calls");
}

TEST(ResponseParser, P3_TwoCalls) {
  auto o = parse_all_ways(" to=get_weather<|message|>" + atem("get_weather", {{"city", "Paris"}}) +
                              "<|eom|><|start|>assistant to=get_weather<|message|>" + atem("get_weather", {{"city", "Tokyo"}}) +
                              "<|eot|>",
                          default_tools());
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[0].second, J(R"({"city":"Paris"})"));
  EXPECT_EQ(o.calls[1].second, J(R"({"city":"Tokyo"})"));
  EXPECT_EQ(o.finish, "tool_calls");
}

TEST(ResponseParser, P4_InvokeInsideUnterminatedReasoningIsNoCall) {
  std::string body = "Maybe I should call " + atem("get_weather", {{"city", "Oslo"}}) + " but wait";
  for (FinishCause cause : {FinishCause::Stop, FinishCause::Length}) {
    auto o = parse_all_ways(" to=self<|message|>" + body, default_tools(), cause);
    EXPECT_TRUE(o.calls.empty());
    EXPECT_EQ(o.reasoning, body);
    EXPECT_EQ(o.content, "");
  }
}

TEST(ResponseParser, P5_InvokeInsideAnswerIsText) {
  std::string body = "Here is how: <atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Oslo</atem:parameter>\n</atem:invoke>";
  auto o = parse_all_ways("to=user<|message|>" + body + "<|eot|>", default_tools());
  EXPECT_TRUE(o.calls.empty());
  EXPECT_EQ(o.content, body);
  EXPECT_EQ(o.finish, "stop");
}

TEST(ResponseParser, P6_ValueTypesBySchema) {
  auto o = parse_all_ways(" to=report<|message|>" +
                              atem("report", {{"sections", "[\"intro\", \"body\"]"}, {"limit", "3"}, {"title", "Q3 Summary"}}) +
                              "<|eot|>",
                          default_tools());
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].second, J(R"({"sections":["intro","body"],"limit":3,"title":"Q3 Summary"})"));
}

TEST(ResponseParser, P7_StringSpacesKeptAndNullableNull) {
  auto o = parse_all_ways(" to=pick<|message|>" + atem("pick", {{"text", " keep  spaces "}, {"choice", "null"}}) + "<|eot|>",
                          default_tools());
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].second, J(R"({"text":" keep  spaces ","choice":null})"));
}

TEST(ResponseParser, P8_StrayMessageMarkerInInvokeName) {
  for (std::string invoke : {std::string("<atem:invoke name=\"read<|message|>\">\n<atem:parameter name=\"path\">go.mod</atem:parameter>\n"),
                             std::string("<atem:invoke name=\"read<|message|><atem:parameter name=\"path\">go.mod</atem:parameter>\n")}) {
    auto o = parse_all_ways(" to=read<|message|><atem:function_calls>\n" + invoke + "</atem:invoke>\n</atem:function_calls><|eot|>",
                            default_tools());
    ASSERT_EQ(o.calls.size(), 1u) << invoke;
    EXPECT_EQ(o.calls[0].first, "read");
    EXPECT_EQ(o.calls[0].second, J(R"({"path":"go.mod"})"));
  }
}

TEST(ResponseParser, P9_NamespaceDoubledName) {
  for (const char* invoke_name : {"get_weather.get_weather", "get_weather"}) {
    auto o = parse_all_ways(" to=get_weather.get_weather<|message|>" + atem(invoke_name, {{"city", "Oslo"}}) + "<|eot|>",
                            default_tools());
    ASSERT_EQ(o.calls.size(), 1u) << invoke_name;
    EXPECT_EQ(o.calls[0].first, "get_weather");
  }
}

TEST(ResponseParser, P10_MissingEomAfterReasoning) {
  auto o = parse_all_ways(" to=self<|message|>Think<|start|>assistant to=get_weather<|message|>" +
                              atem("get_weather", {{"city", "Oslo"}}) + "<|start|>assistant to=user<|message|>Done<|eot|>",
                          default_tools());
  EXPECT_EQ(o.reasoning, "Think");
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.content, "Done");
  EXPECT_EQ(o.finish, "tool_calls");
}

TEST(ResponseParser, P11_SplitMarkerDoesNotLeak) {
  auto o = run_text({" to=user<|message|>Hello<|eo", "t|>"}, default_tools(), FinishCause::Stop);
  EXPECT_EQ(o.content, "Hello");
  EXPECT_EQ(o.streamed_content, "Hello");
  parse_all_ways(" to=user<|message|>Hello<|eot|>", default_tools());
}

TEST(ResponseParser, P12_MarkerTextInsideValuePreserved) {
  std::string value = "literal <|eot|> and <|start|>assistant to=user<|message|> text";
  std::string text = " to=echo<|message|>" + atem("echo", {{"value", value}}) + "<|eot|>";
  // Text input: inside an open parameter only </atem:parameter> closes it.
  auto o = parse_all_ways(text, default_tools(), FinishCause::Stop, /*tokens=*/false);
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].second.find("value")->as_string(), value);
  // Token input: the same characters as ordinary tokens are text.
  ResponseParser p(glimmer(), options(default_tools()));
  std::string head = text.substr(0, text.find("<|message|>"));
  p.push_token(1, head);
  p.push_token(glimmer().message_id, "<|message|>", true);
  std::string rest = text.substr(text.find("<|message|>") + 11);
  rest = rest.substr(0, rest.size() - 7);  // without the final <|eot|>
  for (char c : rest) p.push_token(1, std::string(1, c));
  p.push_token(glimmer().end_turn_id, "<|eot|>", true);
  p.finish(FinishCause::Stop);
  ASSERT_EQ(p.result().tool_calls.size(), 1u);
  EXPECT_EQ(Json::parse(p.result().tool_calls[0].arguments)->find("value")->as_string(), value);
}

TEST(ResponseParser, P13_CallAsFirstFrame) {
  auto o = parse_all_ways(" to=ha_config_set_script<|message|>" +
                              atem("ha_config_set_script", {{"alias", "Morning"}, {"sequence", "[{\"service\": \"light.on\"}]"}}) +
                              "<|eot|>",
                          default_tools());
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].first, "ha_config_set_script");
  EXPECT_EQ(o.calls[0].second, J(R"({"alias":"Morning","sequence":[{"service":"light.on"}]})"));
  EXPECT_EQ(o.finish, "tool_calls");
}

}  // namespace
}  // namespace muse::chat

namespace muse::chat {
namespace {

// §4.6 item 4: fumbled recipients make a call only when the body is solely the block.
TEST(ResponseParserMisbehaviour, FumbledHeaderWithOnlyAtemIsACall) {
  for (const char* header : {" to=muse<|message|>", "<|message|>", " to=user<|message|>", " to=atem:function_calls<|message|>"}) {
    auto o = parse_all_ways(std::string(header) + atem("get_weather", {{"city", "Rome"}}) + "<|eot|>", default_tools());
    ASSERT_EQ(o.calls.size(), 1u) << header;
    EXPECT_EQ(o.calls[0].first, "get_weather");
    EXPECT_EQ(o.content, "") << header;
    EXPECT_EQ(o.finish, "tool_calls");
  }
}

TEST(ResponseParserMisbehaviour, FumbledHeaderWithMoreTextIsContent) {
  std::string body = atem("get_weather", {{"city", "Rome"}}) + "\nand some words";
  for (const char* header : {" to=muse<|message|>", " to=user<|message|>"}) {
    auto o = parse_all_ways(std::string(header) + body + "<|eot|>", default_tools());
    EXPECT_TRUE(o.calls.empty()) << header;
    EXPECT_EQ(o.content, body) << header;
  }
}

TEST(ResponseParserMisbehaviour, HeaderInvokeMismatchIsContent) {
  std::string body = atem("read", {{"path", "x"}});
  ResponseParser p(glimmer(), options(default_tools()));
  p.push_text(" to=get_weather<|message|>" + body + "<|eot|>");
  p.finish(FinishCause::Stop);
  EXPECT_TRUE(p.result().tool_calls.empty());
  EXPECT_EQ(p.result().content, body);
  EXPECT_FALSE(p.result().warnings.empty());
  parse_all_ways(" to=get_weather<|message|>" + body + "<|eot|>", default_tools());
}

TEST(ResponseParserMisbehaviour, SwallowedParameterOpenerRecovered) {
  auto o = parse_all_ways(" to=read<|message|><atem:function_calls>\n<atem:invoke name=\"read.filePath\">go.mod</atem:parameter>\n"
                          "</atem:invoke>\n</atem:function_calls><|eot|>",
                          default_tools());
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].first, "read");
  EXPECT_EQ(o.calls[0].second, J(R"({"filePath":"go.mod"})"));
}

TEST(ResponseParserMisbehaviour, UnrecoverableSwallowedOpenerIsVisible) {
  std::string body = "<atem:function_calls>\n<atem:invoke name=\"read.nosuch\">go.mod</atem:parameter>\n</atem:invoke>\n</atem:function_calls>";
  auto o = parse_all_ways(" to=read<|message|>" + body + "<|eot|>", default_tools());
  EXPECT_TRUE(o.calls.empty());
  EXPECT_NE(o.content.find("go.mod"), std::string::npos);
}

TEST(ResponseParserMisbehaviour, TruncatedToolCallBestEffortOnLength) {
  std::string text = " to=weather.get_forecast<|message|><atem:function_calls>\n<atem:invoke name=\"weather.get_forecast\">\n"
                     "<atem:parameter name=\"city\">Paris</atem:parameter>\n<atem:parameter name=\"days\">1";
  auto o = parse_all_ways(text, default_tools(), FinishCause::Length);
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].second, J(R"({"city":"Paris"})"));
  EXPECT_EQ(o.finish, "length");
}

TEST(ResponseParserMisbehaviour, EndOfTurnInsideOpenParameterIsContent) {
  std::string body = "<atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">Par";
  // Token input only: in text input the spelling is part of the value.
  for (size_t chunk : {size_t(1), size_t(4)}) {
    auto o = run_tokens(" to=get_weather<|message|>" + body + "<|eot|>", default_tools(), FinishCause::Stop, chunk);
    EXPECT_TRUE(o.calls.empty());
    EXPECT_EQ(o.content, body);
  }
}

TEST(ResponseParserMisbehaviour, MissingInvokeCloseStillACall) {
  auto o = parse_all_ways(" to=get_weather<|message|><atem:function_calls>\n<atem:invoke name=\"get_weather\">\n"
                          "<atem:parameter name=\"city\">Oslo</atem:parameter>\n<|eot|>",
                          default_tools());
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].second, J(R"({"city":"Oslo"})"));
}

TEST(ResponseParserMisbehaviour, NoHeaderAtAllIsContent) {
  auto o = parse_all_ways("Hello there.<|eot|>", default_tools());
  EXPECT_EQ(o.content, "Hello there.");
  o = parse_all_ways("  tomorrow it rains<|eot|>", default_tools());
  EXPECT_EQ(o.content, "  tomorrow it rains");
}

TEST(ResponseParserMisbehaviour, HallucinatedUserTurnDropped) {
  auto o = parse_all_ways(" to=user<|message|>Hi<|eom|><|start|>user<|message|>more questions<|eom|>"
                          "<|start|>assistant to=user<|message|> again<|eot|>trailing",
                          default_tools());
  EXPECT_EQ(o.content, "Hi again");
}

TEST(ResponseParserMisbehaviour, NoMarkerLeaksIntoContentOrReasoning) {
  auto o = parse_all_ways(" to=self<|message|>a<|message|>b<|eom|><|start|>assistant to=user<|message|>c<|message|>d<|end_of_text|>",
                          default_tools());
  EXPECT_EQ(o.reasoning, "ab");
  EXPECT_EQ(o.content, "cd");
  ResponseParser p(glimmer(), options(default_tools()));
  p.push_token(glimmer().message_id, "<|message|>", true);
  p.push_token(200092, "<|patch|>", true);  // other special tokens are dropped too
  p.push_token(5, "x");
  p.finish(FinishCause::Stop);
  EXPECT_EQ(p.result().content, "x");
}

TEST(ResponseParserMisbehaviour, TextAfterEndOfTurnIgnored) {
  auto o = parse_all_ways(" to=user<|message|>Yes.<|eot|> to=user<|message|>No.", default_tools());
  EXPECT_EQ(o.content, "Yes.");
}

TEST(ResponseParserMisbehaviour, LengthInsideReasoningLeavesContentEmpty) {
  auto o = parse_all_ways(" to=self<|message|>Long thought", default_tools(), FinishCause::Length);
  EXPECT_EQ(o.reasoning, "Long thought");
  EXPECT_EQ(o.content, "");
  EXPECT_EQ(o.finish, "length");
}

TEST(ResponseParserMisbehaviour, UndeclaredAndInvalidValues) {
  auto o = parse_all_ways(" to=get_weather<|message|>" +
                              atem("get_weather", {{"city", "{\"not\": \"decoded\"}"}, {"extra", "[1, 2]"}, {"note", "plain text"}}) +
                              "<|eot|>",
                          default_tools());
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].second, J(R"({"city":"{\"not\": \"decoded\"}","extra":[1,2],"note":"plain text"})"));
  o = parse_all_ways(" to=report<|message|>" + atem("report", {{"limit", "three"}}) + "<|eot|>", default_tools());
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].second, J(R"({"limit":"three"})"));
}

TEST(ResponseParserMisbehaviour, UnresolvedNamesPassThrough) {
  auto o = parse_all_ways(" to=functions.read<|message|>" + atem("functions.read", {{"path", "a"}}) + "<|eot|>", default_tools());
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.calls[0].first, "functions.read");
}

TEST(ResponseParserMisbehaviour, SeveralInvokesInOneBlock) {
  std::string body = "<atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">A</atem:parameter>\n"
                     "</atem:invoke>\n<atem:invoke name=\"get_weather\">\n<atem:parameter name=\"city\">B</atem:parameter>\n"
                     "</atem:invoke>\n</atem:function_calls>";
  auto o = parse_all_ways(" to=get_weather<|message|>" + body + "<|eot|>", default_tools());
  ASSERT_EQ(o.calls.size(), 2u);
  EXPECT_EQ(o.calls[1].second, J(R"({"city":"B"})"));
}

TEST(ResponseParserMisbehaviour, TextAfterBlockBecomesContent) {
  auto o = parse_all_ways(" to=get_weather<|message|>" + atem("get_weather", {{"city", "A"}}) + "\nDone!<|eot|>", default_tools());
  ASSERT_EQ(o.calls.size(), 1u);
  EXPECT_EQ(o.content, "Done!");
}

TEST(ResponseParserMisbehaviour, ToolChannelWithoutAtemIsContent) {
  auto o = parse_all_ways(" to=get_weather<|message|>{\"city\": \"A\"}<|eot|>", default_tools());
  EXPECT_TRUE(o.calls.empty());
  EXPECT_EQ(o.content, "{\"city\": \"A\"}");
}

TEST(ResponseParserSpark, RecipientlessIsReasoningCommentaryIsContent) {
  ResponseParserOptions opt = options(default_tools());
  ResponseParser p(muse_spark_profile().framing, opt);
  p.push_text("<|message|>thinking<|eom|><|start|>assistant to=commentary<|message|>update <|eom|>"
              "<|start|>assistant to=user<|message|>answer<|eot|>");
  p.finish(FinishCause::Stop);
  EXPECT_EQ(p.result().reasoning, "thinking");
  EXPECT_EQ(p.result().content, "update answer");
}

TEST(ResponseParser, StreamingDeltasArriveEarly) {
  ResponseParser p(glimmer(), options(default_tools()));
  EXPECT_TRUE(p.push_text(" to").empty());  // could still be a header
  EXPECT_TRUE(p.push_text("=user<|mess").empty());
  auto d = p.push_text("age|>Hel");
  EXPECT_EQ(d.content, "Hel");
  EXPECT_EQ(p.channel(), Channel::Content);
  d = p.push_text("lo <|e");
  EXPECT_EQ(d.content, "lo ");
  d = p.push_text("ot|>");
  EXPECT_TRUE(d.empty());
  EXPECT_TRUE(p.turn_ended());
}

}  // namespace
}  // namespace muse::chat
