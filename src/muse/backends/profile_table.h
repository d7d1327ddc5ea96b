// The per-operation time table both backends print for --profile: one row
// per operation name, slowest first, with its share of the total.
#pragma once

#include <algorithm>
#include <cstdio>
#include <string>
#include <vector>

namespace muse {

inline const char* profile_name(const char* s) { return s; }
inline const char* profile_name(const std::string& s) { return s.c_str(); }

// `times`: (name, {count, seconds}) pairs, any order.
template <class Entries>
std::string profile_table(Entries times) {
  double total = 0;
  for (const auto& p : times) total += p.second.seconds;
  std::sort(times.begin(), times.end(), [](const auto& a, const auto& b) { return a.second.seconds > b.second.seconds; });
  std::string out = "operation            calls     total ms   us/call   share\n";
  char line[200];
  for (const auto& [name, t] : times) {
    std::snprintf(line, sizeof(line), "%-18s %8lld %12.3f %9.2f %6.1f%%\n", profile_name(name), (long long)t.count,
                  t.seconds * 1e3, t.seconds * 1e6 / double(t.count), total > 0 ? 100.0 * t.seconds / total : 0.0);
    out += line;
  }
  return out;
}

}  // namespace muse
