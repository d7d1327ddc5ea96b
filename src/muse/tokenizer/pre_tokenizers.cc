#include "muse/tokenizer/pre_tokenizers.h"

#include <string>
#include <vector>

#include "muse/tokenizer/bpe.h"
#include "muse/tokenizer/regex.h"
#include "muse/tokenizer/unicode.h"

namespace muse::tok {
namespace {

enum class Behavior { Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous };

Result<Behavior> parse_behavior(const Json& j, const std::string& where, Behavior fallback) {
  const Json* b = j.find("behavior");
  if (!b || b->is_null()) return fallback;
  if (!b->is_string()) return make_error(where + ".behavior must be a string");
  const std::string& s = b->as_string();
  if (s == "Removed") return Behavior::Removed;
  if (s == "Isolated") return Behavior::Isolated;
  if (s == "MergedWithPrevious") return Behavior::MergedWithPrevious;
  if (s == "MergedWithNext") return Behavior::MergedWithNext;
  if (s == "Contiguous") return Behavior::Contiguous;
  return make_error(where + ".behavior '" + s + "' is not one of Removed, Isolated, MergedWithPrevious, MergedWithNext, Contiguous");
}

// Hugging Face's NormalizedString::split: turns (span, is_match) pieces into
// the kept sub-pieces, then hands the non-empty ones to the sink.
void emit_split(std::string_view text, const std::vector<Span>& spans, Behavior behavior, bool at_start,
                WordSink sink) {
  auto emit = [&](uint32_t s, uint32_t e) {
    if (e > s) sink(text.substr(s, e - s), at_start && s == 0);
  };
  switch (behavior) {
    case Behavior::Isolated:
      for (const Span& sp : spans) emit(sp.start, sp.end);
      return;
    case Behavior::Removed:
      for (const Span& sp : spans)
        if (!sp.is_match) emit(sp.start, sp.end);
      return;
    case Behavior::Contiguous:
    case Behavior::MergedWithPrevious: {
      std::vector<std::pair<uint32_t, uint32_t>> out;
      bool prev_match = false;
      for (const Span& sp : spans) {
        bool merge = behavior == Behavior::Contiguous ? sp.is_match == prev_match : (sp.is_match && !prev_match);
        if (merge && !out.empty()) out.back().second = sp.end;
        else out.push_back({sp.start, sp.end});
        prev_match = sp.is_match;
      }
      for (auto [s, e] : out) emit(s, e);
      return;
    }
    case Behavior::MergedWithNext: {
      std::vector<std::pair<uint32_t, uint32_t>> out;  // built back to front
      bool prev_match = false;
      for (size_t i = spans.size(); i-- > 0;) {
        const Span& sp = spans[i];
        if (sp.is_match && !prev_match && !out.empty()) out.back().first = sp.start;
        else out.push_back({sp.start, sp.end});
        prev_match = sp.is_match;
      }
      for (size_t i = out.size(); i-- > 0;) emit(out[i].first, out[i].second);
      return;
    }
  }
}

// Hugging Face's Pattern for a char predicate: each matching character is a
// match of its own; the runs between them are non-matches.
template <class Pred>
void char_spans(std::string_view text, Pred pred, std::vector<Span>& out) {
  out.clear();
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  uint32_t last = 0;
  for (size_t i = 0; i < text.size();) {
    int len;
    uint32_t cp = decode_utf8(text.data(), i, &len);
    if (pred(cp)) {
      if (last < i) out.push_back({last, uint32_t(i), false});
      out.push_back({uint32_t(i), uint32_t(i + len), true});
      last = uint32_t(i + len);
    }
    i += size_t(len);
  }
  if (last < text.size()) out.push_back({last, uint32_t(text.size()), false});
}

class SplitPreTokenizer final : public PreTokenizer {
 public:
  SplitPreTokenizer(Regex re, Behavior b, bool invert) : re_(std::move(re)), behavior_(b), invert_(invert) {}
  void pre_tokenize(std::string_view text, bool at_start, WordSink sink) const override {
    bool keep_matches, keep_gaps;  // the streaming cases: every kept span is its own piece
    if (behavior_ == Behavior::Isolated) keep_matches = keep_gaps = true;
    else if (behavior_ == Behavior::Removed) keep_matches = invert_, keep_gaps = !invert_;
    else return slow(text, at_start, sink);
    thread_local std::vector<Span> matches;
    size_t mark = matches.size();  // re-entrancy: nested sinks may split too
    re_.find_all(text, matches);
    uint32_t prev = 0;
    for (size_t i = mark; i < matches.size(); ++i) {
      Span m = matches[i];
      if (keep_gaps && prev < m.start) sink(text.substr(prev, m.start - prev), at_start && prev == 0);
      if (keep_matches && m.end > m.start) sink(text.substr(m.start, m.end - m.start), at_start && m.start == 0);
      prev = m.end;
    }
    if (keep_gaps && prev < text.size()) sink(text.substr(prev), at_start && prev == 0);
    matches.resize(mark);
  }

 private:
  void slow(std::string_view text, bool at_start, WordSink sink) const {
    std::vector<Span> spans;
    re_.find_matches(text, spans);
    if (invert_)
      for (Span& s : spans) s.is_match = !s.is_match;
    emit_split(text, spans, behavior_, at_start, sink);
  }
  Regex re_;
  Behavior behavior_;
  bool invert_;
};

// Splits on a character predicate.
class CharSplitPreTokenizer final : public PreTokenizer {
 public:
  enum Kind { Digits, WhitespaceSplit, Punctuation, Delimiter };
  CharSplitPreTokenizer(Kind k, Behavior b, uint32_t delimiter = 0) : kind_(k), behavior_(b), delimiter_(delimiter) {}
  void pre_tokenize(std::string_view text, bool at_start, WordSink sink) const override {
    std::vector<Span> spans;
    switch (kind_) {
      case Digits: char_spans(text, [](uint32_t cp) { return (char_classes(cp) & kN) != 0; }, spans); break;
      case WhitespaceSplit: char_spans(text, is_white_space, spans); break;
      case Punctuation:
        char_spans(text, [](uint32_t cp) {
          bool ascii_punct = cp < 0x80 && ((cp >= 0x21 && cp <= 0x2F) || (cp >= 0x3A && cp <= 0x40) ||
                                           (cp >= 0x5B && cp <= 0x60) || (cp >= 0x7B && cp <= 0x7E));
          return ascii_punct || (char_classes(cp) & kP);
        }, spans);
        break;
      case Delimiter: char_spans(text, [d = delimiter_](uint32_t cp) { return cp == d; }, spans); break;
    }
    emit_split(text, spans, behavior_, at_start, sink);
  }

 private:
  Kind kind_;
  Behavior behavior_;
  uint32_t delimiter_;
};

class MetaspacePreTokenizer final : public PreTokenizer {
 public:
  enum Scheme { Always, First, Never };
  MetaspacePreTokenizer(std::string replacement, Scheme scheme, bool split)
      : rep_(std::move(replacement)), scheme_(scheme), split_(split) {
    int len;
    rep_cp_ = rep_.empty() ? 0 : decode_utf8(rep_.data(), 0, &len);
  }
  void pre_tokenize(std::string_view text, bool at_start, WordSink sink) const override {
    std::string s;
    s.reserve(text.size() + rep_.size());
    for (char c : text) {
      if (c == ' ') s += rep_;
      else s.push_back(c);
    }
    bool starts = s.compare(0, rep_.size(), rep_) == 0;
    if (!starts && (scheme_ == Always || (scheme_ == First && at_start))) s.insert(0, rep_);
    if (!split_) {
      if (!s.empty()) sink(s, at_start);
      return;
    }
    std::vector<Span> spans;
    char_spans(s, [c = rep_cp_](uint32_t cp) { return cp == c; }, spans);
    emit_split(s, spans, Behavior::MergedWithNext, at_start, sink);
  }

 private:
  std::string rep_;
  uint32_t rep_cp_;
  Scheme scheme_;
  bool split_;
};

class ByteLevelPreTokenizer final : public PreTokenizer {
 public:
  ByteLevelPreTokenizer(bool add_prefix_space, bool use_regex, bool map_bytes)
      : add_prefix_space_(add_prefix_space), map_bytes_(map_bytes) {
    if (use_regex) {
      auto re = Regex::compile(R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)");
      if (re.ok()) gpt2_ = std::move(re).value();
    }
  }
  void pre_tokenize(std::string_view text, bool at_start, WordSink sink) const override {
    std::string prefixed;
    if (add_prefix_space_ && (text.empty() || text[0] != ' ')) {
      prefixed.reserve(text.size() + 1);
      prefixed.push_back(' ');
      prefixed.append(text);
      text = prefixed;
    }
    auto out = [&](std::string_view word, bool start) {
      if (!map_bytes_) return sink(word, start);
      std::string mapped;
      mapped.reserve(word.size() * 2);
      for (unsigned char c : word) append_utf8_cp(mapped, byte_level_char(c));
      sink(mapped, start);
    };
    if (!gpt2_.valid()) {
      if (!text.empty()) out(text, at_start);
      return;
    }
    std::vector<Span> matches;
    gpt2_.find_all(text, matches);
    uint32_t prev = 0;
    for (const Span& m : matches) {
      if (prev < m.start) out(text.substr(prev, m.start - prev), at_start && prev == 0);
      if (m.end > m.start) out(text.substr(m.start, m.end - m.start), at_start && m.start == 0);
      prev = m.end;
    }
    if (prev < text.size()) out(text.substr(prev), at_start && prev == 0);
  }

 private:
  bool add_prefix_space_, map_bytes_;
  Regex gpt2_;
};

class SequencePreTokenizer final : public PreTokenizer {
 public:
  explicit SequencePreTokenizer(std::vector<std::unique_ptr<PreTokenizer>> steps) : steps_(std::move(steps)) {}
  void pre_tokenize(std::string_view text, bool at_start, WordSink sink) const override {
    run(0, text, at_start, sink);
  }

 private:
  void run(size_t i, std::string_view text, bool at_start, WordSink sink) const {
    if (i == steps_.size()) return sink(text, at_start);
    steps_[i]->pre_tokenize(text, at_start, [&](std::string_view w, bool s) { run(i + 1, w, s, sink); });
  }
  std::vector<std::unique_ptr<PreTokenizer>> steps_;
};

// Bert: whitespace removed, then punctuation isolated.
class BertPreTokenizer final : public PreTokenizer {
 public:
  BertPreTokenizer()
      : ws_(CharSplitPreTokenizer::WhitespaceSplit, Behavior::Removed),
        punct_(CharSplitPreTokenizer::Punctuation, Behavior::Isolated) {}
  void pre_tokenize(std::string_view text, bool at_start, WordSink sink) const override {
    ws_.pre_tokenize(text, at_start, [&](std::string_view w, bool s) { punct_.pre_tokenize(w, s, sink); });
  }

 private:
  CharSplitPreTokenizer ws_, punct_;
};

// Steps chain through nested calls, so their number bounds the stack depth;
// real tokenizers use at most five.
constexpr int kMaxSteps = 64;

Result<std::unique_ptr<PreTokenizer>> make(const Json& j, bool byte_mode, bool is_last, int& step_count) {
  if (!j.is_object()) return make_error("pre_tokenizer must be an object or null");
  if (++step_count > kMaxSteps) return make_error("pre_tokenizer has more than " + std::to_string(kMaxSteps) + " steps");
  std::string type = j.get_string("type", "");
  std::string where = "pre_tokenizer " + type;
  using P = std::unique_ptr<PreTokenizer>;
  if (type == "Sequence") {
    const Json* list = j.find("pretokenizers");
    if (!list || !list->is_array()) return make_error("pre_tokenizer Sequence needs a 'pretokenizers' array");
    std::vector<P> steps;
    const auto& arr = list->as_array();
    for (size_t i = 0; i < arr.size(); ++i) {
      MUSE_ASSIGN_OR_RETURN(P step, make(arr[i], byte_mode, is_last && i + 1 == arr.size(), step_count));
      steps.push_back(std::move(step));
    }
    return P(new SequencePreTokenizer(std::move(steps)));
  }
  if (type == "Split") {
    const Json* pattern = j.find("pattern");
    if (!pattern) return make_error(where + " needs a pattern");
    MUSE_ASSIGN_OR_RETURN(Regex re, pattern_regex(*pattern, where));
    MUSE_ASSIGN_OR_RETURN(Behavior b, parse_behavior(j, where, Behavior::Isolated));
    MUSE_ASSIGN_OR_RETURN(bool invert, j.bool_member("invert", false));
    return P(new SplitPreTokenizer(std::move(re), b, invert));
  }
  if (type == "ByteLevel") {
    MUSE_ASSIGN_OR_RETURN(bool add_prefix_space, j.bool_member("add_prefix_space", true));
    MUSE_ASSIGN_OR_RETURN(bool use_regex, j.bool_member("use_regex", true));
    return P(new ByteLevelPreTokenizer(add_prefix_space, use_regex, !(byte_mode && is_last)));
  }
  if (type == "Metaspace") {
    MUSE_ASSIGN_OR_RETURN(std::string rep, j.string_member("replacement", "\xE2\x96\x81"));
    int len = 0;
    if (rep.empty() || (decode_utf8(rep.data(), 0, &len), size_t(len) != rep.size()))
      return make_error(where + ".replacement must be one character");
    MetaspacePreTokenizer::Scheme scheme = MetaspacePreTokenizer::Always;
    const Json* ps = j.find("prepend_scheme");
    if (ps && ps->is_string()) {
      if (ps->as_string() == "first") scheme = MetaspacePreTokenizer::First;
      else if (ps->as_string() == "never") scheme = MetaspacePreTokenizer::Never;
      else if (ps->as_string() != "always") return make_error(where + ".prepend_scheme must be always, first or never");
    }
    if (const Json* aps = j.find("add_prefix_space"); aps && aps->is_bool() && !aps->as_bool())
      scheme = MetaspacePreTokenizer::Never;  // legacy spelling of prepend_scheme "never"
    MUSE_ASSIGN_OR_RETURN(bool split, j.bool_member("split", true));
    return P(new MetaspacePreTokenizer(rep, scheme, split));
  }
  if (type == "Digits") {
    MUSE_ASSIGN_OR_RETURN(bool individual, j.bool_member("individual_digits", false));
    return P(new CharSplitPreTokenizer(CharSplitPreTokenizer::Digits,
                                       individual ? Behavior::Isolated : Behavior::Contiguous));
  }
  if (type == "Whitespace") {
    MUSE_ASSIGN_OR_RETURN(Regex re, Regex::compile(R"(\w+|[^\w\s]+)"));
    return P(new SplitPreTokenizer(std::move(re), Behavior::Removed, /*invert=*/true));
  }
  if (type == "WhitespaceSplit") return P(new CharSplitPreTokenizer(CharSplitPreTokenizer::WhitespaceSplit, Behavior::Removed));
  if (type == "Punctuation") {
    MUSE_ASSIGN_OR_RETURN(Behavior b, parse_behavior(j, where, Behavior::Isolated));
    return P(new CharSplitPreTokenizer(CharSplitPreTokenizer::Punctuation, b));
  }
  if (type == "CharDelimiterSplit") {
    MUSE_ASSIGN_OR_RETURN(std::string d, j.string_member("delimiter", ""));
    int len = 0;
    if (d.empty() || (decode_utf8(d.data(), 0, &len), size_t(len) != d.size()))
      return make_error(where + ".delimiter must be one character");
    return P(new CharSplitPreTokenizer(CharSplitPreTokenizer::Delimiter, Behavior::Removed, decode_utf8(d.data(), 0, &len)));
  }
  if (type == "BertPreTokenizer") return P(new BertPreTokenizer);
  if (type.empty()) return make_error("pre_tokenizer has no 'type'");
  return make_error("unsupported pre_tokenizer type '" + type +
                    "' (supported: Sequence, Split, ByteLevel, Metaspace, Digits, Whitespace, WhitespaceSplit, "
                    "Punctuation, CharDelimiterSplit, BertPreTokenizer)");
}

}  // namespace

bool ends_with_byte_level(const Json& j) {
  if (!j.is_object()) return false;
  std::string type = j.get_string("type", "");
  if (type == "ByteLevel") return true;
  if (type == "Sequence") {
    const Json* list = j.find("pretokenizers");
    return list && list->is_array() && !list->as_array().empty() && ends_with_byte_level(list->as_array().back());
  }
  return false;
}

Result<std::unique_ptr<PreTokenizer>> make_pre_tokenizer(const Json& j, bool byte_mode) {
  if (j.is_null()) return std::unique_ptr<PreTokenizer>();
  int step_count = 0;
  return make(j, byte_mode, /*is_last=*/true, step_count);
}

}  // namespace muse::tok
