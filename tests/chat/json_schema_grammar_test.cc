// Structured output (chat/json_schema_grammar.h): JSON admitted or refused
// as the schema says, the schema subset's errors, the Muse answer around
// the JSON, and random walks through a toy vocabulary whose finished outputs
// always parse (chat::ResponseParser, then JSON) and validate.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "muse/chat/grammar_constraint.h"
#include "muse/chat/response_parser.h"
#include "toy_vocabulary.h"

namespace muse::chat {
namespace {

JsonSchemaGrammar grammar(const char* schema) {
  Json j;
  if (schema) j = *Json::parse(schema);
  auto g = JsonSchemaGrammar::make(schema ? &j : nullptr);
  EXPECT_TRUE(g.ok()) << g.message();
  return *g;
}

// Whole text admitted, and the JSON may end there.
bool admits(const JsonSchemaGrammar& g, std::string_view text) {
  auto s = g.initial();
  return g.feed_text(s, text) && g.can_end(s);
}

TEST(JsonSchemaGrammar, JsonObjectIsAnyCompactObject) {
  auto g = grammar(nullptr);
  EXPECT_TRUE(admits(g, R"({})"));
  EXPECT_TRUE(admits(g, R"({"a":1,"b":[true,null,"x\"y\u00e9\n"],"c":{"d":-0.5e+12},"":[]})"));
  for (const char* bad : {R"([1])", R"("x")", R"(1)", R"({"a" :1})", R"({"a":1,})", R"({"a":01})", R"({"a":tru})",
                          R"({"a":"x\q"})", "{\"a\":\"\x01\"}", R"({"a":1}})", R"({a:1})", R"({"a":[1,]})"})
    EXPECT_FALSE(admits(g, bad)) << bad;
  // Strings and keys are valid UTF-8 (byte-level tokens may split a
  // character; the whole must still be valid).
  EXPECT_TRUE(admits(g, "{\"\xc3\xa9\":\"caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80\"}"));
  for (const char* bad : {"{\"a\":\"\xff\"}", "{\"a\":\"\xc3\"}", "{\"a\":\"\xc0\xaf\"}", "{\"a\":\"\xed\xa0\x80\"}",
                          "{\"a\":\"\xf4\x90\x80\x80\"}", "{\"\x80\":1}"})
    EXPECT_FALSE(admits(g, bad)) << bad;
  auto s = g.initial();
  EXPECT_TRUE(g.feed_text(s, R"({"a":[1,{"b")"));
  EXPECT_FALSE(g.can_end(s)) << "an open object cannot end";
}

TEST(JsonSchemaGrammar, SchemaIsEnforced) {
  auto g = grammar(R"({"type": "object", "title": "Person", "properties": {
      "name": {"type": "string", "description": "who"}, "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"type": "string"}}, "kind": {"enum": ["a", "b", 1, null]},
      "score": {"type": ["number", "null"]}, "meta": {"type": "object", "additionalProperties": {"type": "boolean"}}},
    "required": ["name", "age"], "additionalProperties": false})");
  for (const char* ok : {R"({"name":"x","age":3})", R"({"age":-12,"name":"","tags":["a","b"],"kind":"b"})",
                         R"({"name":"x","age":0,"kind":1,"score":null,"meta":{"k":true,"l":false}})",
                         R"({"name":"x","age":1,"score":2.5,"kind":null,"tags":[]})"})
    EXPECT_TRUE(admits(grammar(nullptr), ok)) << ok;
  for (const char* ok : {R"({"name":"x","age":3})", R"({"age":-12,"name":"","tags":["a","b"],"kind":"b"})",
                         R"({"name":"x","age":0,"kind":1,"score":null,"meta":{"k":true,"l":false}})",
                         R"({"name":"x","age":1,"score":2.5,"kind":null,"tags":[]})"})
    EXPECT_TRUE(admits(g, ok)) << ok;
  for (const char* bad : {R"({"name":"x"})", R"({"age":3})", R"({"name":"x","age":3,"extra":1})",
                          R"({"name":"x","age":3.5})", R"({"name":1,"age":3})", R"({"name":"x","age":3,"kind":"c"})",
                          R"({"name":"x","age":3,"tags":[1]})", R"({"name":"x","name":"y","age":3})",
                          R"({"name":"x","age":3,"score":"1"})", R"({"name":"x","age":3,"meta":{"k":1}})", R"([])"})
    EXPECT_FALSE(admits(g, bad)) << bad;
}

TEST(JsonSchemaGrammar, ScalarRootsEndWhenTheAnswerEnds) {
  auto num = grammar(R"({"type": "number"})");
  auto s = num.initial();
  EXPECT_TRUE(num.feed_text(s, "12.5"));
  EXPECT_TRUE(num.can_end(s));
  s = num.initial();
  EXPECT_TRUE(num.feed_text(s, "12."));
  EXPECT_FALSE(num.can_end(s));
  auto en = grammar(R"({"enum": ["ab", "abc"]})");
  s = en.initial();
  EXPECT_TRUE(en.feed_text(s, "\"ab"));
  EXPECT_FALSE(en.can_end(s));
  EXPECT_TRUE(en.feed_text(s, "\""));
  EXPECT_TRUE(en.can_end(s));
}

TEST(JsonSchemaGrammar, UnsupportedSchemasAreClearErrors) {
  struct Case {
    const char* schema;
    const char* expect;
  } cases[] = {{R"({"anyOf": [{"type": "string"}]})", "'anyOf' is not supported"},
               {R"({"type": "object", "properties": {"a": {"$ref": "#/x"}}})", "'$ref' is not supported"},
               {R"({"type": "string", "pattern": "a+"})", "'pattern'"},
               {R"({"type": "object", "properties": {}, "required": ["a"]})", "not declared"},
               {R"({"type": "strang"})", "unknown type"},
               {R"({"enum": []})", "non-empty"},
               {R"(false)", "admits nothing"}};
  for (const auto& c : cases) {
    auto j = Json::parse(c.schema);
    ASSERT_TRUE(j.ok());
    auto g = JsonSchemaGrammar::make(&*j);
    ASSERT_FALSE(g.ok()) << c.schema;
    EXPECT_NE(g.message().find(c.expect), std::string::npos) << g.message();
  }
}

TEST(StructuredAnswerGrammar, TheSchemaAppliesToTheAnswerBody) {
  auto j = Json::parse(R"({"type": "object", "properties": {"a": {"type": "integer"}}, "required": ["a"]})");
  auto g = *StructuredAnswerGrammar::make(toy_framing(), &*j);
  auto s = g.initial();
  EXPECT_TRUE(g.feed_text(s, " to=self"));
  EXPECT_TRUE(g.feed_marker(s, GrammarMarker::Message));
  EXPECT_TRUE(g.feed_text(s, "free {reasoning\" \\"));
  EXPECT_TRUE(g.feed_marker(s, GrammarMarker::EndMessage));
  EXPECT_TRUE(g.feed_marker(s, GrammarMarker::Start));
  EXPECT_TRUE(g.feed_text(s, "assistant to=user"));
  EXPECT_TRUE(g.feed_marker(s, GrammarMarker::Message));
  auto empty = s;
  EXPECT_FALSE(g.feed_marker(empty, GrammarMarker::EndTurn)) << "empty answer";
  EXPECT_TRUE(g.feed_text(s, R"({"a":7})"));
  EXPECT_TRUE(g.feed_marker(s, GrammarMarker::EndTurn));
  EXPECT_TRUE(g.finished(s));
  auto t = g.initial();
  EXPECT_FALSE(g.feed_text(t, " to=get_weather")) << "no tool calls";
  auto bare = *StructuredAnswerGrammar::make(toy_framing(), nullptr, /*framed=*/false);
  auto b = bare.initial();
  EXPECT_TRUE(bare.feed_text(b, R"({"x":[]})"));
  EXPECT_TRUE(bare.feed_marker(b, GrammarMarker::EndOfText));
}

// Toy vocabulary: printable ASCII, JSON pieces, markers (ids 1000-1004).
std::shared_ptr<GrammarVocabulary> toy_vocab() {
  return make_toy_vocabulary({" to=", "self", "user", "assistant", "{\"", "\":", ",\"", "\"}", "name", "age", "tags",
                              "kind", "true", "false", "null", "12", "-3", "0.5", "e+7", "[\"", "\"]", "\\n", "\\u00e9",
                              "\n", "\x01"});
}

TEST(StructuredAnswerConstraint, RandomWalksAlwaysGiveValidJson) {
  const char* schema = R"({"type": "object", "properties": {"name": {"type": "string"}, "age": {"type": "integer"},
      "tags": {"type": "array", "items": {"type": "string"}}, "kind": {"enum": ["a", "b", 1]}},
    "required": ["name", "age"], "additionalProperties": false})";
  auto sj = Json::parse(schema);
  auto vocab = toy_vocab();
  const FramingFormat f = toy_framing();
  int finished = 0, walks = 0;
  for (bool with_schema : {false, true}) {
    auto g = std::make_shared<const StructuredAnswerGrammar>(
        *StructuredAnswerGrammar::make(f, with_schema ? &*sj : nullptr));
    for (uint64_t seed = 1; seed <= 80; ++seed) {
      ++walks;
      std::mt19937_64 rng(seed * 104729 + with_schema);
      StructuredAnswerConstraint con(g, vocab);
      ResponseParser parser(f);
      std::vector<int32_t> allowed;
      std::vector<uint8_t> mask(1006);
      for (int step = 0; step < 4000 && !con.finished(); ++step) {
        allowed.clear();
        con.fill_mask(mask);
        for (int32_t id = 0; id < 1006; ++id) {
          if (con.allows(id)) allowed.push_back(id);
          ASSERT_EQ(mask[size_t(id)], con.allows(id)) << "fill_mask and allows disagree on id " << id;
        }
        ASSERT_FALSE(allowed.empty()) << "a live state with no way on (seed " << seed << ")";
        int32_t id = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
        // Prefer closing brackets and markers now and then, so walks end.
        for (int32_t c : {int32_t('}' - 32), int32_t(']' - 32), int32_t('"' - 32), 1000, 1001, 1002, 1003})
          if (con.allows(c) && rng() % 6 == 0) id = c;
        con.accept(id);
        const bool marker = id >= 1000;
        parser.push_token(marker ? id : -1, marker ? std::string() : vocab->bytes[size_t(id)], marker);
      }
      if (!con.finished()) continue;
      ++finished;
      parser.finish(FinishCause::Stop);
      const ParsedResponse& r = parser.result();
      EXPECT_TRUE(r.tool_calls.empty());
      auto j = Json::parse(r.content);
      ASSERT_TRUE(j.ok() && j->is_object()) << r.content;
      if (!with_schema) continue;
      ASSERT_TRUE(j->find("name") && j->find("name")->is_string()) << r.content;
      ASSERT_TRUE(j->find("age") && j->find("age")->is_int()) << r.content;
      for (const auto& [k, v] : j->as_object()) {
        EXPECT_TRUE(k == "name" || k == "age" || k == "tags" || k == "kind") << r.content;
        if (k == "tags") {
          ASSERT_TRUE(v.is_array());
          for (const Json& t : v.as_array()) EXPECT_TRUE(t.is_string());
        }
        if (k == "kind") EXPECT_TRUE(v.dump() == "\"a\"" || v.dump() == "\"b\"" || v.dump() == "1") << v.dump();
      }
    }
  }
  EXPECT_GT(finished, walks / 2) << finished << " of " << walks;
}

}  // namespace
}  // namespace muse::chat
