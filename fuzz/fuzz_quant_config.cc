// libFuzzer target: what a checkpoint's quantization settings can say.
// The input's first line is a regular expression (a compressed-tensors "re:"
// exclusion), compiled by ModuleRegex and matched against the rest of the
// input; the whole input is also read as a quantization_config
// (describe_quantization) and as an hf_quant_config.json
// (modelopt_quant_config). Properties: never crashes, hangs or overflows
// (ASan/UBSan); every error has a message; a described config's exclusions
// compile or fail with a message.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "muse/core/json.h"
#include "muse/loading/module_regex.h"
#include "muse/loading/quant.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muse;
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const size_t nl = text.find('\n');
  const std::string_view pattern = text.substr(0, nl == std::string_view::npos ? text.size() : nl);
  auto re = ModuleRegex::compile(pattern);
  if (!re.ok() && re.message().empty()) std::abort();
  if (re.ok()) {
    (void)re->matches(nl == std::string_view::npos ? std::string_view() : text.substr(nl + 1));
    (void)re->matches("model.language_model.layers.12.self_attn.q_proj");
  }
  auto j = Json::parse(text);
  if (!j.ok()) return 0;
  for (int pass = 0; pass < 2; ++pass) {
    Result<Json> qc = pass == 0 ? Result<Json>(*j) : modelopt_quant_config(*j);
    if (!qc.ok()) {
      if (qc.message().empty()) std::abort();
      continue;
    }
    auto info = describe_quantization(*qc);
    if (!info.ok()) {
      if (info.message().empty()) std::abort();
      continue;
    }
    for (const std::string& e : info->excluded)
      if (e.rfind("re:", 0) == 0) {
        auto r = ModuleRegex::compile(std::string_view(e).substr(3));
        if (!r.ok() && r.message().empty()) std::abort();
      }
  }
  return 0;
}
