// Small tokenizer.json files built in code for the unit tests and the fuzzer:
// a byte-level BPE (GPT-2/o200k style) and a SentencePiece-style BPE with
// byte fallback (Llama 2 / Gemma style).
#pragma once

#include <cstdio>
#include <string>
#include <utility>
#include <vector>

#include "muse/core/json.h"

namespace muse::testing {

// GPT-2's byte-level alphabet character for a byte, UTF-8 encoded.
inline std::string byte_level(unsigned char b) {
  uint32_t cp = b;
  bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE);
  if (!printable) {
    uint32_t n = 0;
    for (int c = 0; c < b; ++c) {
      bool p = (c >= '!' && c <= '~') || (c >= 0xA1 && c <= 0xAC) || (c >= 0xAE);
      if (!p) ++n;
    }
    cp = 256 + n;
  }
  std::string s;
  append_utf8(s, cp);
  return s;
}
inline std::string byte_level_string(const std::string& raw) {
  std::string s;
  for (unsigned char c : raw) s += byte_level(c);
  return s;
}

struct AddedSpec {
  std::string content;
  bool special = true, normalized = false, lstrip = false, rstrip = false, single_word = false;
};

inline Json added_token_json(int id, const AddedSpec& a) {
  Json t = Json::object();
  t.set("id", id);
  t.set("content", a.content);
  t.set("single_word", a.single_word);
  t.set("lstrip", a.lstrip);
  t.set("rstrip", a.rstrip);
  t.set("normalized", a.normalized);
  t.set("special", a.special);
  return t;
}

inline const char* kO200kPattern =
    R"([^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]*[\p{Ll}\p{Lm}\p{Lo}\p{M}]+(?i:'s|'t|'re|'ve|'m|'ll|'d)?|[^\r\n\p{L}\p{N}]?[\p{Lu}\p{Lt}\p{Lm}\p{Lo}\p{M}]+[\p{Ll}\p{Lm}\p{Lo}\p{M}]*(?i:'s|'t|'re|'ve|'m|'ll|'d)?|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n/]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

// Byte-level BPE: ids 0..255 are the bytes' alphabet characters, then one id
// per merge (merges are raw-byte strings "a b"). `pattern` empty: ByteLevel
// with its own GPT-2 regex.
inline Json byte_level_tokenizer(const std::vector<std::pair<std::string, std::string>>& merges,
                                 const std::vector<AddedSpec>& added = {}, const std::string& pattern = kO200kPattern,
                                 bool ignore_merges = false) {
  Json vocab = Json::object();
  for (int b = 0; b < 256; ++b) vocab.set(byte_level(static_cast<unsigned char>(b)), b);
  Json merge_list = Json::array();
  int next = 256;
  for (const auto& [a, b] : merges) {
    std::string merged = byte_level_string(a + b);
    if (!vocab.find(merged)) vocab.set(merged, next++);
    merge_list.push_back(Json(JsonArray{Json(byte_level_string(a)), Json(byte_level_string(b))}));
  }
  Json added_list = Json::array();
  for (const AddedSpec& a : added) added_list.push_back(added_token_json(next++, a));
  Json model = Json::object();
  model.set("type", "BPE");
  model.set("dropout", nullptr);
  model.set("unk_token", nullptr);
  model.set("fuse_unk", false);
  model.set("byte_fallback", false);
  model.set("ignore_merges", ignore_merges);
  model.set("vocab", vocab);
  model.set("merges", merge_list);
  Json pre;
  if (pattern.empty()) {
    pre = Json::object();
    pre.set("type", "ByteLevel");
    pre.set("add_prefix_space", false);
    pre.set("trim_offsets", true);
    pre.set("use_regex", true);
  } else {
    Json split = Json::object();
    split.set("type", "Split");
    Json pat = Json::object();
    pat.set("Regex", pattern);
    split.set("pattern", pat);
    split.set("behavior", "Isolated");
    split.set("invert", false);
    Json bl = Json::object();
    bl.set("type", "ByteLevel");
    bl.set("add_prefix_space", false);
    bl.set("trim_offsets", true);
    bl.set("use_regex", false);
    pre = Json::object();
    pre.set("type", "Sequence");
    pre.set("pretokenizers", Json(JsonArray{split, bl}));
  }
  Json decoder = Json::object();
  decoder.set("type", "ByteLevel");
  Json root = Json::object();
  root.set("version", "1.0");
  root.set("added_tokens", added_list);
  root.set("normalizer", nullptr);
  root.set("pre_tokenizer", pre);
  root.set("post_processor", nullptr);
  root.set("decoder", decoder);
  root.set("model", model);
  return root;
}

// SentencePiece-style BPE (Gemma 3 layout): spaces become U+2581 in the
// normalizer, no pre-tokenizer, byte fallback for characters outside the
// vocabulary, and a decoder that undoes both. Vocab: <pad> <eos> <bos> <unk>,
// the 256 <0xXX> tokens, then the given pieces; merges are piece pairs.
inline Json sentencepiece_tokenizer(const std::vector<std::string>& pieces,
                                    const std::vector<std::pair<std::string, std::string>>& merges) {
  Json vocab = Json::object();
  int id = 0;
  for (const char* s : {"<pad>", "<eos>", "<bos>", "<unk>"}) vocab.set(s, id++);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof name, "<0x%02X>", b);
    vocab.set(name, id++);
  }
  for (const std::string& p : pieces)
    if (!vocab.find(p)) vocab.set(p, id++);
  Json merge_list = Json::array();
  for (const auto& [a, b] : merges) {
    if (!vocab.find(a + b)) vocab.set(a + b, id++);
    merge_list.push_back(Json(JsonArray{Json(a), Json(b)}));
  }
  Json added_list = Json::array();
  int k = 0;
  for (const char* s : {"<pad>", "<eos>", "<bos>", "<unk>"}) {
    AddedSpec a;
    a.content = s;
    added_list.push_back(added_token_json(k++, a));
  }
  Json model = Json::object();
  model.set("type", "BPE");
  model.set("unk_token", "<unk>");
  model.set("fuse_unk", true);
  model.set("byte_fallback", true);
  model.set("vocab", vocab);
  model.set("merges", merge_list);
  Json normalizer = Json::parse(R"({"type": "Replace", "pattern": {"String": " "}, "content": "\u2581"})").value();
  Json decoder = Json::parse(R"({"type": "Sequence", "decoders": [
      {"type": "Replace", "pattern": {"String": "\u2581"}, "content": " "},
      {"type": "ByteFallback"}, {"type": "Fuse"}]})").value();
  Json post = Json::parse(R"({"type": "TemplateProcessing",
      "single": [{"SpecialToken": {"id": "<bos>", "type_id": 0}}, {"Sequence": {"id": "A", "type_id": 0}}],
      "pair": [], "special_tokens": {"<bos>": {"id": "<bos>", "ids": [2], "tokens": ["<bos>"]}}})").value();
  Json root = Json::object();
  root.set("version", "1.0");
  root.set("added_tokens", added_list);
  root.set("normalizer", normalizer);
  root.set("pre_tokenizer", nullptr);
  root.set("post_processor", post);
  root.set("decoder", decoder);
  root.set("model", model);
  return root;
}

}  // namespace muse::testing
