#include "muse/chat/atem_parser.h"

#include <algorithm>

namespace muse::chat {

namespace {

constexpr size_t kMaxTagBytes = 4096;  // a tag longer than this is not ATEM

bool is_space(char c) { return c == ' ' || c == '\n' || c == '\r' || c == '\t'; }
bool is_key_char(char c) {
  return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') || c == '_' || c == ':' ||
         c == '-' || c == '.';
}

// 1 when `s` starts at `p`, -1 when only a prefix of `s` has arrived, else 0.
int match_at(const std::string& raw, size_t p, std::string_view s) {
  size_t avail = raw.size() - p;
  size_t n = std::min(avail, s.size());
  if (raw.compare(p, n, s.substr(0, n)) != 0) return 0;
  return n == s.size() ? 1 : -1;
}

}  // namespace

void AtemParser::feed(std::string_view text, std::vector<AtemEvent>& out) {
  raw_.append(text);
  advance(out);
}

int AtemParser::match(std::string_view s) const { return match_at(raw_, pos_, s); }

bool AtemParser::skip_space() {
  while (pos_ < raw_.size() && is_space(raw_[pos_])) ++pos_;
  return pos_ < raw_.size();
}

void AtemParser::fail(State s, std::vector<AtemEvent>& out) {
  state_ = s;
  AtemEvent e;
  e.kind = s == State::NotAtem ? AtemEvent::Kind::NotAtem
           : s == State::Trailing ? AtemEvent::Kind::Trailing
                                  : AtemEvent::Kind::Malformed;
  e.at = s == State::NotAtem ? 0 : pos_;
  out.push_back(std::move(e));
}

// Parses a tag's attributes from pos_ (just after `<atem:invoke` or
// `<atem:parameter`) up to `>`. Returns false with *need_more when the tag
// has not fully arrived; false without it when the tag is malformed. A stray
// <|message|> is dropped wherever it appears; inside the invoke name, a '<'
// ends the name and the tag (the model wrote <|message|> instead of `">`).
bool AtemParser::parse_attribute(std::string* key_out, std::string* name_out, bool* need_more, bool in_invoke_tag) {
  *need_more = false;
  const std::string& msg = f_.message;
  size_t p = pos_;
  std::string name;
  bool found = false;
  auto more = [&] {
    *need_more = true;
    return false;
  };
  while (true) {
    while (p < raw_.size() && is_space(raw_[p])) ++p;
    if (p >= raw_.size()) return more();
    if (raw_[p] == '>') {
      ++p;
      break;
    }
    int m = match_at(raw_, p, msg);
    if (m == 1) {
      p += msg.size();
      continue;
    }
    if (m == -1) return more();
    if (raw_[p] == '<' && found) break;  // the next tag follows: `">` was swallowed
    size_t k = p;
    while (k < raw_.size() && is_key_char(raw_[k])) ++k;
    if (k >= raw_.size()) return more();
    if (k == p) return false;
    std::string key = raw_.substr(p, k - p);
    p = k;
    while (p < raw_.size() && is_space(raw_[p])) ++p;
    if (p >= raw_.size()) return more();
    if (raw_[p] != '=') return false;
    ++p;
    while (p < raw_.size() && is_space(raw_[p])) ++p;
    if (p >= raw_.size()) return more();
    char quote = raw_[p];
    if (quote != '"' && quote != '\'') return false;
    ++p;
    std::string value;
    bool ended_by_tag = false;
    while (true) {
      if (p >= raw_.size()) return more();
      int mm = match_at(raw_, p, msg);
      if (mm == 1) {
        p += msg.size();
        continue;
      }
      if (mm == -1) return more();
      char c = raw_[p];
      if (c == quote) {
        ++p;
        break;
      }
      if (c == '<' && in_invoke_tag && key == "name") {
        ended_by_tag = true;
        break;
      }
      value.push_back(c);
      ++p;
      if (p - pos_ > kMaxTagBytes) return false;
    }
    if (key == "name") {
      name = std::move(value);
      found = true;
    }
    if (ended_by_tag) break;
    if (p - pos_ > kMaxTagBytes) return false;
  }
  if (!found) return false;
  *name_out = std::move(name);
  (void)key_out;
  pos_ = p;
  return true;
}

void AtemParser::advance(std::vector<AtemEvent>& out) {
  while (true) {
    switch (state_) {
      case State::Start: {
        if (!skip_space()) return;
        int m = match(f_.calls_open);
        if (m == -1) return;
        if (m == 0) return fail(State::NotAtem, out);
        pos_ += f_.calls_open.size();
        state_ = State::InBlock;
        break;
      }
      case State::InBlock: {
        if (!skip_space()) return;
        int inv = match(f_.invoke_open), close = match(f_.calls_close);
        if (inv == 1) {
          invoke_at_ = pos_;
          pos_ += f_.invoke_open.size();
          state_ = State::InvokeTag;
          params_in_invoke_ = 0;
        } else if (close == 1) {
          pos_ += f_.calls_close.size();
          state_ = State::AfterBlock;
        } else if (inv == -1 || close == -1) {
          return;
        } else {
          return fail(State::Malformed, out);
        }
        break;
      }
      case State::InvokeTag: {
        bool need_more;
        std::string key;
        if (!parse_attribute(&key, &name_, &need_more, true)) {
          if (need_more && raw_.size() - pos_ <= kMaxTagBytes) return;
          return fail(State::Malformed, out);
        }
        AtemEvent e;
        e.kind = AtemEvent::Kind::InvokeStart;
        e.name = name_;
        e.at = invoke_at_;
        out.push_back(std::move(e));
        state_ = State::InInvoke;
        break;
      }
      case State::InInvoke: {
        if (!skip_space()) return;
        int param = match(f_.param_open), close = match(f_.invoke_close);
        if (param == 1) {
          pos_ += f_.param_open.size();
          state_ = State::ParamTag;
        } else if (close == 1) {
          pos_ += f_.invoke_close.size();
          AtemEvent e;
          e.kind = AtemEvent::Kind::InvokeEnd;
          e.at = invoke_at_;
          out.push_back(std::move(e));
          state_ = State::InBlock;
        } else if (param == -1 || close == -1) {
          return;
        } else if (params_in_invoke_ == 0) {
          // §4.6 item 5: the value follows the invoke tag directly.
          param_.clear();
          value_start_ = search_from_ = pos_;
          state_ = State::Value;
        } else {
          return fail(State::Malformed, out);
        }
        break;
      }
      case State::ParamTag: {
        bool need_more;
        std::string key;
        if (!parse_attribute(&key, &param_, &need_more, false)) {
          if (need_more && raw_.size() - pos_ <= kMaxTagBytes) return;
          return fail(State::Malformed, out);
        }
        value_start_ = search_from_ = pos_;
        state_ = State::Value;
        break;
      }
      case State::Value: {
        size_t q = raw_.find(f_.param_close, search_from_);
        if (q == std::string::npos) {
          size_t keep = f_.param_close.size() - 1;
          search_from_ = std::max(value_start_, raw_.size() > keep ? raw_.size() - keep : 0);
          return;
        }
        AtemEvent e;
        e.kind = AtemEvent::Kind::Parameter;
        e.name = param_;
        e.value = raw_.substr(value_start_, q - value_start_);
        e.at = value_start_;
        out.push_back(std::move(e));
        pos_ = q + f_.param_close.size();
        ++params_in_invoke_;
        state_ = State::InInvoke;
        break;
      }
      case State::AfterBlock: {
        if (!skip_space()) return;
        int m = match(f_.calls_open);
        if (m == -1) return;
        if (m == 0) return fail(State::Trailing, out);
        pos_ += f_.calls_open.size();
        state_ = State::InBlock;
        break;
      }
      case State::NotAtem:
      case State::Malformed:
      case State::Trailing: return;
    }
  }
}

}  // namespace muse::chat
