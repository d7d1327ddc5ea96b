// OpenAI Responses API responses: a response object whose `output` holds
// reasoning, message and function_call items, or the typed event stream
// (response.created, response.in_progress, response.output_item.added,
// response.content_part.added, response.reasoning_text.delta /
// response.output_text.delta / response.function_call_arguments.delta, the
// matching .done events, then response.completed or response.incomplete),
// every event with its sequence_number. One choice (Responses has no n).
#include "muse/server/response_writer.h"

#include "muse/server/api_request.h"

namespace muse::server {
namespace {

class ResponsesWriter : public ResponseWriter {
 public:
  explicit ResponsesWriter(const WriterOptions& o) : opt_(o) {}

  std::string stream_start() override {
    std::string out = event("response.created", "response", response_json("in_progress", nullptr));
    return out + event("response.in_progress", "response", response_json("in_progress", nullptr));
  }

  std::string stream_delta(int, const ChoiceDelta& d, const UsageInfo&) override {
    std::string out;
    if (!d.reasoning.empty() && opt_.include_reasoning) {
      if (!open() || open()->kind != Kind::Reasoning) out += open_item(Kind::Reasoning);
      open()->text += d.reasoning;
      out += text_delta("response.reasoning_text.delta", d.reasoning);
    }
    if (!d.content.empty()) {
      if (!open() || open()->kind != Kind::Message) out += open_item(Kind::Message);
      open()->text += d.content;
      out += text_delta("response.output_text.delta", d.content);
    }
    for (const auto& tc : d.tool_calls) {
      if (!tc.name.empty()) {
        out += open_item(Kind::FunctionCall, tc.id, tc.name, tc.index);
      }
      Item* it = find_call(tc.index);
      if (!it || tc.arguments.empty()) continue;
      it->text += tc.arguments;
      if (it == open()) out += text_delta("response.function_call_arguments.delta", tc.arguments);
    }
    return out;
  }

  std::string stream_finish(int, const FinishInfo& f) override {
    finish_ = f;
    return close_item();
  }

  std::string stream_end(const UsageInfo& u) override {
    const bool incomplete = finish_.reason == "length";
    return event(incomplete ? "response.incomplete" : "response.completed", "response",
                 response_json(status(), &u));
  }

  std::string stream_error(const ApiError& e) override {
    std::string out = close_item();
    Json j = Json::object();
    j.set("code", e.code.empty() ? Json() : Json(e.code));
    j.set("message", e.message);
    j.set("param", e.param.empty() ? Json() : Json(e.param));
    return out + event("error", std::move(j));
  }

  std::string keepalive() override { return ": keep-alive\n\n"; }

  // The whole response goes through the same item bookkeeping, with the
  // events not built (emit_ off).
  void add(int choice, const ChoiceDelta& d) override {
    emit_ = false;
    (void)stream_delta(choice, d, {});
  }
  void finish(int choice, const FinishInfo& f) override {
    emit_ = false;
    (void)stream_finish(choice, f);
  }
  std::string body(const UsageInfo& u) override { return response_json(status(), &u).dump(); }

 private:
  enum class Kind { Reasoning, Message, FunctionCall };
  struct Item {
    Kind kind;
    std::string id, call_id, name, text;
    int index = -1;  // tool-call index
    bool done = false;
  };

  std::string status() const {
    if (finish_.reason == "length") return "incomplete";
    if (finish_.reason == "error") return "failed";
    if (finish_.reason == "abort") return "cancelled";
    return "completed";
  }

  Item* find_call(int index) {
    for (auto& it : items_)
      if (it.kind == Kind::FunctionCall && it.index == index) return &it;
    return nullptr;
  }

  int output_index(const Item* it) const { return int(it - items_.data()); }

  Json part_json(const Item& it) const {
    Json p = Json::object();
    if (it.kind == Kind::Reasoning) {
      p.set("type", "reasoning_text");
      p.set("text", it.done ? it.text : "");
    } else {
      p.set("type", "output_text");
      p.set("text", it.done ? it.text : "");
      p.set("annotations", Json::array());
      p.set("logprobs", Json::array());
    }
    return p;
  }

  Json item_json(const Item& it) const {
    Json j = Json::object();
    j.set("id", it.id);
    switch (it.kind) {
      case Kind::Reasoning: {
        j.set("type", "reasoning");
        j.set("summary", Json::array());
        Json content = Json::array();
        if (it.done) content.push_back(part_json(it));
        j.set("content", std::move(content));
        break;
      }
      case Kind::Message: {
        j.set("type", "message");
        j.set("role", "assistant");
        Json content = Json::array();
        if (it.done) content.push_back(part_json(it));
        j.set("content", std::move(content));
        break;
      }
      case Kind::FunctionCall:
        j.set("type", "function_call");
        j.set("call_id", it.call_id);
        j.set("name", it.name);
        j.set("arguments", it.done ? it.text : "");
        break;
    }
    j.set("status", it.done ? "completed" : "in_progress");
    return j;
  }

  Json response_json(const std::string& st, const UsageInfo* u) const {
    Json r = Json::object();
    r.set("id", opt_.id);
    r.set("object", "response");
    r.set("created_at", opt_.created);
    r.set("status", st);
    r.set("error", Json());
    Json incomplete;
    if (st == "incomplete") {
      incomplete = Json::object();
      incomplete.set("reason", "max_output_tokens");
    }
    r.set("incomplete_details", std::move(incomplete));
    r.set("model", opt_.model);
    Json output = Json::array();
    if (u)
      for (const auto& it : items_) output.push_back(item_json(it));
    r.set("output", std::move(output));
    r.set("parallel_tool_calls", true);
    r.set("store", false);  // nothing is stored: GET /v1/responses/{id} is 404
    if (u) {
      Json usage = Json::object();
      usage.set("input_tokens", u->prompt_tokens);
      Json in = Json::object();
      in.set("cached_tokens", u->cached_tokens);
      usage.set("input_tokens_details", std::move(in));
      usage.set("output_tokens", u->completion_tokens);
      Json outd = Json::object();
      outd.set("reasoning_tokens", u->reasoning_tokens);
      usage.set("output_tokens_details", std::move(outd));
      usage.set("total_tokens", u->prompt_tokens + u->completion_tokens);
      r.set("usage", std::move(usage));
    } else {
      r.set("usage", Json());
    }
    return r;
  }

  // One SSE event: type and sequence_number, then `fields`.
  std::string event(const char* type, Json fields) {
    if (!emit_) return {};
    Json j = Json::object();
    j.set("type", type);
    j.set("sequence_number", seq_++);
    for (const auto& [k, v] : fields.as_object()) j.set(k, v);
    return sse_frame(j.dump(), type);
  }

  std::string event(const char* type, const char* key, Json value) {
    Json fields = Json::object();
    fields.set(key, std::move(value));
    return event(type, std::move(fields));
  }

  // An event about one item's content: output_index, item_id (and
  // content_index for text), then `extra`.
  std::string item_event(const char* type, const Item& it, Json extra) {
    Json j = Json::object();
    j.set("output_index", output_index(&it));
    j.set("item_id", it.id);
    if (it.kind != Kind::FunctionCall) j.set("content_index", 0);
    for (const auto& [k, v] : extra.as_object()) j.set(k, v);
    return event(type, std::move(j));
  }

  // output_item.added / .done: output_index and the item as it stands.
  std::string item_state_event(const char* type, const Item& it) {
    if (!emit_) return {};
    Json j = Json::object();
    j.set("output_index", output_index(&it));
    j.set("item", item_json(it));
    return event(type, std::move(j));
  }

  std::string text_delta(const char* type, const std::string& delta) {
    if (!emit_) return {};
    Json extra = Json::object();
    extra.set("delta", delta);
    if (open()->kind == Kind::Message) extra.set("logprobs", Json::array());
    return item_event(type, *open(), std::move(extra));
  }

  std::string open_item(Kind kind, const std::string& call_id = "", const std::string& name = "", int index = -1) {
    std::string out = close_item();
    const char* prefix = kind == Kind::Reasoning ? "rs_" : kind == Kind::Message ? "msg_" : "fc_";
    items_.push_back(Item{kind, prefix + opt_.id.substr(opt_.id.find('_') + 1) + "_" + std::to_string(items_.size()),
                          call_id, name, "", index, false});
    open_ = int(items_.size()) - 1;
    if (!emit_) return out;
    out += item_state_event("response.output_item.added", *open());
    if (kind != Kind::FunctionCall) {
      Json extra = Json::object();
      extra.set("part", part_json(*open()));
      out += item_event("response.content_part.added", *open(), std::move(extra));
    }
    return out;
  }

  std::string close_item() {
    if (!open()) return "";
    Item& it = *open();
    open_ = -1;
    it.done = true;
    if (!emit_) return {};
    std::string out;
    Json extra = Json::object();
    if (it.kind == Kind::FunctionCall) {
      extra.set("arguments", it.text);
      out += item_event("response.function_call_arguments.done", it, std::move(extra));
    } else {
      extra.set("text", it.text);
      if (it.kind == Kind::Message) extra.set("logprobs", Json::array());
      out += item_event(it.kind == Kind::Reasoning ? "response.reasoning_text.done" : "response.output_text.done", it,
                        std::move(extra));
      Json part = Json::object();
      part.set("part", part_json(it));
      out += item_event("response.content_part.done", it, std::move(part));
    }
    return out + item_state_event("response.output_item.done", it);
  }

  Item* open() { return open_ >= 0 ? &items_[size_t(open_)] : nullptr; }

  WriterOptions opt_;
  std::vector<Item> items_;
  int open_ = -1;  // the item receiving deltas
  bool emit_ = true;  // false for a whole (non-streamed) response
  int64_t seq_ = 0;
  FinishInfo finish_{"stop", Json()};
};

}  // namespace

std::unique_ptr<ResponseWriter> make_responses_writer(const WriterOptions& options) {
  return std::make_unique<ResponsesWriter>(options);
}

}  // namespace muse::server
