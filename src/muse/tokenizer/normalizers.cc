#include "muse/tokenizer/normalizers.h"

#include <unicode/bytestream.h>
#include <unicode/normalizer2.h>
#include <unicode/uchar.h>

#include <vector>

#include "muse/tokenizer/bpe.h"
#include "muse/tokenizer/regex.h"
#include "muse/tokenizer/unicode.h"

namespace muse::tok {
namespace {

bool all_ascii(const std::string& s) {
  for (unsigned char c : s)
    if (c >= 0x80) return false;
  return true;
}

class UnicodeNormalizer final : public Normalizer {
 public:
  enum Form { NFC, NFD, NFKC, NFKD };
  explicit UnicodeNormalizer(Form f) : form_(f) {
    UErrorCode err = U_ZERO_ERROR;
    switch (f) {
      case NFC: n_ = icu::Normalizer2::getNFCInstance(err); break;
      case NFD: n_ = icu::Normalizer2::getNFDInstance(err); break;
      case NFKC: n_ = icu::Normalizer2::getNFKCInstance(err); break;
      case NFKD: n_ = icu::Normalizer2::getNFKDInstance(err); break;
    }
    if (U_FAILURE(err)) n_ = nullptr;
  }
  void normalize(std::string& text) const override {
    if (!n_ || all_ascii(text)) return;  // ASCII is invariant under all four forms
    UErrorCode err = U_ZERO_ERROR;
    icu::StringPiece src(text.data(), int32_t(text.size()));
    if (n_->isNormalizedUTF8(src, err) && U_SUCCESS(err)) return;
    err = U_ZERO_ERROR;
    std::string out;
    out.reserve(text.size() + 8);
    icu::StringByteSink<std::string> sink(&out);
    n_->normalizeUTF8(0, src, sink, nullptr, err);
    if (U_SUCCESS(err)) text.swap(out);
  }

 private:
  Form form_;
  const icu::Normalizer2* n_ = nullptr;
};

// Rust's char::to_lowercase per character (full mapping: U+0130 becomes
// "i\u0307"; everything else maps to one character).
class LowercaseNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      unsigned char c = static_cast<unsigned char>(text[i]);
      if (c < 0x80) {
        out.push_back(c >= 'A' && c <= 'Z' ? char(c + 32) : char(c));
        ++i;
        continue;
      }
      int len;
      uint32_t cp = decode_utf8(text.data(), i, &len);
      i += size_t(len);
      if (cp == 0x130) {
        out += "i\xCC\x87";
        continue;
      }
      append_utf8_cp(out, uint32_t(u_tolower(UChar32(cp))));
    }
    text.swap(out);
  }
};

class StripNormalizer final : public Normalizer {
 public:
  StripNormalizer(bool left, bool right) : left_(left), right_(right) {}
  void normalize(std::string& text) const override {
    size_t b = 0, e = text.size();
    int len;
    if (left_)
      while (b < e && is_white_space(decode_utf8(text.data(), b, &len))) b += size_t(len);
    if (right_) {
      while (e > b) {
        size_t j = e - 1;
        while (j > b && (static_cast<unsigned char>(text[j]) & 0xC0) == 0x80) --j;
        if (!is_white_space(decode_utf8(text.data(), j, &len))) break;
        e = j;
      }
    }
    text = text.substr(b, e - b);
  }

 private:
  bool left_, right_;
};

// Removes combining marks (\p{M}).
class StripAccentsNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    if (all_ascii(text)) return;
    std::string out;
    for (size_t i = 0; i < text.size();) {
      int len;
      uint32_t cp = decode_utf8(text.data(), i, &len);
      if (!(char_classes(cp) & kM)) out.append(text, i, size_t(len));
      i += size_t(len);
    }
    text.swap(out);
  }
};

class ReplaceNormalizer final : public Normalizer {
 public:
  ReplaceNormalizer(Regex re, std::string content) : re_(std::move(re)), content_(std::move(content)) {}
  void normalize(std::string& text) const override {
    std::vector<Span> spans;
    re_.find_matches(text, spans);
    std::string out;
    out.reserve(text.size());
    for (const Span& s : spans) {
      if (s.is_match) out += content_;
      else out.append(text, s.start, s.end - s.start);
    }
    text.swap(out);
  }

 private:
  Regex re_;
  std::string content_;
};

class PrependNormalizer final : public Normalizer {
 public:
  explicit PrependNormalizer(std::string p) : prefix_(std::move(p)) {}
  void normalize(std::string& text) const override {
    if (!text.empty()) text.insert(0, prefix_);
  }

 private:
  std::string prefix_;
};

class SequenceNormalizer final : public Normalizer {
 public:
  explicit SequenceNormalizer(std::vector<std::unique_ptr<Normalizer>> steps) : steps_(std::move(steps)) {}
  void normalize(std::string& text) const override {
    for (const auto& s : steps_) s->normalize(text);
  }

 private:
  std::vector<std::unique_ptr<Normalizer>> steps_;
};

// SentencePiece's NMT rules: drop some controls, map odd spaces to ' '.
class NmtNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size());
    for (size_t i = 0; i < text.size();) {
      int len;
      uint32_t cp = decode_utf8(text.data(), i, &len);
      i += size_t(len);
      if ((cp >= 0x01 && cp <= 0x08) || cp == 0x0B || (cp >= 0x0E && cp <= 0x1F) || cp == 0x7F || cp == 0x8F ||
          cp == 0x9F)
        continue;
      if (cp == 0x09 || cp == 0x0A || cp == 0x0C || cp == 0x0D || cp == 0x1680 || (cp >= 0x200B && cp <= 0x200F) ||
          cp == 0x2028 || cp == 0x2029 || cp == 0x2581 || cp == 0xFEFF || cp == 0xFFFD)
        cp = ' ';
      append_utf8_cp(out, cp);
    }
    text.swap(out);
  }
};

// Maps every byte to its byte-level alphabet character.
class ByteLevelNormalizer final : public Normalizer {
 public:
  void normalize(std::string& text) const override {
    std::string out;
    out.reserve(text.size() * 2);
    for (unsigned char c : text) append_utf8_cp(out, byte_level_char(c));
    text.swap(out);
  }
};

}  // namespace

Result<std::unique_ptr<Normalizer>> make_normalizer(const Json& j) {
  if (j.is_null()) return std::unique_ptr<Normalizer>();
  if (!j.is_object()) return make_error("normalizer must be an object or null");
  std::string type = j.get_string("type", "");
  std::string where = "normalizer " + type;
  if (type == "NFC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UnicodeNormalizer::NFC));
  if (type == "NFD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UnicodeNormalizer::NFD));
  if (type == "NFKC") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UnicodeNormalizer::NFKC));
  if (type == "NFKD") return std::unique_ptr<Normalizer>(new UnicodeNormalizer(UnicodeNormalizer::NFKD));
  if (type == "Lowercase") return std::unique_ptr<Normalizer>(new LowercaseNormalizer);
  if (type == "StripAccents") return std::unique_ptr<Normalizer>(new StripAccentsNormalizer);
  if (type == "Nmt") return std::unique_ptr<Normalizer>(new NmtNormalizer);
  if (type == "ByteLevel") return std::unique_ptr<Normalizer>(new ByteLevelNormalizer);
  if (type == "Strip") {
    MUSE_ASSIGN_OR_RETURN(bool left, j.bool_member("strip_left", true));
    MUSE_ASSIGN_OR_RETURN(bool right, j.bool_member("strip_right", true));
    return std::unique_ptr<Normalizer>(new StripNormalizer(left, right));
  }
  if (type == "Prepend") {
    MUSE_ASSIGN_OR_RETURN(std::string p, j.string_member("prepend", ""));
    return std::unique_ptr<Normalizer>(new PrependNormalizer(std::move(p)));
  }
  if (type == "Replace") {
    const Json* pattern = j.find("pattern");
    if (!pattern) return make_error(where + " needs a pattern");
    MUSE_ASSIGN_OR_RETURN(Regex re, pattern_regex(*pattern, where));
    MUSE_ASSIGN_OR_RETURN(std::string content, j.string_member("content", ""));
    return std::unique_ptr<Normalizer>(new ReplaceNormalizer(std::move(re), std::move(content)));
  }
  if (type == "Sequence") {
    const Json* list = j.find("normalizers");
    if (!list || !list->is_array()) return make_error("normalizer Sequence needs a 'normalizers' array");
    std::vector<std::unique_ptr<Normalizer>> steps;
    for (const Json& s : list->as_array()) {
      MUSE_ASSIGN_OR_RETURN(auto step, make_normalizer(s));
      if (step) steps.push_back(std::move(step));
    }
    return std::unique_ptr<Normalizer>(new SequenceNormalizer(std::move(steps)));
  }
  if (type.empty()) return make_error("normalizer has no 'type'");
  return make_error("unsupported normalizer type '" + type +
                    "' (supported: NFC, NFD, NFKC, NFKD, Lowercase, Strip, StripAccents, Replace, Prepend, Nmt, "
                    "ByteLevel, Sequence)");
}

}  // namespace muse::tok
