// Anthropic Messages responses: a message object, or the event stream
// message_start, content_block_start/delta/stop (thinking, text, tool_use with
// input_json_delta), message_delta, message_stop.
#include "muse/server/response_writer.h"

namespace muse::server {
namespace {

std::string stop_reason_of(const FinishInfo& f) {
  if (f.reason == "tool_calls") return "tool_use";
  if (f.reason == "length") return "max_tokens";
  if (f.reason == "stop" && f.stop_reason.is_string()) return "stop_sequence";
  return "end_turn";
}

class MessagesWriter : public ResponseWriter {
 public:
  explicit MessagesWriter(const WriterOptions& o) : opt_(o) {}

  std::string stream_start() override {
    Json message = Json::object();
    message.set("id", opt_.id);
    message.set("type", "message");
    message.set("role", "assistant");
    message.set("model", opt_.model);
    message.set("content", Json::array());
    message.set("stop_reason", Json());
    message.set("stop_sequence", Json());
    Json usage = Json::object();
    usage.set("input_tokens", opt_.prompt_tokens);
    usage.set("output_tokens", 0);
    message.set("usage", std::move(usage));
    Json e = Json::object();
    e.set("type", "message_start");
    e.set("message", std::move(message));
    return event("message_start", e);
  }

  std::string stream_delta(int, const ChoiceDelta& d, const UsageInfo&) override {
    std::string out;
    if (!d.reasoning.empty() && opt_.include_reasoning) {
      if (open_ != Block::Thinking) {
        Json b = Json::object();
        b.set("type", "thinking");
        b.set("thinking", "");
        b.set("signature", "");
        out += open_block(Block::Thinking, std::move(b));
      }
      Json delta = Json::object();
      delta.set("type", "thinking_delta");
      delta.set("thinking", d.reasoning);
      out += block_delta(std::move(delta));
    }
    if (!d.content.empty()) {
      if (open_ != Block::Text) {
        Json b = Json::object();
        b.set("type", "text");
        b.set("text", "");
        out += open_block(Block::Text, std::move(b));
      }
      Json delta = Json::object();
      delta.set("type", "text_delta");
      delta.set("text", d.content);
      out += block_delta(std::move(delta));
    }
    for (const auto& tc : d.tool_calls) {
      if (!tc.name.empty()) {
        Json b = Json::object();
        b.set("type", "tool_use");
        b.set("id", tc.id);
        b.set("name", tc.name);
        b.set("input", Json::object());
        out += open_block(Block::ToolUse, std::move(b));
      }
      if (!tc.arguments.empty() && open_ == Block::ToolUse) {
        Json delta = Json::object();
        delta.set("type", "input_json_delta");
        delta.set("partial_json", tc.arguments);
        out += block_delta(std::move(delta));
      }
    }
    return out;
  }

  std::string stream_finish(int, const FinishInfo& f) override {
    finish_ = f;
    return close_block();
  }

  std::string stream_end(const UsageInfo& u) override {
    Json delta = Json::object();
    delta.set("stop_reason", stop_reason_of(finish_));
    delta.set("stop_sequence", finish_.stop_reason.is_string() ? finish_.stop_reason : Json());
    // Anthropic's meaning: input_tokens are the ones not read from the cache
    // (message_start, sent before scheduling, gives the whole prompt).
    Json usage = Json::object();
    usage.set("input_tokens", u.prompt_tokens - u.cached_tokens);
    usage.set("cache_read_input_tokens", u.cached_tokens);
    usage.set("output_tokens", u.completion_tokens);
    Json e = Json::object();
    e.set("type", "message_delta");
    e.set("delta", std::move(delta));
    e.set("usage", std::move(usage));
    Json stop = Json::object();
    stop.set("type", "message_stop");
    return event("message_delta", e) + event("message_stop", stop);
  }

  std::string stream_error(const ApiError& e) override { return close_block() + sse_frame(anthropic_error_body(e), "error"); }
  std::string keepalive() override { return sse_frame("{\"type\": \"ping\"}", "ping"); }

  void add(int, const ChoiceDelta& d) override {
    if (!d.reasoning.empty() && opt_.include_reasoning) {
      if (blocks_.empty() || blocks_.back().kind != Block::Thinking) blocks_.push_back({Block::Thinking});
      blocks_.back().text += d.reasoning;
    }
    if (!d.content.empty()) {
      if (blocks_.empty() || blocks_.back().kind != Block::Text) blocks_.push_back({Block::Text});
      blocks_.back().text += d.content;
    }
    for (const auto& tc : d.tool_calls) {
      if (!tc.name.empty()) blocks_.push_back({Block::ToolUse, "", tc.id, tc.name, tc.index});
      for (auto& b : blocks_)
        if (b.kind == Block::ToolUse && b.index == tc.index) b.text += tc.arguments;
    }
  }

  void finish(int, const FinishInfo& f) override { finish_ = f; }

  std::string body(const UsageInfo& u) override {
    Json content = Json::array();
    for (const auto& b : blocks_) {
      Json j = Json::object();
      if (b.kind == Block::Thinking) {
        j.set("type", "thinking");
        j.set("thinking", b.text);
        j.set("signature", "");
      } else if (b.kind == Block::Text) {
        j.set("type", "text");
        j.set("text", b.text);
      } else {
        j.set("type", "tool_use");
        j.set("id", b.id);
        j.set("name", b.name);
        auto input = Json::parse(b.text.empty() ? "{}" : b.text);
        j.set("input", input.ok() && input->is_object() ? *input : Json::object());
      }
      content.push_back(std::move(j));
    }
    // Anthropic's meaning: input_tokens + cache_read_input_tokens = the prompt.
    Json usage = Json::object();
    usage.set("input_tokens", u.prompt_tokens - u.cached_tokens);
    usage.set("output_tokens", u.completion_tokens);
    usage.set("cache_read_input_tokens", u.cached_tokens);
    Json r = Json::object();
    r.set("id", opt_.id);
    r.set("type", "message");
    r.set("role", "assistant");
    r.set("model", opt_.model);
    r.set("content", std::move(content));
    r.set("stop_reason", stop_reason_of(finish_));
    r.set("stop_sequence", finish_.stop_reason.is_string() ? finish_.stop_reason : Json());
    r.set("usage", std::move(usage));
    return r.dump();
  }

 private:
  enum class Block { None, Thinking, Text, ToolUse };
  struct WholeBlock {
    Block kind;
    std::string text, id, name;
    int index = 0;
  };

  static std::string event(const char* name, const Json& data) { return sse_frame(data.dump(), name); }

  std::string open_block(Block kind, Json block) {
    std::string out = close_block();
    open_ = kind;
    Json e = Json::object();
    e.set("type", "content_block_start");
    e.set("index", index_);
    e.set("content_block", std::move(block));
    return out + event("content_block_start", e);
  }

  std::string block_delta(Json delta) {
    Json e = Json::object();
    e.set("type", "content_block_delta");
    e.set("index", index_);
    e.set("delta", std::move(delta));
    return event("content_block_delta", e);
  }

  std::string close_block() {
    if (open_ == Block::None) return "";
    Json e = Json::object();
    e.set("type", "content_block_stop");
    e.set("index", index_);
    open_ = Block::None;
    ++index_;
    return event("content_block_stop", e);
  }

  WriterOptions opt_;
  Block open_ = Block::None;
  int index_ = 0;
  FinishInfo finish_{"stop", Json()};
  std::vector<WholeBlock> blocks_;
};

}  // namespace

std::unique_ptr<ResponseWriter> make_messages_writer(const WriterOptions& options) {
  return std::make_unique<MessagesWriter>(options);
}

}  // namespace muse::server
