// The serving adapter on the embedded model (models/muse-tiny): profile and
// ids, rendering, and the output parser lining up ids with the delivered text
// however the engine splits them (text lagging behind ids, stop-token text
// never delivered), plus the stop matcher before min_tokens.
#include <gtest/gtest.h>

#include <random>

#include "muse/chat/request_render.h"
#include "muse/engine/default_model.h"
#include "muse/engine/engine.h"
#include "muse/kv/kv_cache.h"
#include "muse/model/config.h"
#include "muse/server/backend_factory.h"
#include "muse/server/muse_adapter.h"
#include "muse/server/stop_matcher.h"
#include "muse/tokenizer/streaming_detokenizer.h"

namespace muse::server {
namespace {

std::shared_ptr<MuseModelAdapter> tiny_adapter(EngineServeOptions o = {}) {
  auto dir = default_model_dir();
  if (!dir.ok()) return nullptr;
  o.model = *dir;
  auto config = load_model_config(o.model);
  EXPECT_TRUE(config.ok());
  auto a = MuseModelAdapter::create(o, *config, 4096);
  EXPECT_TRUE(a.ok()) << (a.ok() ? "" : a.message());
  return a.ok() ? *a : nullptr;
}

#define NEED_TINY(a) \
  if (!(a)) GTEST_SKIP() << "models/muse-tiny is absent"

TEST(MuseAdapter, TinyUsesTheGlimmerProfileAndItsOwnIds) {
  auto a = tiny_adapter();
  NEED_TINY(a);
  EXPECT_EQ(a->profile_name(), "muse_glimmer");
  EXPECT_EQ(a->info().eos_token_ids, (std::vector<int32_t>{3969, 3976}));
  EXPECT_EQ(a->info().vocab_size, 4160);
  EXPECT_EQ(a->tokenizer().id_limit(), 4096);
  EXPECT_TRUE(a->info().default_sampling.is_object());
  EXPECT_EQ(a->info().default_sampling.find("temperature"), nullptr) << "do_sample is not a sampling default";
  EXPECT_TRUE(a->info().supports_forced_tool_choice);
  EXPECT_TRUE(a->info().supports_prompt_logprobs);
}

TEST(MuseAdapter, RenderIsTheChatLayersPromptTokenizedWithoutSpecials) {
  auto a = tiny_adapter();
  NEED_TINY(a);
  auto req = Json::parse(R"({"messages":[{"role":"user","content":"What color is the sky?"}],"reasoning_effort":"low"})");
  auto p = a->render_chat(*req, ChatApi::OpenAI);
  ASSERT_TRUE(p.ok()) << p.message();
  EXPECT_EQ(p->ids, a->tokenizer().encode(p->text, false));
  EXPECT_EQ(p->ids.front(), 3968) << "the template writes BOS";
  EXPECT_TRUE(p->text.ends_with("<|start|>assistant"));
  auto bad = Json::parse(R"({"messages":[{"role":"user","content":"x"}],"tools":[{"type":"function","function":{"name":"f","description":5}}]})");
  EXPECT_FALSE(a->render_chat(*bad, ChatApi::OpenAI).ok()) << "template errors pass through (HTTP 400)";
}

// What muse-tiny wrote for "What's the weather in Paris?" (greedy), ended by
// <|eot|> (3976), whose text the engine does not deliver.
const char* kToolOutput =
    " to=self<|message|>This needs the weather tool. Calling get_weather with city New Delhi.<|eom|><|start|>assistant "
    "to=get_weather<|message|><atem:function_calls>\n<atem:invoke name=\"get_weather\">\n<atem:parameter "
    "name=\"city\">New Delhi</atem:parameter>\n</atem:invoke>\n</atem:function_calls>";
const char* kChatOutput =
    " to=self<|message|>The user asks about the sky. It is blue.<|eom|><|start|>assistant to=user<|message|>It is "
    "blue.";

Json weather_tools() {
  return *Json::parse(R"([{"type":"function","function":{"name":"get_weather","description":"Weather.",
      "parameters":{"type":"object","properties":{"city":{"type":"string"}},"required":["city"]}}}])");
}

struct Parsed {
  std::string reasoning, content;
  std::map<int, std::pair<std::string, std::string>> calls;
  int reasoning_tokens = 0;
};

// Feeds `ids` (+ the final EOS) in deliveries of random sizes; the text of a
// delivery may lag behind its ids (held back as a stop matcher or an
// incomplete character would), and the EOS's text never comes.
Parsed run_parser(const MuseModelAdapter& a, const std::vector<int32_t>& ids, bool tools, uint32_t seed) {
  ParserOptions po;
  po.tools_enabled = tools;
  po.tools = tools ? weather_tools() : Json();
  auto parser = a.make_output_parser(po);
  StreamingDetokenizer detok(a.tokenizer(), false);
  std::mt19937 rng(seed);
  Parsed out;
  auto take = [&](ParsedDelta& d) {
    out.reasoning += d.reasoning;
    out.content += d.content;
    out.reasoning_tokens += d.reasoning_tokens;
    for (auto& c : d.tool_calls) {
      out.calls[c.index].first += c.name;
      out.calls[c.index].second += c.arguments;
    }
  };
  std::string text_backlog;
  size_t i = 0;
  while (i < ids.size()) {
    size_t n = std::min<size_t>(ids.size() - i, 1 + rng() % 4);
    std::vector<int32_t> part(ids.begin() + ptrdiff_t(i), ids.begin() + ptrdiff_t(i + n));
    for (int32_t id : part) text_backlog += detok.feed(id);
    // Deliver only a random prefix of the available text now.
    size_t give = seed == 0 ? text_backlog.size() : rng() % (text_backlog.size() + 1);
    ParsedDelta d;
    parser->feed(part, std::string_view(text_backlog).substr(0, give), d);
    text_backlog.erase(0, give);
    take(d);
    i += n;
  }
  text_backlog += detok.flush();
  ParsedDelta d;
  const int32_t eot = 3976;
  parser->feed(std::span<const int32_t>(&eot, 1), text_backlog, d);
  parser->finish(FinishReason::Stop, d);
  take(d);
  return out;
}

TEST(MuseAdapter, OutputParserLinesUpIdsAndLaggingText) {
  auto a = tiny_adapter();
  NEED_TINY(a);
  const auto chat_ids = a->tokenizer().encode(kChatOutput, false);
  const auto tool_ids = a->tokenizer().encode(kToolOutput, false);
  // Reasoning tokens: the ids between the first <|message|> and <|eom|>.
  const auto body = a->tokenizer().encode("The user asks about the sky. It is blue.", false);
  for (uint32_t seed = 0; seed < 40; ++seed) {
    Parsed p = run_parser(*a, chat_ids, false, seed);
    EXPECT_EQ(p.reasoning, "The user asks about the sky. It is blue.") << seed;
    EXPECT_EQ(p.content, "It is blue.") << seed;
    EXPECT_TRUE(p.calls.empty());
    EXPECT_EQ(p.reasoning_tokens, int(body.size())) << seed;

    Parsed t = run_parser(*a, tool_ids, true, seed);
    EXPECT_EQ(t.reasoning, "This needs the weather tool. Calling get_weather with city New Delhi.") << seed;
    EXPECT_EQ(t.content, "") << seed;
    ASSERT_EQ(t.calls.size(), 1u) << seed;
    EXPECT_EQ(t.calls[0].first, "get_weather");
    EXPECT_EQ(*Json::parse(t.calls[0].second), *Json::parse(R"({"city":"New Delhi"})"));
  }
}

TEST(MuseAdapter, WithoutToolsACallStaysText) {
  auto a = tiny_adapter();
  NEED_TINY(a);
  Parsed t = run_parser(*a, a->tokenizer().encode(kToolOutput, false), false, 3);
  EXPECT_TRUE(t.calls.empty());
  EXPECT_NE(t.content.find("<atem:invoke name=\"get_weather\">"), std::string::npos) << t.content;
  EXPECT_NE(t.content.find("New Delhi"), std::string::npos);
}

TEST(MuseAdapter, KvPagesFollowTheFlags) {
  auto dir = default_model_dir();
  if (!dir.ok()) GTEST_SKIP() << dir.message();
  auto config = load_model_config(*dir);
  ASSERT_TRUE(config.ok());
  EngineServeOptions o;
  o.max_num_seqs = 4;
  o.max_num_batched_tokens = 256;
  // muse-tiny: 3 full + 7 sliding layers, pages of 3 layers' blocks: a full
  // block is 1 page, a sliding block 3; F32 page = 2 x 3 x 64 x 64 x 4 = 96 KiB.
  const KvGeometry g = KvGeometry::of(*config, 64, EngineOptions{}.kv_max_rollback, 4);
  EXPECT_EQ(g.page_bytes(), 2 * 3 * 64 * 64 * 4);
  const int64_t one = g.pages_for(4096) + g.step_transient_pages(256);
  EXPECT_EQ(g.pages_for(4096), 64 + 3 * 3);
  EXPECT_EQ(*kv_cache_pages(*config, o, 4096, 64, DType::F32), 4 * (64 + 9 + 3) + g.step_transient_pages(256))
      << "all sequences at full length fit the default budget";
  o.num_gpu_blocks_override = 200;
  EXPECT_EQ(*kv_cache_pages(*config, o, 4096, 64, DType::F32), 200);
  o.num_gpu_blocks_override = 10;  // fewer than one full-length sequence: refused at start
  EXPECT_FALSE(kv_cache_pages(*config, o, 4096, 64, DType::F32).ok());
  o.num_gpu_blocks_override = 0;
  o.kv_cache_memory_bytes = 1 << 20;  // 10 pages
  EXPECT_FALSE(kv_cache_pages(*config, o, 4096, 64, DType::F32).ok()) << "less than one sequence";
  o.kv_cache_memory_bytes = 4 << 20;
  EXPECT_EQ(*kv_cache_pages(*config, o, 4096, 64, DType::F8_E4M3), 170) << "fp8 pages are a quarter the size";
  EXPECT_GE(one, 1);
  EXPECT_EQ(*kv_cache_dtype("auto", false), DType::F32);
  EXPECT_EQ(*kv_cache_dtype("auto", true), DType::BF16);
  EXPECT_EQ(*kv_cache_dtype("fp8", false), DType::F8_E4M3);
  EXPECT_EQ(*kv_cache_dtype("bfloat16", false), DType::BF16);
  EXPECT_FALSE(kv_cache_dtype("fp8_e5m2", false).ok());
}

TEST(StopMatcher, NothingMatchesBeforeMinTokensButATailIsHeld) {
  StopStringMatcher m({"STOP"}, false);
  EXPECT_EQ(m.push("a STOP b ST", false), "a STOP b ");
  EXPECT_FALSE(m.matched());
  EXPECT_EQ(m.push("OP c", true), "");
  EXPECT_TRUE(m.matched());
  StopStringMatcher inc({"xy"}, true);
  EXPECT_EQ(inc.push("axyb"), "axy");
}

}  // namespace
}  // namespace muse::server
