// Issue 17: no request can take the server down, starve it, or read past its
// budget. The server runs over loopback on the embedded model (muse-tiny: the
// real tokenizer, chat template and engine), wrapped so that tests can make
// the adapter throw on purpose. Every loop here is bounded in count and time.
#include <gtest/gtest.h>

#include <chrono>
#include <stdexcept>
#include <thread>

#include "hardening_support.h"

namespace muse::server {
namespace {

using hardening::Reply;
using hardening::RealServer;
using hardening::error_code;
using hardening::json_of;
using hardening::request;

const char* kChat = "/v1/chat/completions";
const std::string kHi = R"("messages":[{"role":"user","content":"hi"}])";

// Item 1: the crash from one field, and every other value of every reserved
// template variable, on every endpoint that renders.
TEST_F(RealServer, TemplateVariablesNeverCrash) {
  start();
  const char* values[] = {R"("yes")", "1", "null", "[]", "{}", "true", "false", "1.5", R"({"a":[1,{"b":null}]})"};
  const char* names[] = {"add_generation_prompt", "continue_final_message", "messages", "tools", "documents",
                         "bos_token", "eos_token", "reasoning_strength", "raise_exception", "range", "loop", "namespace"};
  struct Target {
    const char* path;
    std::string prefix;
  } targets[] = {{kChat, "{" + kHi + R"(,"max_tokens":1,)"},
                 {"/v1/messages", "{" + kHi + R"(,"max_tokens":1,)"},
                 {"/v1/messages/count_tokens", "{" + kHi + ","},
                 {"/tokenize", "{" + kHi + ","},
                 {"/v1/responses", R"({"input":"hi","max_output_tokens":1,)"}};
  int requests = 0;
  for (const auto& t : targets)
    for (const char* name : names)
      for (const char* value : values) {
        std::string body = t.prefix + R"("chat_template_kwargs":{")" + name + "\":" + value + "}}";
        Reply r = request(port_, "POST", t.path, body);
        ++requests;
        ASSERT_NE(r.status, 0) << "connection dropped: " << t.path << " " << body;
        EXPECT_TRUE(r.status == 200 || r.status == 400) << r.status << " " << t.path << " " << body << "\n" << r.body;
        // (/v1/responses has no chat_template_kwargs: ignored there, like any unknown field.)
        if (std::string_view(name) == "add_generation_prompt" && std::string_view(t.path) != "/v1/responses" &&
            std::string_view(value) != "true" &&
            std::string_view(value) != "false") {
          EXPECT_EQ(r.status, 400) << t.path << " " << body;
        }
      }
  // The top-level flags too.
  for (const char* value : values) {
    Reply r = request(port_, "POST", kChat, "{" + kHi + R"(,"max_tokens":1,"add_generation_prompt":)" + value + "}");
    EXPECT_TRUE(r.status == 200 || r.status == 400) << value;
  }
  EXPECT_GT(requests, 500);
  EXPECT_EQ(request(port_, "GET", "/health").status, 200);
}

TEST_F(RealServer, NonBooleanAddGenerationPromptIsA400NamingIt) {
  start();
  for (const char* path : {kChat, "/v1/messages", "/v1/messages/count_tokens", "/tokenize"}) {
    Reply r = request(port_, "POST", path,
                      "{" + kHi + R"(,"max_tokens":4,"chat_template_kwargs":{"add_generation_prompt":"yes"}})");
    EXPECT_EQ(r.status, 400) << path << r.body;
    EXPECT_NE(r.body.find("add_generation_prompt"), std::string::npos) << r.body;
  }
  Reply r = request(port_, "POST", kChat, "{" + kHi + R"(,"chat_template_kwargs":{"add_generation_prompt":1}})");
  EXPECT_EQ(json_of(r).find("error")->get_string("param", ""), "chat_template_kwargs.add_generation_prompt");
  EXPECT_EQ(error_code(r), "invalid_type");
  // A valid override still works.
  r = request(port_, "POST", kChat, "{" + kHi + R"(,"max_tokens":2,"chat_template_kwargs":{"add_generation_prompt":true}})");
  EXPECT_EQ(r.status, 200) << r.body;
}

// Item 1, defence in depth: whatever throws while handling one request
// becomes a 500 envelope for it; the server stays up and says what happened.
TEST_F(RealServer, AnExceptionIsA500AndTheServerStaysUp) {
  start();
  for (int i = 0; i < 3; ++i) {
    Reply r = request(port_, "POST", kChat, R"({"messages":[{"role":"user","content":"THROW in render"}]})");
    EXPECT_EQ(r.status, 500) << r.body;
    EXPECT_EQ(error_code(r), "internal_error");
    r = request(port_, "POST", "/v1/messages", R"({"max_tokens":3,"messages":[{"role":"user","content":"THROW in render"}]})");
    EXPECT_EQ(r.status, 500);
    EXPECT_EQ(json_of(r).find("error")->get_string("type", ""), "api_error");
    r = request(port_, "POST", "/v1/completions", R"({"prompt":"THROW in tokenize","max_tokens":2})");
    EXPECT_EQ(r.status, 500);
  }
  // In the output path (the response parser), whole and streamed.
  const std::string tool = R"("tools":[{"type":"function","function":{"name":"throw_in_parser","parameters":{"type":"object"}}}])";
  Reply r = request(port_, "POST", kChat, "{" + kHi + ",\"max_tokens\":3," + tool + "}");
  EXPECT_EQ(r.status, 500) << r.body;
  r = request(port_, "POST", kChat, "{" + kHi + ",\"max_tokens\":3,\"stream\":true," + tool + "}");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("data: {\"error\":"), std::string::npos) << r.body;
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n")) << r.body;
  EXPECT_EQ(request(port_, "GET", "/health").status, 200);
  EXPECT_EQ(request(port_, "POST", kChat, "{" + kHi + R"(,"max_tokens":2})").status, 200);
  EXPECT_TRUE(wait_idle());
}

// An engine that answers inside submit(): the output and the summary are in
// the job's inbox before the I/O thread drains it, so they are handled in one
// batch.
class AnswersAtOnce : public GenerationService {
 public:
  Status load(const LoadProgressFn&) override { return Status::Ok(); }
  std::optional<SubmitError> submit(GenerationRequest r, std::shared_ptr<GenerationSink> sink) override {
    GenerationOutput out;
    out.token_ids = {r.prompt.back()};
    out.text = "x";
    out.finish = FinishReason::Length;
    sink->on_output(std::move(out));
    GenerationSummary summary;
    summary.prompt_tokens = int(r.prompt.size());
    summary.completion_tokens = {1};
    sink->on_complete(std::move(summary));
    return std::nullopt;
  }
  void cancel(const std::string&) override {}
  EngineStats stats() const override { return {}; }
};

// The parser throws on an output whose summary came in the same batch: the
// summary still finalizes the request (it used to be dropped with the rest of
// the batch, leaving the stream open).
TEST_F(RealServer, AThrowingParserDoesNotLoseTheSummaryAfterIt) {
  ApiServerOptions o;
  o.sse_keepalive_seconds = 3600;  // a request left open shows as a receive timeout
  start(o, std::make_shared<AnswersAtOnce>());
  const std::string tool = R"("tools":[{"type":"function","function":{"name":"throw_in_parser","parameters":{"type":"object"}}}])";
  Reply r = request(port_, "POST", kChat, "{" + kHi + ",\"max_tokens\":3,\"stream\":true," + tool + "}");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("data: {\"error\":"), std::string::npos) << r.body;
  EXPECT_TRUE(r.body.ends_with("data: [DONE]\n\n")) << r.body;
  r = request(port_, "POST", kChat, "{" + kHi + ",\"max_tokens\":3," + tool + "}");
  EXPECT_EQ(r.status, 500) << r.body;
}

// Item 6: what used to be accepted wrongly, and what was refused wrongly.
TEST_F(RealServer, WrongAcceptances) {
  start();
  struct Case {
    const char* path;
    std::string body;
    int status;
    const char* param;  // OpenAI envelope only ("" = not checked)
  } cases[] = {
      {kChat, R"({"messages":[{"role":"user","content":[{"type":"text","text":"what is this?"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="}}]}]})", 400, "messages[0].content[1]"},
      {kChat, R"({"messages":[{"role":"user","content":[{"type":"input_audio","input_audio":{"data":"AA==","format":"wav"}}]}]})", 400, "messages[0].content[0]"},
      {"/v1/responses", R"({"input":[{"role":"user","content":[{"type":"input_image","image_url":"data:image/png;base64,AA=="}]}]})", 400, "input.0.content.0"},
      {"/v1/messages", R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"image","source":{"type":"base64","media_type":"image/png","data":"AA=="}}]}]})", 400, ""},
      {"/v1/messages", R"({"max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":[{"type":"image","source":{}}]}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}]})", 400, ""},
      {kChat, R"({"messages":[{"role":"wizard","content":"hi"}]})", 400, "messages[0].role"},
      {kChat, R"({"messages":[{"role":"user","content":"hi"},{"role":"User","content":"hi"}]})", 400, "messages[1].role"},
      // tool_use without its tool_result right after; a tool_result without its tool_use.
      {"/v1/messages", R"({"max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]},{"role":"user","content":"go on"}],"tools":[{"name":"f","input_schema":{"type":"object"}}]})", 400, ""},
      {"/v1/messages", R"({"max_tokens":5,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}]})", 400, ""},
      {"/v1/messages", R"({"max_tokens":5,"messages":[{"role":"user","content":[{"type":"tool_result","tool_use_id":"nope","content":"1"}]}]})", 400, ""},
      {"/v1/messages", R"({"max_tokens":1024,"thinking":{"type":"enabled","budget_tokens":1024},"messages":[{"role":"user","content":"x"}]})", 400, ""},
      {"/v1/messages", R"({"max_tokens":100,"thinking":{"type":"enabled","budget_tokens":5000},"messages":[{"role":"user","content":"x"}]})", 400, ""},
      // Accepted: tools without description (both APIs), budget below max_tokens, a proper tool round trip.
      {kChat, R"({"max_tokens":2,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f"}}]})", 200, ""},
      {kChat, R"({"max_tokens":2,"messages":[{"role":"user","content":"hi"}],"tools":[{"type":"function","function":{"name":"f","parameters":{"type":"object","properties":{"a":{"type":"string"}}}}}]})", 200, ""},
      {"/v1/messages", R"({"max_tokens":2,"messages":[{"role":"user","content":"hi"}],"tools":[{"name":"f","input_schema":{"type":"object"}}]})", 200, ""},
      {"/v1/responses", R"({"max_output_tokens":2,"input":"hi","tools":[{"type":"function","name":"f","parameters":{"type":"object"}}]})", 200, ""},
      {"/v1/messages", R"({"max_tokens":30,"thinking":{"type":"enabled","budget_tokens":20},"messages":[{"role":"user","content":"x"}]})", 200, ""},
      {"/v1/messages", R"({"max_tokens":2,"messages":[{"role":"user","content":"x"},{"role":"assistant","content":[{"type":"tool_use","id":"t1","name":"f","input":{}}]},{"role":"user","content":[{"type":"tool_result","tool_use_id":"t1","content":"1"}]}],"tools":[{"name":"f","input_schema":{"type":"object"}}]})", 200, ""},
  };
  for (const auto& c : cases) {
    Reply r = request(port_, "POST", c.path, c.body);
    EXPECT_EQ(r.status, c.status) << c.body << "\n" << r.body;
    if (c.status == 400 && std::string_view(c.path) != "/v1/messages") {
      ASSERT_TRUE(json_of(r).find("error")) << r.body;
      if (*c.param) {
        EXPECT_EQ(json_of(r).find("error")->get_string("param", ""), c.param) << r.body;
      }
    }
    if (c.status == 400 && std::string_view(c.path) == "/v1/messages") {
      EXPECT_EQ(json_of(r).find("error")->get_string("type", ""), "invalid_request_error") << r.body;
    }
  }
}

TEST_F(RealServer, NonJsonContentTypeIs415) {
  start();
  for (const char* ct : {"text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x", "", "application/jsonx"}) {
    std::string header = *ct ? std::string("Content-Type: ") + ct + "\r\n" : "";
    Reply r = hardening::raw(port_, "POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + header +
                                        "Content-Length: 41\r\n\r\n{\"messages\":[{\"role\":\"user\",\"content\":1}]}");
    EXPECT_EQ(r.status, 415) << ct << r.body;
    EXPECT_EQ(error_code(r), "unsupported_media_type") << r.body;
  }
  Reply r = request(port_, "POST", "/v1/messages", "{}", "", "text/plain;charset=UTF-8");
  EXPECT_EQ(r.status, 415);
  EXPECT_EQ(json_of(r).find("error")->get_string("type", ""), "invalid_request_error");
  r = request(port_, "POST", "/tokenize", R"({"prompt":"a"})", "", "Application/JSON; charset=utf-8");
  EXPECT_EQ(r.status, 200) << "parameters and case are fine";
}

// Item 7 (last point): completions prompt errors name the element.
TEST_F(RealServer, CompletionPromptErrorsNameTheField) {
  start();
  struct Case {
    std::string body;
    const char* param;
  } cases[] = {{R"({"prompt":[[1,2],[3,"x"]]})", "prompt[1][1]"},
               {R"({"prompt":["a",5]})", "prompt[1]"},
               {R"({"prompt":["a",[]]})", "prompt[1]"},
               {R"({"prompt":[1,2,999999]})", "prompt[2]"},
               {R"({"prompt":[1,2.5]})", "prompt[1]"},
               {R"({"prompt":true})", "prompt"}};
  for (const auto& c : cases) {
    Reply r = request(port_, "POST", "/v1/completions", c.body);
    EXPECT_EQ(r.status, 400) << c.body;
    EXPECT_EQ(json_of(r).find("error")->get_string("param", ""), c.param) << r.body;
    EXPECT_NE(json_of(r).find("error")->get_string("message", "").find(c.param), std::string::npos) << r.body;
  }
}

// Item 8: /metrics is open like /health; everything else keeps the key.
TEST_F(RealServer, MetricsNeedNoKey) {
  ApiServerOptions o;
  o.api_key = "sekret";
  start(o);
  Reply r = request(port_, "GET", "/metrics");
  EXPECT_EQ(r.status, 200);
  EXPECT_NE(r.body.find("muse:num_requests_running"), std::string::npos);
  EXPECT_EQ(request(port_, "GET", "/health").status, 200);
  EXPECT_EQ(request(port_, "GET", "/v1/models").status, 401);
  EXPECT_EQ(request(port_, "GET", "/version").status, 401);
  EXPECT_EQ(request(port_, "POST", "/tokenize", R"({"prompt":"a"})").status, 401);
}

}  // namespace
}  // namespace muse::server
