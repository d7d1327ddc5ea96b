#include "muse/loading/module_regex.h"

#include <cctype>

namespace muse {

namespace {

constexpr size_t kMaxStates = 2048;  // {m,n} copies included: a bound on the work per name byte
constexpr int kMaxRepeat = 1000;

using State = ModuleRegex::State;

// A fragment under construction: its start state and the dangling exits
// (state index, which edge) still to be patched to what follows.
struct Frag {
  int start = -1;
  std::vector<std::pair<int, int>> outs;
};

class Compiler {
 public:
  explicit Compiler(std::string_view p) : p_(p) {}

  Result<std::pair<std::vector<State>, int>> run() {
    if (!p_.empty() && p_[0] == '^') ++i_;
    MUSE_ASSIGN_OR_RETURN(Frag f, alternation());
    if (i_ != p_.size()) return err(p_[i_] == ')' ? "an unmatched )" : "unexpected input");
    const int acc = add(State::Accept);
    patch(f, acc);
    return std::make_pair(std::move(states_), f.start);
  }

 private:
  Error err(const std::string& what) const {
    return make_error("regular expression \"" + std::string(p_) + "\": " + what + " at offset " + std::to_string(i_));
  }
  int add(State::Kind k) {
    State s;
    s.kind = k;
    states_.push_back(s);
    return int(states_.size()) - 1;
  }
  void patch(const Frag& f, int target) {
    for (auto [s, which] : f.outs) (which ? states_[size_t(s)].out2 : states_[size_t(s)].out) = target;
  }
  bool full() const { return states_.size() > kMaxStates; }

  Result<Frag> alternation() {
    MUSE_ASSIGN_OR_RETURN(Frag left, sequence());
    while (i_ < p_.size() && p_[i_] == '|') {
      ++i_;
      MUSE_ASSIGN_OR_RETURN(Frag right, sequence());
      const int s = add(State::Split);
      states_[size_t(s)].out = left.start, states_[size_t(s)].out2 = right.start;
      Frag f{s, left.outs};
      f.outs.insert(f.outs.end(), right.outs.begin(), right.outs.end());
      left = std::move(f);
    }
    return left;
  }

  // Concatenation; an empty sequence is a split whose one edge falls through.
  Result<Frag> sequence() {
    Frag seq;
    while (i_ < p_.size() && p_[i_] != '|' && p_[i_] != ')') {
      MUSE_ASSIGN_OR_RETURN(Frag f, repeat());
      if (full()) return err("too large (more than " + std::to_string(kMaxStates) + " states)");
      if (seq.start < 0) seq = std::move(f);
      else patch(seq, f.start), seq.outs = std::move(f.outs);
    }
    if (seq.start < 0) {
      const int s = add(State::Split);  // one exit; out2 stays -1, no edge
      seq = {s, {{s, 0}}};
    }
    return seq;
  }

  // An atom and its quantifiers. {m,n} copies the atom's source text.
  Result<Frag> repeat() {
    const size_t atom_begin = i_;
    MUSE_ASSIGN_OR_RETURN(Frag f, atom());
    const size_t atom_end = i_;
    if (i_ < p_.size() && (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '?' || p_[i_] == '{')) {
      int lo = 0, hi = -1;  // hi -1: unbounded
      const char q = p_[i_++];
      if (q == '*') lo = 0, hi = -1;
      else if (q == '+') lo = 1, hi = -1;
      else if (q == '?') lo = 0, hi = 1;
      else {
        MUSE_ASSIGN_OR_RETURN(lo, number());
        hi = lo;
        if (i_ < p_.size() && p_[i_] == ',') {
          ++i_;
          hi = -1;
          if (i_ < p_.size() && p_[i_] != '}') {
            MUSE_ASSIGN_OR_RETURN(hi, number());
          }
        }
        if (i_ >= p_.size() || p_[i_] != '}') return err("an unterminated {m,n}");
        ++i_;
        if (hi >= 0 && hi < lo) return err("{m,n} with n < m");
      }
      if (i_ < p_.size() && p_[i_] == '?') ++i_;  // lazy: the same yes/no answer
      if (i_ < p_.size() && p_[i_] == '+') return err("possessive quantifiers are not supported");
      MUSE_ASSIGN_OR_RETURN(f, quantify(f, atom_begin, atom_end, lo, hi));
      if (i_ < p_.size() && (p_[i_] == '*' || p_[i_] == '+' || p_[i_] == '?' || p_[i_] == '{'))
        return err("a repeated quantifier");
    }
    return f;
  }

  Result<int> number() {
    if (i_ >= p_.size() || !std::isdigit(static_cast<unsigned char>(p_[i_]))) return err("a number expected in {m,n}");
    int v = 0;
    while (i_ < p_.size() && std::isdigit(static_cast<unsigned char>(p_[i_]))) {
      v = v * 10 + (p_[i_++] - '0');
      if (v > kMaxRepeat) return err("a repeat count above " + std::to_string(kMaxRepeat));
    }
    return v;
  }

  // A fresh copy of the atom at [b, e) of the pattern.
  Result<Frag> copy_atom(size_t b, size_t e) {
    const size_t save = i_;
    i_ = b;
    auto f = atom();
    if (f.ok() && i_ != e) return err("internal: atom copy");
    i_ = save;
    return f;
  }

  Result<Frag> star(Frag f) {
    const int s = add(State::Split);
    states_[size_t(s)].out = f.start;
    patch(f, s);
    return Frag{s, {{s, 1}}};
  }

  Result<Frag> quantify(Frag f, size_t b, size_t e, int lo, int hi) {
    // f is copy 1; further copies come from the source text.
    std::vector<Frag> parts;
    const int mandatory = lo, optional = hi < 0 ? 0 : hi - lo;
    for (int k = 0; k < mandatory + optional + (hi < 0 ? 1 : 0); ++k) {
      Frag c;
      if (k == 0) c = std::move(f);
      else {
        MUSE_ASSIGN_OR_RETURN(c, copy_atom(b, e));
      }
      if (full()) return err("too large (more than " + std::to_string(kMaxStates) + " states)");
      if (k >= mandatory && hi < 0) {
        MUSE_ASSIGN_OR_RETURN(c, star(std::move(c)));
      } else if (k >= mandatory) {  // optional copy: skip or take
        const int s = add(State::Split);
        states_[size_t(s)].out = c.start;
        c.outs.push_back({s, 1});
        c.start = s;
      }
      parts.push_back(std::move(c));
    }
    if (parts.empty()) {  // {0} or {0,0}: matches the empty string
      const int s = add(State::Split);  // one exit; out2 stays -1, no edge
      return Frag{s, {{s, 0}}};
    }
    Frag seq = std::move(parts[0]);
    for (size_t k = 1; k < parts.size(); ++k) patch(seq, parts[k].start), seq.outs = std::move(parts[k].outs);
    return seq;
  }

  Result<Frag> char_state(const bool (&set)[256]) {
    const int s = add(State::Char);
    for (int c = 0; c < 256; ++c) states_[size_t(s)].set[c] = set[c];
    return Frag{s, {{s, 0}}};
  }

  static void class_escape(char e, bool (&set)[256]) {
    for (int c = 0; c < 256; ++c) {
      const bool digit = c >= '0' && c <= '9';
      const bool word = digit || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || c == '_';
      const bool space = c == ' ' || (c >= '\t' && c <= '\r');
      bool in = false;
      switch (e) {
        case 'd': in = digit; break;
        case 'D': in = !digit; break;
        case 'w': in = word; break;
        case 'W': in = !word; break;
        case 's': in = space; break;
        case 'S': in = !space; break;
      }
      if (in) set[c] = true;
    }
  }
  static bool is_class_escape(char e) { return e == 'd' || e == 'D' || e == 'w' || e == 'W' || e == 's' || e == 'S'; }

  // An escaped literal: punctuation, \t \n \r; letters and digits (other
  // than the classes) are backreferences or assertions we do not take.
  Result<unsigned char> escaped_literal(char e) {
    if (e == 't') return static_cast<unsigned char>('\t');
    if (e == 'n') return static_cast<unsigned char>('\n');
    if (e == 'r') return static_cast<unsigned char>('\r');
    if (std::isalnum(static_cast<unsigned char>(e))) return err(std::string("the escape \\") + e + " is not supported");
    return static_cast<unsigned char>(e);
  }

  Result<Frag> atom() {
    if (i_ >= p_.size()) return err("a missing operand");
    const char c = p_[i_];
    bool set[256] = {};
    switch (c) {
      case '(': {
        ++i_;
        if (i_ < p_.size() && p_[i_] == '?') {
          if (i_ + 1 < p_.size() && p_[i_ + 1] == ':') i_ += 2;
          else return err("(? groups other than (?: (lookaround, flags, names) are not supported");
        }
        MUSE_ASSIGN_OR_RETURN(Frag f, alternation());
        if (i_ >= p_.size() || p_[i_] != ')') return err("an unterminated (");
        ++i_;
        return f;
      }
      case '*':
      case '+':
      case '?':
      case '{': return err("a quantifier with nothing to repeat");
      case '.':
        ++i_;
        for (int k = 0; k < 256; ++k) set[k] = k != '\n';
        return char_state(set);
      case '$': {
        ++i_;
        const int s = add(State::End);
        return Frag{s, {{s, 0}}};
      }
      case '^': return err("^ other than at the start");
      case '[': return bracket();
      case '\\': {
        if (i_ + 1 >= p_.size()) return err("a trailing backslash");
        const char e = p_[i_ + 1];
        i_ += 2;
        if (is_class_escape(e)) class_escape(e, set);
        else {
          MUSE_ASSIGN_OR_RETURN(unsigned char l, escaped_literal(e));
          set[l] = true;
        }
        return char_state(set);
      }
      default:
        ++i_;
        set[static_cast<unsigned char>(c)] = true;
        return char_state(set);
    }
  }

  Result<Frag> bracket() {
    ++i_;  // '['
    bool set[256] = {};
    bool negate = false;
    if (i_ < p_.size() && p_[i_] == '^') negate = true, ++i_;
    bool first = true;
    while (i_ < p_.size() && (p_[i_] != ']' || first)) {
      first = false;
      int lo;
      if (p_[i_] == '\\') {
        if (i_ + 1 >= p_.size()) return err("a trailing backslash");
        const char e = p_[i_ + 1];
        i_ += 2;
        if (is_class_escape(e)) {
          class_escape(e, set);
          continue;
        }
        MUSE_ASSIGN_OR_RETURN(unsigned char l, escaped_literal(e));
        lo = l;
      } else {
        lo = static_cast<unsigned char>(p_[i_++]);
      }
      int hi = lo;
      if (i_ + 1 < p_.size() && p_[i_] == '-' && p_[i_ + 1] != ']') {
        ++i_;
        if (p_[i_] == '\\') {
          if (i_ + 1 >= p_.size()) return err("a trailing backslash");
          MUSE_ASSIGN_OR_RETURN(unsigned char l, escaped_literal(p_[i_ + 1]));
          hi = l;
          i_ += 2;
        } else {
          hi = static_cast<unsigned char>(p_[i_++]);
        }
        if (hi < lo) return err("a reversed range in [...]");
      }
      for (int k = lo; k <= hi; ++k) set[k] = true;
    }
    if (i_ >= p_.size()) return err("an unterminated [");
    ++i_;  // ']'
    if (negate)
      for (bool& b : set) b = !b;
    return char_state(set);
  }

  std::string_view p_;
  size_t i_ = 0;
  std::vector<State> states_;
};

}  // namespace

Result<ModuleRegex> ModuleRegex::compile(std::string_view pattern) {
  if (pattern.size() > 4096) return make_error("regular expression longer than 4096 characters");
  Compiler c(pattern);
  MUSE_ASSIGN_OR_RETURN(auto compiled, c.run());
  ModuleRegex r;
  r.states_ = std::move(compiled.first);
  r.start_ = compiled.second;
  return r;
}

bool ModuleRegex::matches(std::string_view name) const {
  if (start_ < 0) return false;
  const size_t n = states_.size();
  std::vector<int> cur, next, stack;
  std::vector<uint32_t> mark(n, 0);
  uint32_t gen = 0;
  // Adds s and everything its epsilon edges reach; an End assertion passes
  // only at the end of the name. Returns true when Accept is reached.
  auto close = [&](std::vector<int>& set, int s0, bool at_end) {
    bool accept = false;
    stack.assign(1, s0);
    while (!stack.empty()) {
      const int s = stack.back();
      stack.pop_back();
      if (s < 0 || mark[size_t(s)] == gen) continue;
      mark[size_t(s)] = gen;
      const State& st = states_[size_t(s)];
      switch (st.kind) {
        case State::Char: set.push_back(s); break;
        case State::Split:
          stack.push_back(st.out);
          stack.push_back(st.out2);  // -1 (no edge) is skipped when popped
          break;
        case State::End:
          if (at_end) stack.push_back(st.out);
          break;
        case State::Accept: accept = true; break;
      }
    }
    return accept;
  };
  ++gen;
  if (close(cur, start_, name.empty())) return true;
  for (size_t i = 0; i < name.size(); ++i) {
    const unsigned char c = static_cast<unsigned char>(name[i]);
    next.clear();
    ++gen;
    bool accept = false;
    for (int s : cur)
      if (states_[size_t(s)].set[c]) accept = close(next, states_[size_t(s)].out, i + 1 == name.size()) || accept;
    if (accept) return true;  // re.match: a prefix suffices ($ was checked in close)
    cur.swap(next);
    if (cur.empty()) return false;
  }
  return false;
}

}  // namespace muse
