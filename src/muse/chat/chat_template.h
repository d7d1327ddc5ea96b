// A model's chat template, compiled, with what Hugging Face passes to it
// besides the messages (special tokens) and the model family's profile.
//
//   MUSE_ASSIGN_OR_RETURN(auto files, load_tokenizer_files(dir));
//   MUSE_ASSIGN_OR_RETURN(auto tpl, ChatTemplate::from_tokenizer_files(files, model_type));
//   MUSE_ASSIGN_OR_RETURN(std::string prompt, render_chat_prompt(request_json, tpl));
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "muse/chat/chat_profile.h"
#include "muse/core/json.h"
#include "muse/core/status.h"
#include "muse/jinja/jinja.h"

namespace muse {
struct TokenizerFiles;
}

namespace muse::chat {

class ChatTemplate {
 public:
  struct Options {
    // Special-token strings passed to the template like transformers'
    // special_tokens_map (bos_token, eos_token, unk_token, pad_token, ...).
    std::vector<std::pair<std::string, std::string>> special_tokens;
    std::string model_type;  // config.json model_type, for picking the profile
  };

  static Result<ChatTemplate> create(std::string source, const Options& options);
  // From a model directory's tokenizer files; `model_type` may be empty.
  // `override_template` (vLLM's --chat-template: a file path, or the
  // template text itself) replaces the model's template when non-empty.
  static Result<ChatTemplate> from_tokenizer_files(const TokenizerFiles& files, const std::string& model_type,
                                                   const std::string& override_template = "");

  const std::string& source() const { return source_; }
  const std::string& sha256() const { return sha256_; }
  const ChatProfile& profile() const { return *profile_; }
  // The template is a known older revision (rendered as shipped; warn).
  bool legacy() const { return legacy_; }
  const jinja::Template& compiled() const { return compiled_; }
  // transformers picks a tokenizer's "tool_use" template when tools are
  // given and the tokenizer has one; otherwise the default.
  const jinja::Template& compiled_for(bool has_tools) const {
    return has_tools && tool_use_ ? *tool_use_ : compiled_;
  }
  Status set_tool_use_template(const std::string& source);
  const std::vector<std::pair<std::string, std::string>>& special_tokens() const { return special_tokens_; }
  // Whether the template iterates over a message's content parts; if not,
  // text-only part lists are joined into one string (vLLM's "string" format).
  bool accepts_content_lists() const { return accepts_content_lists_; }

 private:
  std::string source_, sha256_;
  const ChatProfile* profile_ = nullptr;
  bool legacy_ = false;
  bool accepts_content_lists_ = true;
  jinja::Template compiled_;
  std::shared_ptr<const jinja::Template> tool_use_;
  std::vector<std::pair<std::string, std::string>> special_tokens_;
};

// config.json's model_type in a model directory ("" when the file is absent;
// an error when it is unreadable or not JSON).
Result<std::string> read_model_type(const std::string& model_dir);

// Lower-case hex SHA-256 of `data` (for pinning templates by hash).
std::string sha256_hex(std::string_view data);

}  // namespace muse::chat
