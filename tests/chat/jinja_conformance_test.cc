// Jinja renderer conformance:
//  - the 31 Hugging-Face-rendered Muse Glimmer cases (shared testdata),
//    byte for byte, straight through the template and through the request
//    path;
//  - tests/chat/data/jinja_snippets.json: small templates rendered by Python
//    jinja2 under transformers' settings (tests/chat/py/gen_jinja_snippets.py).
#include <gtest/gtest.h>

#include "muse/chat/chat_template.h"
#include "muse/chat/jinja.h"
#include "muse/chat/request_render.h"
#include "muse/core/mapped_file.h"

namespace muse::chat {
namespace {

const std::string kGlimmerDir = std::string(MUSE_SOURCE_DIR) + "/../shared/testdata/muse-glimmer/";
const char* kGlimmerSha = "cfc67e5f349f37690dfd31ed1f18bc4442a9dd32fe39a648f993cb4eb3cae678";

struct GlimmerData {
  std::string tpl;
  Json cases;
};

// Loads the shared Glimmer data, or says why not (the caller skips).
bool load_glimmer(GlimmerData* out, std::string* why) {
  auto tpl = read_file(kGlimmerDir + "chat_template.jinja");
  auto cases = read_file(kGlimmerDir + "chat-cases.json");
  if (!tpl.ok() || !cases.ok()) {
    *why = "shared test data absent: " + kGlimmerDir + "chat_template.jinja / chat-cases.json";
    return false;
  }
  auto j = Json::parse(*cases);
  if (!j.ok()) {
    *why = "chat-cases.json does not parse: " + j.message();
    return false;
  }
  out->tpl = std::move(*tpl);
  out->cases = std::move(*j);
  return true;
}

TEST(JinjaConformance, Sha256) {
  EXPECT_EQ(sha256_hex(""), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(sha256_hex("abc"), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(sha256_hex(std::string(1000, 'a')), "41edece42d63e8d9bf515a9ba6932e1c20cbc9f5a5d134645adb5db1b9737ea3");
}

TEST(JinjaConformance, Glimmer31CasesThroughTheTemplate) {
  GlimmerData g;
  std::string why;
  if (!load_glimmer(&g, &why)) GTEST_SKIP() << why;
  ASSERT_EQ(sha256_hex(g.tpl), kGlimmerSha) << "the shared template is not revision a4e59da";
  auto tpl = jinja::Template::parse(g.tpl);
  ASSERT_TRUE(tpl.ok()) << tpl.message();
  const auto& cases = g.cases.find("cases")->as_array();
  ASSERT_EQ(cases.size(), 31u);
  int passed = 0;
  for (const auto& c : cases) {
    Json ctx = *c.find("kwargs");
    ctx.set("bos_token", "<|begin_of_text|>");
    auto out = tpl->render(ctx);
    ASSERT_TRUE(out.ok()) << c.find("name")->as_string() << ": " << out.message();
    EXPECT_EQ(*out, c.find("expected")->as_string()) << c.find("name")->as_string();
    passed += *out == c.find("expected")->as_string();
  }
  EXPECT_EQ(passed, 31);
}

// The same cases as OpenAI requests through render_chat (what `muse render`
// and the server do): template kwargs become chat_template_kwargs.
TEST(JinjaConformance, Glimmer31CasesThroughTheRequestPath) {
  GlimmerData g;
  std::string why;
  if (!load_glimmer(&g, &why)) GTEST_SKIP() << why;
  ChatTemplate::Options o;
  auto tpl = ChatTemplate::create(g.tpl, o);
  ASSERT_TRUE(tpl.ok()) << tpl.message();
  EXPECT_EQ(tpl->profile().name, "muse_glimmer");
  int passed = 0, compared = 0;
  for (const auto& c : g.cases.find("cases")->as_array()) {
    const std::string& name = c.find("name")->as_string();
    Json request = Json::object();
    Json kwargs = Json::object();
    for (const auto& [k, v] : c.find("kwargs")->as_object()) {
      if (k == "messages" || k == "tools" || k == "add_generation_prompt") request.set(k, v);
      else kwargs.set(k, v);
    }
    if (!request.contains("add_generation_prompt")) request.set("add_generation_prompt", false);  // HF's default
    request.set("chat_template_kwargs", kwargs);
    auto out = render_chat_prompt(request, *tpl);
    ASSERT_TRUE(out.ok()) << name << ": " << out.message();
    if (name == "unknown_role") {
      // Requirement 7: developer is mapped to system before rendering.
      EXPECT_NE(out->find("<|start|>system<|message|>dropped entirely"), std::string::npos) << *out;
      continue;
    }
    ++compared;
    EXPECT_EQ(*out, c.find("expected")->as_string()) << name;
    passed += *out == c.find("expected")->as_string();
  }
  EXPECT_EQ(compared, 30);
  EXPECT_EQ(passed, compared);
}

// Where Python cannot be matched, by design (docs/chat.md "Deviations").
bool known_deviation(const std::string& tpl) {
  return tpl.find("9223372036854775807 + 1") != std::string::npos;  // Python ints are unbounded
}

TEST(JinjaConformance, PythonJinjaSnippets) {
  std::string path = std::string(MUSE_SOURCE_DIR) + "/tests/chat/data/jinja_snippets.json";
  auto text = read_file(path);
  ASSERT_TRUE(text.ok()) << text.message();
  auto data = Json::parse(*text);
  ASSERT_TRUE(data.ok()) << data.message();
  const Json& ctx = *data->find("context");
  jinja::RenderOptions opts;
  opts.now_unix_seconds = 1786665600;  // 2026-08-14, as the generator used
  int checked = 0;
  for (const auto& c : data->find("cases")->as_array()) {
    const std::string& src = c.find("template")->as_string();
    if (known_deviation(src)) continue;
    ++checked;
    auto tpl = jinja::Template::parse(src);
    Result<std::string> out = tpl.ok() ? tpl->render(ctx, opts) : Result<std::string>(tpl.error());
    if (c.find("ok")->as_bool()) {
      ASSERT_TRUE(out.ok()) << src << "\n" << out.message();
      EXPECT_EQ(*out, c.find("expected")->as_string()) << src;
    } else {
      EXPECT_FALSE(out.ok()) << src << "\nPython: " << c.find("python_error")->as_string() << "\nours: " << *out;
    }
  }
  EXPECT_GT(checked, 100);
}

TEST(Jinja, ErrorsCarryLineNumbersAndKinds) {
  auto t = jinja::Template::parse("line one\n{{ x.y }}");
  ASSERT_TRUE(t.ok());
  jinja::RenderFailure failure;
  auto r = t->render(Json::object(), {}, &failure);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(failure.line, 2);
  EXPECT_EQ(failure.kind, jinja::ErrorKind::Undefined);
  EXPECT_NE(r.message().find("line 2"), std::string::npos) << r.message();

  t = jinja::Template::parse("a\nb\n{{ raise_exception('no system role') }}");
  r = t->render(Json::object(), {}, &failure);
  EXPECT_EQ(failure.kind, jinja::ErrorKind::Raised);
  EXPECT_EQ(failure.message, "no system role");
  EXPECT_EQ(failure.line, 3);

  auto bad = jinja::Template::parse("{% for x in y %}\n\n{% endif %}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("line 3"), std::string::npos) << bad.message();
}

TEST(Jinja, HostileTemplatesHitLimits) {
  jinja::RenderOptions opts;
  opts.limits.max_steps = 100000;
  opts.limits.max_output_bytes = 1 << 20;
  const char* hostile[] = {
      "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
      "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
      "{{ 'x' * 100000000 }}",
      "{% set ns = namespace(s='ab') %}{% for i in range(60) %}{% set ns.s = ns.s ~ ns.s %}{% endfor %}{{ ns.s|length }}",
      "{% set ns = namespace(l=[]) %}{% for i in range(1000) %}{% set ns.l = [ns.l] %}{% endfor %}{{ ns.l }}",
      "{% set ns = namespace() %}{% set ns.me = ns %}{{ ns }}",
      "{% for item in [[1]] recursive %}{{ loop([[item]]) }}{% endfor %}",
  };
  for (const char* src : hostile) {
    auto t = jinja::Template::parse(src);
    ASSERT_TRUE(t.ok()) << src;
    auto r = t->render(Json::object(), opts);
    EXPECT_FALSE(r.ok()) << src;
  }
  // Legal nesting times legal recursion: bounded by the stack budget.
  std::string body;
  for (int i = 0; i < 150; ++i) body += "{% if true %}";
  body += "{{ m(n + 1) if n < 99 else '' }}";
  for (int i = 0; i < 150; ++i) body += "{% endif %}";
  auto rec = jinja::Template::parse("{% macro m(n) %}" + body + "{% endmacro %}{{ m(0) }}");
  ASSERT_TRUE(rec.ok()) << rec.message();
  EXPECT_FALSE(rec->render(Json::object()).ok());
  for (const char* empty_repeat : {"{{ ('' * 1000000000000000000)|length }}", "{{ ([] * 1000000000000000000)|length }}"}) {
    auto t = jinja::Template::parse(empty_repeat);
    ASSERT_TRUE(t.ok());
    auto r = t->render(Json::object(), opts);
    ASSERT_TRUE(r.ok()) << r.message();
    EXPECT_EQ(*r, "0");
  }
  std::string deep(5000, '(');
  EXPECT_FALSE(jinja::Template::parse("{{ " + deep + " }}").ok());
  std::string nested;
  for (int i = 0; i < 1000; ++i) nested += "{% if true %}";
  EXPECT_FALSE(jinja::Template::parse(nested).ok());
}

}  // namespace
}  // namespace muse::chat
