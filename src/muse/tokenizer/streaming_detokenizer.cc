#include "muse/tokenizer/streaming_detokenizer.h"

#include "muse/tokenizer/tokenizer_impl.h"
#include "muse/tokenizer/unicode.h"

namespace muse {

StreamingDetokenizer::StreamingDetokenizer(Tokenizer tokenizer, bool skip_special_tokens)
    : tokenizer_(std::move(tokenizer)), skip_special_tokens_(skip_special_tokens) {}

void StreamingDetokenizer::reset() {
  window_.clear();
  consumed_ = 0;
  raw_.clear();
}

std::string StreamingDetokenizer::feed(int32_t id) {
  const tok::TokenizerImpl* impl = tokenizer_.impl();
  if (!impl) return {};
  if (skip_special_tokens_ && impl->skipped_when_skipping_specials(id)) return {};
  window_.push_back(id);
  raw_ = impl->decode(window_.data(), window_.size(), skip_special_tokens_, /*raw=*/true);
  // Decoders real tokenizers use only append as tokens are added; if one
  // ever rewrote earlier text we cannot take back what was sent, so we
  // continue from the same byte count.
  if (consumed_ > raw_.size()) consumed_ = raw_.size();

  std::string out;
  const auto* p = reinterpret_cast<const unsigned char*>(raw_.data());
  size_t n = raw_.size(), i = consumed_;
  while (i < n) {
    if (p[i] < 0x80) {
      out.push_back(char(p[i++]));
      continue;
    }
    tok::Utf8Step st = tok::utf8_step(p, n, i);
    if (st.kind == tok::Utf8Step::Truncated) break;  // wait for the rest of the character
    if (st.kind == tok::Utf8Step::Valid) out.append(raw_, i, st.len);
    else out.append("\xEF\xBF\xBD");
    i += st.len;
  }
  consumed_ = i;
  if (consumed_ == n && window_.size() > 1) {
    // Everything is out: keep only the last token as context.
    window_.erase(window_.begin(), window_.end() - 1);
    raw_ = impl->decode(window_.data(), window_.size(), skip_special_tokens_, /*raw=*/true);
    consumed_ = raw_.size();
  }
  return out;
}

std::string StreamingDetokenizer::flush() {
  std::string out;
  if (consumed_ < raw_.size()) tok::append_utf8_lossy(out, std::string_view(raw_).substr(consumed_));
  reset();
  return out;
}

}  // namespace muse
