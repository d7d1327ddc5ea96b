// libFuzzer target: safetensors file validation (parse_safetensors) and the
// shard index parser.
// Properties: never crashes or reads out of bounds (ASan); whatever validates
// has every tensor inside the file, tiling the data buffer, converts to f32
// without touching bytes outside it, and re-serialises through our writer
// into a file that parses to the same tensors.
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string_view>
#include <vector>

#include "muse/loading/convert.h"
#include "muse/loading/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace muse;
  // The index parser sees the same bytes as text.
  (void)parse_shard_index(std::string_view(reinterpret_cast<const char*>(data), size));

  auto parsed = parse_safetensors(data, size, "fuzz");
  if (!parsed.ok()) return 0;
  const SafetensorsHeader& h = *parsed;
  uint64_t pos = 0;
  std::vector<TensorToWrite> tensors;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin != pos || t.end < t.begin || h.data_offset + t.end > size) std::abort();
    pos = t.end;
    const uint8_t* p = data + h.data_offset + t.begin;
    int64_t n = t.numel();
    if (convertible_to_float(t.dtype) && n <= (1 << 16) && (t.dtype != DType::F4 || n % 2 == 0)) {
      std::vector<float> out(static_cast<size_t>(n));
      if (!convert_to_f32(t.dtype, p, 0, n, out.data()).ok()) std::abort();
    }
    tensors.push_back({t.name, t.dtype, t.shape, std::string_view(reinterpret_cast<const char*>(p), t.nbytes())});
  }
  if (h.data_offset + pos != size) std::abort();

  auto again_bytes = serialize_safetensors(tensors, h.metadata);
  if (!again_bytes.ok()) std::abort();
  auto again = parse_safetensors(reinterpret_cast<const uint8_t*>(again_bytes->data()), again_bytes->size(), "again");
  if (!again.ok() || again->tensors.size() != h.tensors.size() || again->metadata != h.metadata) std::abort();
  for (const TensorInfo& t : h.tensors) {
    const TensorInfo* u = again->find(t.name);
    if (!u || u->dtype != t.dtype || u->shape != t.shape || u->nbytes() != t.nbytes()) std::abort();
    if (t.nbytes() && std::memcmp(data + h.data_offset + t.begin,
                                  again_bytes->data() + again->data_offset + u->begin, t.nbytes()) != 0)
      std::abort();
  }
  return 0;
}
