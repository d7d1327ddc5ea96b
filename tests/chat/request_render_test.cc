// Request rendering: OpenAI / Anthropic requests -> Muse Glimmer prompts
// (chat-format.md requirements 4-8, §2.7 reference prompts), and the errors
// malformed requests get.
#include <gtest/gtest.h>

#include "muse/chat/request_render.h"
#include "muse/core/mapped_file.h"
#include "muse/tokenizer/tokenizer_files.h"

namespace muse::chat {
namespace {

const std::string kTemplatePath = std::string(MUSE_SOURCE_DIR) + "/../shared/testdata/muse-glimmer/chat_template.jinja";

class GlimmerRequest : public ::testing::Test {
 protected:
  void SetUp() override {
    auto src = read_file(kTemplatePath);
    if (!src.ok()) GTEST_SKIP() << "shared test data absent: " << kTemplatePath;
    auto t = ChatTemplate::create(*src, {});
    ASSERT_TRUE(t.ok()) << t.message();
    tpl_ = std::make_unique<ChatTemplate>(std::move(*t));
  }

  Result<std::string> render(const std::string& request_json, RequestApi api = RequestApi::OpenAIChat) {
    auto j = Json::parse(request_json);
    EXPECT_TRUE(j.ok()) << j.message();
    ChatRenderOptions o;
    o.api = api;
    return render_chat_prompt(*j, *tpl_, o);
  }

  std::string ok(const std::string& request_json, RequestApi api = RequestApi::OpenAIChat) {
    auto r = render(request_json, api);
    EXPECT_TRUE(r.ok()) << r.message();
    return r.ok() ? *r : "";
  }

  void fails(const std::string& request_json, const std::string& needle, RequestApi api = RequestApi::OpenAIChat) {
    auto r = render(request_json, api);
    ASSERT_FALSE(r.ok()) << request_json;
    EXPECT_NE(r.message().find(needle), std::string::npos) << r.message();
  }

  std::unique_ptr<ChatTemplate> tpl_;
};

const char* kKwargs = R"("chat_template_kwargs": {"current_date": "2026-10-01"})";

TEST_F(GlimmerRequest, ReferencePromptA) {
  EXPECT_EQ(ok(std::string(R"({"messages": [{"role": "system", "content": "You are a concise assistant."},
                                           {"role": "user", "content": "What is 2+2?"}], )") + kKwargs + "}"),
            "<|begin_of_text|><|start|>system<|message|>You are a concise assistant.\n\nReasoning strength: high.\n\n"
            "# Valid recipients: \"self\", \"user\".<|eot|><|start|>user<|message|>What is 2+2?<|eot|><|start|>assistant");
}

// §2.7 (c): reasoning, a call, its result, reasoning + answer, a new question.
TEST_F(GlimmerRequest, ReferencePromptC) {
  std::string out = ok(std::string(R"({"messages": [
      {"role": "user", "content": "Weather in Paris for 2 days?"},
      {"role": "assistant", "reasoning_content": "I should call the forecast tool.", "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "weather.get_forecast", "arguments": "{\"city\": \"Paris\", \"days\": 2}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "{\"temp_c\": 18, \"sky\": \"clear\"}"},
      {"role": "assistant", "reasoning_content": "Summarize the result.", "content": "18 °C and clear."},
      {"role": "user", "content": "Thanks! And Tokyo?"}], )") + kKwargs + "}");
  const std::string expected =
      "<|start|>user<|message|>Weather in Paris for 2 days?<|eot|><|start|>assistant to=self<|message|>I should call the "
      "forecast tool.<|eom|><|start|>assistant to=weather.get_forecast<|message|><atem:function_calls>\n<atem:invoke "
      "name=\"weather.get_forecast\">\n<atem:parameter name=\"city\">Paris</atem:parameter>\n<atem:parameter "
      "name=\"days\">2</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|><|start|>tool "
      "weather.get_forecast<|message|><tool_output name=\"weather.get_forecast\">\n{\"temp_c\": 18, \"sky\": "
      "\"clear\"}\n</tool_output><|eot|><|start|>assistant to=self<|message|>Summarize the result.<|eom|><|start|>assistant "
      "to=user<|message|>18 °C and clear.<|eot|><|start|>user<|message|>Thanks! And Tokyo?<|eot|><|start|>assistant";
  ASSERT_GE(out.size(), expected.size());
  EXPECT_EQ(out.substr(out.size() - expected.size()), expected);
}

// §2.7 (d): two calls in one assistant message, then two results.
TEST_F(GlimmerRequest, ReferencePromptD) {
  std::string out = ok(std::string(R"({"messages": [{"role": "user", "content": "Paris and Tokyo?"},
      {"role": "assistant", "tool_calls": [
        {"id": "a", "type": "function", "function": {"name": "weather.get_forecast", "arguments": "{\"city\": \"Paris\"}"}},
        {"id": "b", "type": "function", "function": {"name": "weather.get_forecast", "arguments": "{\"city\": \"Tokyo\", \"days\": 3}"}}]},
      {"role": "tool", "tool_call_id": "a", "content": "sunny"}, {"role": "tool", "tool_call_id": "b", "content": "rain"}], )") +
                       kKwargs + "}");
  EXPECT_NE(out.find("</atem:function_calls><|eom|><|start|>assistant to=weather.get_forecast<|message|><atem:function_calls>\n"
                     "<atem:invoke name=\"weather.get_forecast\">\n<atem:parameter name=\"city\">Tokyo</atem:parameter>\n"
                     "<atem:parameter name=\"days\">3</atem:parameter>\n</atem:invoke>\n</atem:function_calls><|eot|><|start|>tool "
                     "weather.get_forecast<|message|><tool_output name=\"weather.get_forecast\">\nsunny\n</tool_output><|eot|>"
                     "<|start|>tool weather.get_forecast<|message|><tool_output name=\"weather.get_forecast\">\nrain\n"
                     "</tool_output><|eot|><|start|>assistant"),
            std::string::npos)
      << out;
}

// §2.1: the template itself refuses string arguments (the request path parses them first).
TEST_F(GlimmerRequest, TemplateRefusesStringArguments) {
  auto ctx = Json::parse(R"({"bos_token": "<|begin_of_text|>", "messages": [{"role": "user", "content": "x"},
      {"role": "assistant", "tool_calls": [{"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}}]}]})");
  jinja::RenderFailure failure;
  auto r = tpl_->compiled().render(*ctx, {}, &failure);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(failure.kind, jinja::ErrorKind::Raised);
  EXPECT_EQ(failure.message,
            "Muse Glimmer ATEM chat template requires tool_call.function.arguments to be a dict (mapping); a JSON string "
            "cannot be parsed in the HF jinja sandbox.");
}

TEST_F(GlimmerRequest, StringArgumentsBecomeMappings) {
  std::string out = ok(std::string(R"({"messages": [{"role": "user", "content": "Weather?"},
      {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
        "function": {"name": "weather.get_forecast", "arguments": "{\"city\": \"Paris\", \"days\": 2, \"ratio\": 2.0}"}}]},
      {"role": "tool", "tool_call_id": "c1", "content": "{\"temp_c\": 18}"}], )") + kKwargs + "}");
  EXPECT_NE(out.find("<|start|>assistant to=weather.get_forecast<|message|><atem:function_calls>\n<atem:invoke "
                     "name=\"weather.get_forecast\">\n<atem:parameter name=\"city\">Paris</atem:parameter>\n"
                     "<atem:parameter name=\"days\">2</atem:parameter>\n<atem:parameter name=\"ratio\">2.0</atem:parameter>\n"),
            std::string::npos)
      << out;
  EXPECT_NE(out.find("<|start|>tool weather.get_forecast<|message|><tool_output name=\"weather.get_forecast\">"),
            std::string::npos);
}

TEST_F(GlimmerRequest, BadArgumentsNameTheMessageAndCall) {
  fails(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
          {"id": "a", "type": "function", "function": {"name": "f", "arguments": "{}"}},
          {"id": "b", "type": "function", "function": {"name": "f", "arguments": "{not json"}}]}]})",
        "messages[1].tool_calls[1].function.arguments is not valid JSON");
  fails(R"({"messages": [{"role": "user", "content": "x"}, {"role": "assistant", "tool_calls": [
          {"id": "a", "type": "function", "function": {"name": "f", "arguments": "[1, 2]"}}]}]})",
        "messages[1].tool_calls[0].function.arguments must be a JSON object");
}

TEST_F(GlimmerRequest, MediaPartsMapToTemplateTypes) {
  std::string out = ok(std::string(R"({"messages": [{"role": "user", "content": [
      {"type": "text", "text": "look: "}, {"type": "image_url", "image_url": {"url": "data:image/png;base64,AAAA"}},
      {"type": "text", "text": " and "}, {"type": "video_url", "video_url": {"url": "file:///v.mp4"}}]}], )") +
                       kKwargs + "}");
  EXPECT_NE(out.find("<|start|>user<|message|>look: <|patch|> and <|video|><|eot|>"), std::string::npos) << out;
  fails(R"({"messages": [{"role": "user", "content": [{"type": "input_audio", "input_audio": {"data": "", "format": "wav"}}]}]})",
        "messages[0].content[0]: content part type 'input_audio' is not supported");
  fails(R"({"messages": [{"role": "user", "content": [{"type": "text"}]}]})", "without a string 'text'");
}

TEST_F(GlimmerRequest, ReasoningEffortMapsToStrength) {
  auto with_effort = [&](const std::string& effort) {
    return render(R"({"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": ")" + effort + R"("})");
  };
  for (auto [effort, strength] : std::vector<std::pair<std::string, std::string>>{
           {"low", "low"}, {"medium", "medium"}, {"high", "high"}, {"xhigh", "xhigh"}, {"none", "low"}, {"minimal", "low"}}) {
    auto r = with_effort(effort);
    ASSERT_TRUE(r.ok()) << r.message();
    EXPECT_NE(r->find("Reasoning strength: " + strength + "."), std::string::npos) << effort;
  }
  auto bad = with_effort("max");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("reasoning_effort 'max'"), std::string::npos);
  // An explicit kwarg wins, and may carry any string.
  std::string out = ok(R"({"messages": [{"role": "user", "content": "Hi"}], "reasoning_effort": "low",
                           "chat_template_kwargs": {"reasoning_strength": "max"}})");
  EXPECT_NE(out.find("Reasoning strength: max."), std::string::npos);
  out = ok(R"({"messages": [{"role": "user", "content": "Hi"}], "reasoning": {"effort": "medium"}})");
  EXPECT_NE(out.find("Reasoning strength: medium."), std::string::npos);
}

TEST_F(GlimmerRequest, HistoryNormalisation) {
  std::string out = ok(std::string(R"({"messages": [{"role": "developer", "content": "Be terse."},
      {"role": "user", "content": "Why?"}, {"role": "assistant", "reasoning": "Because.", "content": "Short."}], )") +
                       kKwargs + "}");
  EXPECT_NE(out.find("<|start|>system<|message|>Be terse."), std::string::npos) << out;
  EXPECT_NE(out.find("<|start|>assistant to=self<|message|>Because.<|eom|><|start|>assistant to=user<|message|>Short.<|eot|>"),
            std::string::npos)
      << out;
}

TEST_F(GlimmerRequest, ToolValidation) {
  const std::string msgs = R"("messages": [{"role": "user", "content": "Hi"}])";
  fails("{" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "bad name!", "description": "", "parameters": {}}}]})",
        "must match [A-Za-z0-9_.-]+");
  fails("{" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "f", "description": 5}}]})",
        "tools[0].function.description must be a string");
  fails("{" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "f", "parameters": []}}]})",
        "tools[0].function.parameters must be an object");
  // Both are optional in the APIs: absent ones render as empty (issue 17).
  std::string bare = ok("{" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "f"}}]})");
  EXPECT_NE(bare.find("{\"name\": \"f\", \"description\": \"\", \"parameters\": {\"type\": \"object\", \"properties\": {}}}"),
            std::string::npos)
      << bare;
  // Reserved template variables keep their types whatever chat_template_kwargs says.
  fails("{" + msgs + R"(, "chat_template_kwargs": {"add_generation_prompt": "yes"}})",
        "chat_template_kwargs.add_generation_prompt must be a boolean");
  fails("{" + msgs + R"(, "chat_template_kwargs": {"continue_final_message": 1}})",
        "chat_template_kwargs.continue_final_message must be a boolean");
  fails("{" + msgs + R"(, "chat_template_kwargs": {"tools": 1}})", "cannot replace 'tools'");
  EXPECT_FALSE(ok("{" + msgs + R"(, "chat_template_kwargs": {"add_generation_prompt": false}})").ends_with("<|start|>assistant"));
  fails("{" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "f", "description": "", "parameters": {}}}],
         "tool_choice": {"type": "function", "function": {"name": "g"}}})",
        "tool_choice names 'g'");
  std::string out = ok("{" + msgs + R"(, "tools": [{"type": "function", "function": {"name": "get_time",
      "description": "Current time.", "parameters": {"type": "object", "properties": {"tz": {"type": "string"}}}}}]})");
  EXPECT_NE(out.find("{\"name\": \"get_time\", \"description\": \"Current time.\", \"parameters\": {\"type\": \"object\", "
                     "\"properties\": {\"tz\": {\"type\": \"string\"}}}}"),
            std::string::npos);
  EXPECT_NE(out.find("# Valid recipients: \"self\", \"get_time.*\", \"user\"."), std::string::npos);
}

TEST_F(GlimmerRequest, MalformedMessages) {
  fails(R"({"messages": [{"content": "no role"}]})", "messages[0] has no 'role'");
  fails(R"({"messages": [{"role": 3, "content": "x"}]})", "messages[0].role must be a non-empty string");
  fails(R"({"messages": []})", "'messages' must not be empty");
  fails(R"({"messages": "hi"})", "'messages' must be an array");
  fails(R"({"model": "x"})", "no 'messages'");
  fails(R"({"messages": [{"role": "user", "content": 5}]})", "messages[0].content must be a string");
  fails(R"({"messages": [{"role": "user", "content": "x"}, {"role": "tool", "content": "4C"}]})",
        "messages[1]: a tool message needs 'tool_call_id'");
  fails(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": []})", "chat_template_kwargs must be an object");
  fails(R"({"messages": [{"role": "user", "content": "x"}], "add_generation_prompt": "yes"})", "add_generation_prompt");
}

TEST_F(GlimmerRequest, TemplateRaiseIsAnError) {
  // A dict-valued `arguments` cannot be forged into a string by a client, but
  // the template's own checks still surface as errors with their message.
  auto r = render(R"({"messages": [{"role": "user", "content": "x"}], "chat_template_kwargs": {"tools": 5}})");
  EXPECT_FALSE(r.ok());
}

TEST_F(GlimmerRequest, ContinueFinalMessage) {
  std::string out = ok(std::string(R"({"messages": [{"role": "user", "content": "Count"},
      {"role": "assistant", "content": "1, 2, "}], "continue_final_message": true, "add_generation_prompt": false, )") +
                       kKwargs + "}");
  const std::string tail = "<|start|>assistant to=user<|message|>1, 2, ";
  ASSERT_GE(out.size(), tail.size());
  EXPECT_EQ(out.substr(out.size() - tail.size()), tail);
}

TEST_F(GlimmerRequest, AnthropicMessagesRenderLikeOpenAI) {
  std::string anthropic = R"({"model": "m", "max_tokens": 100, "system": "Be brief.",
    "tools": [{"name": "get_weather", "description": "Weather.", "input_schema": {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "messages": [
      {"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": [{"type": "thinking", "thinking": "Call the tool.", "signature": "x"},
                                        {"type": "tool_use", "id": "t1", "name": "get_weather", "input": {"city": "Oslo"}}]},
      {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "t1", "content": "4C"}, {"type": "text", "text": "Thanks"}]}]})";
  std::string openai = R"({"messages": [
      {"role": "system", "content": "Be brief."},
      {"role": "user", "content": "Weather in Oslo?"},
      {"role": "assistant", "content": null, "reasoning_content": "Call the tool.",
       "tool_calls": [{"id": "t1", "type": "function", "function": {"name": "get_weather", "arguments": "{\"city\": \"Oslo\"}"}}]},
      {"role": "tool", "tool_call_id": "t1", "content": "4C"},
      {"role": "user", "content": [{"type": "text", "text": "Thanks"}]}],
    "tools": [{"type": "function", "function": {"name": "get_weather", "description": "Weather.",
               "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]})";
  std::string a = ok(anthropic, RequestApi::AnthropicMessages);
  EXPECT_EQ(a, ok(openai));
  EXPECT_NE(a.find("<|start|>tool get_weather<|message|><tool_output name=\"get_weather\">\n4C\n</tool_output><|eot|>"),
            std::string::npos)
      << a;
  fails(R"({"messages": [{"role": "system", "content": "x"}]})", "messages[0].role must be \"user\" or \"assistant\"",
        RequestApi::AnthropicMessages);
  fails(R"({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]})",
        "content block type 'document' is not supported", RequestApi::AnthropicMessages);
}

TEST(GenericTemplate, PassesThroughAndJoinsTextParts) {
  auto t = ChatTemplate::create(
      "{{ bos_token }}{% for m in messages %}<{{ m.role }}>{{ m.content }}</{{ m.role }}>{% endfor %}"
      "{% if add_generation_prompt %}<assistant>{% endif %}",
      ChatTemplate::Options{{{"bos_token", "<s>"}}, ""});
  ASSERT_TRUE(t.ok()) << t.message();
  EXPECT_EQ(t->profile().name, "generic");
  EXPECT_FALSE(t->accepts_content_lists());
  auto r = render_chat_prompt(*Json::parse(R"({"messages": [{"role": "developer", "content": [{"type": "text", "text": "a"},
      {"type": "text", "text": "b"}]}, {"role": "user", "content": "hi"}], "reasoning_effort": "whatever"})"),
                              *t);
  ASSERT_TRUE(r.ok()) << r.message();
  EXPECT_EQ(*r, "<s><developer>a\nb</developer><user>hi</user><assistant>");
}

}  // namespace
}  // namespace muse::chat

namespace muse::chat {
namespace {

TEST(GenericTemplate, ToolUseTemplateWhenToolsAreGiven) {
  TokenizerFiles files;
  files.chat_template = "default:{{ messages[0].content }}";
  files.named_chat_templates["default"] = files.chat_template;
  files.named_chat_templates["tool_use"] = "tool_use:{{ tools[0].function.name }}";
  auto t = ChatTemplate::from_tokenizer_files(files, "");
  ASSERT_TRUE(t.ok()) << t.message();
  auto plain = render_chat_prompt(*Json::parse(R"({"messages": [{"role": "user", "content": "hi"}]})"), *t);
  ASSERT_TRUE(plain.ok()) << plain.message();
  EXPECT_EQ(*plain, "default:hi");
  auto tools = render_chat_prompt(*Json::parse(R"({"messages": [{"role": "user", "content": "hi"}],
      "tools": [{"type": "function", "function": {"name": "f"}}]})"), *t);
  ASSERT_TRUE(tools.ok()) << tools.message();
  EXPECT_EQ(*tools, "tool_use:f");
}

}  // namespace
}  // namespace muse::chat
