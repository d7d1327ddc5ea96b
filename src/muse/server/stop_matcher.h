// Stop strings matched across token boundaries, never leaked: text is
// released only once no stop string can still start inside it. A helper for
// GenerationService implementations (the fake uses it; the real engine may).
#pragma once

#include <string>
#include <string_view>
#include <vector>

namespace muse::server {

class StopStringMatcher {
 public:
  StopStringMatcher() = default;
  StopStringMatcher(std::vector<std::string> stops, bool include_stop_in_output)
      : stops_(std::move(stops)), include_(include_stop_in_output) {}

  // Appends `text` and returns what may be released now. After a match,
  // `matched()` is set, the released text ends at the match (or after it with
  // include_stop_in_output) and later calls release nothing. With
  // match=false (vLLM: before min_tokens) nothing matches yet; only a tail
  // that may still begin a stop string is held back.
  std::string push(std::string_view text, bool match = true);
  // End of generation without a match: everything still held back.
  std::string flush();

  bool matched() const { return matched_index_ >= 0; }
  const std::string& matched_string() const { return stops_[matched_index_]; }

 private:
  std::vector<std::string> stops_;
  bool include_ = false;
  std::string pending_;
  int matched_index_ = -1;
};

}  // namespace muse::server
