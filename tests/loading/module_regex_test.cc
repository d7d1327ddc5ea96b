// ModuleRegex (loading/module_regex.h): Python re.match semantics on module
// names, linear time on hostile patterns, clear errors on unsupported syntax.
#include "muse/loading/module_regex.h"

#include <gtest/gtest.h>

#include <chrono>
#include <string>

namespace muse {
namespace {

bool m(const char* pattern, const std::string& name) {
  auto r = ModuleRegex::compile(pattern);
  EXPECT_TRUE(r.ok()) << pattern << ": " << r.message();
  return r.ok() && r->matches(name);
}

TEST(ModuleRegex, MatchesAsPythonReMatch) {
  const std::string q = "model.layers.12.self_attn.q_proj";
  EXPECT_TRUE(m(".*q_proj", q));
  EXPECT_TRUE(m(".*q_proj$", q));
  EXPECT_FALSE(m(".*k_proj$", q));
  EXPECT_TRUE(m("model", q));             // a prefix suffices (re.match)
  EXPECT_FALSE(m("model$", q));
  EXPECT_FALSE(m("layers", q));           // anchored at the start
  EXPECT_TRUE(m("^model\\.layers\\.[0-9]+\\.self_attn", q));
  EXPECT_TRUE(m("model\\.layers\\.\\d{2}\\.", q));
  EXPECT_FALSE(m("model\\.layers\\.\\d{3}\\.", q));
  EXPECT_TRUE(m("model\\.layers\\.\\d{1,3}\\.(self_attn|mlp)\\.(q|k|v)_proj$", q));
  EXPECT_TRUE(m("(?:model|backbone)\\.layers\\.1[0-9]", q));
  EXPECT_FALSE(m("model\\.layers\\.[^1]", q));
  EXPECT_TRUE(m("[a-z.]+\\d+\\.\\w+\\.[qkv]_proj", q));
  EXPECT_TRUE(m("a*", q));                 // the empty prefix
  EXPECT_TRUE(m("x?y?model", q));
  EXPECT_TRUE(m(".*mlp\\.gate$", "model.layers.0.mlp.gate"));
  EXPECT_FALSE(m(".*mlp\\.gate$", "model.layers.0.mlp.gate_proj"));
  EXPECT_TRUE(m("lm_head|.*embed", "model.embed_tokens"));
  EXPECT_TRUE(m("(ab){2,}c", "ababc"));
  EXPECT_FALSE(m("(ab){2,}c", "abc"));
  EXPECT_TRUE(m("a{0}b", "b"));
  EXPECT_TRUE(m("", "anything"));
  EXPECT_TRUE(m("$", ""));
}

TEST(ModuleRegex, UnsupportedSyntaxIsAnErrorByName) {
  for (const char* bad : {"(a", "a)", "[a-", "*a", "a**", "a{2", "a{3,1}", "(?=a)", "(?i)a", "\\1", "\\b", "a\\",
                          "a{1001}", "a^"}) {
    auto r = ModuleRegex::compile(bad);
    EXPECT_FALSE(r.ok()) << bad;
    if (!r.ok()) EXPECT_NE(r.message().find("regular expression"), std::string::npos) << r.message();
  }
  // Too many states once the repeats are expanded.
  EXPECT_FALSE(ModuleRegex::compile("(a{1000}){1000}").ok());
}

// Patterns that take exponential time in a backtracking engine finish at
// once: the NFA is simulated, never backtracked.
TEST(ModuleRegex, HostilePatternsRunInLinearTime) {
  const auto t0 = std::chrono::steady_clock::now();
  const std::string as(200, 'a');
  for (const char* p : {"(a*)*b", "(a|a)*b", "(a+)+b", "(.*)*x", ".*.*.*.*.*.*.*.*.*.*x", "(a|aa)*c"}) {
    auto r = ModuleRegex::compile(p);
    ASSERT_TRUE(r.ok()) << p << ": " << r.message();
    EXPECT_FALSE(r->matches(as)) << p;
  }
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
}

}  // namespace
}  // namespace muse
