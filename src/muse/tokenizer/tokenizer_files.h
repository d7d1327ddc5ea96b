// The tokenizer side of a Hugging Face model directory: tokenizer.json,
// tokenizer_config.json (special-token strings, add_bos_token, the chat
// template), chat_template.jinja / chat_template.json, and
// generation_config.json (the end-of-sequence ids that stop generation).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "muse/core/json.h"
#include "muse/core/status.h"
#include "muse/tokenizer/tokenizer.h"

namespace muse {

struct TokenizerFiles {
  Tokenizer tokenizer;
  // chat_template.jinja, else chat_template.json's "chat_template", else
  // tokenizer_config.json "chat_template" (a string, or the "default" entry
  // of a list of {name, template}); empty if none.
  std::string chat_template;
  // Every named template of a tokenizer_config.json list (e.g. "tool_use").
  std::map<std::string, std::string> named_chat_templates;
  // Strings from tokenizer_config.json (plain or AddedToken objects there).
  std::string bos_token, eos_token, pad_token, unk_token;
  int32_t bos_token_id = -1, pad_token_id = -1;
  // generation_config.json eos_token_id (int or list), then the id of
  // tokenizer_config's eos_token if not already listed.
  std::vector<int32_t> eos_token_ids;
  bool add_bos_token = false;
  Json tokenizer_config;         // raw (an empty object when the file is absent)
  std::string tokenizer_json_path;
};

// Needs DIR/tokenizer.json; the other files are optional. Errors name the
// file and what is wrong with it.
Result<TokenizerFiles> load_tokenizer_files(const std::string& model_dir);

// Builds the same from explicit files (`tokenizer_config_path` may be empty).
Result<TokenizerFiles> load_tokenizer_files(const std::string& tokenizer_json_path,
                                            const std::string& tokenizer_config_path,
                                            const std::string& generation_config_path,
                                            const std::string& chat_template_path);

}  // namespace muse
