#include "muse/tokenizer/tokenizer.h"

#include <algorithm>

#include "muse/core/mapped_file.h"
#include "muse/tokenizer/fast_split.h"
#include "muse/tokenizer/tokenizer_impl.h"
#include "muse/tokenizer/unicode.h"

namespace muse {
namespace tok {
namespace {

// Names of the Split patterns that run on a hand-written matcher.
void collect_fast_patterns(const Json& pre, std::string& out) {
  if (!pre.is_object()) return;
  if (const Json* list = pre.find("pretokenizers"); list && list->is_array())
    for (const Json& p : list->as_array()) collect_fast_patterns(p, out);
  if (pre.get_string("type", "") == "ByteLevel" && pre.get_bool("use_regex", true)) out += " gpt2";
  const Json* pattern = pre.find("pattern");
  const Json* re = pattern && pattern->is_object() ? pattern->find("Regex") : nullptr;
  if (re && re->is_string()) {
    FastPattern f = detect_fast_pattern(re->as_string());
    out += " ";
    out += f == FastPattern::None ? "regex" : fast_pattern_name(f);
  }
}

}  // namespace

Result<std::unique_ptr<TokenizerImpl>> TokenizerImpl::from_json(const Json& root) {
  if (!root.is_object()) return make_error("tokenizer.json must be a JSON object");
  std::unique_ptr<TokenizerImpl> t(new TokenizerImpl);
  const Json* model = root.find("model");
  if (!model || !model->is_object()) return make_error("tokenizer.json has no 'model' object");
  std::string type = model->get_string("type", model->contains("merges") ? "BPE" : "");
  if (type != "BPE")
    return make_error("unsupported tokenizer model type '" + type + "' (only BPE is supported)");
  auto bpe = BpeModel::from_json(*model);
  if (!bpe.ok()) return make_error("tokenizer.json: " + bpe.message());
  t->model_ = std::move(bpe).value();

  static const Json null_json;
  auto member = [&](const char* key) -> const Json& {
    const Json* v = root.find(key);
    return v ? *v : null_json;
  };
  auto context = [](const char* what, const Error& e) { return make_error(std::string("tokenizer.json ") + what + ": " + e.message); };

  auto normalizer = make_normalizer(member("normalizer"));
  if (!normalizer.ok()) return context("normalizer", normalizer.error());
  t->normalizer_ = std::move(normalizer).value();

  bool byte_mode = ends_with_byte_level(member("pre_tokenizer")) && t->model_->enable_byte_mode();
  auto pre = make_pre_tokenizer(member("pre_tokenizer"), byte_mode);
  if (!pre.ok()) return context("pre_tokenizer", pre.error());
  t->pre_tokenizer_ = std::move(pre).value();

  auto post = make_post_processor(member("post_processor"));
  if (!post.ok()) return context("post_processor", post.error());
  t->post_processor_ = std::move(post).value();

  auto decoder = make_decoder(member("decoder"));
  if (!decoder.ok()) return context("decoder", decoder.error());
  t->decoder_ = std::move(decoder).value();

  const BpeModel& m = *t->model_;
  Status added = t->added_.load(
      member("added_tokens"), [&](const std::string& s) { return m.token_to_id(s); }, m.vocab_entries(),
      t->normalizer_.get());
  if (!added.ok()) return make_error("tokenizer.json: " + added.message());

  // Per-id tables.
  std::vector<int32_t> added_ids = t->added_.ids();
  int32_t limit = m.max_id() + 1;
  if (!added_ids.empty()) limit = std::max(limit, added_ids.back() + 1);
  t->id_limit_ = limit;
  t->special_.assign(size_t(limit), 0);
  t->skip_.assign(size_t(limit), 0);
  size_t extra = 0;
  for (int32_t id : added_ids) {
    const AddedToken* a = t->added_.token(id);
    if (a && a->special) t->special_[size_t(id)] = 1;
    if (a && m.token_to_id(a->content) < 0) ++extra;
  }
  t->vocab_size_ = m.vocab_entries() + extra;
  for (int32_t id = 0; id < limit; ++id) {
    const std::string* s = t->id_to_token(id);
    if (s && t->added_.is_special_content(*s)) t->skip_[size_t(id)] = 1;
  }
  t->plain_byte_level_decoder_ = is_plain_byte_level_decoder(member("decoder"));
  if (t->plain_byte_level_decoder_) {
    t->byte_level_bytes_.resize(size_t(limit));
    for (int32_t id = 0; id < limit; ++id)
      if (const std::string* s = t->id_to_token(id)) byte_level_token_bytes(*s, t->byte_level_bytes_[size_t(id)]);
  }

  std::string fast;
  collect_fast_patterns(member("pre_tokenizer"), fast);
  t->description_ = "BPE, " + std::to_string(t->vocab_size_) + " tokens (" + std::to_string(t->added_.size()) +
                    " added), " + (byte_mode ? "byte-level (byte mode)" : "character mode") +
                    (t->normalizer_ ? ", normalizer" : "") + (fast.empty() ? "" : ", splits:" + fast);
  return t;
}

int32_t TokenizerImpl::token_to_id(std::string_view token) const {
  int32_t id = added_.token_to_id(token);
  return id >= 0 ? id : model_->token_to_id(token);
}

const std::string* TokenizerImpl::id_to_token(int32_t id) const {
  if (const std::string* s = added_.id_to_token(id)) return s;
  return model_->id_to_token(id);
}

bool TokenizerImpl::is_byte_fallback_token(int32_t id) const {
  const std::string* t = id_to_token(id);
  return t && t->size() == 6 && t->compare(0, 3, "<0x") == 0 && (*t)[5] == '>';
}

void TokenizerImpl::encode_words(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  if (!pre_tokenizer_) {
    model_->encode_word(text, out);
    return;
  }
  pre_tokenizer_->pre_tokenize(text, at_start, [&](std::string_view word, bool) { model_->encode_word(word, out); });
}

void TokenizerImpl::encode_normalized(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  if (!added_.has_normalized_tokens()) return encode_words(text, at_start, out);
  std::vector<AddedVocabulary::Piece> pieces;
  added_.split(text, /*normalized_tokens=*/true, pieces);
  for (const auto& p : pieces) {
    if (p.id >= 0) out.push_back(p.id);
    else encode_words(text.substr(p.start, p.end - p.start), at_start && p.start == 0, out);
  }
}

void TokenizerImpl::encode_segment(std::string_view text, bool at_start, std::vector<int32_t>& out) const {
  if (text.empty()) return;
  if (!normalizer_) return encode_normalized(text, at_start, out);
  std::string normalized(text);
  normalizer_->normalize(normalized);
  encode_normalized(normalized, at_start, out);
}

void TokenizerImpl::encode(std::string_view input, bool add_special_tokens, std::vector<int32_t>& out) const {
  std::string valid;
  std::string_view text = sanitize_utf8(input, &valid) ? std::string_view(valid) : input;
  size_t first = out.size();
  if (!added_.has_raw_tokens()) {
    encode_segment(text, true, out);
  } else {
    std::vector<AddedVocabulary::Piece> pieces;
    added_.split(text, /*normalized_tokens=*/false, pieces);
    for (const auto& p : pieces) {
      if (p.id >= 0) out.push_back(p.id);
      else encode_segment(text.substr(p.start, p.end - p.start), p.start == 0, out);
    }
  }
  if (add_special_tokens && post_processor_) {
    std::vector<int32_t> ids(out.begin() + long(first), out.end());
    post_processor_->process(ids);
    out.resize(first);
    out.insert(out.end(), ids.begin(), ids.end());
  }
}

std::string TokenizerImpl::decode(const int32_t* ids, size_t n, bool skip_special_tokens, bool raw) const {
  if (plain_byte_level_decoder_) {
    std::string bytes;
    for (size_t i = 0; i < n; ++i) {
      int32_t id = ids[i];
      if (id < 0 || id >= id_limit_ || (skip_special_tokens && skip_[size_t(id)])) continue;
      bytes += byte_level_bytes_[size_t(id)];
    }
    if (raw) return bytes;
    std::string text;
    append_utf8_lossy(text, bytes);
    return text;
  }
  std::vector<std::string> tokens;
  tokens.reserve(n);
  for (size_t i = 0; i < n; ++i) {
    int32_t id = ids[i];
    const std::string* s = id_to_token(id);
    if (!s || (skip_special_tokens && skipped_when_skipping_specials(id))) continue;
    tokens.push_back(*s);
  }
  std::string out;
  if (decoder_) {
    decoder_->decode_chain(tokens, raw);
    for (const std::string& t : tokens) out += t;
  } else {
    for (size_t i = 0; i < tokens.size(); ++i) {
      if (i) out.push_back(' ');
      out += tokens[i];
    }
  }
  if (!raw) {
    std::string valid;
    if (sanitize_utf8(out, &valid)) out.swap(valid);
  }
  return out;
}

}  // namespace tok

Tokenizer::Tokenizer() = default;

Result<Tokenizer> Tokenizer::from_json(std::string_view text) {
  auto root = Json::parse(text);
  if (!root.ok()) return make_error("tokenizer.json is not valid JSON: " + root.message());
  auto impl = tok::TokenizerImpl::from_json(*root);
  if (!impl.ok()) return impl.error();
  Tokenizer t;
  t.impl_ = std::shared_ptr<const tok::TokenizerImpl>(std::move(impl).value());
  return t;
}

Result<Tokenizer> Tokenizer::from_file(const std::string& path) {
  auto text = read_file(path);
  if (!text.ok()) return make_error("cannot read tokenizer file " + path + ": " + text.message());
  auto t = from_json(*text);
  if (!t.ok()) return make_error(path + ": " + t.message());
  return t;
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special_tokens) const {
  std::vector<int32_t> out;
  encode_to(text, out, add_special_tokens);
  return out;
}

void Tokenizer::encode_to(std::string_view text, std::vector<int32_t>& out, bool add_special_tokens) const {
  if (impl_) impl_->encode(text, add_special_tokens, out);
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special_tokens) const {
  return impl_ ? impl_->decode(ids.data(), ids.size(), skip_special_tokens, /*raw=*/false) : std::string();
}

int32_t Tokenizer::token_to_id(std::string_view token) const { return impl_ ? impl_->token_to_id(token) : -1; }

std::string Tokenizer::id_to_token(int32_t id) const {
  const std::string* s = impl_ ? impl_->id_to_token(id) : nullptr;
  return s ? *s : std::string();
}

size_t Tokenizer::vocab_size() const { return impl_ ? impl_->vocab_size() : 0; }
int32_t Tokenizer::id_limit() const { return impl_ ? impl_->id_limit() : 0; }
bool Tokenizer::is_special(int32_t id) const { return impl_ && impl_->is_special(id); }
std::string Tokenizer::describe() const { return impl_ ? impl_->description() : "empty tokenizer"; }

}  // namespace muse
