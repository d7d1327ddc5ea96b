// The Muse Glimmer chat template: the 31 Hugging-Face-rendered cases (shared
// testdata), byte for byte, straight through the template and through the
// request path. The general Jinja engine's own tests are in tests/jinja/.
#include <gtest/gtest.h>

#include "muse/chat/chat_template.h"
#include "muse/chat/request_render.h"
#include "muse/core/mapped_file.h"
#include "muse/jinja/jinja.h"

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

}  // namespace
}  // namespace muse::chat
