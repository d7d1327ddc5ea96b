// The fake model's adapter half: byte vocabulary, line-per-message "template",
// and the response parser for its <|think|>/<|tool|> framing.
#include "fake_model.h"

#include <cstring>

#include "fake_model_internal.h"

namespace muse::server {

const char* fake_vocab::special_text(int32_t id) {
  switch (id) {
    case kBegin: return "<|begin|>";
    case kEot: return "<|eot|>";
    case kThink: return "<|think|>";
    case kEndThink: return "<|/think|>";
    case kTool: return "<|tool|>";
    case kEndTool: return "<|/tool|>";
    default: return nullptr;
  }
}

namespace fake {

std::vector<int32_t> encode(std::string_view text, bool parse_specials) {
  std::vector<int32_t> ids;
  ids.reserve(text.size());
  for (size_t i = 0; i < text.size();) {
    if (parse_specials && text[i] == '<') {
      bool found = false;
      for (int32_t id = fake_vocab::kBegin; id <= fake_vocab::kEndTool; ++id) {
        const char* s = fake_vocab::special_text(id);
        size_t len = std::strlen(s);
        if (text.substr(i, len) == s) {
          ids.push_back(id);
          i += len;
          found = true;
          break;
        }
      }
      if (found) continue;
    }
    ids.push_back(static_cast<unsigned char>(text[i]));
    ++i;
  }
  return ids;
}

std::string decode_bytes(std::span<const int32_t> ids, bool skip_special) {
  std::string out;
  for (int32_t id : ids) {
    if (id >= 0 && id < 256) out.push_back(char(id));
    else if (const char* s = fake_vocab::special_text(id); s && !skip_special) out += s;
  }
  return out;
}

}  // namespace fake

namespace {

using namespace fake_vocab;

// Text of an OpenAI/Anthropic content value: strings as is, text parts joined,
// other parts as a placeholder.
std::string content_text(const Json* content) {
  if (!content || content->is_null()) return "";
  if (content->is_string()) return content->as_string();
  std::string out;
  if (content->is_array()) {
    for (const auto& part : content->as_array()) {
      std::string type = part.get_string("type", "");
      if (type == "text") out += part.get_string("text", "");
      else if (type == "tool_result") out += "[tool_result] " + content_text(part.find("content"));
      else if (type == "tool_use") out += "[tool_use] " + part.get_string("name", "");
      else if (type == "thinking") out += "";
      else out += "<" + type + ">";
    }
  }
  return out;
}

// Parses the fake framing from the text (markers spelled out, since chat
// requests keep special tokens), holding back a tail that may still become a
// marker, as the real Muse parser must. Reasoning tokens are counted on ids.
class FakeOutputParser : public OutputParser {
 public:
  explicit FakeOutputParser(bool tools_enabled) : tools_(tools_enabled) {}

  void feed(std::span<const int32_t> ids, std::string_view text, ParsedDelta& out) override {
    for (int32_t id : ids) {
      if (id == kThink) in_think_ids_ = true;
      else if (id == kEndThink) in_think_ids_ = false;
      else if (in_think_ids_) ++out.reasoning_tokens;
    }
    buf_.append(text);
    size_t i = 0;
    while (i < buf_.size()) {
      size_t lt = buf_.find("<|", i);
      if (lt == std::string::npos) {
        // A lone trailing '<' may start a marker.
        size_t end = buf_.back() == '<' ? buf_.size() - 1 : buf_.size();
        emit(buf_.substr(i, end - i), out);
        i = end;
        break;
      }
      emit(buf_.substr(i, lt - i), out);
      i = lt;
      int32_t marker = -1;
      bool partial = false;
      for (int32_t id = kThink; id <= kEndTool; ++id) {
        std::string_view m = special_text(id);
        std::string_view rest = std::string_view(buf_).substr(i);
        if (rest.starts_with(m)) { marker = id; break; }
        if (m.starts_with(rest)) partial = true;
      }
      if (marker >= 0) {
        on_marker(marker);
        i += std::strlen(special_text(marker));
      } else if (partial) {
        break;  // wait for more text
      } else {
        emit("<|", out);
        i += 2;
      }
    }
    buf_.erase(0, i);
  }

  void finish(FinishReason, ParsedDelta& out) override {
    emit(buf_, out);
    buf_.clear();
  }

 private:
  enum class State { Content, Reasoning, ToolName, ToolArgs };

  void on_marker(int32_t id) {
    if (id == kThink) state_ = State::Reasoning;
    else if (id == kEndThink) state_ = State::Content;
    else if (id == kTool) { state_ = State::ToolName; name_.clear(); }
    else if (id == kEndTool) {
      if (state_ == State::ToolArgs && tools_) ++tool_index_;
      state_ = State::Content;
    }
  }

  void emit(std::string_view text, ParsedDelta& out) {
    if (text.empty()) return;
    switch (state_) {
      case State::Reasoning: out.reasoning += text; break;
      case State::Content: out.content += text; break;
      case State::ToolName: {
        size_t nl = text.find('\n');
        name_ += text.substr(0, nl);
        if (nl == std::string_view::npos) break;
        state_ = State::ToolArgs;
        if (tools_) out.tool_calls.push_back({tool_index_, name_, ""});
        else out.content += name_ + "\n";
        emit(text.substr(nl + 1), out);
        break;
      }
      case State::ToolArgs:
        if (!tools_) out.content += text;
        else if (!out.tool_calls.empty() && out.tool_calls.back().index == tool_index_) out.tool_calls.back().arguments += text;
        else out.tool_calls.push_back({tool_index_, "", std::string(text)});
        break;
    }
  }

  bool tools_;
  State state_ = State::Content;
  bool in_think_ids_ = false;
  std::string buf_, name_;
  int tool_index_ = 0;
};

class FakeModelAdapter : public ModelAdapter {
 public:
  explicit FakeModelAdapter(const FakeModelOptions& o) {
    info_.max_model_len = o.max_model_len;
    info_.vocab_size = kSize;
    info_.eos_token_ids = {kEot};
    info_.supports_structured_output = false;
    info_.supports_forced_tool_choice = true;
    info_.supports_prompt_logprobs = true;
  }
  const ModelInfo& info() const override { return info_; }

  Result<std::vector<int32_t>> tokenize(std::string_view text, bool add_special_tokens) const override {
    std::vector<int32_t> ids;
    if (add_special_tokens) ids.push_back(kBegin);
    auto body = fake::encode(text, /*parse_specials=*/false);
    ids.insert(ids.end(), body.begin(), body.end());
    return ids;
  }

  Result<std::string> detokenize(std::span<const int32_t> ids, bool skip_special) const override {
    for (int32_t id : ids)
      if (id < 0 || id >= kSize) return make_error("token id " + std::to_string(id) + " is out of range [0, " + std::to_string(kSize) + ")");
    return fake::decode_bytes(ids, skip_special);
  }

  Result<RenderedPrompt> render_chat(const Json& request, ChatApi api) const override {
    std::string text = special_text(kBegin);
    if (const Json* kwargs = request.find("chat_template_kwargs"); kwargs && kwargs->contains("raise_exception"))
      return make_error(kwargs->get_string("raise_exception", "template error"));
    const Json* tools = request.find("tools");
    if (tools && tools->is_array() && !tools->as_array().empty()) {
      // One line with each tool's name and parameter schema (the fake model
      // reads it back to invent arguments).
      Json compact = Json::array();
      for (const auto& t : tools->as_array()) {
        const Json* fn = api == ChatApi::OpenAI ? t.find("function") : &t;
        if (!fn) continue;
        const Json* params = fn->find(api == ChatApi::OpenAI ? "parameters" : "input_schema");
        Json entry = Json::object();
        entry.set("name", fn->get_string("name", ""));
        entry.set("parameters", params ? *params : Json::object());
        compact.push_back(std::move(entry));
      }
      text += "[tools] " + compact.dump() + "\n";
    }
    std::string choice = "auto";
    if (const Json* tc = request.find("tool_choice")) {
      if (tc->is_string()) choice = tc->as_string();
      else if (tc->is_object()) {
        std::string type = tc->get_string("type", "");
        if (type == "function") choice = "name:" + (tc->find("function") ? tc->find("function")->get_string("name", "") : "");
        else if (type == "tool") choice = "name:" + tc->get_string("name", "");
        else if (type == "any") choice = "required";
        else choice = type;
      }
    }
    text += "[tool_choice] " + choice + "\n";
    std::string effort = request.get_string("reasoning_effort", "");
    if (const Json* oc = request.find("output_config")) effort = oc->get_string("effort", effort);
    if (!effort.empty()) text += "[effort] " + effort + "\n";
    if (api == ChatApi::Anthropic) {
      if (const Json* sys = request.find("system")) text += "[system] " + content_text(sys) + "\n";
    }
    if (const Json* messages = request.find("messages"); messages && messages->is_array()) {
      for (const auto& m : messages->as_array()) {
        text += "[" + m.get_string("role", "?") + "] " + content_text(m.find("content"));
        if (const Json* calls = m.find("tool_calls"); calls && calls->is_array())
          for (const auto& c : calls->as_array())
            if (const Json* fn = c.find("function")) text += " call " + fn->get_string("name", "");
        text += "\n";
      }
    }
    text += "[assistant]";
    return RenderedPrompt{text, fake::encode(text, /*parse_specials=*/true)};
  }

  std::unique_ptr<OutputParser> make_output_parser(const ParserOptions& options) const override {
    return std::make_unique<FakeOutputParser>(options.tools_enabled);
  }

 private:
  ModelInfo info_;
};

}  // namespace

ServeBackend make_fake_backend(const FakeModelOptions& options) {
  ServeBackend b;
  b.adapter = std::make_shared<FakeModelAdapter>(options);
  b.service = fake::make_fake_engine(options);
  return b;
}

}  // namespace muse::server
