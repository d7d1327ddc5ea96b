#include "muse/server/stop_matcher.h"

#include <algorithm>

namespace muse::server {

namespace {
// Length of the longest suffix of `s` that is a proper prefix of `stop`.
size_t partial_suffix(std::string_view s, std::string_view stop) {
  size_t max = std::min(s.size(), stop.size() - 1);
  for (size_t len = max; len > 0; --len)
    if (s.substr(s.size() - len) == stop.substr(0, len)) return len;
  return 0;
}
// Never split a UTF-8 sequence when holding back: move the cut left onto a
// character boundary.
size_t utf8_floor(std::string_view s, size_t cut) {
  while (cut > 0 && cut < s.size() && (static_cast<unsigned char>(s[cut]) & 0xC0) == 0x80) --cut;
  return cut;
}
}  // namespace

std::string StopStringMatcher::push(std::string_view text, bool match) {
  if (matched()) return {};
  pending_.append(text);
  // Earliest full match wins (the text before it is what the model "said").
  size_t best = std::string::npos;
  for (size_t i = 0; match && i < stops_.size(); ++i) {
    if (stops_[i].empty()) continue;
    size_t at = pending_.find(stops_[i]);
    if (at != std::string::npos && (best == std::string::npos || at < best)) {
      best = at;
      matched_index_ = int(i);
    }
  }
  if (matched()) {
    size_t end = best + (include_ ? stops_[matched_index_].size() : 0);
    std::string out = pending_.substr(0, end);
    pending_.clear();
    return out;
  }
  size_t hold = 0;
  for (const auto& s : stops_)
    if (!s.empty()) hold = std::max(hold, partial_suffix(pending_, s));
  size_t cut = utf8_floor(pending_, pending_.size() - hold);
  std::string out = pending_.substr(0, cut);
  pending_.erase(0, cut);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  if (!matched()) out.swap(pending_);
  return out;
}

}  // namespace muse::server
