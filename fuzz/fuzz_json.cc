// libFuzzer target: JSON parsing and re-serialisation.
// Properties: parse never crashes; whatever parses dumps to text that parses
// again to an equal value (round trip), in both compact and Python styles.
#include <cstdint>
#include <cstdlib>
#include <string_view>

#include "muse/core/json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string_view text(reinterpret_cast<const char*>(data), size);
  auto parsed = muse::Json::parse(text);
  if (!parsed.ok()) return 0;
  for (const auto& opts : {muse::JsonDumpOptions{}, muse::JsonDumpOptions::python(2, true)}) {
    std::string out = parsed->dump(opts);
    auto again = muse::Json::parse(out);
    if (!again.ok()) std::abort();
    // NaN cannot appear (the parser rejects it), so equality is well defined.
    if (!(*again == *parsed)) std::abort();
  }
  return 0;
}
