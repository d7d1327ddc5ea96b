// OpenAI chat completions and completions, whole and streamed (server-api.md §3).
#include <cmath>

#include "muse/server/response_writer.h"

namespace muse::server {

std::string sse_frame(std::string_view json, std::string_view event) {
  std::string out;
  out.reserve(json.size() + 16 + event.size());
  if (!event.empty()) out.append("event: ").append(event).append("\n");
  out.append("data: ").append(json).append("\n\n");
  return out;
}

std::string sanitize_utf8(std::string_view s) {
  std::string out;
  size_t i = 0;
  while (i < s.size()) {
    size_t bad = find_invalid_utf8(s.substr(i));
    if (bad == std::string_view::npos) {
      out.append(s.substr(i));
      break;
    }
    out.append(s.substr(i, bad));
    out.append("\xEF\xBF\xBD");
    i += bad + 1;
  }
  return out;
}

namespace {

Json bytes_of(const std::string& s) {
  Json arr = Json::array();
  for (unsigned char c : s) arr.push_back(int(c));
  return arr;
}

}  // namespace

Json chat_logprob_entry(const TokenLogprob& lp) {
  Json e = Json::object();
  e.set("token", sanitize_utf8(lp.token));
  e.set("logprob", lp.logprob);
  e.set("bytes", bytes_of(lp.token));
  Json top = Json::array();
  for (const auto& t : lp.top) {
    Json o = Json::object();
    o.set("token", sanitize_utf8(t.token));
    o.set("logprob", t.logprob);
    o.set("bytes", bytes_of(t.token));
    top.push_back(std::move(o));
  }
  e.set("top_logprobs", std::move(top));
  return e;
}

namespace {

Json usage_json(const UsageInfo& u, bool details) {
  Json j = Json::object();
  j.set("prompt_tokens", u.prompt_tokens);
  j.set("completion_tokens", u.completion_tokens);
  j.set("total_tokens", u.prompt_tokens + u.completion_tokens);
  if (details) {
    Json p = Json::object();
    p.set("cached_tokens", u.cached_tokens);
    j.set("prompt_tokens_details", std::move(p));
    Json c = Json::object();
    c.set("reasoning_tokens", u.reasoning_tokens);
    j.set("completion_tokens_details", std::move(c));
  }
  return j;
}

// The whole (non-streamed) response body of both endpoints.
std::string whole_body(const WriterOptions& o, const char* object, Json choices, const UsageInfo& u) {
  Json r = Json::object();
  r.set("id", o.id);
  r.set("object", object);
  r.set("created", o.created);
  r.set("model", o.model);
  r.set("choices", std::move(choices));
  r.set("usage", usage_json(u, true));
  r.set("system_fingerprint", Json());
  return r.dump();
}

// Shared chunk envelope and usage rules of both OpenAI streams.
class OpenAIStream {
 protected:
  explicit OpenAIStream(const WriterOptions& o, const char* object) : opt_(o), object_(object) {}

  Json chunk(Json choices, const UsageInfo* usage_so_far) const {
    Json c = Json::object();
    c.set("id", opt_.id);
    c.set("object", object_);
    c.set("created", opt_.created);
    c.set("model", opt_.model);
    c.set("choices", std::move(choices));
    if (opt_.include_usage)
      c.set("usage", opt_.continuous_usage && usage_so_far ? usage_json(*usage_so_far, false) : Json());
    return c;
  }
  std::string frame(const Json& j) const { return sse_frame(j.dump()); }
  std::string end_frames(const UsageInfo& u) const {
    std::string out;
    if (opt_.include_usage) {
      Json c = Json::object();
      c.set("id", opt_.id);
      c.set("object", object_);
      c.set("created", opt_.created);
      c.set("model", opt_.model);
      c.set("choices", Json::array());
      c.set("usage", usage_json(u, true));
      out += frame(c);
    }
    return out + "data: [DONE]\n\n";
  }
  std::string error_frames(const ApiError& e) const { return sse_frame(openai_error_body(e)) + "data: [DONE]\n\n"; }

  WriterOptions opt_;
  const char* object_;
};

class ChatWriter : public ResponseWriter, OpenAIStream {
 public:
  explicit ChatWriter(const WriterOptions& o) : OpenAIStream(o, "chat.completion.chunk"), choices_(size_t(o.choices)) {}

  std::string stream_start() override {
    std::string out;
    for (int i = 0; i < opt_.choices; ++i) {
      Json delta = Json::object();
      delta.set("role", "assistant");
      delta.set("content", "");
      out += frame(chunk(one_choice(i, std::move(delta), Json(), Json(), false), nullptr));
    }
    return out;
  }

  std::string stream_delta(int i, const ChoiceDelta& d, const UsageInfo& so_far) override {
    std::string out;
    Json delta = Json::object();
    if (!d.reasoning.empty() && opt_.include_reasoning) set_reasoning(delta, Json(d.reasoning));
    if (!d.content.empty()) delta.set("content", d.content);
    Json logprobs = d.logprobs.empty() ? Json() : logprobs_json(d.logprobs);
    // A call's id/type/name go out once, in their own chunk with empty
    // arguments; the argument fragments follow (server-api.md §3.2).
    std::vector<const ToolCallOut*> fragments;
    for (const auto& tc : d.tool_calls) {
      if (!tc.name.empty()) {
        if (delta.size() || !logprobs.is_null()) {
          out += frame(chunk(one_choice(i, std::move(delta), logprobs, Json(), true), &so_far));
          delta = Json::object();
          logprobs = Json();
        }
        Json fn = Json::object();
        fn.set("name", tc.name);
        fn.set("arguments", "");
        Json call = Json::object();
        call.set("index", tc.index);
        call.set("id", tc.id);
        call.set("type", "function");
        call.set("function", std::move(fn));
        Json calls = Json::array();
        calls.push_back(std::move(call));
        Json head = Json::object();
        head.set("tool_calls", std::move(calls));
        out += frame(chunk(one_choice(i, std::move(head), Json(), Json(), true), &so_far));
      }
      if (!tc.arguments.empty()) fragments.push_back(&tc);
    }
    if (!fragments.empty()) {
      Json calls = Json::array();
      for (const auto* tc : fragments) {
        Json fn = Json::object();
        fn.set("arguments", tc->arguments);
        Json call = Json::object();
        call.set("index", tc->index);
        call.set("function", std::move(fn));
        calls.push_back(std::move(call));
      }
      delta.set("tool_calls", std::move(calls));
    }
    if (delta.size() || !logprobs.is_null()) out += frame(chunk(one_choice(i, std::move(delta), logprobs, Json(), true), &so_far));
    return out;
  }

  std::string stream_finish(int i, const FinishInfo& f) override {
    Json c = one_choice(i, Json::object(), Json(), Json(f.reason), true);
    c.as_array()[0].set("stop_reason", f.stop_reason);
    return frame(chunk(std::move(c), nullptr));
  }

  std::string stream_end(const UsageInfo& u) override { return end_frames(u); }
  std::string stream_error(const ApiError& e) override { return error_frames(e); }
  std::string keepalive() override { return ": keep-alive\n\n"; }

  void add(int i, const ChoiceDelta& d) override {
    auto& c = choices_[size_t(i)];
    c.reasoning += d.reasoning;
    c.content += d.content;
    for (const auto& tc : d.tool_calls) {
      if (!tc.name.empty()) c.calls.push_back({tc.index, tc.id, tc.name, ""});
      for (auto& call : c.calls)
        if (call.index == tc.index) call.arguments += tc.arguments;
    }
    for (const auto& lp : d.logprobs) c.logprobs.push_back(lp);
    c.want_logprobs |= !d.logprobs.empty();
  }

  void finish(int i, const FinishInfo& f) override { choices_[size_t(i)].finish = f; }

  std::string body(const UsageInfo& u) override {
    Json choices = Json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      auto& c = choices_[i];
      Json msg = Json::object();
      msg.set("role", "assistant");
      msg.set("content", c.content.empty() && !c.calls.empty() ? Json() : Json(c.content));
      if (opt_.include_reasoning) set_reasoning(msg, c.reasoning.empty() ? Json() : Json(c.reasoning));
      if (!c.calls.empty()) {
        Json calls = Json::array();
        for (const auto& call : c.calls) {
          Json fn = Json::object();
          fn.set("name", call.name);
          fn.set("arguments", call.arguments);
          Json j = Json::object();
          j.set("id", call.id);
          j.set("type", "function");
          j.set("function", std::move(fn));
          calls.push_back(std::move(j));
        }
        msg.set("tool_calls", std::move(calls));
      }
      Json choice = Json::object();
      choice.set("index", int(i));
      choice.set("message", std::move(msg));
      choice.set("logprobs", c.want_logprobs ? logprobs_json(c.logprobs) : Json());
      choice.set("finish_reason", c.finish.reason);
      choice.set("stop_reason", c.finish.stop_reason);
      choices.push_back(std::move(choice));
    }
    return whole_body(opt_, "chat.completion", std::move(choices), u);
  }

 private:
  struct Choice {
    std::string reasoning, content;
    std::vector<ToolCallOut> calls;
    std::vector<TokenLogprob> logprobs;
    bool want_logprobs = false;
    FinishInfo finish;
  };

  void set_reasoning(Json& obj, Json value) const {
    if (opt_.reasoning_fields != ReasoningFields::ReasoningContent) obj.set("reasoning", value);
    if (opt_.reasoning_fields != ReasoningFields::Reasoning) obj.set("reasoning_content", std::move(value));
  }

  static Json logprobs_json(const std::vector<TokenLogprob>& lps) {
    Json content = Json::array();
    for (const auto& lp : lps) content.push_back(chat_logprob_entry(lp));
    Json j = Json::object();
    j.set("content", std::move(content));
    return j;
  }

  static Json one_choice(int i, Json delta, Json logprobs, Json finish_reason, bool) {
    Json c = Json::object();
    c.set("index", i);
    c.set("delta", std::move(delta));
    c.set("logprobs", std::move(logprobs));
    c.set("finish_reason", std::move(finish_reason));
    Json arr = Json::array();
    arr.push_back(std::move(c));
    return arr;
  }

  std::vector<Choice> choices_;
};

class CompletionWriter : public ResponseWriter, OpenAIStream {
 public:
  explicit CompletionWriter(const WriterOptions& o) : OpenAIStream(o, "text_completion"), choices_(size_t(o.choices)) {}

  std::string stream_start() override { return ""; }

  std::string stream_delta(int i, const ChoiceDelta& d, const UsageInfo& so_far) override {
    auto& c = choices_[size_t(i)];
    std::string text = d.echo_text + d.text;
    Json logprobs = Json();
    if (!d.logprobs.empty() || !d.prompt_logprobs.empty()) {
      Logprobs lp;
      append_logprobs(lp, d, c.offset);
      logprobs = lp.json();
    }
    if (text.empty() && logprobs.is_null()) return "";
    return frame(chunk(one_choice(i, text, std::move(logprobs), Json(), Json()), &so_far));
  }

  std::string stream_finish(int i, const FinishInfo& f) override {
    return frame(chunk(one_choice(i, "", Json(), Json(f.reason), f.stop_reason), nullptr));
  }

  std::string stream_end(const UsageInfo& u) override { return end_frames(u); }
  std::string stream_error(const ApiError& e) override { return error_frames(e); }
  std::string keepalive() override { return ": keep-alive\n\n"; }

  void add(int i, const ChoiceDelta& d) override {
    auto& c = choices_[size_t(i)];
    if (!d.logprobs.empty() || !d.prompt_logprobs.empty()) {
      c.want_logprobs = true;
      append_logprobs(c.lp, d, c.offset);
    }
    c.text += d.echo_text + d.text;
  }

  void finish(int i, const FinishInfo& f) override { choices_[size_t(i)].finish = f; }

  std::string body(const UsageInfo& u) override {
    Json choices = Json::array();
    for (size_t i = 0; i < choices_.size(); ++i) {
      auto& c = choices_[i];
      Json arr = one_choice(int(i), c.text, c.want_logprobs ? c.lp.json() : Json(), Json(c.finish.reason), c.finish.stop_reason);
      choices.push_back(std::move(arr.as_array()[0]));
    }
    return whole_body(opt_, "text_completion", std::move(choices), u);
  }

 private:
  // The legacy completions logprobs shape: parallel arrays.
  struct Logprobs {
    Json tokens = Json::array(), token_logprobs = Json::array(), top = Json::array(), offsets = Json::array();
    Json json() const {
      Json j = Json::object();
      j.set("text_offset", offsets);
      j.set("token_logprobs", token_logprobs);
      j.set("tokens", tokens);
      j.set("top_logprobs", top);
      return j;
    }
  };
  struct Choice {
    std::string text;
    int64_t offset = 0;  // text_offset of the next token: code points of the token texts so far
    Logprobs lp;
    bool want_logprobs = false;
    FinishInfo finish;
  };

  static int64_t codepoints(std::string_view s) {
    int64_t n = 0;
    for (unsigned char c : s) n += (c & 0xC0) != 0x80;
    return n;
  }

  static void append_one(Logprobs& lp, const TokenLogprob* t, int64_t& offset) {
    std::string token = sanitize_utf8(t->token);
    lp.offsets.push_back(offset);
    lp.tokens.push_back(token);
    lp.token_logprobs.push_back(std::isnan(t->logprob) ? Json() : Json(t->logprob));
    if (!t->top.empty()) {
      Json top = Json::object();
      for (const auto& alt : t->top) {
        std::string key = sanitize_utf8(alt.token);
        if (!top.find(key)) top.set(key, alt.logprob);
      }
      lp.top.push_back(std::move(top));
    } else {
      lp.top.push_back(Json());
    }
    offset += codepoints(token);
  }

  static void append_logprobs(Logprobs& lp, const ChoiceDelta& d, int64_t& offset) {
    for (const auto& p : d.prompt_logprobs) append_one(lp, &p, offset);
    for (const auto& t : d.logprobs) append_one(lp, &t, offset);
  }

  static Json one_choice(int i, const std::string& text, Json logprobs, Json finish_reason, Json stop_reason) {
    Json c = Json::object();
    c.set("index", i);
    c.set("text", text);
    c.set("logprobs", std::move(logprobs));
    c.set("finish_reason", std::move(finish_reason));
    c.set("stop_reason", std::move(stop_reason));
    Json arr = Json::array();
    arr.push_back(std::move(c));
    return arr;
  }

  std::vector<Choice> choices_;
};

}  // namespace

std::unique_ptr<ResponseWriter> make_chat_writer(const WriterOptions& options) { return std::make_unique<ChatWriter>(options); }
std::unique_ptr<ResponseWriter> make_completion_writer(const WriterOptions& options) {
  return std::make_unique<CompletionWriter>(options);
}

}  // namespace muse::server
