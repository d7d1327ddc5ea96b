#include "muse/chat/chat_template.h"

#include <cstdint>
#include <cstdio>

#include "muse/core/log.h"
#include "muse/core/mapped_file.h"
#include "muse/tokenizer/tokenizer_files.h"

namespace muse::chat {

// ---------------------------------------------------------------------------
// SHA-256 (FIPS 180-4), for pinning templates by hash.
// ---------------------------------------------------------------------------

namespace {

constexpr uint32_t kRound[64] = {
    0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5, 0xd807aa98,
    0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174, 0xe49b69c1, 0xefbe4786,
    0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da, 0x983e5152, 0xa831c66d, 0xb00327c8,
    0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967, 0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13,
    0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85, 0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819,
    0xd6990624, 0xf40e3585, 0x106aa070, 0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a,
    0x5b9cca4f, 0x682e6ff3, 0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7,
    0xc67178f2};

uint32_t rotr(uint32_t x, int n) { return (x >> n) | (x << (32 - n)); }

void compress(uint32_t h[8], const unsigned char* block) {
  uint32_t w[64];
  for (int i = 0; i < 16; ++i)
    w[i] = uint32_t(block[4 * i]) << 24 | uint32_t(block[4 * i + 1]) << 16 | uint32_t(block[4 * i + 2]) << 8 |
           uint32_t(block[4 * i + 3]);
  for (int i = 16; i < 64; ++i) {
    uint32_t s0 = rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3);
    uint32_t s1 = rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10);
    w[i] = w[i - 16] + s0 + w[i - 7] + s1;
  }
  uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], k = h[7];
  for (int i = 0; i < 64; ++i) {
    uint32_t t1 = k + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + kRound[i] + w[i];
    uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
    k = g;
    g = f;
    f = e;
    e = d + t1;
    d = c;
    c = b;
    b = a;
    a = t1 + t2;
  }
  h[0] += a, h[1] += b, h[2] += c, h[3] += d, h[4] += e, h[5] += f, h[6] += g, h[7] += k;
}

// Whether the template loops over a message's content, i.e. accepts
// OpenAI-style part lists (vLLM's "openai" content format); otherwise text
// parts are joined into one string first ("string" format).
bool detect_content_lists(const std::string& src) {
  for (const char* needle : {"in content", "in message.content", "in message['content']", "in message[\"content\"]",
                             "in msg.content", "in msg['content']", "in m.content", "in m['content']"})
    if (src.find(needle) != std::string::npos) return true;
  return false;
}

}  // namespace

std::string sha256_hex(std::string_view data) {
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  size_t full = data.size() / 64;
  for (size_t i = 0; i < full; ++i) compress(h, reinterpret_cast<const unsigned char*>(data.data()) + 64 * i);
  unsigned char tail[128] = {};
  size_t rest = data.size() - 64 * full;
  for (size_t i = 0; i < rest; ++i) tail[i] = static_cast<unsigned char>(data[64 * full + i]);
  tail[rest] = 0x80;
  size_t tail_len = rest + 1 + 8 <= 64 ? 64 : 128;
  uint64_t bits = uint64_t(data.size()) * 8;
  for (int i = 0; i < 8; ++i) tail[tail_len - 1 - i] = static_cast<unsigned char>(bits >> (8 * i));
  compress(h, tail);
  if (tail_len == 128) compress(h, tail + 64);
  char out[65];
  for (int i = 0; i < 8; ++i) std::snprintf(out + 8 * i, 9, "%08x", h[i]);
  return std::string(out, 64);
}

// ---------------------------------------------------------------------------
// ChatTemplate
// ---------------------------------------------------------------------------

Result<ChatTemplate> ChatTemplate::create(std::string source, const Options& options) {
  ChatTemplate t;
  t.sha256_ = sha256_hex(source);
  t.profile_ = &select_profile(t.sha256_, options.model_type, &t.legacy_);
  if (t.legacy_)
    LOG_WARN("chat template %s is an older %s revision; rendering it as shipped (override with --chat-template)",
             t.sha256_.substr(0, 12).c_str(), t.profile_->name.c_str());
  auto compiled = jinja::Template::parse(source);
  if (!compiled.ok()) return compiled.error();
  t.compiled_ = std::move(compiled).value();
  t.accepts_content_lists_ = detect_content_lists(source);
  t.special_tokens_ = options.special_tokens;
  bool has_bos = false;
  for (const auto& [k, v] : t.special_tokens_) has_bos = has_bos || k == "bos_token";
  if (!has_bos && !t.profile_->bos_token.empty()) t.special_tokens_.emplace_back("bos_token", t.profile_->bos_token);
  t.source_ = std::move(source);
  return t;
}

Status ChatTemplate::set_tool_use_template(const std::string& source) {
  auto compiled = jinja::Template::parse(source);
  if (!compiled.ok()) return make_error("tool_use " + compiled.message());
  tool_use_ = std::make_shared<const jinja::Template>(std::move(compiled).value());
  return Status::Ok();
}

Result<ChatTemplate> ChatTemplate::from_tokenizer_files(const TokenizerFiles& files, const std::string& model_type,
                                                       const std::string& override_template) {
  std::string source = files.chat_template;
  if (!override_template.empty()) {
    if (file_exists(override_template)) {
      MUSE_ASSIGN_OR_RETURN(source, read_file(override_template));
    } else if (override_template.find("{%") != std::string::npos || override_template.find("{{") != std::string::npos) {
      source = override_template;
    } else {
      return make_error("--chat-template: no such file: " + override_template);
    }
  }
  if (source.empty())
    return make_error("the model has no chat template (no chat_template.jinja, chat_template.json or "
                      "tokenizer_config.json 'chat_template'); pass one with --chat-template");
  Options o;
  o.model_type = model_type;
  auto add = [&](const char* key, const std::string& value) {
    if (!value.empty()) o.special_tokens.emplace_back(key, value);
  };
  add("bos_token", files.bos_token);
  add("eos_token", files.eos_token);
  add("unk_token", files.unk_token);
  add("pad_token", files.pad_token);
  for (const char* key : {"sep_token", "cls_token", "mask_token"}) {
    const Json* v = files.tokenizer_config.find(key);
    if (v && v->is_string()) add(key, v->as_string());
    else if (v && v->is_object() && v->find("content") && v->find("content")->is_string())
      add(key, v->find("content")->as_string());
  }
  MUSE_ASSIGN_OR_RETURN(ChatTemplate t, create(std::move(source), o));
  auto tool_use = files.named_chat_templates.find("tool_use");
  if (override_template.empty() && tool_use != files.named_chat_templates.end())
    MUSE_RETURN_IF_ERROR(t.set_tool_use_template(tool_use->second));
  return t;
}

Result<std::string> read_model_type(const std::string& model_dir) {
  std::string path = model_dir + "/config.json";
  if (!file_exists(path)) return std::string();
  MUSE_ASSIGN_OR_RETURN(std::string text, read_file(path));
  auto j = Json::parse(text);
  if (!j.ok()) return make_error(path + " is not valid JSON: " + j.message());
  return j->get_string("model_type", "");
}

}  // namespace muse::chat
