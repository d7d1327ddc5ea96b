#include "muse/tokenizer/unicode.h"

#include <oniguruma.h>

#include <cstring>
#include <map>
#include <vector>

#include "muse/tokenizer/regex.h"

namespace muse::tok {

Utf8Step utf8_step(const unsigned char* s, size_t n, size_t i) {
  unsigned c = s[i];
  if (c < 0x80) return {Utf8Step::Valid, 1};
  int need;                      // continuation bytes
  unsigned lo = 0x80, hi = 0xBF;  // range of the second byte (Unicode Table 3-7)
  if (c >= 0xC2 && c <= 0xDF) {
    need = 1;
  } else if (c >= 0xE0 && c <= 0xEF) {
    need = 2;
    if (c == 0xE0) lo = 0xA0;
    if (c == 0xED) hi = 0x9F;
  } else if (c >= 0xF0 && c <= 0xF4) {
    need = 3;
    if (c == 0xF0) lo = 0x90;
    if (c == 0xF4) hi = 0x8F;
  } else {
    return {Utf8Step::Invalid, 1};
  }
  for (int k = 1; k <= need; ++k) {
    if (i + k >= n) return {Utf8Step::Truncated, uint8_t(k)};
    unsigned b = s[i + k];
    if (k == 1 ? (b < lo || b > hi) : (b < 0x80 || b > 0xBF)) return {Utf8Step::Invalid, uint8_t(k)};
  }
  return {Utf8Step::Valid, uint8_t(need + 1)};
}

void append_utf8_lossy(std::string& out, std::string_view bytes) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size(), i = 0, run = 0;  // [run, i) is valid and not yet copied
  while (i < n) {
    if (p[i] < 0x80) { ++i; continue; }
    Utf8Step st = utf8_step(p, n, i);
    if (st.kind == Utf8Step::Valid) { i += st.len; continue; }
    out.append(bytes.data() + run, i - run);
    out.append("\xEF\xBF\xBD");
    i += st.len;
    run = i;
  }
  out.append(bytes.data() + run, n - run);
}

bool sanitize_utf8(std::string_view bytes, std::string* out) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  size_t n = bytes.size(), i = 0;
  while (i < n) {
    if (p[i] < 0x80) { ++i; continue; }
    Utf8Step st = utf8_step(p, n, i);
    if (st.kind != Utf8Step::Valid) break;
    i += st.len;
  }
  if (i == n) return false;
  out->clear();
  out->reserve(n + 16);
  append_utf8_lossy(*out, bytes);
  return true;
}

// ---------------------------------------------------------------------------
// Class table: two stages, 256 code points per block, identical blocks shared.
// ---------------------------------------------------------------------------
namespace {

struct TableStorage {
  CharTables tables;
  std::vector<uint32_t> stage1;
  std::vector<uint16_t> stage2;
};

void add_ranges(std::vector<uint16_t>& full, OnigCtype ctype, uint16_t bit) {
  OnigCodePoint sb_out = 0;
  const OnigCodePoint* ranges = nullptr;
  if (ONIGENC_GET_CTYPE_CODE_RANGE(ONIG_ENCODING_UTF8, ctype, &sb_out, &ranges) != 0 || !ranges) {
    // Oniguruma answers ONIG_NO_SUPPORT_CONFIG for ctypes it tests by
    // function; fall back to asking it code point by code point.
    for (uint32_t cp = 0; cp < 0x110000; ++cp)
      if (ONIGENC_IS_CODE_CTYPE(ONIG_ENCODING_UTF8, cp, ctype)) full[cp] |= bit;
    return;
  }
  OnigCodePoint count = ranges[0];
  for (OnigCodePoint k = 0; k < count; ++k) {
    OnigCodePoint lo = ranges[1 + 2 * k], hi = ranges[2 + 2 * k];
    for (OnigCodePoint cp = lo; cp <= hi && cp < 0x110000; ++cp) full[cp] |= bit;
  }
}

void add_property(std::vector<uint16_t>& full, const char* name, uint16_t bit) {
  auto* p = reinterpret_cast<OnigUChar*>(const_cast<char*>(name));
  int ctype = ONIGENC_PROPERTY_NAME_TO_CTYPE(ONIG_ENCODING_UTF8, p, p + std::strlen(name));
  if (ctype < 0) return;  // cannot happen for the names below
  add_ranges(full, OnigCtype(ctype), bit);
}

TableStorage* build_tables() {
  ensure_onig_initialized();
  auto* st = new TableStorage;
  std::vector<uint16_t> full(0x110000, 0);
  add_property(full, "L", kL);
  add_property(full, "Lu", kLu);
  add_property(full, "Ll", kLl);
  add_property(full, "Lt", kLt);
  add_property(full, "Lm", kLm);
  add_property(full, "Lo", kLo);
  add_property(full, "M", kM);
  add_property(full, "N", kN);
  add_property(full, "P", kP);
  add_property(full, "S", kS);
  add_property(full, "Nd", kNd);
  add_ranges(full, ONIGENC_CTYPE_SPACE, kSpace);
  add_ranges(full, ONIGENC_CTYPE_WORD, kWord);
  std::map<std::vector<uint16_t>, uint32_t> seen;
  st->stage1.resize(0x1100);
  for (uint32_t block = 0; block < 0x1100; ++block) {
    std::vector<uint16_t> b(full.begin() + block * 256, full.begin() + (block + 1) * 256);
    auto it = seen.find(b);
    if (it == seen.end()) {
      uint32_t offset = uint32_t(st->stage2.size());
      st->stage2.insert(st->stage2.end(), b.begin(), b.end());
      it = seen.emplace(std::move(b), offset).first;
    }
    st->stage1[block] = it->second;
  }
  for (uint32_t cp = 0; cp < 128; ++cp) st->tables.ascii[cp] = full[cp];
  st->tables.stage1 = st->stage1.data();
  st->tables.stage2 = st->stage2.data();
  return st;
}

}  // namespace

const CharTables& char_tables() {
  static const TableStorage* storage = build_tables();  // never freed: process lifetime
  return storage->tables;
}

uint16_t char_classes(uint32_t cp) { return char_classes_fast(char_tables(), cp); }

}  // namespace muse::tok
