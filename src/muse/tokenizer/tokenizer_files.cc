#include "muse/tokenizer/tokenizer_files.h"

#include <algorithm>
#include <climits>

#include "muse/core/mapped_file.h"

namespace muse {
namespace {

Result<Json> read_json_file(const std::string& path) {
  auto text = read_file(path);
  if (!text.ok()) return make_error("cannot read " + path + ": " + text.message());
  auto j = Json::parse(*text);
  if (!j.ok()) return make_error(path + " is not valid JSON: " + j.message());
  return j;
}

// A special-token entry of tokenizer_config.json: "…" or {"content": "…", …}.
Result<std::string> token_string(const Json& config, const char* key, const std::string& path) {
  const Json* v = config.find(key);
  if (!v || v->is_null()) return std::string();
  if (v->is_string()) return v->as_string();
  if (v->is_object()) {
    const Json* c = v->find("content");
    if (c && c->is_string()) return c->as_string();
  }
  return make_error(path + ": '" + key + "' must be a string, an object with \"content\", or null");
}

Status read_chat_templates(const Json& config, const std::string& path, TokenizerFiles& out) {
  const Json* t = config.find("chat_template");
  if (!t || t->is_null()) return Status::Ok();
  if (t->is_string()) {
    out.chat_template = t->as_string();
    return Status::Ok();
  }
  if (!t->is_array()) return make_error(path + ": 'chat_template' must be a string or a list of {name, template}");
  for (const Json& e : t->as_array()) {
    const Json* name = e.find("name");
    const Json* tmpl = e.find("template");
    if (!name || !name->is_string() || !tmpl || !tmpl->is_string())
      return make_error(path + ": each 'chat_template' entry needs string 'name' and 'template'");
    out.named_chat_templates[name->as_string()] = tmpl->as_string();
  }
  auto def = out.named_chat_templates.find("default");
  if (def != out.named_chat_templates.end()) out.chat_template = def->second;
  return Status::Ok();
}

void add_unique(std::vector<int32_t>& ids, int64_t id) {
  if (id >= 0 && id <= INT32_MAX && std::find(ids.begin(), ids.end(), int32_t(id)) == ids.end())
    ids.push_back(int32_t(id));
}

}  // namespace

Result<TokenizerFiles> load_tokenizer_files(const std::string& tokenizer_json_path,
                                            const std::string& tokenizer_config_path,
                                            const std::string& generation_config_path,
                                            const std::string& chat_template_path) {
  TokenizerFiles out;
  out.tokenizer_json_path = tokenizer_json_path;
  if (!file_exists(tokenizer_json_path)) return make_error("tokenizer file not found: " + tokenizer_json_path);
  MUSE_ASSIGN_OR_RETURN(out.tokenizer, Tokenizer::from_file(tokenizer_json_path));

  out.tokenizer_config = Json::object();
  if (!tokenizer_config_path.empty() && file_exists(tokenizer_config_path)) {
    MUSE_ASSIGN_OR_RETURN(out.tokenizer_config, read_json_file(tokenizer_config_path));
    if (!out.tokenizer_config.is_object())
      return make_error(tokenizer_config_path + " must contain a JSON object");
  }
  const Json& config = out.tokenizer_config;
  const std::string& cpath = tokenizer_config_path;
  MUSE_ASSIGN_OR_RETURN(out.bos_token, token_string(config, "bos_token", cpath));
  MUSE_ASSIGN_OR_RETURN(out.eos_token, token_string(config, "eos_token", cpath));
  MUSE_ASSIGN_OR_RETURN(out.pad_token, token_string(config, "pad_token", cpath));
  MUSE_ASSIGN_OR_RETURN(out.unk_token, token_string(config, "unk_token", cpath));
  auto add_bos = config.bool_member("add_bos_token", false);
  if (!add_bos.ok()) return make_error(cpath + ": " + add_bos.message());
  out.add_bos_token = *add_bos;
  MUSE_RETURN_IF_ERROR(read_chat_templates(config, cpath, out));

  // A separate template file wins over the config's copy (as in transformers).
  if (!chat_template_path.empty() && file_exists(chat_template_path)) {
    if (chat_template_path.size() >= 5 && chat_template_path.compare(chat_template_path.size() - 5, 5, ".json") == 0) {
      MUSE_ASSIGN_OR_RETURN(Json j, read_json_file(chat_template_path));
      const Json* t = j.find("chat_template");
      if (!t || !t->is_string()) return make_error(chat_template_path + ": needs a string 'chat_template'");
      out.chat_template = t->as_string();
    } else {
      MUSE_ASSIGN_OR_RETURN(out.chat_template, read_file(chat_template_path));
    }
  }

  const Tokenizer& tok = out.tokenizer;
  Json generation = Json::object();
  if (!generation_config_path.empty() && file_exists(generation_config_path)) {
    MUSE_ASSIGN_OR_RETURN(generation, read_json_file(generation_config_path));
  }
  if (const Json* eos = generation.find("eos_token_id")) {
    if (eos->is_int()) {
      add_unique(out.eos_token_ids, eos->as_int());
    } else if (eos->is_array()) {
      for (const Json& e : eos->as_array()) {
        if (!e.is_int()) return make_error(generation_config_path + ": eos_token_id list must hold integers");
        add_unique(out.eos_token_ids, e.as_int());
      }
    } else if (!eos->is_null()) {
      return make_error(generation_config_path + ": eos_token_id must be an integer or a list of integers");
    }
  }
  if (!out.eos_token.empty()) add_unique(out.eos_token_ids, tok.token_to_id(out.eos_token));

  auto generation_id = [&](const char* key) -> int32_t {
    const Json* v = generation.find(key);
    return v && v->is_int() && v->as_int() >= 0 && v->as_int() <= INT32_MAX ? int32_t(v->as_int()) : -1;
  };
  out.bos_token_id = out.bos_token.empty() ? -1 : tok.token_to_id(out.bos_token);
  if (out.bos_token_id < 0) out.bos_token_id = generation_id("bos_token_id");
  out.pad_token_id = out.pad_token.empty() ? -1 : tok.token_to_id(out.pad_token);
  if (out.pad_token_id < 0) out.pad_token_id = generation_id("pad_token_id");
  return out;
}

Result<TokenizerFiles> load_tokenizer_files(const std::string& model_dir) {
  std::string dir = model_dir;
  while (dir.size() > 1 && dir.back() == '/') dir.pop_back();
  if (!file_exists(dir)) return make_error("model directory not found: " + model_dir);
  std::string tokenizer_json = dir + "/tokenizer.json";
  if (!file_exists(tokenizer_json))
    return make_error("model directory " + model_dir + " has no tokenizer.json (muse reads Hugging Face fast-tokenizer files)");
  std::string chat_template = dir + "/chat_template.jinja";
  if (!file_exists(chat_template)) chat_template = dir + "/chat_template.json";
  return load_tokenizer_files(tokenizer_json, dir + "/tokenizer_config.json", dir + "/generation_config.json",
                              chat_template);
}

}  // namespace muse
