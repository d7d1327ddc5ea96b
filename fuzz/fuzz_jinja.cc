// libFuzzer target: the Jinja renderer on hostile templates and contexts.
// Input: template text, optionally followed by a NUL byte and a JSON object
// used as the context (otherwise a chat-like default context).
// Properties: parsing and rendering never crash, leak, hang or overflow the
// stack (ASan/UBSan, libFuzzer's timeout); every failure is an error value;
// rendering is deterministic (same output twice).
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "muse/jinja/jinja.h"

namespace {

const muse::Json& default_context() {
  static const muse::Json ctx = *muse::Json::parse(R"({
    "messages": [{"role": "system", "content": "sys"}, {"role": "user", "content": "hi ünï"},
      {"role": "assistant", "content": null, "reasoning_content": "think",
       "tool_calls": [{"id": "c1", "type": "function", "function": {"name": "f.g", "arguments": {"a": 1, "b": [2.0, null, true], "c": {"d": "e"}}}}]},
      {"role": "tool", "tool_call_id": "c1", "content": [{"type": "text", "text": "res"}, {"type": "image"}]}],
    "tools": [{"type": "function", "function": {"name": "f.g", "description": "d", "parameters": {"type": "object", "properties": {"a": {"type": "integer"}}}}}],
    "add_generation_prompt": true, "bos_token": "<s>", "eos_token": "</s>", "n": 3, "f": 1.5, "s": "text", "l": [3, 1, 2]
  })");
  return ctx;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view input(reinterpret_cast<const char*>(data), size);
  std::string_view source = input;
  muse::Json ctx = default_context();
  size_t nul = input.find('\0');
  if (nul != std::string_view::npos) {
    source = input.substr(0, nul);
    auto parsed = muse::Json::parse(input.substr(nul + 1));
    if (parsed.ok() && parsed->is_object()) ctx = std::move(*parsed);
  }
  auto tpl = muse::jinja::Template::parse(source);
  if (!tpl.ok()) {
    if (tpl.message().empty()) std::abort();
    return 0;
  }
  muse::jinja::RenderOptions opts;
  opts.limits.max_steps = 200000;
  opts.limits.max_output_bytes = 1 << 20;
  opts.limits.max_work_bytes = 32u << 20;
  opts.now_unix_seconds = 1786665600;
  auto a = tpl->render(ctx, opts);
  auto b = tpl->render(ctx, opts);
  if (a.ok() != b.ok()) std::abort();
  if (a.ok() && *a != *b) std::abort();
  if (!a.ok() && a.message().empty()) std::abort();
  return 0;
}
