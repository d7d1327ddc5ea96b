#include "muse/jinja/unicode.h"

#include "muse/core/json.h"

namespace muse::jinja {

uint32_t next_code_point(std::string_view s, size_t* pos) {
  size_t i = *pos;
  auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x80) {
    *pos = i + 1;
    return c;
  }
  size_t len = (c & 0xE0) == 0xC0 ? 2 : (c & 0xF0) == 0xE0 ? 3 : (c & 0xF8) == 0xF0 ? 4 : 0;
  if (len == 0 || i + len > s.size()) {
    *pos = i + 1;
    return 0xFFFD;
  }
  uint32_t cp = c & (len == 2 ? 0x1F : len == 3 ? 0x0F : 0x07);
  for (size_t k = 1; k < len; ++k) {
    auto b = static_cast<unsigned char>(s[i + k]);
    if ((b & 0xC0) != 0x80) {
      *pos = i + 1;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  *pos = i + len;
  return cp;
}

bool is_ascii(std::string_view s) {
  for (char c : s)
    if (static_cast<unsigned char>(c) >= 0x80) return false;
  return true;
}

size_t code_point_count(std::string_view s) {
  size_t n = 0;
  for (char c : s)
    if ((static_cast<unsigned char>(c) & 0xC0) != 0x80) ++n;
  return n;
}

std::vector<size_t> code_point_offsets(std::string_view s) {
  std::vector<size_t> out;
  out.reserve(s.size() + 1);
  size_t pos = 0;
  while (pos < s.size()) {
    out.push_back(pos);
    next_code_point(s, &pos);
  }
  out.push_back(s.size());
  return out;
}

bool is_space(uint32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x1F);
  return cp == 0x85 || cp == 0xA0 || cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 ||
         cp == 0x2029 || cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

bool is_digit(uint32_t cp) {
  if (cp < 0x80) return cp >= '0' && cp <= '9';
  return cp == 0xB2 || cp == 0xB3 || cp == 0xB9 || (cp >= 0x660 && cp <= 0x669) || (cp >= 0x6F0 && cp <= 0x6F9) ||
         (cp >= 0x966 && cp <= 0x96F) || (cp >= 0xFF10 && cp <= 0xFF19);
}

namespace {

// Simple one-to-one case pairs; multi-character mappings are handled by the callers.
uint32_t lower_cp(uint32_t c) {
  if (c < 0x80) return (c >= 'A' && c <= 'Z') ? c + 32 : c;
  if (c >= 0xC0 && c <= 0xDE && c != 0xD7) return c + 32;
  if (c >= 0x100 && c <= 0x12F) return c | 1;
  if (c >= 0x132 && c <= 0x137) return c | 1;
  if (c >= 0x139 && c <= 0x148) return (c & 1) ? c + 1 : c;
  if (c >= 0x14A && c <= 0x177) return c | 1;
  if (c == 0x178) return 0xFF;
  if (c >= 0x179 && c <= 0x17E) return (c & 1) ? c + 1 : c;
  if (c == 0x386) return 0x3AC;
  if (c >= 0x388 && c <= 0x38A) return c + 37;
  if (c == 0x38C) return 0x3CC;
  if (c == 0x38E || c == 0x38F) return c + 63;
  if ((c >= 0x391 && c <= 0x3A1) || (c >= 0x3A3 && c <= 0x3AB)) return c + 32;
  if (c >= 0x400 && c <= 0x40F) return c + 80;
  if (c >= 0x410 && c <= 0x42F) return c + 32;
  if ((c >= 0x460 && c <= 0x481) || (c >= 0x48A && c <= 0x4BF)) return c | 1;
  if (c >= 0xFF21 && c <= 0xFF3A) return c + 32;
  return c;
}

uint32_t upper_cp(uint32_t c) {
  if (c < 0x80) return (c >= 'a' && c <= 'z') ? c - 32 : c;
  if (c == 0xB5) return 0x39C;
  if (c >= 0xE0 && c <= 0xFE && c != 0xF7) return c - 32;
  if (c == 0xFF) return 0x178;
  if (c >= 0x101 && c <= 0x12F && (c & 1)) return c - 1;
  if (c == 0x131) return 'I';
  if (c >= 0x133 && c <= 0x137 && (c & 1)) return c - 1;
  if (c >= 0x13A && c <= 0x148 && !(c & 1)) return c - 1;
  if (c >= 0x14B && c <= 0x177 && (c & 1)) return c - 1;
  if (c >= 0x17A && c <= 0x17E && !(c & 1)) return c - 1;
  if (c == 0x17F) return 'S';
  if (c == 0x3AC) return 0x386;
  if (c >= 0x3AD && c <= 0x3AF) return c - 37;
  if (c == 0x3C2) return 0x3A3;
  if ((c >= 0x3B1 && c <= 0x3C1) || (c >= 0x3C3 && c <= 0x3CB)) return c - 32;
  if (c == 0x3CC) return 0x38C;
  if (c == 0x3CD || c == 0x3CE) return c - 63;
  if (c >= 0x430 && c <= 0x44F) return c - 32;
  if (c >= 0x450 && c <= 0x45F) return c - 80;
  if (((c >= 0x461 && c <= 0x481) || (c >= 0x48B && c <= 0x4BF)) && (c & 1)) return c - 1;
  if (c >= 0xFF41 && c <= 0xFF5A) return c - 32;
  return c;
}

void append_upper(std::string& out, uint32_t c) {
  if (c == 0xDF) {
    out += "SS";
  } else if (c == 0x149) {
    append_utf8(out, 0x2BC);
    out.push_back('N');
  } else {
    append_utf8(out, upper_cp(c));
  }
}

void append_lower(std::string& out, uint32_t c, bool final_sigma) {
  if (c == 0x130) {
    out.push_back('i');
    append_utf8(out, 0x307);
  } else if (c == 0x3A3 && final_sigma) {
    append_utf8(out, 0x3C2);
  } else {
    append_utf8(out, lower_cp(c));
  }
}

// Title case of one code point: as upper, except ß stays "Ss" like Python.
void append_title(std::string& out, uint32_t c) {
  if (c == 0xDF) {
    out += "Ss";
  } else {
    append_upper(out, c);
  }
}

bool is_cased(uint32_t c) { return is_upper_cp(c) || is_lower_cp(c); }

}  // namespace

bool is_upper_cp(uint32_t c) { return lower_cp(c) != c || c == 0x130; }
bool is_lower_cp(uint32_t c) {
  return upper_cp(c) != c || c == 0xDF || c == 0x149 || c == 0x138 || (c >= 0x250 && c <= 0x2AF);
}

bool is_alpha(uint32_t c) {
  if (c < 0x80) return (c | 32) >= 'a' && (c | 32) <= 'z';
  if (is_cased(c)) return true;
  return c == 0xAA || c == 0xBA || (c >= 0x100 && c <= 0x24F) || (c >= 0x5D0 && c <= 0x5EA) ||
         (c >= 0x620 && c <= 0x64A) || (c >= 0x3041 && c <= 0x30FF && c != 0x30FB) ||
         (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x4E00 && c <= 0x9FFF) || (c >= 0xAC00 && c <= 0xD7A3);
}

std::string to_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  uint32_t prev = 0;
  while (pos < s.size()) {
    uint32_t c = next_code_point(s, &pos);
    bool final_sigma = false;
    if (c == 0x3A3 && is_alpha(prev)) {
      size_t look = pos;
      final_sigma = look >= s.size() || !is_alpha(next_code_point(s, &look));
    }
    append_lower(out, c, final_sigma);
    prev = c;
  }
  return out;
}

std::string to_upper(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  while (pos < s.size()) append_upper(out, next_code_point(s, &pos));
  return out;
}

std::string swap_case(std::string_view s) {
  std::string out;
  size_t pos = 0;
  while (pos < s.size()) {
    uint32_t c = next_code_point(s, &pos);
    if (is_upper_cp(c))
      append_lower(out, c, false);
    else if (is_lower_cp(c))
      append_upper(out, c);
    else
      append_utf8(out, c);
  }
  return out;
}

std::string to_title(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t pos = 0;
  bool prev_cased = false;
  while (pos < s.size()) {
    uint32_t c = next_code_point(s, &pos);
    if (prev_cased)
      append_lower(out, c, false);
    else
      append_title(out, c);
    prev_cased = is_cased(c);
  }
  return out;
}

std::string to_capitalize(std::string_view s) {
  std::string out;
  size_t pos = 0;
  bool first = true;
  while (pos < s.size()) {
    uint32_t c = next_code_point(s, &pos);
    if (first)
      append_title(out, c);
    else
      append_lower(out, c, false);
    first = false;
  }
  return out;
}

std::string_view strip_view(std::string_view s, const std::string* chars, bool left, bool right) {
  auto strip_set = [&](uint32_t c) {
    if (!chars) return is_space(c);
    size_t p = 0;
    while (p < chars->size())
      if (next_code_point(*chars, &p) == c) return true;
    return false;
  };
  size_t begin = 0, end = s.size();
  if (left) {
    while (begin < end) {
      size_t p = begin;
      if (!strip_set(next_code_point(s, &p))) break;
      begin = p;
    }
  }
  if (right) {
    while (end > begin) {
      size_t start = end - 1;
      while (start > begin && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
      size_t p = start;
      if (!strip_set(next_code_point(s, &p))) break;
      end = start;
    }
  }
  return s.substr(begin, end - begin);
}

}  // namespace muse::jinja
