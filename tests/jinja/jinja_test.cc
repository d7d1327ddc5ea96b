// The Jinja engine on its own:
//  - tests/jinja/data/jinja_snippets.json: small templates rendered by Python
//    jinja2 under transformers' settings (tests/jinja/py/gen_jinja_snippets.py);
//  - error values (line numbers, kinds) and the resource limits on hostile
//    templates.
// Real chat templates against @huggingface/jinja and Python jinja2 run as the
// jinja_conformance and jinja_python tests (tests/jinja/tests.cmake).
#include <gtest/gtest.h>

#include <string>

#include "muse/core/json.h"
#include "muse/core/mapped_file.h"
#include "muse/jinja/jinja.h"

namespace muse::jinja {
namespace {

// Where Python cannot be matched, by design (docs/chat.md "Deviations").
bool known_deviation(const std::string& tpl) {
  return tpl.find("9223372036854775807 + 1") != std::string::npos;  // Python ints are unbounded
}

TEST(Jinja, PythonJinjaSnippets) {
  std::string path = std::string(MUSE_SOURCE_DIR) + "/tests/jinja/data/jinja_snippets.json";
  auto text = read_file(path);
  ASSERT_TRUE(text.ok()) << text.message();
  auto data = Json::parse(*text);
  ASSERT_TRUE(data.ok()) << data.message();
  const Json& ctx = *data->find("context");
  RenderOptions opts;
  opts.now_unix_seconds = 1786665600;  // 2026-08-14, as the generator used
  int checked = 0;
  for (const auto& c : data->find("cases")->as_array()) {
    const std::string& src = c.find("template")->as_string();
    if (known_deviation(src)) continue;
    ++checked;
    auto tpl = Template::parse(src);
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
  auto t = Template::parse("line one\n{{ x.y }}");
  ASSERT_TRUE(t.ok());
  RenderFailure failure;
  auto r = t->render(Json::object(), {}, &failure);
  ASSERT_FALSE(r.ok());
  EXPECT_EQ(failure.line, 2);
  EXPECT_EQ(failure.kind, ErrorKind::Undefined);
  EXPECT_NE(r.message().find("line 2"), std::string::npos) << r.message();

  t = Template::parse("a\nb\n{{ raise_exception('no system role') }}");
  r = t->render(Json::object(), {}, &failure);
  EXPECT_EQ(failure.kind, ErrorKind::Raised);
  EXPECT_EQ(failure.message, "no system role");
  EXPECT_EQ(failure.line, 3);

  auto bad = Template::parse("{% for x in y %}\n\n{% endif %}");
  ASSERT_FALSE(bad.ok());
  EXPECT_NE(bad.message().find("line 3"), std::string::npos) << bad.message();
}

TEST(Jinja, HostileTemplatesHitLimits) {
  RenderOptions opts;
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
    auto t = Template::parse(src);
    ASSERT_TRUE(t.ok()) << src;
    auto r = t->render(Json::object(), opts);
    EXPECT_FALSE(r.ok()) << src;
  }
  // Legal nesting times legal recursion: bounded by the stack budget.
  std::string body;
  for (int i = 0; i < 150; ++i) body += "{% if true %}";
  body += "{{ m(n + 1) if n < 99 else '' }}";
  for (int i = 0; i < 150; ++i) body += "{% endif %}";
  auto rec = Template::parse("{% macro m(n) %}" + body + "{% endmacro %}{{ m(0) }}");
  ASSERT_TRUE(rec.ok()) << rec.message();
  EXPECT_FALSE(rec->render(Json::object()).ok());
  for (const char* empty_repeat : {"{{ ('' * 1000000000000000000)|length }}", "{{ ([] * 1000000000000000000)|length }}"}) {
    auto t = Template::parse(empty_repeat);
    ASSERT_TRUE(t.ok());
    auto r = t->render(Json::object(), opts);
    ASSERT_TRUE(r.ok()) << r.message();
    EXPECT_EQ(*r, "0");
  }
  std::string deep(5000, '(');
  EXPECT_FALSE(Template::parse("{{ " + deep + " }}").ok());
  std::string nested;
  for (int i = 0; i < 1000; ++i) nested += "{% if true %}";
  EXPECT_FALSE(Template::parse(nested).ok());
}

}  // namespace
}  // namespace muse::jinja
