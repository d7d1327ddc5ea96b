// `muse render`: the exact prompt a chat request becomes, for people
// debugging prompts. Reads an OpenAI chat-completions request body (or an
// Anthropic messages body with --anthropic) and prints the rendered text,
// or with --json {"prompt": "...", "ids": [...]} (ids from the model's
// tokenizer, no special tokens added: the template writes BOS itself).
// The rendering is the server's own code path (chat/request_render.h).
#include <cstdio>
#include <ctime>
#include <string>

#include "command.h"
#include "muse/chat/request_render.h"
#include "muse/core/cli.h"
#include "muse/core/json.h"
#include "muse/core/mapped_file.h"
#include "muse/tokenizer/tokenizer_files.h"

namespace muse::tool {
namespace {

struct RenderOptions {
  std::string model_dir;
  std::string chat_template;  // vLLM's --chat-template: a path or the template text
  std::string request = "-";  // request body file, '-' for standard input
  std::string date;           // YYYY-MM-DD for strftime_now (default: today)
  bool json = false, anthropic = false, show_context = false;
};

Result<std::string> read_input(const std::string& path) {
  if (path != "-") return read_file(path);
  std::string all;
  char buf[65536];
  size_t n;
  while ((n = std::fread(buf, 1, sizeof buf, stdin)) > 0) all.append(buf, n);
  if (std::ferror(stdin)) return make_error("error reading standard input");
  return all;
}

Result<int64_t> parse_date(const std::string& date) {
  std::tm tm{};
  int y, m, d;
  char tail;
  if (std::sscanf(date.c_str(), "%4d-%2d-%2d%c", &y, &m, &d, &tail) != 3 || m < 1 || m > 12 || d < 1 || d > 31)
    return make_error("--date must be YYYY-MM-DD, got '" + date + "'");
  tm.tm_year = y - 1900;
  tm.tm_mon = m - 1;
  tm.tm_mday = d;
  return int64_t(timegm(&tm));
}

int render_command(int argc, char** argv) {
  RenderOptions o;
  ArgParser args("muse render",
                 "print the prompt an OpenAI chat-completions request (standard input) renders to with the model's "
                 "chat template");
  args.option("--model", &o.model_dir, "DIR",
              "model directory: tokenizer.json, tokenizer_config.json and a chat template (chat_template.jinja or in "
              "tokenizer_config.json); config.json optional");
  args.alias("-m", "--model");
  args.option("--chat-template", &o.chat_template, "TEMPLATE", "use this chat template (a file, or the template text)");
  args.option("--request", &o.request, "FILE", "read the request body from FILE instead of standard input");
  args.option("--date", &o.date, "YYYY-MM-DD", "the date strftime_now reports (default: today, local time)");
  args.flag("--json", &o.json, "print {\"prompt\": \"...\", \"ids\": [...]}");
  args.flag("--anthropic", &o.anthropic, "the body is an Anthropic messages request");
  args.flag("--show-context", &o.show_context, "print the template's input variables (JSON) instead of rendering");
  auto fail = [](const std::string& m) { return tool::fail("render", m); };
  if (int rc = parse_flags(args, argc, argv, "render"); rc >= 0) return rc;
  if (o.model_dir.empty()) return fail("--model DIR is required");
  auto files = load_tokenizer_files(o.model_dir);
  if (!files.ok()) return fail(files.message());
  auto model_type = chat::read_model_type(o.model_dir);
  if (!model_type.ok()) return fail(model_type.message());
  auto tpl = chat::ChatTemplate::from_tokenizer_files(*files, *model_type, o.chat_template);
  if (!tpl.ok()) return fail(tpl.message());

  auto body = read_input(o.request);
  if (!body.ok()) return fail(body.message());
  auto request = Json::parse(*body);
  if (!request.ok()) return fail("the request body is not valid JSON: " + request.message());

  chat::ChatRenderOptions ro;
  ro.api = o.anthropic ? chat::RequestApi::AnthropicMessages : chat::RequestApi::OpenAIChat;
  if (!o.date.empty()) {
    auto t = parse_date(o.date);
    if (!t.ok()) return fail(t.message());
    ro.render.now_unix_seconds = *t;
  }
  if (o.show_context) {
    auto ctx = chat::build_template_context(*request, *tpl, ro);
    if (!ctx.ok()) return fail(ctx.message());
    std::string out = ctx->dump(JsonDumpOptions::python(2, false)) + "\n";
    std::fwrite(out.data(), 1, out.size(), stdout);
    return 0;
  }
  auto prompt = chat::render_chat_prompt(*request, *tpl, ro);
  if (!prompt.ok()) return fail(prompt.message());
  if (!o.json) {
    std::fwrite(prompt->data(), 1, prompt->size(), stdout);
    return 0;
  }
  Json ids = Json::array();
  for (int32_t id : files->tokenizer.encode(*prompt, /*add_special_tokens=*/false)) ids.push_back(Json(int64_t(id)));
  Json out = Json::object();
  out.set("prompt", Json(*prompt));
  out.set("ids", std::move(ids));
  std::string text = out.dump(JsonDumpOptions::python(-1, false)) + "\n";
  std::fwrite(text.data(), 1, text.size(), stdout);
  return 0;
}

}  // namespace

MUSE_COMMAND("render", "print the prompt a chat request renders to (chat template)", render_command, 62);

}  // namespace muse::tool
