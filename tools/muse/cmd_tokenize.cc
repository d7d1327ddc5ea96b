// `muse tokenize` and `muse detokenize`: the tokenizer of a model directory
// (or a tokenizer.json) from the command line, for people debugging prompts
// (in the spirit of llama.cpp's llama-tokenize).
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "command.h"
#include "muse/core/cli.h"
#include "muse/core/json.h"
#include "muse/core/mapped_file.h"
#include "muse/tokenizer/tokenizer.h"
#include "muse/tokenizer/tokenizer_files.h"

namespace muse::tool {
namespace {

struct TokenizerSource {
  std::string model_dir;       // --model DIR
  std::string tokenizer_json;  // --tokenizer FILE
};

void declare_source(ArgParser& args, TokenizerSource& src) {
  args.option("--model", &src.model_dir, "DIR",
              "model directory with tokenizer.json (tokenizer_config.json, generation_config.json optional)");
  args.alias("-m", "--model");
  args.option("--tokenizer", &src.tokenizer_json, "FILE", "a tokenizer.json file (instead of --model)");
}

Result<Tokenizer> load_source(const TokenizerSource& src) {
  if (!src.model_dir.empty() && !src.tokenizer_json.empty())
    return make_error("give either --model or --tokenizer, not both");
  if (!src.tokenizer_json.empty()) return Tokenizer::from_file(src.tokenizer_json);
  if (src.model_dir.empty()) return make_error("--model DIR (or --tokenizer FILE) is required");
  MUSE_ASSIGN_OR_RETURN(TokenizerFiles files, load_tokenizer_files(src.model_dir));
  return files.tokenizer;
}

Result<std::string> read_input(const std::string& path) {
  if (path != "-") return read_file(path);
  std::string all;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) all.append(buf, n);
  if (std::ferror(stdin)) return make_error("error reading standard input");
  return all;
}

struct TokenizeOptions {
  TokenizerSource source;
  std::string text, file;
  bool json = false, add_special_tokens = false, show_tokens = false, verbose = false;
};

int tokenize_command(int argc, char** argv) {
  TokenizeOptions o;
  ArgParser args("muse tokenize", "print the token ids of a text, as the model's tokenizer.json encodes it");
  declare_source(args, o.source);
  args.option("--text", &o.text, "TEXT", "the text to tokenize");
  args.option("--file", &o.file, "PATH", "read the text from a file ('-': standard input), byte for byte");
  args.flag("--json", &o.json, "print {\"ids\": [...]} (with --show-tokens, also \"tokens\")");
  args.flag("--add-special-tokens", &o.add_special_tokens,
            "apply the post-processor (e.g. prepend BOS), as encode(..., add_special_tokens=True)");
  args.flag("--show-tokens", &o.show_tokens, "print one token per line: id, then the token string (JSON-quoted)");
  args.flag("--verbose", &o.verbose, "describe the tokenizer on standard error");
  auto fail = [](const std::string& m) { return tool::fail("tokenize", m); };
  if (int rc = parse_flags(args, argc, argv, "tokenize"); rc >= 0) return rc;
  if (args.given("--text") == args.given("--file")) return fail("give exactly one of --text TEXT or --file PATH");
  std::string text = o.text;
  if (args.given("--file")) {
    auto r = read_input(o.file);
    if (!r.ok()) return fail(r.message());
    text = std::move(*r);
  }
  auto tok = load_source(o.source);
  if (!tok.ok()) return fail(tok.message());
  if (o.verbose) std::fprintf(stderr, "muse tokenize: %s\n", tok->describe().c_str());
  std::vector<int32_t> ids = tok->encode(text, o.add_special_tokens);

  std::string out;
  if (o.json) {
    Json j = Json::object();
    Json arr = Json::array();
    for (int32_t id : ids) arr.push_back(Json(int64_t(id)));
    j.set("ids", std::move(arr));
    if (o.show_tokens) {
      Json toks = Json::array();
      for (int32_t id : ids) toks.push_back(Json(tok->id_to_token(id)));
      j.set("tokens", std::move(toks));
    }
    out = j.dump(JsonDumpOptions::python(-1, false)) + "\n";
  } else if (o.show_tokens) {
    for (int32_t id : ids) out += std::to_string(id) + "\t" + json_quote(tok->id_to_token(id)) + "\n";
  } else {
    for (size_t i = 0; i < ids.size(); ++i) {
      if (i) out.push_back(' ');
      out += std::to_string(ids[i]);
    }
    out.push_back('\n');
  }
  std::fwrite(out.data(), 1, out.size(), stdout);
  return 0;
}

struct DetokenizeOptions {
  TokenizerSource source;
  std::string ids;
  bool json = false, skip_special_tokens = false;
};

// "1 2 3", "1,2,3" or "[1, 2, 3]".
Result<std::vector<int32_t>> parse_ids(const std::string& text) {
  std::vector<int32_t> ids;
  std::string cur;
  auto flush = [&]() -> Status {
    if (cur.empty()) return Status::Ok();
    char* end = nullptr;
    long long v = std::strtoll(cur.c_str(), &end, 10);
    if (*end != '\0' || v < 0 || v > INT32_MAX) return make_error("'" + cur + "' is not a token id");
    ids.push_back(int32_t(v));
    cur.clear();
    return Status::Ok();
  };
  for (char c : text) {
    if (c == ' ' || c == ',' || c == '\n' || c == '\t' || c == '\r' || c == '[' || c == ']') {
      MUSE_RETURN_IF_ERROR(flush());
    } else {
      cur.push_back(c);
    }
  }
  MUSE_RETURN_IF_ERROR(flush());
  return ids;
}

int detokenize_command(int argc, char** argv) {
  DetokenizeOptions o;
  ArgParser args("muse detokenize", "print the text of token ids, as the model's tokenizer.json decodes them");
  declare_source(args, o.source);
  args.option("--ids", &o.ids, "IDS", "ids separated by spaces or commas, or a JSON list ('-': standard input)");
  args.flag("--skip-special-tokens", &o.skip_special_tokens, "leave out special tokens");
  args.flag("--json", &o.json, "print {\"text\": \"...\"}");
  auto fail = [](const std::string& m) { return tool::fail("detokenize", m); };
  if (int rc = parse_flags(args, argc, argv, "detokenize"); rc >= 0) return rc;
  if (!args.given("--ids")) return fail("--ids is required");
  std::string ids_text = o.ids;
  if (ids_text == "-") {
    auto r = read_input("-");
    if (!r.ok()) return fail(r.message());
    ids_text = std::move(*r);
  }
  auto ids = parse_ids(ids_text);
  if (!ids.ok()) return fail("--ids: " + ids.message());
  auto tok = load_source(o.source);
  if (!tok.ok()) return fail(tok.message());
  std::string text = tok->decode(*ids, o.skip_special_tokens);
  if (o.json) {
    Json j = Json::object();
    j.set("text", Json(text));
    text = j.dump(JsonDumpOptions::python(-1, false)) + "\n";
  }
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

MUSE_COMMAND("tokenize", "print the token ids of a text (tokenizer.json)", tokenize_command, 60);
MUSE_COMMAND("detokenize", "print the text of token ids (tokenizer.json)", detokenize_command, 61);

}  // namespace muse::tool
