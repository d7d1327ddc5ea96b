#include "muse/tokenizer/decoders.h"

#include "muse/tokenizer/bpe.h"
#include "muse/tokenizer/regex.h"
#include "muse/tokenizer/unicode.h"

namespace muse::tok {
namespace {

// Character boundaries of possibly invalid UTF-8 (an invalid byte counts as
// one character), for steps that walk characters in raw mode.
std::vector<std::pair<size_t, size_t>> chars_of(const std::string& s) {
  std::vector<std::pair<size_t, size_t>> out;
  const auto* p = reinterpret_cast<const unsigned char*>(s.data());
  for (size_t i = 0; i < s.size();) {
    Utf8Step st = utf8_step(p, s.size(), i);
    size_t len = st.kind == Utf8Step::Valid ? st.len : 1;
    out.push_back({i, len});
    i += len;
  }
  return out;
}


class ByteLevelDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, bool raw) const override {
    std::string bytes;
    for (const std::string& t : tokens) byte_level_token_bytes(t, bytes);
    tokens.clear();
    if (raw) {
      tokens.push_back(std::move(bytes));
    } else {
      std::string text;
      append_utf8_lossy(text, bytes);
      tokens.push_back(std::move(text));
    }
  }
};

class ByteFallbackDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, bool raw) const override {
    std::vector<std::string> out;
    std::string run;
    size_t run_tokens = 0;
    auto flush = [&] {
      if (!run_tokens) return;
      if (raw || is_valid_run(run)) {
        out.push_back(run);
      } else {
        for (size_t i = 0; i < run_tokens; ++i) out.push_back("\xEF\xBF\xBD");
      }
      run.clear();
      run_tokens = 0;
    };
    for (std::string& t : tokens) {
      int byte = parse_byte_token(t);
      if (byte >= 0) {
        run.push_back(char(byte));
        ++run_tokens;
      } else {
        flush();
        out.push_back(std::move(t));
      }
    }
    flush();
    tokens.swap(out);
  }

 private:
  static int hex(char c) {
    if (c >= '0' && c <= '9') return c - '0';
    if (c >= 'a' && c <= 'f') return c - 'a' + 10;
    if (c >= 'A' && c <= 'F') return c - 'A' + 10;
    return -1;
  }
  // "<0xAB>" -> 0xAB (Rust's u8::from_str_radix accepts either case).
  static int parse_byte_token(const std::string& t) {
    if (t.size() != 6 || t[0] != '<' || t[1] != '0' || t[2] != 'x' || t[5] != '>') return -1;
    int l = hex(t[4]);
    if (t[3] == '+') return l;  // from_str_radix("+A", 16) == 10
    int h = hex(t[3]);
    return h < 0 || l < 0 ? -1 : h * 16 + l;
  }
  static bool is_valid_run(const std::string& s) {
    std::string tmp;
    return !sanitize_utf8(s, &tmp);
  }
};

class FuseDecoder final : public Decoder {
 public:
  void decode_chain(std::vector<std::string>& tokens, bool) const override {
    std::string all;
    for (const std::string& t : tokens) all += t;
    tokens.assign(1, std::move(all));
  }
};

class StripDecoder final : public Decoder {
 public:
  StripDecoder(std::string content, size_t start, size_t stop) : content_(std::move(content)), start_(start), stop_(stop) {}
  void decode_chain(std::vector<std::string>& tokens, bool) const override {
    for (std::string& t : tokens) {
      auto chars = chars_of(t);
      auto is_content = [&](size_t k) { return t.compare(chars[k].first, chars[k].second, content_) == 0; };
      size_t start_cut = 0, stop_cut = chars.size();
      for (size_t k = 0; k < start_ && k < chars.size() && is_content(k); ++k) start_cut = k + 1;
      for (size_t i = 0; i < stop_ && i < chars.size(); ++i) {
        size_t k = chars.size() - i - 1;
        if (!is_content(k)) break;
        stop_cut = k;
      }
      if (stop_cut < start_cut) stop_cut = start_cut;
      size_t b = start_cut < chars.size() ? chars[start_cut].first : t.size();
      size_t e = stop_cut < chars.size() ? chars[stop_cut].first : t.size();
      t = t.substr(b, e - b);
    }
  }

 private:
  std::string content_;
  size_t start_, stop_;
};

class ReplaceDecoder final : public Decoder {
 public:
  ReplaceDecoder(Regex re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void decode_chain(std::vector<std::string>& tokens, bool) const override {
    std::vector<Span> spans;
    for (std::string& t : tokens) {
      std::string valid;
      if (sanitize_utf8(t, &valid)) t.swap(valid);  // only raw-mode bytes can be invalid here
      re_.find_matches(t, spans);
      std::string out;
      for (const Span& s : spans) {
        if (s.is_match) out += content_;
        else out.append(t, s.start, s.end - s.start);
      }
      t.swap(out);
    }
  }

 private:
  Regex re_;
  std::string content_;
};

class MetaspaceDecoder final : public Decoder {
 public:
  MetaspaceDecoder(std::string rep, bool strip_first) : rep_(std::move(rep)), strip_first_(strip_first) {}
  void decode_chain(std::vector<std::string>& tokens, bool) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      std::string out;
      for (auto [b, len] : chars_of(t)) {
        if (t.compare(b, len, rep_) == 0) {
          if (!(i == 0 && strip_first_)) out.push_back(' ');
        } else {
          out.append(t, b, len);
        }
      }
      t.swap(out);
    }
  }

 private:
  std::string rep_;
  bool strip_first_;
};

void replace_all(std::string& s, const std::string& from, const std::string& to) {
  if (from.empty()) return;
  std::string out;
  size_t i = 0;
  for (size_t j; (j = s.find(from, i)) != std::string::npos; i = j + from.size()) {
    out.append(s, i, j - i);
    out += to;
  }
  out.append(s, i, std::string::npos);
  s.swap(out);
}

void wordpiece_cleanup(std::string& s) {
  static const std::pair<const char*, const char*> rules[] = {
      {" .", "."}, {" ?", "?"}, {" !", "!"}, {" ,", ","}, {" ' ", "'"}, {" n't", "n't"},
      {" 'm", "'m"}, {" do not", " don't"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (auto [from, to] : rules) replace_all(s, from, to);
}

class WordPieceDecoder final : public Decoder {
 public:
  WordPieceDecoder(std::string prefix, bool cleanup) : prefix_(std::move(prefix)), cleanup_(cleanup) {}
  void decode_chain(std::vector<std::string>& tokens, bool) const override {
    for (size_t i = 0; i < tokens.size(); ++i) {
      std::string& t = tokens[i];
      if (i != 0) {
        if (t.compare(0, prefix_.size(), prefix_) == 0) t.erase(0, prefix_.size());
        else t.insert(0, " ");
      }
      if (cleanup_) wordpiece_cleanup(t);
    }
  }

 private:
  std::string prefix_;
  bool cleanup_;
};

class BpeDecoder final : public Decoder {
 public:
  explicit BpeDecoder(std::string suffix) : suffix_(std::move(suffix)) {}
  void decode_chain(std::vector<std::string>& tokens, bool) const override {
    for (size_t i = 0; i < tokens.size(); ++i) replace_all(tokens[i], suffix_, i + 1 == tokens.size() ? "" : " ");
  }

 private:
  std::string suffix_;
};

class CtcDecoder final : public Decoder {
 public:
  CtcDecoder(std::string pad, std::string delim, bool cleanup) : pad_(std::move(pad)), delim_(std::move(delim)), cleanup_(cleanup) {}
  void decode_chain(std::vector<std::string>& tokens, bool) const override {
    std::vector<std::string> out;
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i > 0 && tokens[i] == tokens[i - 1]) continue;  // dedup consecutive
      std::string t = tokens[i];
      replace_all(t, pad_, "");
      if (cleanup_) {
        wordpiece_cleanup(t);
        replace_all(t, delim_, " ");
      }
      if (!t.empty()) out.push_back(std::move(t));
    }
    tokens.swap(out);
  }

 private:
  std::string pad_, delim_;
  bool cleanup_;
};

class SequenceDecoder final : public Decoder {
 public:
  explicit SequenceDecoder(std::vector<std::unique_ptr<Decoder>> steps) : steps_(std::move(steps)) {}
  void decode_chain(std::vector<std::string>& tokens, bool raw) const override {
    for (const auto& s : steps_) s->decode_chain(tokens, raw);
  }

 private:
  std::vector<std::unique_ptr<Decoder>> steps_;
};

Result<std::string> one_char(const Json& j, const char* key, const char* fallback, const std::string& where) {
  MUSE_ASSIGN_OR_RETURN(std::string s, j.string_member(key, fallback));
  int len = 0;
  if (s.empty() || !is_valid_utf8(s) || (decode_utf8(s.data(), 0, &len), size_t(len) != s.size()))
    return make_error(where + "." + key + " must be one character");
  return s;
}

}  // namespace

void byte_level_token_bytes(std::string_view token, std::string& out) {
  size_t mark = out.size();
  for (size_t i = 0; i < token.size();) {
    int len;
    int b = byte_level_byte(decode_utf8(token.data(), i, &len));
    if (b < 0) {
      out.resize(mark);
      out.append(token);
      return;
    }
    out.push_back(char(b));
    i += size_t(len);
  }
}

bool is_plain_byte_level_decoder(const Json& j) {
  return j.is_object() && j.get_string("type", "") == "ByteLevel";
}

Result<std::unique_ptr<Decoder>> make_decoder(const Json& j) {
  using D = std::unique_ptr<Decoder>;
  if (j.is_null()) return D();
  if (!j.is_object()) return make_error("decoder must be an object or null");
  std::string type = j.get_string("type", "");
  std::string where = "decoder " + type;
  if (type == "ByteLevel") return D(new ByteLevelDecoder);
  if (type == "ByteFallback") return D(new ByteFallbackDecoder);
  if (type == "Fuse") return D(new FuseDecoder);
  if (type == "Strip") {
    MUSE_ASSIGN_OR_RETURN(std::string content, one_char(j, "content", " ", where));
    MUSE_ASSIGN_OR_RETURN(int64_t start, j.int_member("start", 0));
    MUSE_ASSIGN_OR_RETURN(int64_t stop, j.int_member("stop", 0));
    if (start < 0 || stop < 0) return make_error(where + ".start/.stop must be non-negative");
    return D(new StripDecoder(content, size_t(start), size_t(stop)));
  }
  if (type == "Replace") {
    const Json* pattern = j.find("pattern");
    if (!pattern) return make_error(where + " needs a pattern");
    MUSE_ASSIGN_OR_RETURN(Regex re, pattern_regex(*pattern, where));
    MUSE_ASSIGN_OR_RETURN(std::string content, j.string_member("content", ""));
    return D(new ReplaceDecoder(std::move(re), std::move(content)));
  }
  if (type == "Metaspace") {
    MUSE_ASSIGN_OR_RETURN(std::string rep, one_char(j, "replacement", "\xE2\x96\x81", where));
    std::string scheme = j.get_string("prepend_scheme", "always");
    if (const Json* aps = j.find("add_prefix_space"); aps && aps->is_bool() && !aps->as_bool()) scheme = "never";
    return D(new MetaspaceDecoder(rep, scheme != "never"));
  }
  if (type == "WordPiece") {
    MUSE_ASSIGN_OR_RETURN(std::string prefix, j.string_member("prefix", "##"));
    MUSE_ASSIGN_OR_RETURN(bool cleanup, j.bool_member("cleanup", true));
    return D(new WordPieceDecoder(prefix, cleanup));
  }
  if (type == "BPEDecoder") {
    MUSE_ASSIGN_OR_RETURN(std::string suffix, j.string_member("suffix", "</w>"));
    return D(new BpeDecoder(suffix));
  }
  if (type == "CTC") {
    MUSE_ASSIGN_OR_RETURN(std::string pad, j.string_member("pad_token", "<pad>"));
    MUSE_ASSIGN_OR_RETURN(std::string delim, j.string_member("word_delimiter_token", "|"));
    MUSE_ASSIGN_OR_RETURN(bool cleanup, j.bool_member("cleanup", true));
    return D(new CtcDecoder(pad, delim, cleanup));
  }
  if (type == "Sequence") {
    const Json* list = j.find("decoders");
    if (!list || !list->is_array()) return make_error("decoder Sequence needs a 'decoders' array");
    std::vector<D> steps;
    for (const Json& s : list->as_array()) {
      MUSE_ASSIGN_OR_RETURN(D step, make_decoder(s));
      if (step) steps.push_back(std::move(step));
    }
    return D(new SequenceDecoder(std::move(steps)));
  }
  if (type.empty()) return make_error("decoder has no 'type'");
  return make_error("unsupported decoder type '" + type +
                    "' (supported: ByteLevel, ByteFallback, Fuse, Strip, Replace, Metaspace, WordPiece, BPEDecoder, "
                    "CTC, Sequence)");
}

}  // namespace muse::tok
