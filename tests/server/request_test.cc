// Request validation, stop strings and response wire formats.
#include <gtest/gtest.h>

#include "muse/server/api_request.h"
#include "muse/server/response_writer.h"
#include "muse/server/stop_matcher.h"

#include "../support/fake_model/fake_model.h"

using namespace muse;
using namespace muse::server;

namespace {

Json parse(const std::string& s) {
  auto j = Json::parse(s);
  EXPECT_TRUE(j.ok()) << s;
  return j.ok() ? *j : Json();
}

std::optional<ApiError> chat(const std::string& body, ApiRequest* out = nullptr) {
  ApiRequest tmp;
  ValidationLimits limits;
  limits.vocab_size = 1000;
  return parse_chat_request(parse(body), limits, out ? out : &tmp);
}

const char* kMsgs = R"("messages":[{"role":"user","content":"hi"}])";

std::string with(const std::string& extra) { return std::string("{") + kMsgs + (extra.empty() ? "" : "," + extra) + "}"; }

}  // namespace

TEST(ServerRequest, BodyParsing) {
  Json j;
  auto e = parse_json_body("{\"a\":", &j);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->status, 400);
  EXPECT_EQ(e->code, "invalid_json");
  e = parse_json_body("[1,2]", &j);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "invalid_json");
  e = parse_json_body("{\"a\":\"\xff\xfe\"}", &j);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "invalid_encoding");
  EXPECT_FALSE(parse_json_body("{\"a\":1}", &j));
}

TEST(ServerRequest, ChatAcceptsAFullRequest) {
  ApiRequest r;
  auto e = chat(with(R"("model":"m","n":2,"temperature":0.5,"top_p":0.9,"top_k":-1,"min_p":0.1,"seed":7,
    "max_tokens":10,"max_completion_tokens":20,"stop":["a","b"],"logprobs":true,"top_logprobs":3,
    "stream":true,"stream_options":{"include_usage":true},"presence_penalty":1,"frequency_penalty":-1,
    "logit_bias":{"5":-100},"reasoning_effort":"xhigh","chat_template_kwargs":{"x":1},"parallel_tool_calls":false,
    "tools":[{"type":"function","function":{"name":"f.g-h","parameters":{"type":"object"}}}],
    "tool_choice":{"type":"function","function":{"name":"f.g-h"}})"),
                &r);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(r.generation.n, 2);
  EXPECT_EQ(*r.max_tokens, 20);  // max_completion_tokens wins
  EXPECT_EQ(r.generation.logprobs, 3);
  EXPECT_TRUE(r.include_usage);
  EXPECT_EQ(r.generation.sampling.top_k, 0);
  EXPECT_EQ(*r.generation.sampling.seed, 7u);
  EXPECT_EQ(r.generation.stop_strings.size(), 2u);
  EXPECT_EQ(r.tool_choice.kind, ToolChoice::Kind::Named);
  EXPECT_FALSE(r.parallel_tool_calls);
  ASSERT_EQ(r.generation.sampling.logit_bias.size(), 1u);
  EXPECT_EQ(r.generation.sampling.logit_bias[0].first, 5);
}

TEST(ServerRequest, ChatRejectsBadParameters) {
  struct Case {
    std::string body;
    std::string param;
    std::string code;
  };
  const Case cases[] = {
      {R"({"messages":"hi"})", "messages", "invalid_type"},
      {R"({})", "messages", "missing_required_parameter"},
      {R"({"messages":[]})", "messages", "invalid_value"},
      {R"({"messages":[{"content":"x"}]})", "messages[0].role", "invalid_value"},
      {R"({"messages":[{"role":"user","content":5}]})", "messages[0].content", "invalid_type"},
      {with(R"("temperature":"hot")"), "temperature", "invalid_type"},
      {with(R"("temperature":5)"), "temperature", "invalid_value"},
      {with(R"("top_p":0)"), "top_p", "invalid_value"},
      {with(R"("n":0)"), "n", "invalid_value"},
      {with(R"("n":1000000)"), "n", "invalid_value"},
      {with(R"("n":1.5)"), "n", "invalid_type"},
      {with(R"("max_tokens":0)"), "max_tokens", "invalid_value"},
      {with(R"("max_tokens":-5)"), "max_tokens", "invalid_value"},
      {with(R"("max_completion_tokens":1e300)"), "max_completion_tokens", "invalid_type"},
      {with(R"("seed":"x")"), "seed", "invalid_type"},
      {with(R"("stop":[1])"), "stop", "invalid_type"},
      {with(R"("stop":"")"), "stop", "invalid_value"},
      {with(R"("logprobs":"yes")"), "logprobs", "invalid_type"},
      {with(R"("top_logprobs":3)"), "top_logprobs", "invalid_value"},
      {with(R"("logprobs":true,"top_logprobs":50)"), "top_logprobs", "invalid_value"},
      {with(R"("presence_penalty":3)"), "presence_penalty", "invalid_value"},
      // The sampling ranges are checked here only (the engine takes the request as validated).
      {with(R"("temperature":null,"min_p":1.5)"), "min_p", "invalid_value"},
      {with(R"("repetition_penalty":0)"), "repetition_penalty", "invalid_value"},
      {with(R"("min_tokens":-1)"), "min_tokens", "invalid_value"},
      {with(R"("top_k":-2)"), "top_k", "invalid_value"},
      {with(R"("logit_bias":{"abc":1})"), "logit_bias", "invalid_value"},
      {with(R"("logit_bias":{"5000":1})"), "logit_bias", "invalid_value"},
      {with(R"("logit_bias":{"5":1000})"), "logit_bias", "invalid_value"},
      {with(R"("stream_options":{"include_usage":true})"), "stream_options", "invalid_value"},
      {with(R"("stream":true,"stream_options":{"include_usage":1})"), "stream_options.include_usage", "invalid_type"},
      {with(R"("reasoning_effort":"extreme")"), "reasoning_effort", "invalid_value"},
      {with(R"("chat_template_kwargs":[1])"), "chat_template_kwargs", "invalid_type"},
      {with(R"("tools":{})"), "tools", "invalid_type"},
      {with(R"("tools":[{"type":"custom","function":{"name":"f"}}])"), "tools[0].type", "invalid_value"},
      {with(R"("tools":[{"type":"function","function":{"name":"bad name"}}])"), "tools[0].function.name", "invalid_value"},
      {with(R"("tool_choice":"required")"), "tool_choice", "invalid_value"},
      {with(R"("tool_choice":"sometimes","tools":[{"type":"function","function":{"name":"f"}}])"), "tool_choice", "invalid_value"},
      {with(R"("tool_choice":{"type":"function","function":{"name":"g"}},"tools":[{"type":"function","function":{"name":"f"}}])"), "tool_choice", "invalid_value"},
      {with(R"("parallel_tool_calls":"no")"), "parallel_tool_calls", "invalid_type"},
      {with(R"("response_format":{"type":"xml"})"), "response_format.type", "invalid_value"},
      {with(R"("response_format":{"type":"json_schema"})"), "response_format.json_schema", "invalid_value"},
      {with(R"("functions":[])"), "functions", "unsupported_parameter"},
      {with(R"("chat_template":"{{x}}")"), "chat_template", "unsupported_parameter"},
      {with(R"("model":5)"), "model", "invalid_type"},
  };
  for (const auto& c : cases) {
    auto e = chat(c.body);
    ASSERT_TRUE(e) << c.body;
    EXPECT_EQ(e->status, 400) << c.body;
    EXPECT_EQ(e->param, c.param) << c.body << " -> " << e->message;
    EXPECT_EQ(e->code, c.code) << c.body << " -> " << e->message;
    EXPECT_FALSE(e->message.empty());
  }
}

TEST(ServerRequest, Completions) {
  ApiRequest r;
  ValidationLimits limits;
  limits.vocab_size = 1000;
  ASSERT_FALSE(parse_completion_request(parse(R"({"prompt":["a",[1,2]],"max_tokens":0,"echo":true,"logprobs":1})"), limits, &r));
  ASSERT_EQ(r.prompts.size(), 2u);
  EXPECT_EQ(*r.max_tokens, 0);
  ASSERT_FALSE(parse_completion_request(parse(R"({"prompt":[5,6,7]})"), limits, &r));
  ASSERT_EQ(r.prompts.size(), 1u);
  EXPECT_EQ(*r.max_tokens, 16);
  auto e = parse_completion_request(parse(R"({"prompt":[5,6000]})"), limits, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "prompt[1]");
  e = parse_completion_request(parse(R"({"prompt":"x","suffix":"y"})"), limits, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->code, "unsupported_parameter");
  e = parse_completion_request(parse(R"({"prompt":"x","max_tokens":0})"), limits, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "max_tokens");
  e = parse_completion_request(parse(R"({"prompt":{}})"), limits, &r);
  ASSERT_TRUE(e);
  e = parse_completion_request(parse(R"({"prompt":"x","best_of":3})"), limits, &r);
  ASSERT_TRUE(e);
  EXPECT_EQ(e->param, "best_of");
}

TEST(ServerRequest, AnthropicMessages) {
  ApiRequest r;
  ValidationLimits limits;
  auto ok = parse_messages_request(parse(R"({"model":"m","max_tokens":4096,"system":"be brief","stop_sequences":["x"],
      "messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}],
      "tools":[{"name":"get","input_schema":{"type":"object"}}],"tool_choice":{"type":"any","disable_parallel_tool_use":true},
      "thinking":{"type":"enabled","budget_tokens":2048},"output_config":{"effort":"high"}})"),
                                   limits, &r);
  ASSERT_FALSE(ok) << ok->message;
  EXPECT_EQ(r.tool_choice.kind, ToolChoice::Kind::Required);
  EXPECT_FALSE(r.parallel_tool_calls);
  EXPECT_EQ(r.generation.stop_strings, std::vector<std::string>{"x"});
  for (const char* bad : {R"({"messages":[{"role":"user","content":"hi"}]})",
                          R"({"max_tokens":10,"messages":[{"role":"system","content":"hi"}]})",
                          R"({"max_tokens":"10","messages":[{"role":"user","content":"hi"}]})",
                          R"({"max_tokens":10,"temperature":1.5,"messages":[{"role":"user","content":"hi"}]})",
                          R"({"max_tokens":10,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"x"}]})",
                          R"({"max_tokens":10,"messages":[{"role":"user","content":"hi"}],"tool_choice":{"type":"tool","name":"x"}})",
                          R"({"max_tokens":10,"messages":[{"role":"user","content":"hi"}],"thinking":{"type":"maybe"}})"}) {
    auto e = parse_messages_request(parse(bad), limits, &r);
    ASSERT_TRUE(e) << bad;
    EXPECT_EQ(e->status, 400);
    EXPECT_NE(anthropic_error_body(*e).find("\"type\":\"error\""), std::string::npos);
  }
}

TEST(ServerRequest, ResponsesBecomeTheEquivalentChatRequest) {
  ValidationLimits limits;
  ApiRequest r;
  auto e = parse_responses_request(parse(R"({"model":"m","instructions":"Be brief.","max_output_tokens":50,
    "reasoning":{"effort":"low"},"text":{"format":{"type":"json_schema","name":"x","schema":{"type":"object"}}},
    "tools":[{"type":"function","name":"f","description":"d","parameters":{"type":"object"}}],"tool_choice":{"type":"function","name":"f"},
    "include":["reasoning.encrypted_content"],"store":false,
    "input":[{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_text","text":"there"}]},
             {"type":"reasoning","summary":[],"content":[{"type":"reasoning_text","text":"think"}]},
             {"type":"function_call","call_id":"c1","name":"f","arguments":"{\"a\":1}"},
             {"type":"function_call","call_id":"c2","name":"f","arguments":"{}"},
             {"type":"function_call_output","call_id":"c1","output":"one"},
             {"type":"function_call_output","call_id":"c2","output":[{"type":"input_text","text":"two"}]},
             {"type":"message","role":"assistant","content":[{"type":"output_text","text":"done"}]}]})"),
                                   limits, &r);
  ASSERT_FALSE(e) << e->message;
  EXPECT_EQ(r.endpoint, Endpoint::Responses);
  EXPECT_EQ(r.max_tokens, 50);
  EXPECT_EQ(r.tool_choice.kind, ToolChoice::Kind::Named);
  EXPECT_EQ(r.response_format.get_string("type", ""), "json_schema");
  const Json& m = *r.body.find("messages");
  ASSERT_EQ(m.size(), 6u);
  EXPECT_EQ(m.as_array()[0].dump(), R"({"role":"system","content":"Be brief."})");
  EXPECT_EQ(m.as_array()[1].find("content")->as_array()[1].get_string("text", ""), "there");
  const Json& calls = m.as_array()[2];
  EXPECT_EQ(calls.get_string("reasoning_content", ""), "think");
  ASSERT_EQ(calls.find("tool_calls")->size(), 2u) << "consecutive calls are one assistant turn";
  EXPECT_EQ(m.as_array()[3].dump(), R"({"role":"tool","tool_call_id":"c1","content":"one"})");
  EXPECT_EQ(m.as_array()[4].get_string("content", ""), "two");
  EXPECT_EQ(r.body.get_string("reasoning_effort", ""), "low");

  struct Case {
    const char* body;
    const char* param;
  } bad[] = {{R"({"input":"hi","previous_response_id":"resp_1"})", "previous_response_id"},
             {R"({"input":"hi","background":true})", "background"},
             {R"({"input":"hi","truncation":"auto"})", "truncation"},
             {R"({"input":"hi","include":["file_search_call.results"]})", "include"},
             {R"({})", "input"},
             {R"({"input":[]})", "input"},
             {R"({"input":[{"type":"web_search_call"}]})", "input.0.type"},
             {R"({"input":[{"role":"tool","content":"x"}]})", "input.0.role"},
             {R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AA=="}]}]})", "input.0.content.0"},
             {R"({"input":"hi","tools":[{"type":"web_search"}]})", "tools.0.type"},
             {R"({"input":"hi","max_output_tokens":0})", "max_output_tokens"},
             {R"({"input":[{"type":"function_call","name":"f","arguments":{}}]})", "input.0.arguments"}};
  for (const auto& c : bad) {
    ApiRequest out;
    auto err = parse_responses_request(parse(c.body), limits, &out);
    ASSERT_TRUE(err) << c.body;
    EXPECT_EQ(err->status, 400);
    EXPECT_EQ(err->param, c.param) << c.body << ": " << err->message;
  }
  // The message names the Responses field too, not the chat one it became.
  ApiRequest out;
  auto err = parse_responses_request(parse(R"({"input":"hi","max_output_tokens":0})"), limits, &out);
  ASSERT_TRUE(err);
  EXPECT_NE(err->message.find("'max_output_tokens'"), std::string::npos) << err->message;
}

TEST(ServerStop, MatchesAcrossChunksAndNeverLeaks) {
  StopStringMatcher m({"STOP", "xy"}, false);
  std::string out;
  for (const char* piece : {"ab", "cS", "TO", "Pdef"}) out += m.push(piece);
  EXPECT_TRUE(m.matched());
  EXPECT_EQ(out, "abc");
  EXPECT_EQ(m.matched_string(), "STOP");

  StopStringMatcher keep({"STOP"}, true);
  EXPECT_EQ(keep.push("a STOP b"), "a STOP");

  StopStringMatcher none({"zz"}, false);
  EXPECT_EQ(none.push("abz"), "ab");  // "z" held: could start "zz"
  EXPECT_EQ(none.push("q"), "zq");
  EXPECT_EQ(none.flush(), "");

  // A held-back tail never splits a UTF-8 character.
  StopStringMatcher utf({"\xC3\xA9X"}, false);
  std::string s = utf.push("caf\xC3\xA9");
  EXPECT_EQ(s, "caf");
  EXPECT_EQ(utf.push("!"), "\xC3\xA9!");
}

TEST(ServerWriter, ChatStreamSequence) {
  WriterOptions o;
  o.id = "chatcmpl-1";
  o.model = "m";
  o.created = 1;
  o.include_usage = true;
  auto w = make_chat_writer(o);
  std::string s = w->stream_start();
  EXPECT_NE(s.find(R"("delta":{"role":"assistant","content":""})"), std::string::npos) << s;
  ChoiceDelta d;
  d.reasoning = "think";
  s = w->stream_delta(0, d, {});
  EXPECT_NE(s.find(R"("reasoning":"think","reasoning_content":"think")"), std::string::npos) << s;
  ChoiceDelta call;
  call.tool_calls.push_back({0, "call_0", "get_weather", "{\"city\":\"Pa"});
  s = w->stream_delta(0, call, {});
  // Header chunk (id/type/name, empty arguments) then the fragment.
  size_t head = s.find(R"("tool_calls":[{"index":0,"id":"call_0","type":"function","function":{"name":"get_weather","arguments":""}}])");
  size_t frag = s.find(R"("tool_calls":[{"index":0,"function":{"arguments":"{\"city\":\"Pa"}}])");
  ASSERT_NE(head, std::string::npos) << s;
  ASSERT_NE(frag, std::string::npos) << s;
  EXPECT_LT(head, frag);
  EXPECT_NE(s.find(R"("usage":null)"), std::string::npos);
  s = w->stream_finish(0, {"tool_calls", Json()});
  EXPECT_NE(s.find(R"("delta":{},"logprobs":null,"finish_reason":"tool_calls")"), std::string::npos) << s;
  UsageInfo u{10, 5, 2, 3};
  s = w->stream_end(u);
  EXPECT_NE(s.find(R"("choices":[],"usage":{"prompt_tokens":10,"completion_tokens":5,"total_tokens":15)"), std::string::npos) << s;
  EXPECT_TRUE(s.ends_with("data: [DONE]\n\n"));
}

TEST(ServerWriter, ChatWholeBody) {
  WriterOptions o;
  o.id = "chatcmpl-1";
  o.model = "m";
  auto w = make_chat_writer(o);
  ChoiceDelta d;
  d.reasoning = "r";
  d.tool_calls.push_back({0, "call_0", "f", "{\"a\":"});
  w->add(0, d);
  ChoiceDelta d2;
  d2.tool_calls.push_back({0, "", "", "1}"});
  w->add(0, d2);
  w->finish(0, {"tool_calls", Json()});
  Json body = parse(w->body({3, 4, 0, 1}));
  const Json& msg = *body.find("choices")->as_array()[0].find("message");
  EXPECT_TRUE(msg.find("content")->is_null());
  EXPECT_EQ(msg.get_string("reasoning_content", ""), "r");
  EXPECT_EQ(msg.find("tool_calls")->as_array()[0].find("function")->get_string("arguments", ""), "{\"a\":1}");
  EXPECT_EQ(body.find("usage")->find("completion_tokens_details")->get_int("reasoning_tokens", -1), 1);
}

TEST(ServerWriter, AnthropicStreamEvents) {
  WriterOptions o;
  o.id = "msg_1";
  o.model = "m";
  o.prompt_tokens = 7;
  auto w = make_messages_writer(o);
  std::string s = w->stream_start();
  ChoiceDelta d;
  d.reasoning = "hmm";
  s += w->stream_delta(0, d, {});
  ChoiceDelta t;
  t.content = "hi";
  t.tool_calls.push_back({0, "toolu_1", "get", "{\"x\":1}"});
  s += w->stream_delta(0, t, {});
  s += w->stream_finish(0, {"tool_calls", Json()});
  s += w->stream_end({7, 9, 0, 0});
  const char* order[] = {"event: message_start", "\"type\":\"thinking\"", "thinking_delta", "content_block_stop",
                         "\"type\":\"text\"", "text_delta", "content_block_stop", "\"type\":\"tool_use\"",
                         "input_json_delta", "content_block_stop", "\"stop_reason\":\"tool_use\"", "event: message_stop"};
  size_t at = 0;
  for (const char* needle : order) {
    size_t p = s.find(needle, at);
    ASSERT_NE(p, std::string::npos) << needle << "\n" << s;
    at = p + 1;
  }
}

TEST(ServerWriter, CompletionLogprobsAndSanitizing) {
  WriterOptions o;
  o.id = "cmpl-1";
  auto w = make_completion_writer(o);
  ChoiceDelta d;
  d.text = "ab";
  d.logprobs.push_back({1, "a", -0.5, {{1, "a", -0.5}, {2, "\xE6", -1.0}}});
  d.logprobs.push_back({2, "b", -0.25, {}});
  w->add(0, d);
  w->finish(0, {"length", Json()});
  Json body = parse(w->body({1, 2, 0, 0}));
  const Json& lp = *body.find("choices")->as_array()[0].find("logprobs");
  EXPECT_EQ(lp.find("tokens")->as_array().size(), 2u);
  EXPECT_EQ(lp.find("text_offset")->as_array()[1].as_int(), 1);
  EXPECT_TRUE(lp.find("top_logprobs")->as_array()[0].contains("\xEF\xBF\xBD"));
  EXPECT_EQ(sanitize_utf8("a\xFF" "b"), "a\xEF\xBF\xBD" "b");
}

TEST(ServerFake, ParserReassemblesToolCallsSplitAnywhere) {
  FakeModelOptions fo;
  auto backend = make_fake_backend(fo);
  ParserOptions po;
  po.tools_enabled = true;
  std::string text = "<|think|>why<|/think|><|tool|>f\n{\"a\":\"<|x\"}<|/tool|><|tool|>g\n{}<|/tool|>";
  for (size_t split = 1; split < text.size(); ++split) {
    auto parser = backend.adapter->make_output_parser(po);
    ParsedDelta a, b, c;
    parser->feed({}, std::string_view(text).substr(0, split), a);
    parser->feed({}, std::string_view(text).substr(split), b);
    parser->finish(FinishReason::Stop, c);
    std::string reasoning = a.reasoning + b.reasoning + c.reasoning;
    std::map<int, std::string> args, names;
    for (auto* d : {&a, &b, &c})
      for (auto& t : d->tool_calls) {
        args[t.index] += t.arguments;
        names[t.index] += t.name;
      }
    EXPECT_EQ(reasoning, "why") << split;
    EXPECT_EQ(names[0], "f") << split;
    EXPECT_EQ(args[0], "{\"a\":\"<|x\"}") << split;
    EXPECT_EQ(names[1], "g") << split;
    EXPECT_EQ(args[1], "{}") << split;
    EXPECT_EQ(a.content + b.content + c.content, "") << split;
  }
}
