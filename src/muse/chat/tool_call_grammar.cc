#include "muse/chat/tool_call_grammar.h"

#include <bit>

#include "muse/chat/grammar_support.h"

namespace muse::chat {

using namespace detail;

namespace {

enum Phase : uint8_t {
  kLiteral,       // matching a fixed string (State::literal)
  kRecipient,     // header recipient, until <|message|>
  kReasoning,     // reasoning body, until <|eom|>
  kExpectStart,   // <|start|> of the next frame
  kParamOrEnd,    // another parameter, or the end of the call
  kParamName,     // a key, until '"'
  kValueText,     // free text until the closing tag (pos: how much of it matched)
  kValueNumber,   // number characters, then the closing tag
  kValueOptions,  // one of the parameter's values, then the closing tag
  kEndOfCall,     // <|eom|> (another call) or <|eot|>
  kDone,
};

enum Literal : uint8_t { kTo, kAssistantTo, kCallOpen, kParamOpen, kGt, kParamClose, kCallsClose };

}  // namespace

Result<ToolCallGrammar> ToolCallGrammar::make(const FramingFormat& f, const ToolSet& tools,
                                              const std::vector<std::string>& names, bool single_call) {
  ToolCallGrammar g;
  g.f_ = f;
  g.single_call_ = single_call;
  if (names.empty()) return make_error("a forced tool call needs at least one tool");
  if (f.param_close.empty() || f.param_close.find(f.param_close[0], 1) != std::string::npos)
    return make_error("the parameter closing tag must not repeat its first character");
  g.recipients_ = f.reasoning_recipients;
  g.reasoning_count_ = g.recipients_.size();
  if (g.reasoning_count_ + names.size() > kMaxOptions)
    return make_error("a forced tool call can choose among at most " + std::to_string(kMaxOptions - g.reasoning_count_) +
                      " tools; this request declares " + std::to_string(names.size()));
  for (const std::string& name : names) {
    if (!is_valid_tool_name(name)) return make_error("tool name '" + name + "' is not [A-Za-z0-9_.-]+");
    const ToolInfo* info = tools.find(name);
    if (!info) return make_error("no tool named '" + name + "' is declared");
    Tool t;
    t.name = name;
    t.call_open = f.calls_open + "\n" + f.invoke_open + " name=\"" + name + "\">\n";
    const Json* props = info->parameters.is_object() ? info->parameters.find("properties") : nullptr;
    if (!props || !props->is_object() || props->as_object().empty() || props->as_object().size() > kMaxOptions) {
      t.free_keys = true;
    } else {
      for (const auto& [key, schema] : props->as_object()) {
        Param p;
        p.name = key;
        const std::string type = schema.is_object() ? schema.get_string("type", "") : "";
        const Json* en = schema.is_object() ? schema.find("enum") : nullptr;
        bool strings = en && en->is_array() && !en->as_array().empty() && en->as_array().size() <= kMaxOptions;
        if (strings)
          for (const Json& v : en->as_array()) strings = strings && v.is_string();
        if (strings) {
          p.kind = Param::Kind::Options;
          for (const Json& v : en->as_array()) p.options.push_back(v.as_string());
        } else if (type == "boolean") {
          p.kind = Param::Kind::Options;
          p.options = {"true", "false"};
        } else if (type == "integer") {
          p.kind = Param::Kind::Integer;
        } else if (type == "number") {
          p.kind = Param::Kind::Number;
        }
        // A key with a quote could never be written (the tag ends at '"').
        if (key.empty() || key.find('"') != std::string::npos) return make_error("parameter name '" + key + "' cannot be written in ATEM");
        t.param_names.push_back(p.name);
        t.params.push_back(std::move(p));
      }
      if (const Json* req = info->parameters.find("required"); req && req->is_array())
        for (const Json& r : req->as_array())
          for (size_t i = 0; i < t.params.size(); ++i)
            if (r.is_string() && r.as_string() == t.params[i].name) t.required |= uint64_t(1) << i;
    }
    g.recipients_.push_back(name);
    g.tools_.push_back(std::move(t));
  }
  g.to_ = " " + f.recipient_prefix;
  g.assistant_to_ = f.assistant_role + " " + f.recipient_prefix;
  g.param_open_ = f.param_open + " name=\"";
  g.param_close_ = f.param_close + "\n";
  g.calls_close_ = f.invoke_close + "\n" + f.calls_close;
  return g;
}

ToolCallGrammar::State ToolCallGrammar::initial() const {
  State s;
  s.phase = kLiteral;
  s.literal = kTo;
  return s;
}

uint64_t ToolCallGrammar::recipient_candidates(const State& s) const {
  uint64_t names = all_bits(recipients_.size()) & ~all_bits(reasoning_count_);
  if (!s.reasoning_done && s.calls == 0) names |= all_bits(reasoning_count_);
  return names;
}

std::string_view ToolCallGrammar::literal(const State& s) const {
  switch (s.literal) {
    case kTo: return to_;
    case kAssistantTo: return assistant_to_;
    case kCallOpen: return tools_[size_t(s.tool)].call_open;
    case kParamOpen: return param_open_;
    case kGt: return ">";
    case kParamClose: return param_close_;
    case kCallsClose: return calls_close_;
  }
  return {};
}

void ToolCallGrammar::after_literal(State& s) const {
  s.pos = 0;
  switch (s.literal) {
    case kTo:
    case kAssistantTo:
      s.phase = kRecipient;
      s.candidates = recipient_candidates(s);
      return;
    case kCallOpen:
    case kParamClose:
      s.phase = kParamOrEnd;
      return;
    case kParamOpen: {
      const Tool& t = tools_[size_t(s.tool)];
      s.phase = kParamName;
      s.candidates = t.free_keys ? 0 : all_bits(t.params.size()) & ~s.seen;
      return;
    }
    case kGt: start_value(s); return;
    case kCallsClose: s.phase = kEndOfCall; return;
  }
}

void ToolCallGrammar::start_value(State& s) const {
  s.pos = 0;
  if (s.param < 0) {
    s.phase = kValueText;
    return;
  }
  const Param& p = tools_[size_t(s.tool)].params[size_t(s.param)];
  switch (p.kind) {
    case Param::Kind::Text: s.phase = kValueText; return;
    case Param::Kind::Integer:
    case Param::Kind::Number:
      s.phase = kValueNumber;
      s.next = 0;
      return;
    case Param::Kind::Options:
      s.phase = kValueOptions;
      s.candidates = all_bits(p.options.size());
      return;
  }
}

bool ToolCallGrammar::feed_char(State& s, char c) const {
  switch (s.phase) {
    case kLiteral: {
      std::string_view lit = literal(s);
      if (s.pos >= lit.size() || lit[s.pos] != c) return false;
      if (++s.pos == lit.size()) after_literal(s);
      return true;
    }
    case kRecipient: {
      s.candidates = narrow(recipients_, s.candidates, s.pos, c);
      ++s.pos;
      return s.candidates != 0;
    }
    case kReasoning: return true;
    case kParamOrEnd: {
      const Tool& t = tools_[size_t(s.tool)];
      const bool more = t.free_keys || (all_bits(t.params.size()) & ~s.seen) != 0;
      const bool closeable = (s.seen & t.required) == t.required;
      const bool a = more && s.pos < param_open_.size() && param_open_[s.pos] == c;
      const bool b = closeable && s.pos < calls_close_.size() && calls_close_[s.pos] == c;
      if (!a && !b) return false;
      ++s.pos;
      if (a && b) return true;  // the shared "<"
      s.phase = kLiteral;
      s.literal = a ? kParamOpen : kCallsClose;
      if (s.pos == literal(s).size()) after_literal(s);
      return true;
    }
    case kParamName: {
      const Tool& t = tools_[size_t(s.tool)];
      if (c == '"') {
        if (t.free_keys) {
          if (s.pos == 0) return false;
          s.param = -1;
        } else {
          const int i = exact(t.param_names, s.candidates, s.pos);
          if (i < 0) return false;
          s.param = int16_t(i);
          s.seen |= uint64_t(1) << i;
        }
        s.phase = kLiteral;
        s.literal = kGt;
        s.pos = 0;
        return true;
      }
      if (t.free_keys) {
        if (c == '<' || c == '>' || c == '\n') return false;
        ++s.pos;
        return true;
      }
      s.candidates = narrow(t.param_names, s.candidates, s.pos, c);
      ++s.pos;
      return s.candidates != 0;
    }
    case kValueText: {
      const std::string& close = f_.param_close;
      if (close[s.pos] == c) {
        if (++s.pos == close.size()) {  // the closing tag; its newline follows
          s.phase = kLiteral;
          s.literal = kParamClose;
        }
        return true;
      }
      s.pos = c == close[0] ? 1 : 0;
      return true;
    }
    case kValueNumber: {
      // JSON's number grammar, sized to parse back as a number (`next` is
      // the automaton's state).
      const bool integer = tools_[size_t(s.tool)].params[size_t(s.param)].kind == Param::Kind::Integer;
      if (c == f_.param_close[0]) {
        if (!detail::json_number_complete(s.next)) return false;
        s.phase = kLiteral;
        s.literal = kParamClose;
        s.pos = 1;
        return true;
      }
      return detail::json_number_step(s.next, s.pos, c, integer);
    }
    case kValueOptions: {
      const Param& p = tools_[size_t(s.tool)].params[size_t(s.param)];
      if (c == f_.param_close[0] && exact(p.options, s.candidates, s.pos) >= 0) {  // a whole value, then the tag
        s.phase = kLiteral;
        s.literal = kParamClose;
        s.pos = 1;
        return true;
      }
      s.candidates = narrow(p.options, s.candidates, s.pos, c);
      ++s.pos;
      return s.candidates != 0;
    }
    default: return false;  // markers only
  }
}

bool ToolCallGrammar::feed_text(State& s, std::string_view bytes) const {
  for (char c : bytes)
    if (!feed_char(s, c)) return false;
  return true;
}

bool ToolCallGrammar::feed_marker(State& s, GrammarMarker m) const {
  switch (s.phase) {
    case kRecipient: {
      if (m != GrammarMarker::Message) return false;
      const int i = exact(recipients_, s.candidates, s.pos);
      if (i < 0) return false;
      s.pos = 0;
      if (size_t(i) < reasoning_count_) {
        s.phase = kReasoning;
        return true;
      }
      s.tool = int16_t(size_t(i) - reasoning_count_);
      s.seen = 0;
      s.param = -1;
      s.phase = kLiteral;
      s.literal = kCallOpen;
      return true;
    }
    case kReasoning:
      if (m != GrammarMarker::EndMessage) return false;
      s.reasoning_done = true;
      s.phase = kExpectStart;
      return true;
    case kExpectStart:
      if (m != GrammarMarker::Start) return false;
      s.phase = kLiteral;
      s.literal = kAssistantTo;
      s.pos = 0;
      return true;
    case kEndOfCall:
      if (m == GrammarMarker::EndTurn) {
        ++s.calls;
        s.phase = kDone;
        return true;
      }
      if (m == GrammarMarker::EndMessage && !single_call_) {
        ++s.calls;
        s.phase = kExpectStart;
        return true;
      }
      return false;
    default: return false;
  }
}

uint8_t ToolCallGrammar::fast_path_blockers(const State& s) const {
  if (s.phase == kReasoning) return 0;
  if (s.phase == kValueText && s.pos == 0) return kTextHasAngle;
  return kNoFastPath;
}

bool ToolCallGrammar::finished(const State& s) const { return s.phase == kDone; }

}  // namespace muse::chat
