// The Unicode pieces Python's str methods need, on UTF-8 strings.
//
// Python strings are sequences of code points; ours are UTF-8 bytes (always
// valid: templates and JSON inputs are validated on the way in). Lengths,
// indices and slices therefore count code points, and case mapping follows
// Python for the scripts chat templates meet (Latin, Greek, Cyrillic,
// fullwidth); other scripts are left unchanged (documented in docs/chat.md).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace muse::jinja {

// Decodes the code point at s[*pos] and advances *pos (invalid bytes decode
// as U+FFFD, one byte each, so loops always make progress).
uint32_t next_code_point(std::string_view s, size_t* pos);
size_t code_point_count(std::string_view s);
bool is_ascii(std::string_view s);
// Byte offset of every code point, plus s.size() at the end.
std::vector<size_t> code_point_offsets(std::string_view s);

bool is_space(uint32_t cp);  // Python str.isspace() for one code point
bool is_alpha(uint32_t cp);
bool is_digit(uint32_t cp);
bool is_upper_cp(uint32_t cp);
bool is_lower_cp(uint32_t cp);

std::string to_lower(std::string_view s);
std::string to_upper(std::string_view s);
std::string to_title(std::string_view s);       // str.title()
std::string to_capitalize(std::string_view s);  // str.capitalize()
std::string swap_case(std::string_view s);

// Python's str.strip family; `chars` null means whitespace.
std::string_view strip_view(std::string_view s, const std::string* chars, bool left, bool right);

}  // namespace muse::jinja
