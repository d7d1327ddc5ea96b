// The forced-tool-call grammar (chat/tool_call_grammar.h) and its token
// constraint: canonical template output is admitted, each way of leaving the
// grammar is refused, and random walks through a toy vocabulary that take
// only admitted tokens always parse (chat::ResponseParser) as calls to an
// allowed function with declared keys, required keys present and values of
// the declared types.
#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

#include "muse/chat/response_parser.h"
#include "toy_vocabulary.h"
#include "muse/chat/grammar_constraint.h"

namespace muse::chat {
namespace {

ToolSet tools() {
  auto j = Json::parse(R"([
    {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
      "properties": {"city": {"type": "string"}, "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
                     "days": {"type": "integer"}, "hourly": {"type": "boolean"}},
      "required": ["city"]}}},
    {"type": "function", "function": {"name": "calc", "parameters": {"type": "object",
      "properties": {"x": {"type": "number"}, "y": {"type": "number"}}, "required": ["x", "y"]}}},
    {"type": "function", "function": {"name": "ping", "parameters": {"type": "object"}}}
  ])");
  EXPECT_TRUE(j.ok());
  auto t = ToolSet::from_json(*j);
  EXPECT_TRUE(t.ok());
  return *t;
}

ToolCallGrammar grammar(std::vector<std::string> names, bool single) {
  auto g = ToolCallGrammar::make(toy_framing(), tools(), names, single);
  EXPECT_TRUE(g.ok()) << g.message();
  return *g;
}

// A piece of model output: text, or a framing marker.
struct Piece {
  bool marker = false;
  GrammarMarker m{};
  std::string text;
};
Piece T(std::string s) { return {false, {}, std::move(s)}; }
Piece M(GrammarMarker m) { return {true, m, {}}; }
constexpr auto kStart = GrammarMarker::Start, kMsg = GrammarMarker::Message, kEom = GrammarMarker::EndMessage,
               kEot = GrammarMarker::EndTurn;

// How far a sequence of pieces gets: -1 if all admitted, else the index of
// the first refused piece.
int first_refused(const ToolCallGrammar& g, const std::vector<Piece>& pieces, ToolCallGrammar::State* end = nullptr) {
  auto s = g.initial();
  for (size_t i = 0; i < pieces.size(); ++i) {
    bool ok = pieces[i].marker ? g.feed_marker(s, pieces[i].m) : g.feed_text(s, pieces[i].text);
    if (!ok) return int(i);
  }
  if (end) *end = s;
  return -1;
}

std::string call(const std::string& name, const std::string& params) {
  return "<atem:function_calls>\n<atem:invoke name=\"" + name + "\">\n" + params + "</atem:invoke>\n</atem:function_calls>";
}
std::string param(const std::string& k, const std::string& v) {
  return "<atem:parameter name=\"" + k + "\">" + v + "</atem:parameter>\n";
}

TEST(ToolCallGrammar, AdmitsWhatTheTemplateRenders) {
  auto g = grammar({"get_weather", "calc", "ping"}, false);
  ToolCallGrammar::State end;
  // Reasoning first, then two calls (required: parallel allowed).
  std::vector<Piece> p = {T(" to=self"), M(kMsg), T("I need <the> weather </atem:parameter>"), M(kEom), M(kStart),
                          T("assistant to=get_weather"), M(kMsg),
                          T(call("get_weather", param("city", "Paris </atem:param") + param("unit", "celsius") +
                                                    param("days", "3") + param("hourly", "false"))),
                          M(kEom), M(kStart), T("assistant to=calc"), M(kMsg),
                          T(call("calc", param("x", "-1.5e3") + param("y", "0"))), M(kEot)};
  EXPECT_EQ(first_refused(g, p, &end), -1);
  EXPECT_TRUE(g.finished(end));
  // No reasoning; a tool without declared properties takes any key.
  EXPECT_EQ(first_refused(g, {T(" to=ping"), M(kMsg), T(call("ping", param("anything", "{\"a\": 1}"))), M(kEot)}, &end), -1);
  EXPECT_TRUE(g.finished(end));
  EXPECT_EQ(first_refused(g, {T(" to=ping"), M(kMsg), T(call("ping", "")), M(kEot)}), -1);
}

TEST(ToolCallGrammar, RefusesEverythingElse) {
  auto g = grammar({"get_weather", "calc"}, false);
  auto w = [](const std::string& params) {
    return std::vector<Piece>{T(" to=get_weather"), M(kMsg), T(call("get_weather", params)), M(kEot)};
  };
  EXPECT_EQ(first_refused(g, {T(" to=user"), M(kMsg)}), 0) << "an answer instead of a call";
  EXPECT_EQ(first_refused(g, {T(" to=get_weathe"), M(kMsg)}), 1) << "a prefix of a name is not a name";
  EXPECT_EQ(first_refused(g, {T(" to=ping"), M(kMsg)}), 0) << "not among the allowed names";
  EXPECT_EQ(first_refused(g, {T(" to=get_weather"), M(kMsg), T(call("calc", ""))}), 2) << "invoke name != recipient";
  EXPECT_EQ(first_refused(g, w(param("town", "Paris"))), 2) << "undeclared key";
  EXPECT_EQ(first_refused(g, w(param("unit", "celsius"))), 2) << "required city missing";
  EXPECT_EQ(first_refused(g, w(param("city", "A") + param("city", "B"))), 2) << "a key twice";
  EXPECT_EQ(first_refused(g, w(param("city", "A") + param("unit", "kelvin"))), 2) << "not in the enum";
  EXPECT_EQ(first_refused(g, w(param("city", "A") + param("days", "3.5"))), 2) << "integer with a fraction";
  EXPECT_EQ(first_refused(g, w(param("city", "A") + param("days", "-"))), 2) << "no digits";
  EXPECT_EQ(first_refused(g, w(param("city", "A") + param("days", "07"))), 2) << "leading zero";
  EXPECT_EQ(first_refused(g, w(param("city", "A") + param("hourly", "yes"))), 2) << "boolean";
  EXPECT_EQ(first_refused(g, {T(" to=get_weather"), M(kMsg), T(call("get_weather", param("city", "A"))), M(kEom),
                              M(kStart), T("assistant to=self")}),
            5)
      << "no reasoning between calls";
  EXPECT_EQ(first_refused(g, {T(" to=self"), M(kMsg), T("x"), M(kEot)}), 3) << "reasoning ends with <|eom|>";
  EXPECT_EQ(first_refused(g, {T(" to=self"), M(kMsg), T("x"), M(kEom), T("assistant")}), 4) << "then <|start|>";
  EXPECT_EQ(first_refused(g, {T(" to=get_weather"), M(kEot)}), 1);
  EXPECT_EQ(first_refused(g, {T("to=get_weather")}), 0) << "the first header's space";
  // A named choice makes exactly one call.
  auto named = grammar({"calc"}, true);
  EXPECT_EQ(first_refused(named, {T(" to=calc"), M(kMsg), T(call("calc", param("x", "1") + param("y", "2"))), M(kEom)}), 3);
  EXPECT_EQ(first_refused(named, {T(" to=get_weather")}), 0);
}

TEST(ToolCallGrammar, BadRequestsAreClearErrors) {
  FramingFormat f = toy_framing();
  EXPECT_FALSE(ToolCallGrammar::make(f, tools(), {}, false).ok());
  auto missing = ToolCallGrammar::make(f, tools(), {"nope"}, true);
  ASSERT_FALSE(missing.ok());
  EXPECT_NE(missing.message().find("no tool named 'nope'"), std::string::npos);
  ToolSet many;
  std::vector<std::string> names;
  for (int i = 0; i < 70; ++i) {
    many.add({"t" + std::to_string(i), Json()});
    names.push_back("t" + std::to_string(i));
  }
  auto too_many = ToolCallGrammar::make(f, many, names, false);
  ASSERT_FALSE(too_many.ok());
  EXPECT_NE(too_many.message().find("at most"), std::string::npos);
}

// A toy vocabulary: every printable ASCII character, pieces of the ATEM
// syntax, names, keys and values (so walks make progress), some multi-byte
// UTF-8, and the five markers; plus one non-framing special (refused).
struct ToyVocab {
  std::shared_ptr<GrammarVocabulary> v = make_toy_vocabulary(
      {"\n", " to=", "self", "assistant", " to", "=", "get_weather", "calc", "ping", "get", "_weather",
       "<atem:function_calls>\n", "<atem:invoke name=\"", "\">\n", "\">", "<atem:parameter name=\"",
       "</atem:parameter>\n", "</atem:parameter>", "</atem:invoke>\n</atem:function_calls>", "</atem:invoke>",
       "\n</atem:function_calls>", "city", "unit", "days", "hourly", "x", "y", "celsius", "fahrenheit", "true", "false",
       "12", "-3", "0.5", "e+7", "Paris", " the", "\xc3\xa9", "\xe2\x82\xac", "</", "<atem", ":parameter", " name=\""});
};

TEST(ToolCallConstraint, RandomWalksAlwaysParseAsValidCalls) {
  ToyVocab toy;
  const FramingFormat f = toy_framing();
  const ToolSet ts = tools();
  struct Case {
    std::vector<std::string> names;
    bool single;
  } cases[] = {{{"get_weather", "calc", "ping"}, false}, {{"get_weather"}, true}, {{"calc"}, true}};
  int finished = 0, walks = 0;
  for (const Case& c : cases) {
    auto g = std::make_shared<const ToolCallGrammar>(grammar(c.names, c.single));
    for (uint64_t seed = 1; seed <= 60; ++seed) {
      ++walks;
      std::mt19937_64 rng(seed * 7919 + c.names.size());
      ToolCallConstraint con(g, toy.v);
      ResponseParserOptions po;
      po.tools = ts;
      ResponseParser parser(f, po);
      std::vector<int32_t> allowed;
      bool done = false;
      std::vector<uint8_t> mask(1006);
      for (int step = 0; step < 6000 && !done; ++step) {
        allowed.clear();
        con.fill_mask(mask);
        for (int32_t id = 0; id < 1006; ++id) {
          if (con.allows(id)) allowed.push_back(id);
          ASSERT_EQ(mask[size_t(id)], con.allows(id)) << "fill_mask and allows disagree on id " << id;
        }
        ASSERT_FALSE(allowed.empty()) << "a live grammar state with no way on (seed " << seed << ")";
        // Markers are rare in a real vocabulary's mass; here they get a fair
        // chance so walks end.
        int32_t id = allowed[std::uniform_int_distribution<size_t>(0, allowed.size() - 1)(rng)];
        for (int32_t m = 1000; m <= 1004; ++m)
          if (con.allows(m) && rng() % 8 == 0) id = m;
        EXPECT_NE(id, 1005);
        con.accept(id);
        const bool marker = id >= 1000;
        parser.push_token(marker ? id : -1, marker ? std::string() : toy.v->bytes[size_t(id)], marker);
        done = con.finished();
      }
      if (!done) continue;  // (a very long value; nothing to check)
      ++finished;
      parser.finish(FinishCause::Stop);
      const ParsedResponse& r = parser.result();
      ASSERT_FALSE(r.tool_calls.empty()) << "seed " << seed;
      if (c.single) EXPECT_EQ(r.tool_calls.size(), 1u);
      EXPECT_EQ(r.content, "");
      EXPECT_EQ(r.finish_reason, "tool_calls");
      for (const ToolCall& call : r.tool_calls) {
        EXPECT_NE(std::find(c.names.begin(), c.names.end(), call.name), c.names.end()) << call.name;
        auto args = Json::parse(call.arguments);
        ASSERT_TRUE(args.ok() && args->is_object()) << call.arguments;
        if (call.name == "get_weather") {
          ASSERT_NE(args->find("city"), nullptr) << call.arguments;
          EXPECT_TRUE(args->find("city")->is_string());
          if (const Json* u = args->find("unit")) EXPECT_TRUE(u->is_string() && (u->as_string() == "celsius" || u->as_string() == "fahrenheit"));
          if (const Json* d = args->find("days")) EXPECT_TRUE(d->is_int()) << call.arguments;
          if (const Json* h = args->find("hourly")) EXPECT_TRUE(h->is_bool()) << call.arguments;
          for (const auto& [k, v] : args->as_object())
            EXPECT_TRUE(k == "city" || k == "unit" || k == "days" || k == "hourly") << k;
        } else if (call.name == "calc") {
          ASSERT_TRUE(args->find("x") && args->find("y")) << call.arguments;
          EXPECT_TRUE(args->find("x")->is_number() && args->find("y")->is_number()) << call.arguments;
        }
      }
    }
  }
  // Most walks end (the marker bias); all that end were checked above.
  EXPECT_GT(finished, walks / 2) << finished << " of " << walks;
}

TEST(ToolCallConstraint, AcceptingARefusedIdLiftsTheConstraint) {
  ToyVocab toy;
  auto g = std::make_shared<const ToolCallGrammar>(grammar({"calc"}, true));
  ToolCallConstraint con(g, toy.v);
  EXPECT_FALSE(con.allows(int32_t('u' - 32)));  // char c is id c - 32
  EXPECT_TRUE(con.allows(int32_t(' ' - 32)));
  con.accept(1003);  // <|eot|> where it is not admitted (a sampler fallback)
  EXPECT_TRUE(con.allows(int32_t('u' - 32)));
}

}  // namespace
}  // namespace muse::chat
