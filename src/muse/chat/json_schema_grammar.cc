#include "muse/chat/json_schema_grammar.h"

#include <bit>

#include "muse/chat/grammar_support.h"

namespace muse::chat {

namespace detail {

namespace {
enum : uint8_t { kStart, kMinus, kZero, kInt, kDot, kFrac, kE, kESign, kExp, kExp2, kBad = 255 };
bool is_digit(char c) { return c >= '0' && c <= '9'; }
}  // namespace

bool json_number_step(uint8_t& n, uint16_t& length, char c, bool integer) {
  const bool d = is_digit(c), e = c == 'e' || c == 'E';
  switch (n) {
    case kStart: n = c == '-' ? kMinus : c == '0' ? kZero : d ? kInt : kBad; break;
    case kMinus: n = c == '0' ? kZero : d ? kInt : kBad; break;
    case kZero: n = c == '.' ? kDot : e ? kE : kBad; break;
    case kInt: n = d ? kInt : c == '.' ? kDot : e ? kE : kBad; break;
    case kDot: n = d ? kFrac : kBad; break;
    case kFrac: n = d ? kFrac : e ? kE : kBad; break;
    case kE: n = d ? kExp : (c == '+' || c == '-') ? kESign : kBad; break;
    case kESign: n = d ? kExp : kBad; break;
    case kExp: n = d ? kExp2 : kBad; break;  // two exponent digits at most
    default: n = kBad;
  }
  if (n == kBad || (integer && (n == kDot || n == kE))) return false;
  return ++length <= (integer ? 18 : 64);
}

bool json_number_complete(uint8_t n) { return n == kZero || n == kInt || n == kFrac || n == kExp || n == kExp2; }

}  // namespace detail

using namespace detail;

namespace {

enum TypeBits : uint8_t {
  kObject = 1, kArray = 2, kString = 4, kNumber = 8, kInteger = 16, kBoolean = 32, kNull = 64, kAllTypes = 127
};

enum Phase : uint8_t {
  kInString, kEscape, kHex, kInNumber, kInOptions, kInKeyword,
  kObjOpen, kObjKeyStart, kObjKey, kObjColon, kObjValue, kObjAfter,
  kArrOpen, kArrValue, kArrAfter,
};

constexpr const char* kKeywords[] = {"true", "false", "null"};
// UTF-8 inside strings and keys (RFC 3629: no overlongs, surrogates or code
// points past U+10FFFF), one byte at a time. `state`: 0 between characters,
// else (continuation bytes left << 3) | the range of the next byte.
enum : uint8_t { kCont, kE0, kED, kF0, kF4 };  // 80-BF, A0-BF, 80-9F, 90-BF, 80-8F
bool utf8_step(uint8_t& state, uint8_t b) {
  if (state == 0) {
    if (b < 0x80) return true;
    if (b >= 0xC2 && b <= 0xDF) state = (1 << 3) | kCont;
    else if (b == 0xE0) state = (2 << 3) | kE0;
    else if (b == 0xED) state = (2 << 3) | kED;
    else if (b >= 0xE1 && b <= 0xEF) state = (2 << 3) | kCont;
    else if (b == 0xF0) state = (3 << 3) | kF0;
    else if (b >= 0xF1 && b <= 0xF3) state = (3 << 3) | kCont;
    else if (b == 0xF4) state = (3 << 3) | kF4;
    else return false;
    return true;
  }
  static constexpr uint8_t lo[] = {0x80, 0xA0, 0x80, 0x90, 0x80}, hi[] = {0xBF, 0xBF, 0x9F, 0xBF, 0x8F};
  const uint8_t range = state & 7, left = state >> 3;
  if (b < lo[range] || b > hi[range]) return false;
  state = left == 1 ? 0 : uint8_t(((left - 1) << 3) | kCont);
  return true;
}

bool is_annotation(std::string_view k) {
  for (const char* a : {"title", "description", "default", "examples", "$schema", "$id", "$comment", "format"})
    if (k == a) return true;
  return false;
}

}  // namespace

uint16_t JsonSchemaGrammar::any_node() {
  if (any_ < 0) {
    any_ = int32_t(nodes_.size());
    Node n;
    n.types = kAllTypes;
    n.additional = any_;
    n.items = uint16_t(any_);
    nodes_.push_back(std::move(n));
  }
  return uint16_t(any_);
}

Result<uint16_t> JsonSchemaGrammar::compile(const Json& schema, int depth) {
  if (depth > 32) return make_error("the schema is nested more than 32 levels deep");
  if (schema.is_bool()) {
    if (schema.as_bool()) return any_node();
    return make_error("a schema of false admits nothing");
  }
  if (!schema.is_object()) return make_error("a schema must be an object or a boolean");
  Node n;
  for (const auto& [key, v] : schema.as_object()) {
    if (is_annotation(key)) continue;
    if (key == "type") {
      std::vector<const Json*> names;
      if (v.is_string()) names.push_back(&v);
      else if (v.is_array())
        for (const Json& t : v.as_array()) names.push_back(&t);
      if (names.empty()) return make_error("'type' must be a type name or a list of them");
      for (const Json* t : names) {
        const std::string s = t->is_string() ? t->as_string() : "";
        uint8_t bit = s == "object" ? kObject : s == "array" ? kArray : s == "string" ? kString : s == "number" ? kNumber
                    : s == "integer" ? kInteger : s == "boolean" ? kBoolean : s == "null" ? kNull : 0;
        if (!bit) return make_error("unknown type '" + (t->is_string() ? s : t->dump()) + "'");
        n.types |= bit;
      }
    } else if (key == "enum" || key == "const") {
      if (key == "enum" && (!v.is_array() || v.as_array().empty())) return make_error("'enum' must be a non-empty array");
      if (key == "enum") {
        for (const Json& o : v.as_array()) n.options.push_back(o.dump());
      } else {
        n.options.push_back(v.dump());
      }
      if (n.options.size() > kMaxOptions) return make_error("'enum' may list at most 64 values here");
    } else if (key != "properties" && key != "required" && key != "additionalProperties" && key != "items") {
      return make_error("the schema keyword '" + key +
                        "' is not supported (supported: type, properties, required, additionalProperties, items, "
                        "enum, const; annotations are ignored)");
    }
  }
  const Json* props = schema.find("properties");
  const Json* required = schema.find("required");
  const Json* additional = schema.find("additionalProperties");
  const Json* items = schema.find("items");
  if (!n.types && n.options.empty()) {  // no type: what the keywords imply, else anything
    n.types = (props || required || additional) ? kObject : items ? kArray : kAllTypes;
  }
  if (props) {
    if (!props->is_object()) return make_error("'properties' must be an object");
    if (props->as_object().size() > kMaxOptions) return make_error("at most 64 properties per object are supported");
    for (const auto& [name, sub] : props->as_object()) {
      MUSE_ASSIGN_OR_RETURN(uint16_t idx, compile(sub, depth + 1));
      n.prop_names.push_back(name);
      n.prop_nodes.push_back(idx);
    }
  }
  if (required) {
    if (!required->is_array()) return make_error("'required' must be an array of property names");
    for (const Json& r : required->as_array()) {
      bool found = false;
      for (size_t i = 0; i < n.prop_names.size(); ++i)
        if (r.is_string() && n.prop_names[i] == r.as_string()) n.required |= uint64_t(1) << i, found = true;
      if (!found) return make_error("required property " + r.dump() + " is not declared in 'properties'");
    }
  }
  if (!additional || (additional->is_bool() && additional->as_bool())) {
    n.additional = any_node();
  } else if (additional->is_bool()) {
    n.additional = -1;
  } else {
    MUSE_ASSIGN_OR_RETURN(uint16_t idx, compile(*additional, depth + 1));
    n.additional = idx;
  }
  if (items) {
    MUSE_ASSIGN_OR_RETURN(uint16_t idx, compile(*items, depth + 1));
    n.items = idx;
  } else {
    n.items = any_node();
  }
  nodes_.push_back(std::move(n));
  if (nodes_.size() > 60000) return make_error("the schema is too large");
  return uint16_t(nodes_.size() - 1);
}

Result<JsonSchemaGrammar> JsonSchemaGrammar::make(const Json* schema) {
  JsonSchemaGrammar g;
  g.nodes_.emplace_back();  // slot 0: the root, filled below
  Node root;
  if (!schema || schema->is_null()) {  // json_object: any object
    root.types = kObject;
    root.additional = g.any_node();
    root.items = uint16_t(root.additional);
  } else {
    MUSE_ASSIGN_OR_RETURN(uint16_t idx, g.compile(*schema, 0));
    root = g.nodes_[idx];
  }
  g.nodes_[0] = std::move(root);
  return g;
}

bool JsonSchemaGrammar::start_value(State& s, uint16_t node, char c) const {
  if (s.depth >= kMaxDepth) return false;
  const Node& n = nodes_[node];
  Frame f;
  f.node = node;
  if (!n.options.empty()) {
    f.phase = kInOptions;
    f.candidates = narrow(n.options, all_bits(n.options.size()), 0, c);
    f.pos = 1;
    if (!f.candidates) return false;
  } else if (c == '{' && (n.types & kObject)) {
    f.phase = kObjOpen;
  } else if (c == '[' && (n.types & kArray)) {
    f.phase = kArrOpen;
  } else if (c == '"' && (n.types & kString)) {
    f.phase = kInString;
  } else if ((c == '-' || (c >= '0' && c <= '9')) && (n.types & (kNumber | kInteger))) {
    f.phase = kInNumber;
    if (!detail::json_number_step(f.aux, f.pos, c, !(n.types & kNumber))) return false;
  } else if ((c == 't' || c == 'f') && (n.types & kBoolean)) {
    f.phase = kInKeyword;
    f.aux = c == 't' ? 0 : 1;
    f.pos = 1;
  } else if (c == 'n' && (n.types & kNull)) {
    f.phase = kInKeyword;
    f.aux = 2;
    f.pos = 1;
  } else {
    return false;
  }
  s.stack[s.depth++] = f;
  return true;
}

JsonSchemaGrammar::Step JsonSchemaGrammar::step(Frame& f, char c) const {
  switch (f.phase) {
    case kInString:
      if (f.aux != 0) return utf8_step(f.aux, uint8_t(c)) ? Step::Consumed : Step::Refused;
      if (c == '"') return Step::Done;
      if (c == '\\') f.phase = kEscape;
      else if (uint8_t(c) < 0x20) return Step::Refused;
      else if (!utf8_step(f.aux, uint8_t(c))) return Step::Refused;
      return Step::Consumed;
    case kEscape:
      if (c == 'u') {
        f.phase = kHex;
        f.aux = 4;
        return Step::Consumed;
      }
      for (char e : std::string_view("\"\\/bfnrt"))
        if (c == e) {
          f.phase = kInString;
          return Step::Consumed;
        }
      return Step::Refused;
    case kHex: {
      const bool hex = (c >= '0' && c <= '9') || (c >= 'a' && c <= 'f') || (c >= 'A' && c <= 'F');
      if (!hex) return Step::Refused;
      if (--f.aux == 0) f.phase = kInString;
      return Step::Consumed;
    }
    case kInKeyword: {
      std::string_view k = kKeywords[f.aux];
      if (f.pos >= k.size() || k[f.pos] != c) return Step::Refused;
      return ++f.pos == k.size() ? Step::Done : Step::Consumed;
    }
    default: break;
  }
  return Step::Refused;  // the container phases are handled in feed_char
}

bool JsonSchemaGrammar::feed_char(State& s, char c) const {
  if (s.done) return false;
  if (!s.started) {
    s.started = true;
    return start_value(s, 0, c);
  }
  for (;;) {
    if (s.depth == 0) return false;
    Frame& f = s.stack[s.depth - 1];
    const Node& n = nodes_[f.node];
    auto keys_left = [&] { return n.additional >= 0 || (all_bits(n.prop_names.size()) & ~f.seen) != 0; };
    auto closeable = [&] { return (f.seen & n.required) == n.required; };
    auto pop = [&] {
      --s.depth;
      if (s.depth == 0) s.done = true;
    };
    switch (f.phase) {
      case kInString:
      case kEscape:
      case kHex:
      case kInKeyword: {
        Step r = step(f, c);
        if (r == Step::Done) pop();
        return r != Step::Refused;
      }
      case kInNumber: {
        uint8_t state = f.aux;
        uint16_t length = f.pos;
        if (detail::json_number_step(state, length, c, !(n.types & kNumber))) {
          f.aux = state;
          f.pos = length;
          return true;
        }
        if (!detail::json_number_complete(f.aux)) return false;
        pop();  // the number ended; c belongs to the container
        if (s.done) return false;
        continue;
      }
      case kInOptions: {
        uint64_t next = narrow(n.options, f.candidates, f.pos, c);
        if (next) {
          f.candidates = next;
          ++f.pos;
          return true;
        }
        if (exact(n.options, f.candidates, f.pos) < 0) return false;
        pop();
        if (s.done) return false;
        continue;
      }
      case kObjOpen:
      case kObjKeyStart:
        if (c == '"' && keys_left()) {
          f.phase = kObjKey;
          f.candidates = all_bits(n.prop_names.size()) & ~f.seen;
          f.free_key = n.additional >= 0;
          f.pos = 0;
          f.aux = 0;  // UTF-8 state of the key
          return true;
        }
        if (c == '}' && f.phase == kObjOpen && closeable()) {
          pop();
          return true;
        }
        return false;
      case kObjKey: {
        if (f.aux == 0 && c == '"') {
          f.prop = int16_t(exact(n.prop_names, f.candidates, f.pos));
          if (f.prop < 0 && !f.free_key) return false;
          if (f.prop >= 0) f.seen |= uint64_t(1) << f.prop;
          f.phase = kObjColon;
          return true;
        }
        if (c == '\\' || uint8_t(c) < 0x20 || !utf8_step(f.aux, uint8_t(c))) return false;  // keys without escapes
        const uint64_t next = narrow(n.prop_names, f.candidates, f.pos, c);
        if (!next && !f.free_key) return false;
        f.candidates = next;
        ++f.pos;
        return true;
      }
      case kObjColon:
        if (c != ':') return false;
        f.phase = kObjValue;
        return true;
      case kObjValue: {
        const uint16_t child = f.prop >= 0 ? n.prop_nodes[size_t(f.prop)] : uint16_t(n.additional);
        f.phase = kObjAfter;
        return start_value(s, child, c);
      }
      case kObjAfter:
        if (c == ',' && keys_left()) {
          f.phase = kObjKeyStart;
          return true;
        }
        if (c == '}' && closeable()) {
          pop();
          return true;
        }
        return false;
      case kArrOpen:
        if (c == ']') {
          pop();
          return true;
        }
        [[fallthrough]];
      case kArrValue:
        f.phase = kArrAfter;
        return start_value(s, n.items, c);
      case kArrAfter:
        if (c == ',') {
          f.phase = kArrValue;
          return true;
        }
        if (c == ']') {
          pop();
          return true;
        }
        return false;
      default: return false;
    }
  }
}

bool JsonSchemaGrammar::feed_text(State& s, std::string_view bytes) const {
  for (char c : bytes)
    if (!feed_char(s, c)) return false;
  return true;
}

bool JsonSchemaGrammar::can_end(const State& s) const {
  if (s.done) return true;
  if (s.depth != 1) return false;
  const Frame& f = s.stack[0];
  if (f.phase == kInNumber) return detail::json_number_complete(f.aux);
  if (f.phase == kInOptions) return 0 <= exact(nodes_[f.node].options, f.candidates, f.pos);
  return false;
}

bool JsonSchemaGrammar::in_plain_string(const State& s) const {
  return s.depth > 0 && s.stack[s.depth - 1].phase == kInString && s.stack[s.depth - 1].aux == 0;
}

// ---------------------------------------------------------------------------

namespace {
enum AnswerPhase : uint8_t { kALiteral, kARecipient, kAReasoning, kAExpectStart, kAJson, kADone };
}  // namespace

Result<StructuredAnswerGrammar> StructuredAnswerGrammar::make(const FramingFormat& f, const Json* schema, bool framed) {
  StructuredAnswerGrammar g;
  g.framed_ = framed;
  MUSE_ASSIGN_OR_RETURN(g.json_, JsonSchemaGrammar::make(schema));
  g.recipients_ = f.reasoning_recipients;
  g.reasoning_count_ = g.recipients_.size();
  if (f.content_recipients.empty()) return make_error("the chat profile has no answer recipient");
  g.recipients_.push_back(f.content_recipients[0]);
  g.to_ = " " + f.recipient_prefix;
  g.assistant_to_ = f.assistant_role + " " + f.recipient_prefix;
  return g;
}

StructuredAnswerGrammar::State StructuredAnswerGrammar::initial() const {
  State s;
  s.phase = framed_ ? kALiteral : kAJson;
  s.json = json_.initial();
  return s;
}

bool StructuredAnswerGrammar::feed_text(State& s, std::string_view bytes) const {
  for (size_t i = 0; i < bytes.size(); ++i) {
    const char c = bytes[i];
    switch (s.phase) {
      case kALiteral: {
        std::string_view lit = s.reasoning_done ? assistant_to_ : to_;
        if (s.pos >= lit.size() || lit[s.pos] != c) return false;
        if (++s.pos == lit.size()) {
          s.phase = kARecipient;
          s.pos = 0;
          s.candidates = all_bits(recipients_.size());
          if (s.reasoning_done) s.candidates &= ~all_bits(reasoning_count_);
        }
        break;
      }
      case kARecipient:
        s.candidates = narrow(recipients_, s.candidates, s.pos++, c);
        if (!s.candidates) return false;
        break;
      case kAReasoning: break;
      case kAJson:
        if (json_.in_plain_string(s.json)) {  // the common case: a run of string text
          size_t j = i;
          while (j < bytes.size() && bytes[j] != '"' && bytes[j] != '\\' && uint8_t(bytes[j]) >= 0x20 &&
                 uint8_t(bytes[j]) < 0x80)
            ++j;
          if (j > i) {
            i = j - 1;
            break;
          }
        }
        if (!json_.feed_text(s.json, bytes.substr(i, 1))) return false;
        break;
      default: return false;
    }
  }
  return true;
}

bool StructuredAnswerGrammar::feed_marker(State& s, GrammarMarker m) const {
  switch (s.phase) {
    case kARecipient: {
      const int i = exact(recipients_, s.candidates, s.pos);
      if (m != GrammarMarker::Message || i < 0) return false;
      s.pos = 0;
      s.phase = size_t(i) < reasoning_count_ ? kAReasoning : kAJson;
      return true;
    }
    case kAReasoning:
      if (m != GrammarMarker::EndMessage) return false;
      s.reasoning_done = true;
      s.phase = kAExpectStart;
      return true;
    case kAExpectStart:
      if (m != GrammarMarker::Start) return false;
      s.phase = kALiteral;
      s.pos = 0;
      return true;
    case kAJson:
      if (!(m == GrammarMarker::EndTurn || (!framed_ && m == GrammarMarker::EndOfText)) || !json_.can_end(s.json))
        return false;
      s.phase = kADone;
      return true;
    default: return false;
  }
}

uint8_t StructuredAnswerGrammar::fast_path_blockers(const State& s) const {
  if (s.phase == kAReasoning) return 0;
  if (s.phase == kAJson && json_.in_plain_string(s.json))
    return kTextHasQuote | kTextHasBackslash | kTextHasControl | kTextNotUtf8;
  return kNoFastPath;
}

bool StructuredAnswerGrammar::finished(const State& s) const { return s.phase == kADone; }

}  // namespace muse::chat
