#include "muse/jinja/lexer.h"

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "muse/core/json.h"
#include "muse/jinja/unicode.h"

namespace muse::jinja {

const char* token_type_name(TokenType t) {
  switch (t) {
    case TokenType::Data: return "template data";
    case TokenType::VariableBegin: return "begin of print statement";
    case TokenType::VariableEnd: return "end of print statement";
    case TokenType::BlockBegin: return "begin of statement block";
    case TokenType::BlockEnd: return "end of statement block";
    case TokenType::Name: return "name";
    case TokenType::String: return "string";
    case TokenType::Integer: return "integer";
    case TokenType::Float: return "float";
    case TokenType::Operator: return "operator";
    case TokenType::Eof: return "end of template";
  }
  return "token";
}

std::string describe_token(const Token& t) {
  if (t.type == TokenType::Name || t.type == TokenType::Operator) return t.value;
  return token_type_name(t.type);
}

namespace {

struct LexError {
  std::string message;
  int line;
};

bool is_ident_start(unsigned char c) { return (c | 32) >= 'a' && (c | 32) <= 'z' ? true : c == '_' || c >= 0x80; }
bool is_ident_char(unsigned char c) { return is_ident_start(c) || (c >= '0' && c <= '9'); }
bool is_ascii_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

// Python's str.rstrip() (Unicode whitespace).
std::string_view rstrip(std::string_view s) { return strip_view(s, nullptr, false, true); }

// Whether s is non-empty and all whitespace (jinja2: whitespace_re.fullmatch).
bool all_space(std::string_view s) {
  if (s.empty()) return false;
  return strip_view(s, nullptr, true, false).empty();
}

class Lexer {
 public:
  Lexer(std::string src, const LexerOptions& o) : s_(std::move(src)), opt_(o) {
    for (size_t i = 0; i < s_.size(); ++i)
      if (s_[i] == '\n') newlines_.push_back(i);
  }

  std::vector<Token> run() {
    while (pos_ < s_.size()) lex_root();
    push(TokenType::Eof, "", s_.size());
    return std::move(out_);
  }

 private:
  int line_at(size_t pos) const {
    return int(std::lower_bound(newlines_.begin(), newlines_.end(), pos) - newlines_.begin()) + 1;
  }
  [[noreturn]] void fail(std::string msg, size_t pos) { throw LexError{std::move(msg), line_at(pos)}; }

  void push(TokenType t, std::string value, size_t pos) {
    Token tok;
    tok.type = t;
    tok.value = std::move(value);
    tok.line = line_at(pos);
    out_.push_back(std::move(tok));
  }

  bool starts(size_t at, std::string_view what) const { return s_.compare(at, what.size(), what) == 0; }
  size_t skip_ws(size_t at) const {
    // Python's \s inside tags: Unicode whitespace.
    while (at < s_.size()) {
      size_t p = at;
      if (!is_space(next_code_point(s_, &p))) break;
      at = p;
    }
    return at;
  }

  // Matches `{%(-|+|)\s*raw\s*(-%}\s*|%})` at `at`; returns the end or npos.
  size_t match_raw_begin(size_t at) const {
    size_t p = at + 2;
    if (p < s_.size() && (s_[p] == '-' || s_[p] == '+')) ++p;
    p = skip_ws(p);
    if (!starts(p, "raw")) return std::string::npos;
    p = skip_ws(p + 3);
    if (starts(p, "-%}")) return skip_ws(p + 3);
    if (starts(p, "%}")) return p + 2;
    return std::string::npos;
  }

  // Data, then the tag that ends it; `sign` is the tag's '-', '+' or 0.
  void emit_data(std::string_view text, size_t text_pos, char sign, bool is_variable) {
    if (sign == '-') {
      text = rstrip(text);
    } else if (sign != '+' && opt_.lstrip_blocks && !is_variable) {
      size_t l_pos = text.rfind('\n');
      l_pos = l_pos == std::string_view::npos ? 0 : l_pos + 1;
      if ((l_pos > 0 || line_starting_) && all_space(text.substr(l_pos))) text = text.substr(0, l_pos);
    }
    if (!text.empty()) push(TokenType::Data, std::string(text), text_pos);
  }

  void lex_root() {
    size_t start = pos_;
    size_t at = start;
    while (true) {
      at = s_.find('{', at);
      if (at == std::string::npos || at + 1 >= s_.size()) {
        // The rest is data.
        push(TokenType::Data, s_.substr(start), start);
        pos_ = s_.size();
        return;
      }
      char c = s_[at + 1];
      if (c == '{' || c == '%' || c == '#') break;
      ++at;
    }
    std::string_view text(s_.data() + start, at - start);
    char kind = s_[at + 1];
    char sign = (at + 2 < s_.size() && (s_[at + 2] == '-' || s_[at + 2] == '+')) ? s_[at + 2] : 0;
    if (kind == '%') {
      size_t raw_end = match_raw_begin(at);
      if (raw_end != std::string::npos) {
        emit_data(text, start, sign, false);
        line_starting_ = s_[raw_end - 1] == '\n';
        lex_raw(raw_end, at);
        return;
      }
    }
    emit_data(text, start, sign, kind == '{');
    size_t after = at + 2 + (sign ? 1 : 0);
    line_starting_ = false;
    if (kind == '#') {
      lex_comment(after, at);
    } else {
      push(kind == '{' ? TokenType::VariableBegin : TokenType::BlockBegin, "", at);
      lex_tag(after, kind == '{');
    }
  }

  void lex_comment(size_t p, size_t tag_pos) {
    while (true) {
      size_t e = s_.find("#}", p);
      if (e == std::string::npos) fail("Missing end of comment tag", tag_pos);
      // The lazy `(.*?)` stops at the first of `+#}`, `-#}`, `#}`.
      size_t end;
      if (e > p && s_[e - 1] == '-') {
        end = skip_ws(e + 2);
      } else if (e > p && s_[e - 1] == '+') {
        end = e + 2;
      } else {
        end = e + 2;
        if (opt_.trim_blocks && end < s_.size() && s_[end] == '\n') ++end;
      }
      line_starting_ = end > 0 && s_[end - 1] == '\n';
      pos_ = end;
      return;
    }
  }

  void lex_raw(size_t p, size_t tag_pos) {
    // `(.*?)({%(-|+|)\s*endraw\s*(+%}|-%}\s*|%}\n?))`
    size_t search = p;
    while (true) {
      size_t e = s_.find("{%", search);
      if (e == std::string::npos) fail("Missing end of raw directive", tag_pos);
      size_t q = e + 2;
      char sign = (q < s_.size() && (s_[q] == '-' || s_[q] == '+')) ? s_[q] : 0;
      if (sign) ++q;
      q = skip_ws(q);
      if (!starts(q, "endraw")) {
        search = e + 1;
        continue;
      }
      q = skip_ws(q + 6);
      size_t end;
      if (starts(q, "+%}")) {
        end = q + 3;
      } else if (starts(q, "-%}")) {
        end = skip_ws(q + 3);
      } else if (starts(q, "%}")) {
        end = q + 2;
        if (opt_.trim_blocks && end < s_.size() && s_[end] == '\n') ++end;
      } else {
        search = e + 1;
        continue;
      }
      emit_data(std::string_view(s_.data() + p, e - p), p, sign, false);
      line_starting_ = s_[end - 1] == '\n';
      pos_ = end;
      return;
    }
  }

  // Inside {{ }} or {% %}.
  void lex_tag(size_t p, bool variable) {
    std::vector<char> balance;
    while (true) {
      if (p >= s_.size()) fail(variable ? "unexpected end of template, expected 'end of print statement'."
                                        : "unexpected end of template, expected 'end of statement block'.",
                               p);
      if (balance.empty()) {
        size_t end = match_tag_end(p, variable);
        if (end != std::string::npos) {
          push(variable ? TokenType::VariableEnd : TokenType::BlockEnd, "", p);
          line_starting_ = s_[end - 1] == '\n';
          pos_ = end;
          return;
        }
      }
      unsigned char c = static_cast<unsigned char>(s_[p]);
      size_t q = p;
      if (is_space(next_code_point(s_, &q))) {
        p = q;
        continue;
      }
      if (c >= '0' && c <= '9') {
        p = lex_number(p);
        continue;
      }
      if (is_ident_start(c)) {
        size_t e = p;
        while (e < s_.size() && is_ident_char(static_cast<unsigned char>(s_[e]))) ++e;
        push(TokenType::Name, s_.substr(p, e - p), p);
        p = e;
        continue;
      }
      if (c == '\'' || c == '"') {
        p = lex_string(p);
        continue;
      }
      static const char* ops2[] = {"**", "//", "==", "!=", ">=", "<="};
      std::string op;
      for (const char* o : ops2)
        if (starts(p, o)) op = o;
      if (op.empty() && std::string_view("+-/*%~[](){}=<>.:|,;").find(char(c)) != std::string_view::npos)
        op = std::string(1, char(c));
      if (op.empty()) {
        std::string shown = s_.substr(p, q - p);
        fail("unexpected char '" + shown + "' at " + std::to_string(p), p);
      }
      if (op == "{" || op == "(" || op == "[") {
        balance.push_back(op == "{" ? '}' : op == "(" ? ')' : ']');
      } else if (op == "}" || op == ")" || op == "]") {
        if (balance.empty()) fail("unexpected '" + op + "'", p);
        char expected = balance.back();
        balance.pop_back();
        if (expected != op[0]) fail("unexpected '" + op + "', expected '" + std::string(1, expected) + "'", p);
      }
      push(TokenType::Operator, op, p);
      p += op.size();
    }
  }

  size_t match_tag_end(size_t p, bool variable) const {
    if (variable) {
      if (starts(p, "-}}")) return skip_ws(p + 3);
      if (starts(p, "}}")) return p + 2;
      return std::string::npos;
    }
    if (starts(p, "+%}")) return p + 3;
    if (starts(p, "-%}")) return skip_ws(p + 3);
    if (starts(p, "%}")) {
      size_t e = p + 2;
      if (opt_.trim_blocks && e < s_.size() && s_[e] == '\n') ++e;
      return e;
    }
    return std::string::npos;
  }

  static bool digit_in_base(char c, int base) {
    if (base == 16) return std::isxdigit(static_cast<unsigned char>(c));
    return c >= '0' && c < char('0' + base);
  }

  // Digits with single '_' separators: `(\d+_)*\d+` style. Returns end.
  size_t digits(size_t p, int base) const {
    size_t e = p;
    while (e < s_.size() && digit_in_base(s_[e], base)) {
      ++e;
      if (e + 1 < s_.size() && s_[e] == '_' && digit_in_base(s_[e + 1], base)) ++e;
    }
    return e;
  }

  size_t lex_number(size_t p) {
    bool after_dot = p > 0 && s_[p - 1] == '.';
    // Float: (\d+_)*\d+ ( (\.digits)? e[+-]?digits | \.digits )
    if (!after_dot) {
      size_t e = digits(p, 10);
      size_t f = e;
      bool has_frac = false, has_exp = false;
      if (f + 1 < s_.size() && s_[f] == '.' && std::isdigit(static_cast<unsigned char>(s_[f + 1]))) {
        f = digits(f + 1, 10);
        has_frac = true;
      }
      if (f < s_.size() && (s_[f] | 32) == 'e') {
        size_t x = f + 1;
        if (x < s_.size() && (s_[x] == '+' || s_[x] == '-')) ++x;
        if (x < s_.size() && std::isdigit(static_cast<unsigned char>(s_[x]))) {
          f = digits(x, 10);
          has_exp = true;
        }
      }
      if (has_exp || has_frac) {
        std::string text;
        for (size_t i = p; i < f; ++i)
          if (s_[i] != '_') text.push_back(s_[i]);
        Token tok;
        tok.type = TokenType::Float;
        tok.value = text;
        tok.line = line_at(p);
        tok.float_value = std::strtod(text.c_str(), nullptr);
        out_.push_back(std::move(tok));
        return f;
      }
    }
    // Integer: 0b/0o/0x prefixes, [1-9](_?\d)*, 0(_?0)*.
    int base = 10;
    size_t b = p, e;
    if (s_[p] == '0' && p + 2 < s_.size() && std::string_view("bBoOxX").find(s_[p + 1]) != std::string_view::npos) {
      char k = char(s_[p + 1] | 32);
      int pb = k == 'b' ? 2 : k == 'o' ? 8 : 16;
      size_t d = p + 2;
      if (s_[d] == '_') ++d;
      if (d < s_.size() && digit_in_base(s_[d], pb)) {
        base = pb;
        b = p + 2;
      }
    }
    if (base != 10) {
      e = b;
      while (e < s_.size() && (digit_in_base(s_[e], base) ||
                               (s_[e] == '_' && e + 1 < s_.size() && digit_in_base(s_[e + 1], base))))
        ++e;
    } else if (s_[p] == '0') {
      e = p + 1;
      while (e < s_.size() && (s_[e] == '0' || (s_[e] == '_' && e + 1 < s_.size() && s_[e + 1] == '0'))) ++e;
    } else {
      e = digits(p, 10);
    }
    std::string text;
    for (size_t i = b; i < e; ++i)
      if (s_[i] != '_') text.push_back(s_[i]);
    Token tok;
    tok.type = TokenType::Integer;
    tok.value = s_.substr(p, e - p);
    tok.line = line_at(p);
    auto r = std::from_chars(text.data(), text.data() + text.size(), tok.int_value, base);
    if (r.ec != std::errc()) fail("integer literal out of the supported 64-bit range", p);
    out_.push_back(std::move(tok));
    return e;
  }

  // Python string literal with unicode-escape decoding.
  size_t lex_string(size_t p) {
    char q = s_[p];
    size_t i = p + 1;
    std::string out;
    while (true) {
      if (i >= s_.size()) fail("unexpected char '" + std::string(1, q) + "' at " + std::to_string(p), p);
      char c = s_[i];
      if (c == q) break;
      if (c != '\\') {
        out.push_back(c);
        ++i;
        continue;
      }
      if (i + 1 >= s_.size()) fail("unexpected char '" + std::string(1, q) + "' at " + std::to_string(p), p);
      char e = s_[i + 1];
      i += 2;
      switch (e) {
        case '\n': break;  // line continuation
        case '\\': out.push_back('\\'); break;
        case '\'': out.push_back('\''); break;
        case '"': out.push_back('"'); break;
        case 'a': out.push_back('\a'); break;
        case 'b': out.push_back('\b'); break;
        case 'f': out.push_back('\f'); break;
        case 'n': out.push_back('\n'); break;
        case 'r': out.push_back('\r'); break;
        case 't': out.push_back('\t'); break;
        case 'v': out.push_back('\v'); break;
        case 'x':
        case 'u':
        case 'U': {
          size_t n = e == 'x' ? 2 : e == 'u' ? 4 : 8;
          uint32_t cp = 0;
          for (size_t k = 0; k < n; ++k) {
            if (i + k >= s_.size() || !std::isxdigit(static_cast<unsigned char>(s_[i + k])))
              fail(std::string("truncated \\") + e + " escape", p);
            char h = s_[i + k];
            cp = cp * 16 + uint32_t(h <= '9' ? h - '0' : (h | 32) - 'a' + 10);
          }
          i += n;
          if (cp > 0x10FFFF) fail("illegal Unicode character", p);
          if (cp >= 0xD800 && cp <= 0xDFFF) cp = 0xFFFD;  // lone surrogates cannot be UTF-8
          append_utf8(out, cp);
          break;
        }
        default:
          if (e >= '0' && e <= '7') {
            uint32_t cp = uint32_t(e - '0');
            for (int k = 0; k < 2 && i < s_.size() && s_[i] >= '0' && s_[i] <= '7'; ++k) cp = cp * 8 + uint32_t(s_[i++] - '0');
            append_utf8(out, cp);
          } else {
            // Unknown escapes stay as written (Python keeps the backslash).
            out.push_back('\\');
            --i;
          }
      }
    }
    push(TokenType::String, std::move(out), p);
    return i + 1;
  }

  std::string s_;
  LexerOptions opt_;
  std::vector<size_t> newlines_;
  std::vector<Token> out_;
  size_t pos_ = 0;
  bool line_starting_ = true;
};

// jinja2 normalises \r\n and \r to \n and drops one trailing newline.
std::string normalize_newlines(std::string_view src) {
  std::string out;
  out.reserve(src.size());
  for (size_t i = 0; i < src.size(); ++i) {
    if (src[i] == '\r') {
      out.push_back('\n');
      if (i + 1 < src.size() && src[i + 1] == '\n') ++i;
    } else {
      out.push_back(src[i]);
    }
  }
  if (!out.empty() && out.back() == '\n') out.pop_back();
  return out;
}

}  // namespace

Result<std::vector<Token>> tokenize(std::string_view source, const LexerOptions& options) {
  size_t bad = find_invalid_utf8(source);
  if (bad != std::string_view::npos)
    return make_error("template is not valid UTF-8 (byte offset " + std::to_string(bad) + ")");
  Lexer lexer(normalize_newlines(source), options);
  try {
    return lexer.run();
  } catch (const LexError& e) {
    return make_error("line " + std::to_string(e.line) + ": " + e.message);
  }
}

}  // namespace muse::jinja
