// libFuzzer target: the forced-tool-call grammar (chat/tool_call_grammar.h).
// The input is `TOOLS\0OUTPUT`: TOOLS a JSON tools array (when it does not
// parse or declares nothing usable, a fixed set is used), OUTPUT generated
// text whose marker spellings stand for the framing tokens.
// Properties: never crashes; building the grammar from any tools JSON gives a
// grammar or an error, never undefined behaviour; whenever the grammar admits
// the whole output and is finished, the response parser reads it as one or
// more calls, each to an allowed function, with a JSON object of arguments
// whose keys the tool declares (when it declares any) and whose required keys
// are all present.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "muse/chat/response_parser.h"
#include "muse/chat/tool_call_grammar.h"

namespace {

using namespace muse::chat;

const char* kDefaultTools = R"([
  {"type": "function", "function": {"name": "get_weather", "parameters": {"type": "object",
    "properties": {"city": {"type": "string"}, "unit": {"enum": ["c", "f"]}, "days": {"type": "integer"},
                   "x": {"type": "number"}, "ok": {"type": "boolean"}}, "required": ["city"]}}},
  {"type": "function", "function": {"name": "ping", "parameters": {}}}])";

struct Piece {
  bool marker;
  GrammarMarker m;
  std::string text;
};

std::vector<Piece> split(std::string_view out, const FramingFormat& f) {
  const std::pair<std::string_view, GrammarMarker> markers[] = {{f.start, GrammarMarker::Start},
                                                               {f.message, GrammarMarker::Message},
                                                               {f.end_message, GrammarMarker::EndMessage},
                                                               {f.end_turn, GrammarMarker::EndTurn},
                                                               {f.end_of_text, GrammarMarker::EndOfText}};
  std::vector<Piece> pieces;
  std::string text;
  for (size_t i = 0; i < out.size();) {
    bool hit = false;
    for (const auto& [spelling, m] : markers)
      if (out.substr(i, spelling.size()) == spelling) {
        if (!text.empty()) pieces.push_back({false, {}, std::move(text)});
        text.clear();
        pieces.push_back({true, m, {}});
        i += spelling.size();
        hit = true;
        break;
      }
    if (!hit) text += out[i++];
  }
  if (!text.empty()) pieces.push_back({false, {}, std::move(text)});
  return pieces;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view in(reinterpret_cast<const char*>(data), size);
  const size_t nul = in.find('\0');
  std::string_view tools_text = nul == std::string_view::npos ? std::string_view() : in.substr(0, nul);
  std::string_view out = nul == std::string_view::npos ? in : in.substr(nul + 1);

  const FramingFormat& f = muse_glimmer_profile().framing;
  ToolSet tools;
  if (auto j = muse::Json::parse(tools_text); j.ok())
    if (auto t = ToolSet::from_json(*j); t.ok()) tools = std::move(t).value();
  if (tools.empty()) tools = *ToolSet::from_json(*muse::Json::parse(kDefaultTools));
  std::vector<std::string> names;
  for (const auto& t : tools.tools()) names.push_back(t.name);
  const bool single = !out.empty() && (out[0] & 1);

  auto g = ToolCallGrammar::make(f, tools, names, single);
  if (!g.ok()) return 0;
  auto s = g->initial();
  const auto pieces = split(out, f);
  for (const Piece& p : pieces) {
    bool ok = p.marker ? g->feed_marker(s, p.m) : g->feed_text(s, p.text);
    (void)g->fast_path_blockers(s);
    if (!ok) return 0;
  }
  if (!g->finished(s)) return 0;

  ResponseParserOptions po;
  po.tools = tools;
  ResponseParser parser(f, po);
  const int32_t ids[] = {f.start_id, f.message_id, f.end_message_id, f.end_turn_id, f.end_of_text_id};
  for (const Piece& p : pieces)
    parser.push_token(p.marker ? ids[int(p.m)] : -1, p.text, p.marker);
  parser.finish(FinishCause::Stop);
  const ParsedResponse& r = parser.result();
  if (r.tool_calls.empty() || (single && r.tool_calls.size() != 1)) std::abort();
  for (const ToolCall& c : r.tool_calls) {
    const ToolInfo* tool = tools.find(c.name);
    if (!tool) std::abort();
    auto args = muse::Json::parse(c.arguments);
    if (!args.ok() || !args->is_object()) std::abort();
    const muse::Json* props = tool->parameters.is_object() ? tool->parameters.find("properties") : nullptr;
    if (props && props->is_object() && !props->as_object().empty() && props->as_object().size() <= 64) {
      for (const auto& [k, v] : args->as_object())
        if (!props->find(k)) std::abort();
      if (const muse::Json* req = tool->parameters.find("required"); req && req->is_array())
        for (const muse::Json& k : req->as_array())
          if (k.is_string() && props->find(k.as_string()) && !args->find(k.as_string())) std::abort();
    }
  }
  return 0;
}
