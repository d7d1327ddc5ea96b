// libFuzzer target for the tokenizer. The first byte picks a property:
//   0  byte-level BPE (o200k split, special/non-special/single_word added
//      tokens): decode(encode(x)) == x after U+FFFD substitution, and the
//      streaming detokenizer equals decode; with lstrip/rstrip tokens (which
//      swallow spaces) only that nothing crashes and output is valid UTF-8;
//   1  SentencePiece-style BPE (byte fallback, U+2581 spaces): the same
//      round trip (U+2581 in the input comes back as a space) and streaming;
//   2  every hand-written pre-tokenizer matcher equals Oniguruma;
//   3  arbitrary ids: decode and streaming never crash, always valid UTF-8,
//      and streaming equals decode for byte-level;
//   4  tokenizer.json parsing of the rest of the input; when it loads, encode
//      and decode must not crash.
// Seeds: fuzz/corpus/tokenizer/.
#include <cstddef>
#include <cstdint>
#include <cstdlib>
#include <string>
#include <vector>

#include "../tests/tokenizer/tiny_tokenizers.h"
#include "muse/core/json.h"
#include "muse/tokenizer/fast_split.h"
#include "muse/tokenizer/regex.h"
#include "muse/tokenizer/streaming_detokenizer.h"
#include "muse/tokenizer/tokenizer.h"
#include "muse/tokenizer/unicode.h"

namespace {

using muse::Tokenizer;

[[noreturn]] void fail(const char* what, const std::string& input) {
  std::fprintf(stderr, "fuzz_tokenizer: %s on input %s\n", what, muse::json_quote(input).c_str());
  std::abort();
}

const std::vector<std::pair<std::string, std::string>> kMerges = {
    {"t", "h"}, {"th", "e"}, {" ", "the"}, {" ", " "}, {"  ", "  "}, {"\xE4", "\xB8"}, {"'", "s"}, {"1", "2"}};

const Tokenizer& byte_level() {
  static const Tokenizer t = [] {
    muse::testing::AddedSpec w{"<w>"}, plain{"<|eot|>"};
    w.single_word = true;
    plain.special = false;
    return *Tokenizer::from_json(muse::testing::byte_level_tokenizer(kMerges, {w, plain, {"<|start|>"}}).dump());
  }();
  return t;
}

const Tokenizer& stripping() {
  static const Tokenizer t = [] {
    muse::testing::AddedSpec l{"<|l|>"}, r{"<|r|>"}, both{"<lr>"};
    l.lstrip = true;
    r.rstrip = true;
    both.lstrip = both.rstrip = both.single_word = true;
    return *Tokenizer::from_json(muse::testing::byte_level_tokenizer(kMerges, {l, r, both}).dump());
  }();
  return t;
}

const Tokenizer& sentencepiece() {
  static const Tokenizer t = [] {
    auto j = muse::testing::sentencepiece_tokenizer({"\xE2\x96\x81", "a", "b", "c", "\xC3\xA9"},
                                                    {{"a", "b"}, {"\xE2\x96\x81", "ab"}, {"c", "c"}});
    return *Tokenizer::from_json(j.dump());
  }();
  return t;
}

std::string sanitized(const std::string& s) {
  std::string out;
  return muse::tok::sanitize_utf8(s, &out) ? out : s;
}

std::string streamed(const Tokenizer& t, const std::vector<int32_t>& ids) {
  muse::StreamingDetokenizer d(t);
  std::string out;
  for (int32_t id : ids) {
    std::string piece = d.feed(id);
    if (!muse::is_valid_utf8(piece)) fail("streaming produced invalid UTF-8", piece);
    out += piece;
  }
  return out + d.flush();
}

void round_trip(const Tokenizer& t, const std::string& text, bool spaces_marked) {
  std::vector<int32_t> ids = t.encode(text);
  std::string decoded = t.decode(ids);
  std::string want = sanitized(text);
  if (spaces_marked) {  // the decoder turns every U+2581 into a space
    std::string w;
    for (size_t i = 0; i < want.size(); ++i) {
      if (want.compare(i, 3, "\xE2\x96\x81") == 0) {
        w.push_back(' ');
        i += 2;
      } else {
        w.push_back(want[i]);
      }
    }
    want.swap(w);
  }
  if (decoded != want) fail("decode(encode(x)) != x", text);
  if (streamed(t, ids) != decoded) fail("streaming != decode", text);
  if (t.encode(text, true).size() < ids.size()) fail("add_special_tokens lost ids", text);
}

void fast_paths(const std::string& raw) {
  static const std::vector<muse::tok::Regex> patterns = [] {
    std::vector<muse::tok::Regex> out;
    for (const char* p : {
             R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)",
             R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
             R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)",
             muse::testing::kO200kPattern, R"(\p{N}{1,3})", "[\u4e00-\u9fa5\u3040-\u309f\u30a0-\u30ff]+",
             "[!\"#$%&'()*+,\\-./:;<=>?@\\[\\\\\\]^_`{|}~][A-Za-z]+|[^\r\n\\p{L}\\p{P}\\p{S}]?[\\p{L}\\p{M}]+| "
             "?[\\p{P}\\p{S}]+[\r\n]*|\\s*[\r\n]+|\\s+(?!\\S)|\\s+"}) {
      out.push_back(*muse::tok::Regex::compile(p, true));
      out.push_back(*muse::tok::Regex::compile(p, false));
      if (out[out.size() - 2].fast_pattern() == muse::tok::FastPattern::None) std::abort();
    }
    return out;
  }();
  std::string text = sanitized(raw);
  std::vector<muse::tok::Span> a, b;
  for (size_t i = 0; i < patterns.size(); i += 2) {
    patterns[i].find_matches(text, a);
    patterns[i + 1].find_matches(text, b);
    bool same = a.size() == b.size();
    for (size_t k = 0; same && k < a.size(); ++k)
      same = a[k].start == b[k].start && a[k].end == b[k].end && a[k].is_match == b[k].is_match;
    if (!same) fail(("fast matcher differs from Oniguruma: " + patterns[i].pattern()).c_str(), text);
  }
}

void arbitrary_ids(const uint8_t* data, size_t size) {
  for (const Tokenizer* t : {&byte_level(), &sentencepiece()}) {
    std::vector<int32_t> ids;
    for (size_t i = 0; i + 1 < size; i += 2) ids.push_back(int32_t((data[i] << 8 | data[i + 1]) % (t->id_limit() + 8)) - 4);
    std::string decoded = t->decode(ids), skipped = t->decode(ids, true);
    if (!muse::is_valid_utf8(decoded) || !muse::is_valid_utf8(skipped)) fail("decode produced invalid UTF-8", decoded);
    std::string s = streamed(*t, ids);
    if (t == &byte_level() && s != decoded) fail("streaming != decode for byte-level ids", decoded);
    for (int32_t id : ids) (void)t->id_to_token(id), (void)t->is_special(id);
  }
}

void parse(const std::string& json) {
  auto t = Tokenizer::from_json(json);
  if (!t.ok()) return;
  for (const char* s : {"Hello world", "  spaces\n\n", "\xE4\xB8\xAD\xF0\x9F\x99\x82", "<|eot|>x", ""}) {
    auto ids = t->encode(s, true);
    std::string d = t->decode(ids);
    if (!muse::is_valid_utf8(d)) fail("decode produced invalid UTF-8", json);
    (void)streamed(*t, ids);
  }
  auto ids = t->encode(json.substr(0, 512));
  (void)t->decode(ids, true);
  (void)t->vocab_size();
  (void)t->describe();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string rest(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 5) {
    case 0: {
      round_trip(byte_level(), rest, false);
      std::string d = stripping().decode(stripping().encode(rest));
      if (!muse::is_valid_utf8(d)) fail("decode produced invalid UTF-8", rest);
      break;
    }
    case 1: round_trip(sentencepiece(), rest, true); break;
    case 2: fast_paths(rest); break;
    case 3: arbitrary_ids(data + 1, size - 1); break;
    case 4: parse(rest); break;
  }
  return 0;
}
