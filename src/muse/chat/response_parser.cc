#include "muse/chat/response_parser.h"

#include <algorithm>
#include <random>

#include "muse/core/log.h"

namespace muse::chat {

namespace {

constexpr size_t kMaxHeaderBytes = 256;

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }

std::string_view trim_left(std::string_view s) {
  while (!s.empty() && is_space(s.front())) s.remove_prefix(1);
  return s;
}

std::string_view trim(std::string_view s) {
  s = trim_left(s);
  while (!s.empty() && is_space(s.back())) s.remove_suffix(1);
  return s;
}

bool is_prefix_of(std::string_view prefix, std::string_view whole) {
  return prefix.size() <= whole.size() && whole.compare(0, prefix.size(), prefix) == 0;
}

bool contains(const std::vector<std::string>& v, std::string_view s) {
  return std::find(v.begin(), v.end(), s) != v.end();
}

// Tool-call names and arguments must be valid JSON text for clients: invalid
// UTF-8 (impossible from the streaming detokenizer, possible in raw text
// input) becomes U+FFFD, as Python's errors="replace" would.
std::string valid_utf8(std::string_view s) {
  if (is_valid_utf8(s)) return std::string(s);
  std::string out;
  while (!s.empty()) {
    size_t bad = find_invalid_utf8(s);
    if (bad == std::string_view::npos) {
      out.append(s);
      break;
    }
    out.append(s.substr(0, bad));
    out += "\xEF\xBF\xBD";
    s.remove_prefix(bad + 1);
    while (!s.empty() && (static_cast<unsigned char>(s[0]) & 0xC0) == 0x80) s.remove_prefix(1);
  }
  return out;
}

std::string random_call_id() {
  static thread_local std::mt19937_64 rng{std::random_device{}()};
  static const char* chars = "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789";
  std::string id = "call_";
  for (int i = 0; i < 24; ++i) id.push_back(chars[rng() % 62]);
  return id;
}

}  // namespace

ResponseParser::ResponseParser(const FramingFormat& format, ResponseParserOptions options)
    : f_(format), opt_(std::move(options)) {
  if (!opt_.make_call_id) opt_.make_call_id = [](size_t) { return random_call_id(); };
  begin_header(false);
}

Channel ResponseParser::channel() const {
  if (state_ == State::Done) return Channel::Done;
  if (state_ == State::Header) return Channel::Header;
  switch (body_) {
    case BodyKind::Reasoning: return Channel::Reasoning;
    case BodyKind::Content: return Channel::Content;
    case BodyKind::Ignored: return Channel::Ignored;
    default: return Channel::ToolCall;
  }
}

void ResponseParser::warn(std::string message) {
  LOG_DEBUG("muse response parser: %s", message.c_str());
  result_.warnings.push_back(std::move(message));
}

// ---------------------------------------------------------------------------
// Input
// ---------------------------------------------------------------------------

ResponseDelta ResponseParser::push_token(int32_t id, std::string_view text, bool special) {
  ResponseDelta d;
  if (id == f_.start_id) on_marker(Marker::Start, d);
  else if (id == f_.message_id) on_marker(Marker::Message, d);
  else if (id == f_.end_message_id) on_marker(Marker::EndMessage, d);
  else if (id == f_.end_turn_id) on_marker(Marker::EndTurn, d);
  else if (id == f_.end_of_text_id) on_marker(Marker::EndOfText, d);
  else if (!special) on_text(text, d);
  return d;
}

ResponseDelta ResponseParser::push_text(std::string_view text) {
  ResponseDelta d;
  text_mode_ = true;
  pending_.append(text);
  scan_text(false, d);
  return d;
}

bool ResponseParser::markers_active() const {
  return !(state_ == State::Body && atem_ && atem_->inside_value());
}

// Text input: splits pending_ into text and markers. Text that could still
// grow into a marker is held back; inside an ATEM value, text is fed only up
// to each '>' so that the value's closing tag re-enables marker scanning.
void ResponseParser::scan_text(bool final, ResponseDelta& d) {
  const std::pair<std::string_view, Marker> markers[] = {
      {f_.start, Marker::Start},          {f_.message, Marker::Message},   {f_.end_message, Marker::EndMessage},
      {f_.end_turn, Marker::EndTurn},     {f_.end_of_text, Marker::EndOfText}};
  std::string_view rest = pending_;
  size_t next_marker = std::string_view::npos;  // cached position of the earliest marker in `rest`
  Marker which = Marker::Start;
  size_t len = 0;
  auto find_marker = [&] {
    next_marker = std::string_view::npos;
    for (const auto& [spelling, m] : markers) {
      size_t p = rest.find(spelling);
      if (p < next_marker) {
        next_marker = p;
        which = m;
        len = spelling.size();
      }
    }
  };
  bool marker_known = false;
  while (!rest.empty() && state_ != State::Done) {
    if (!markers_active()) {
      size_t gt = rest.find('>');
      size_t n = gt == std::string_view::npos ? rest.size() : gt + 1;
      on_text(rest.substr(0, n), d);
      rest.remove_prefix(n);
      marker_known = false;
      continue;
    }
    if (!marker_known) {
      find_marker();
      marker_known = true;
    }
    if (next_marker == 0) {
      rest.remove_prefix(len);
      marker_known = false;
      on_marker(which, d);
      continue;
    }
    if (next_marker != std::string_view::npos) {
      on_text(rest.substr(0, next_marker), d);
      rest.remove_prefix(next_marker);
      next_marker = 0;  // still the earliest; re-checked against markers_active() first
      continue;
    }
    size_t hold = 0;
    if (!final) {
      for (const auto& [spelling, m] : markers)
        for (size_t k = std::min(spelling.size() - 1, rest.size()); k > hold; --k)
          if (rest.substr(rest.size() - k) == spelling.substr(0, k)) {
            hold = k;
            break;
          }
    }
    if (rest.size() > hold) on_text(rest.substr(0, rest.size() - hold), d);
    rest.remove_prefix(rest.size() - hold);
    break;
  }
  if (state_ == State::Done) rest = {};
  pending_ = std::string(rest);
}

void ResponseParser::on_marker(Marker m, ResponseDelta& d) {
  if (state_ == State::Done) return;
  if (m == Marker::Message) {
    if (state_ == State::Header) complete_header();
    // A stray <|message|> inside a body is dropped (in an invoke name it
    // stands for the `">` the model skipped, which the ATEM parser handles).
    return;
  }
  end_frame(false, d);
  switch (m) {
    case Marker::Start: begin_header(true); break;
    case Marker::EndMessage: begin_header(false); break;
    default: state_ = State::Done; break;
  }
}

void ResponseParser::on_text(std::string_view text, ResponseDelta& d) {
  if (text.empty() || state_ == State::Done) return;
  if (state_ == State::Header) header_text(text, d);
  else body_text(text, d);
}

ResponseDelta ResponseParser::finish(FinishCause cause) {
  ResponseDelta d;
  if (!pending_.empty()) scan_text(true, d);
  if (state_ != State::Done) end_frame(cause == FinishCause::Length, d);
  state_ = State::Done;
  if (cause == FinishCause::Length) result_.finish_reason = "length";
  else result_.finish_reason = result_.tool_calls.empty() ? "stop" : "tool_calls";
  return d;
}

// ---------------------------------------------------------------------------
// Headers
// ---------------------------------------------------------------------------

void ResponseParser::begin_header(bool role_expected) {
  state_ = State::Header;
  role_expected_ = role_expected;
  header_.clear();
}

void ResponseParser::header_text(std::string_view text, ResponseDelta& d) {
  header_.append(text);
  std::string_view h = header_;
  if (role_expected_) {
    std::string_view role = f_.assistant_role;
    if (h.size() < role.size() && is_prefix_of(h, role)) return;
    if (!is_prefix_of(role, h)) {
      // Another role (a hallucinated user or tool turn): dropped up to its
      // <|message|>; a runaway header becomes an ignored body.
      if (header_.size() > kMaxHeaderBytes) {
        header_.clear();
        open_body(false, "");
      }
      return;
    }
    h.remove_prefix(role.size());
  }
  std::string_view t = trim_left(h);
  std::string_view prefix = f_.recipient_prefix;
  bool small = header_.size() <= kMaxHeaderBytes;
  if (small && (t.empty() || is_prefix_of(t, prefix))) return;  // may still become ` to=R`
  if (small && is_prefix_of(prefix, t) && t.find('\n') == std::string_view::npos) return;
  // Not a header: the frame has no recipient and this text is its body.
  std::string body(h);
  header_.clear();
  open_body(true, "");
  body_text(body, d);
}

void ResponseParser::complete_header() {
  std::string_view h = header_;
  bool role_ok = true;
  if (role_expected_) {
    h = trim_left(h);
    role_ok = is_prefix_of(f_.assistant_role, h);
    if (role_ok) h.remove_prefix(f_.assistant_role.size());
  }
  std::string recipient;
  std::string_view t = trim(h);
  if (is_prefix_of(f_.recipient_prefix, t)) {
    t.remove_prefix(f_.recipient_prefix.size());
    size_t end = 0;
    while (end < t.size() && !is_space(t[end])) ++end;
    recipient = std::string(t.substr(0, end));
  }
  header_.clear();
  open_body(role_ok, recipient);
}

void ResponseParser::open_body(bool role_ok, const std::string& recipient) {
  state_ = State::Body;
  sniffing_ = false;
  sniff_.clear();
  atem_.reset();
  events_.clear();
  events_done_ = 0;
  header_tool_ = nullptr;
  invoke_ = Invoke{};
  fumbled_calls_.clear();
  frame_calls_ = 0;
  if (!role_ok) {
    body_ = BodyKind::Ignored;
    warn("dropped a generated message with a non-assistant role");
    return;
  }
  if (contains(f_.reasoning_recipients, recipient) || (recipient.empty() && f_.missing_recipient_is_reasoning)) {
    body_ = BodyKind::Reasoning;
  } else if (recipient.empty() || contains(f_.content_recipients, recipient)) {
    body_ = BodyKind::Content;
    sniffing_ = true;
  } else {
    header_tool_ = opt_.tools.resolve(recipient);
    body_ = header_tool_ ? BodyKind::Tool : BodyKind::Fumbled;
    atem_ = std::make_unique<AtemParser>(f_);
    if (!header_tool_) warn("recipient '" + recipient + "' is not a declared tool");
  }
}

// ---------------------------------------------------------------------------
// Bodies
// ---------------------------------------------------------------------------

void ResponseParser::content_text(std::string_view text, ResponseDelta& d) {
  result_.content.append(text);
  d.content.append(text);
}

void ResponseParser::body_text(std::string_view text, ResponseDelta& d) {
  switch (body_) {
    case BodyKind::Reasoning:
      result_.reasoning.append(text);
      d.reasoning.append(text);
      return;
    case BodyKind::Ignored: return;
    case BodyKind::Content: {
      if (!sniffing_) return content_text(text, d);
      // An answer body that is solely an ATEM block is a call (fumbled
      // header, §4.6 item 4); anything else streams as content at once.
      sniff_.append(text);
      std::string_view t = trim_left(sniff_);
      if (t.empty()) return;
      if (is_prefix_of(t, f_.calls_open) || is_prefix_of(f_.calls_open, t)) {
        body_ = BodyKind::Fumbled;
        sniffing_ = false;
        atem_ = std::make_unique<AtemParser>(f_);
        std::string held = std::move(sniff_);
        sniff_.clear();
        atem_->feed(held, events_);
        return atem_events(d);
      }
      sniffing_ = false;
      std::string held = std::move(sniff_);
      sniff_.clear();
      return content_text(held, d);
    }
    case BodyKind::Tool:
    case BodyKind::Fumbled:
      atem_->feed(text, events_);
      return atem_events(d);
  }
}

// Gives up on ATEM for the rest of this body: raw text from `raw_offset`
// on becomes content, and so does everything after it.
void ResponseParser::to_content(size_t raw_offset, ResponseDelta& d, const std::string& why) {
  if (frame_calls_ == 0) raw_offset = 0;  // nothing of this body became a call: all of it is content
  std::string raw = atem_ ? atem_->raw().substr(std::min(raw_offset, atem_->raw().size())) : std::string();
  warn(why);
  atem_.reset();
  events_.clear();
  events_done_ = 0;
  invoke_ = Invoke{};
  fumbled_calls_.clear();
  body_ = BodyKind::Content;
  sniffing_ = false;
  content_text(raw, d);
}

void ResponseParser::settle_pending_invoke(const AtemEvent* next, ResponseDelta& d) {
  invoke_.settled = true;
  invoke_.tool = opt_.tools.resolve(invoke_.name);
  if (next && next->kind == AtemEvent::Kind::Parameter && next->name.empty()) {
    // §4.6 item 5: `name="read.filePath">value</atem:parameter>`.
    size_t dot = invoke_.name.rfind('.');
    const ToolInfo* tool = dot == std::string::npos || invoke_.tool ? nullptr
                                                                     : opt_.tools.resolve(invoke_.name.substr(0, dot));
    std::string param = dot == std::string::npos ? "" : invoke_.name.substr(dot + 1);
    if (!tool || !parameter_schema(tool, param))
      return to_content(invoke_.at, d, "invoke without a parameter tag could not be recovered");
    warn("recovered a swallowed <atem:parameter> opener in '" + invoke_.name + "'");
    invoke_.tool = tool;
    invoke_.name = tool->name;
    invoke_.args.emplace_back(param, Json());  // filled by the Parameter event
  }
  if (body_ == BodyKind::Tool && invoke_.tool != header_tool_)
    return to_content(invoke_.at, d,
                      "invoke name '" + invoke_.name + "' does not match the header's tool '" + header_tool_->name + "'");
  if (invoke_.tool) invoke_.name = invoke_.tool->name;
}

void ResponseParser::emit_call(ResponseDelta& d) {
  ToolCall call;
  call.name = valid_utf8(invoke_.name);
  call.arguments = Json(std::move(invoke_.args)).dump();
  invoke_ = Invoke{};
  if (body_ == BodyKind::Fumbled) {
    fumbled_calls_.push_back(std::move(call));
    return;
  }
  size_t index = result_.tool_calls.size();
  call.id = opt_.make_call_id(index);
  d.tool_calls.push_back(ToolCallDelta{index, call.id, call.name, call.arguments});
  result_.tool_calls.push_back(std::move(call));
  ++frame_calls_;
}

void ResponseParser::atem_events(ResponseDelta& d) {
  while (atem_ && events_done_ < events_.size()) {
    const AtemEvent e = events_[events_done_++];
    bool fumbled = body_ == BodyKind::Fumbled;
    switch (e.kind) {
      case AtemEvent::Kind::InvokeStart:
        invoke_ = Invoke{};
        invoke_.active = true;
        invoke_.name = e.name;
        invoke_.at = e.at;
        break;
      case AtemEvent::Kind::Parameter: {
        if (!invoke_.settled) {
          settle_pending_invoke(&e, d);
          if (!atem_) return;
        }
        std::string name = e.name;
        if (name.empty()) {
          if (invoke_.args.empty()) return to_content(invoke_.at, d, "parameter without a name");
          name = invoke_.args.back().first;
          invoke_.args.pop_back();
        }
        Json value = decode_parameter_value(valid_utf8(e.value), parameter_schema(invoke_.tool, name));
        Json obj(std::move(invoke_.args));
        obj.set(valid_utf8(name), std::move(value));  // a repeated name: the last value wins, in place
        invoke_.args = std::move(obj.as_object());
        break;
      }
      case AtemEvent::Kind::InvokeEnd:
        if (!invoke_.settled) {
          settle_pending_invoke(&e, d);
          if (!atem_) return;
        }
        emit_call(d);
        break;
      case AtemEvent::Kind::NotAtem: return to_content(0, d, "tool channel without an ATEM block");
      case AtemEvent::Kind::Malformed:
        return to_content(fumbled ? 0 : invoke_.active ? invoke_.at : e.at, d, "malformed ATEM block");
      case AtemEvent::Kind::Trailing:
        return to_content(fumbled ? 0 : e.at, d, "text after the ATEM block");
    }
  }
}

void ResponseParser::end_frame(bool by_length, ResponseDelta& d) {
  if (state_ == State::Header) {
    header_.clear();  // a header cut short carries no text
    return;
  }
  if (state_ != State::Body) return;
  if (body_ == BodyKind::Content && sniffing_) {
    std::string held = std::move(sniff_);
    sniff_.clear();
    sniffing_ = false;
    content_text(held, d);
  }
  if (body_ == BodyKind::Tool && atem_) {
    if (atem_->in_invoke()) {
      bool keep = by_length || !atem_->value_open();
      if (keep && invoke_.active) {
        if (!invoke_.settled) settle_pending_invoke(nullptr, d);
        if (atem_) {
          warn(by_length ? "tool call cut short by the length limit" : "tool call without </atem:invoke>");
          emit_call(d);
        }
      } else {
        to_content(invoke_.active ? invoke_.at : 0, d, "tool call cut short inside a parameter");
      }
    } else if (!atem_->complete() && !trim(atem_->raw()).empty() && events_.empty()) {
      to_content(0, d, "tool channel without an ATEM block");
    }
  } else if (body_ == BodyKind::Fumbled && atem_) {
    bool calls_only = atem_->complete() || (!atem_->in_invoke() && !fumbled_calls_.empty());
    if (calls_only && !fumbled_calls_.empty()) {
      warn("treated an ATEM-only body under a fumbled header as a tool call");
      for (auto& call : fumbled_calls_) {
        size_t index = result_.tool_calls.size();
        call.id = opt_.make_call_id(index);
        d.tool_calls.push_back(ToolCallDelta{index, call.id, call.name, call.arguments});
        result_.tool_calls.push_back(std::move(call));
      }
      fumbled_calls_.clear();
    } else {
      to_content(0, d, "fumbled header without a complete ATEM body");
    }
  }
  atem_.reset();
  events_.clear();
  events_done_ = 0;
  invoke_ = Invoke{};
  body_ = BodyKind::Content;
}

ParsedResponse parse_response_text(std::string_view text, const FramingFormat& format, const ToolSet& tools,
                                   FinishCause cause) {
  ResponseParserOptions opt;
  opt.tools = tools;
  opt.make_call_id = [](size_t i) { return "call_" + std::to_string(i); };
  ResponseParser p(format, std::move(opt));
  p.push_text(text);
  p.finish(cause);
  return p.result();
}

}  // namespace muse::chat
