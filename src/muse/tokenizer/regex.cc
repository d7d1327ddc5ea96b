#include "muse/tokenizer/regex.h"

#include <oniguruma.h>

#include <mutex>

#include "muse/core/log.h"
#include "muse/tokenizer/unicode.h"

namespace muse::tok {

void ensure_onig_initialized() {
  static std::once_flag once;
  std::call_once(once, [] {
    OnigEncoding encodings[] = {ONIG_ENCODING_UTF8};
    onig_initialize(encodings, 1);
  });
}

Result<Regex> Regex::compile(std::string_view pattern, bool allow_fast_path) {
  ensure_onig_initialized();
  OnigRegex re = nullptr;
  OnigErrorInfo einfo;
  const auto* p = reinterpret_cast<const OnigUChar*>(pattern.data());
  // Hugging Face: onig::Regex::new(pattern) = no options, the default
  // (Oniguruma/Ruby) syntax, UTF-8.
  int r = onig_new(&re, p, p + pattern.size(), ONIG_OPTION_NONE, ONIG_ENCODING_UTF8,
                   ONIG_SYNTAX_DEFAULT, &einfo);
  if (r != ONIG_NORMAL) {
    OnigUChar buf[ONIG_MAX_ERROR_MESSAGE_LEN];
    onig_error_code_to_str(buf, r, &einfo);
    return make_error("invalid regex '" + std::string(pattern) + "': " + reinterpret_cast<char*>(buf));
  }
  Regex out;
  out.pattern_ = std::string(pattern);
  out.re_ = std::shared_ptr<void>(re, [](void* q) { onig_free(static_cast<OnigRegex>(q)); });
  if (allow_fast_path) {
    out.fast_ = detect_fast_pattern(pattern);
    if (out.fast_ != FastPattern::None) char_tables();  // build before first use
  }
  return out;
}

Result<Regex> Regex::literal(std::string_view literal) {
  // Escape every ASCII punctuation character: Oniguruma reads an escaped
  // non-alphanumeric as itself, so this is safe for all of them.
  std::string escaped;
  for (char c : literal) {
    auto u = static_cast<unsigned char>(c);
    if (u < 0x80 && !((c >= '0' && c <= '9') || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) &&
        c != ' ' && u >= 0x21 && u != 0x7F)
      escaped.push_back('\\');
    escaped.push_back(c);
  }
  auto re = compile(escaped, /*allow_fast_path=*/false);
  if (re.ok()) re->literal_ = std::string(literal);
  return re;
}

void Regex::find_all_onig(std::string_view text, std::vector<Span>& out) const {
  auto* re = static_cast<OnigRegex>(re_.get());
  const auto* begin = reinterpret_cast<const OnigUChar*>(text.data());
  const auto* end = begin + text.size();
  OnigRegion region;
  onig_region_init(&region);
  size_t last_end = 0;
  bool have_last = false;
  size_t last_match_end = 0;
  while (last_end <= text.size()) {
    onig_region_clear(&region);
    int r = onig_search(re, begin, end, begin + last_end, end, &region, ONIG_OPTION_NONE);
    if (r == ONIG_MISMATCH) break;
    if (r < 0) {
      // Hugging Face panics here (retry limit); we keep the rest unsplit.
      LOG_WARN("tokenizer: regex search gave up (Oniguruma error %d); rest of the piece left unsplit", r);
      break;
    }
    size_t s = size_t(region.beg[0]), e = size_t(region.end[0]);
    // The onig crate's rule: no empty match right after the previous match.
    if (s == e && have_last && last_match_end == e) {
      if (last_end >= text.size()) break;
      last_end += utf8_len(static_cast<unsigned char>(text[last_end]));
      continue;
    }
    last_end = e;
    have_last = true;
    last_match_end = e;
    out.push_back({uint32_t(s), uint32_t(e), true});
    if (s == e && e == text.size()) break;
  }
  onig_region_free(&region, 0);
}

void Regex::find_all(std::string_view text, std::vector<Span>& out) const {
  if (!literal_.empty()) {  // leftmost non-overlapping occurrences, as the escaped regex finds
    for (size_t pos = text.find(literal_); pos != std::string_view::npos; pos = text.find(literal_, pos + literal_.size()))
      out.push_back({uint32_t(pos), uint32_t(pos + literal_.size()), true});
    return;
  }
  if (fast_ == FastPattern::None) {
    find_all_onig(text, out);
    return;
  }
  const CharTables& t = char_tables();
  const char* s = text.data();
  size_t n = text.size(), pos = 0;
  while (pos < n) {
    size_t e = fast_match_at(fast_, t, s, n, pos);
    if (e > pos) {
      out.push_back({uint32_t(pos), uint32_t(e), true});
      pos = e;
    } else {
      pos += utf8_len(static_cast<unsigned char>(s[pos]));
    }
  }
}

void Regex::find_matches(std::string_view text, std::vector<Span>& out) const {
  out.clear();
  if (text.empty()) {
    out.push_back({0, 0, false});
    return;
  }
  thread_local std::vector<Span> matches;
  matches.clear();
  find_all(text, matches);
  uint32_t prev = 0;
  for (const Span& m : matches) {
    if (prev != m.start) out.push_back({prev, m.start, false});
    out.push_back(m);
    prev = m.end;
  }
  if (prev != text.size()) out.push_back({prev, uint32_t(text.size()), false});
}

Result<Regex> pattern_regex(const Json& pattern, const std::string& where) {
  if (!pattern.is_object()) return make_error(where + ".pattern must be {\"String\": …} or {\"Regex\": …}");
  if (const Json* s = pattern.find("String"); s && s->is_string()) return Regex::literal(s->as_string());
  if (const Json* r = pattern.find("Regex"); r && r->is_string()) return Regex::compile(r->as_string());
  return make_error(where + ".pattern must be {\"String\": …} or {\"Regex\": …}");
}

}  // namespace muse::tok
