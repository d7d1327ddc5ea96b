// Model-directory loading (tokenizer_config.json, generation_config.json,
// chat templates) and Muse special-token handling against the 31 Hugging
// Face-rendered Muse Glimmer cases.
#include <gtest/gtest.h>

#include <unistd.h>

#include <filesystem>
#include <string>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/mapped_file.h"
#include "muse/tokenizer/tokenizer_files.h"
#include "tiny_tokenizers.h"

namespace muse {
namespace {

namespace fs = std::filesystem;

struct TempDir {
  fs::path path;
  TempDir() {
    path = fs::temp_directory_path() / ("muse-tok-" + std::to_string(::getpid()) + "-" + std::to_string(counter()++));
    fs::create_directories(path);
  }
  ~TempDir() { fs::remove_all(path); }
  static int& counter() {
    static int c = 0;
    return c;
  }
  void write(const std::string& name, const std::string& text) const {
    ASSERT_TRUE(write_file((path / name).string(), text).ok());
  }
  std::string str() const { return path.string(); }
};

TEST(TokenizerFiles, ReadsConfigTokensTemplatesAndEosIds) {
  TempDir d;
  d.write("tokenizer.json", testing::byte_level_tokenizer({}, {{"<|bos|>"}, {"<|eot|>"}, {"<|end|>"}, {"<pad>"}}).dump());
  d.write("tokenizer_config.json", R"({
    "bos_token": {"__type": "AddedToken", "content": "<|bos|>", "lstrip": false},
    "eos_token": "<|eot|>", "pad_token": "<pad>", "unk_token": null, "add_bos_token": true,
    "chat_template": [{"name": "default", "template": "{{ messages }}"}, {"name": "tool_use", "template": "T"}]})");
  d.write("generation_config.json", R"({"eos_token_id": [258, 999], "bos_token_id": 1})");
  auto f = load_tokenizer_files(d.str());
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_EQ(f->bos_token, "<|bos|>");
  EXPECT_EQ(f->bos_token_id, 256);
  EXPECT_EQ(f->eos_token, "<|eot|>");
  EXPECT_EQ(f->eos_token_ids, (std::vector<int32_t>{258, 999, 257}));
  EXPECT_EQ(f->pad_token_id, 259);
  EXPECT_TRUE(f->unk_token.empty());
  EXPECT_TRUE(f->add_bos_token);
  EXPECT_EQ(f->chat_template, "{{ messages }}");
  EXPECT_EQ(f->named_chat_templates.at("tool_use"), "T");
  EXPECT_TRUE(f->tokenizer_config.is_object());
  // chat_template.jinja wins over the config's template.
  d.write("chat_template.jinja", "{{ bos_token }}");
  auto g = load_tokenizer_files(d.str());
  ASSERT_TRUE(g.ok());
  EXPECT_EQ(g->chat_template, "{{ bos_token }}");
}

TEST(TokenizerFiles, OnlyTokenizerJsonIsRequired) {
  TempDir d;
  d.write("tokenizer.json", testing::byte_level_tokenizer({}).dump());
  auto f = load_tokenizer_files(d.str() + "/");
  ASSERT_TRUE(f.ok()) << f.message();
  EXPECT_TRUE(f->chat_template.empty());
  EXPECT_TRUE(f->eos_token_ids.empty());
  EXPECT_EQ(f->bos_token_id, -1);
}

TEST(TokenizerFiles, ClearErrors) {
  TempDir d;
  auto missing = load_tokenizer_files(d.str());
  EXPECT_NE(missing.message().find("no tokenizer.json"), std::string::npos) << missing.message();
  EXPECT_NE(load_tokenizer_files("/no/such/dir").message().find("not found"), std::string::npos);
  d.write("tokenizer.json", testing::byte_level_tokenizer({}).dump());
  d.write("tokenizer_config.json", "{\"bos_token\": ");
  auto bad = load_tokenizer_files(d.str());
  EXPECT_NE(bad.message().find("tokenizer_config.json is not valid JSON"), std::string::npos) << bad.message();
  d.write("tokenizer_config.json", R"({"bos_token": 5})");
  EXPECT_NE(load_tokenizer_files(d.str()).message().find("bos_token"), std::string::npos);
  d.write("tokenizer_config.json", "{}");
  d.write("generation_config.json", R"({"eos_token_id": "x"})");
  EXPECT_NE(load_tokenizer_files(d.str()).message().find("eos_token_id"), std::string::npos);
  d.write("tokenizer.json", "{\"model\": 3}");
  d.write("generation_config.json", "{}");
  EXPECT_NE(load_tokenizer_files(d.str()).message().find("tokenizer.json"), std::string::npos);
}

// Muse's special tokens (spec §3) on top of a byte-level vocabulary: every
// special-token spelling in the 31 rendered cases must come out as its id,
// in order, and nothing else may produce an id >= 200000.
TEST(MuseGlimmer, SpecialTokensOfTheRenderedCases) {
  std::string path = std::string(MUSE_SOURCE_DIR) + "/../shared/testdata/muse-glimmer/chat-cases.json";
  if (!file_exists(path)) GTEST_SKIP() << "missing " << path << " (shared test data not present)";
  auto text = read_file(path);
  ASSERT_TRUE(text.ok());
  auto cases = Json::parse(*text);
  ASSERT_TRUE(cases.ok());
  std::vector<testing::AddedSpec> specials;
  auto named = [](int id) -> std::string {
    switch (id) {
      case 0: return "<|begin_of_text|>";
      case 1: return "<|end_of_text|>";
      case 7: return "<|eom|>";
      case 8: return "<|eot|>";
      case 18: return "<|finetune_right_pad|>";
      case 22: return "<|start|>";
      case 23: return "<|message|>";
      case 80: return "<|image_start|>";
      case 81: return "<|image_end|>";
      case 82: return "<|vid_start|>";
      case 83: return "<|vid_end|>";
      case 87: return "<|vid_frame_separator|>";
      case 90: return "<|image|>";
      case 91: return "<|video|>";
      case 92: return "<|patch|>";
      default: return "<|reserved_special_token_" + std::to_string(id) + "|>";
    }
  };
  Json j = testing::byte_level_tokenizer({});
  // Place the specials at 200000.. by padding the vocabulary.
  Json& vocab = j["model"]["vocab"];
  for (int id = 256; id < 200000; ++id) vocab.as_object().emplace_back("<pad" + std::to_string(id) + ">", Json(id));
  Json added = Json::array();
  for (int i = 0; i < 2048; ++i) {
    testing::AddedSpec a;
    a.content = named(i);
    added.push_back(testing::added_token_json(200000 + i, a));
  }
  j.set("added_tokens", added);
  auto tok = Tokenizer::from_json(j.dump());
  ASSERT_TRUE(tok.ok()) << tok.message();
  EXPECT_EQ(tok->token_to_id("<|patch|>"), 200092);
  int checked = 0;
  for (const Json& c : cases->find("cases")->as_array()) {
    std::vector<int32_t> want, got;
    for (const Json& id : c.find("ids")->as_array())
      if (id.as_int() >= 200000) want.push_back(int32_t(id.as_int()));
    for (int32_t id : tok->encode(c.get_string("expected", "")))
      if (id >= 200000) got.push_back(id);
    EXPECT_EQ(got, want) << c.get_string("name", "");
    ++checked;
  }
  EXPECT_EQ(checked, 31);
}

}  // namespace
}  // namespace muse
