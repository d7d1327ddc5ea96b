#include "muse/loading/safetensors.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "muse/core/json.h"

namespace muse {

namespace {

std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

uint64_t read_u64_le(const uint8_t* p) {
  uint64_t v = 0;
  for (int i = 7; i >= 0; --i) v = (v << 8) | p[i];
  return v;
}

// Bytes of `numel` elements of `dtype`, or false on overflow / a partial byte.
bool storage_bytes(DType dtype, int64_t numel, uint64_t* out) {
  unsigned __int128 bits = (unsigned __int128)uint64_t(numel) * unsigned(dtype_bits(dtype));
  if (bits % 8 != 0 || bits / 8 > UINT64_MAX) return false;
  *out = uint64_t(bits / 8);
  return true;
}

Result<TensorInfo> parse_entry(const std::string& name, const Json& v, const std::string& where) {
  auto bad = [&](const std::string& what) {
    return make_error(where + ": corrupt header: tensor \"" + name + "\": " + what);
  };
  if (!v.is_object()) return bad(std::string("entry must be an object, got ") + v.type_name());
  TensorInfo t;
  t.name = name;
  const Json* dtype = v.find("dtype");
  if (!dtype || !dtype->is_string()) return bad("missing or non-string \"dtype\"");
  if (!parse_dtype(dtype->as_string(), &t.dtype))
    return bad("unknown dtype \"" + dtype->as_string() +
               "\" (known: BOOL, F4, F6_E2M3, F6_E3M2, U8, I8, F8_E5M2, F8_E4M3, F8_E8M0, F8_E4M3FNUZ, "
               "F8_E5M2FNUZ, I16, U16, F16, BF16, I32, U32, F32, C64, F64, I64, U64)");
  const Json* shape = v.find("shape");
  if (!shape || !shape->is_array()) return bad("missing or non-list \"shape\"");
  if (shape->size() > 64) return bad("shape has " + std::to_string(shape->size()) + " dimensions");
  int64_t numel = 1;
  for (const Json& d : shape->as_array()) {
    if (!d.is_int() || d.as_int() < 0) return bad("shape " + shape->dump() + " must list non-negative integers");
    t.shape.push_back(d.as_int());
    if (__builtin_mul_overflow(numel, d.as_int(), &numel)) return bad("shape " + shape->dump() + " overflows");
  }
  const Json* offs = v.find("data_offsets");
  if (!offs || !offs->is_array() || offs->size() != 2 || !offs->as_array()[0].is_int() ||
      !offs->as_array()[1].is_int() || offs->as_array()[0].as_int() < 0 || offs->as_array()[1].as_int() < 0)
    return bad("\"data_offsets\" must be [BEGIN, END], two non-negative integers");
  t.begin = uint64_t(offs->as_array()[0].as_int());
  t.end = uint64_t(offs->as_array()[1].as_int());
  if (t.end < t.begin)
    return bad("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] end before they begin");
  uint64_t want;
  if (!storage_bytes(t.dtype, numel, &want))
    return bad(shape_text(t.shape) + " " + std::string(dtype_name(t.dtype)) +
               " does not fill a whole number of bytes (or overflows)");
  if (t.end - t.begin != want)
    return bad("data_offsets [" + std::to_string(t.begin) + ", " + std::to_string(t.end) + "] span " +
               std::to_string(t.end - t.begin) + " bytes but " + shape_text(t.shape) + " " +
               std::string(dtype_name(t.dtype)) + " needs " + std::to_string(want));
  return t;
}

}  // namespace

int64_t TensorInfo::numel() const {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

const TensorInfo* SafetensorsHeader::find(std::string_view name) const {
  auto it = index.find(std::string(name));
  return it == index.end() ? nullptr : &tensors[it->second];
}

Result<SafetensorsHeader> parse_safetensors(const uint8_t* data, size_t size, const std::string& source) {
  if (size < 8)
    return make_error(source + ": file is " + std::to_string(size) +
                      " bytes, too short for the 8-byte safetensors header length (truncated or not safetensors)");
  SafetensorsHeader h;
  h.header_bytes = read_u64_le(data);
  if (h.header_bytes > kMaxSafetensorsHeaderBytes)
    return make_error(source + ": header length " + std::to_string(h.header_bytes) +
                      " exceeds the 100,000,000-byte limit (corrupt file or not safetensors)");
  if (h.header_bytes > size - 8)
    return make_error(source + ": header length " + std::to_string(h.header_bytes) + " runs past the end of the " +
                      std::to_string(size) + "-byte file (truncated download?)");
  h.data_offset = 8 + h.header_bytes;
  std::string_view text(reinterpret_cast<const char*>(data + 8), size_t(h.header_bytes));
  if (text.empty() || text[0] != '{')
    return make_error(source + ": header does not start with '{' (corrupt file or not safetensors)");

  JsonParseOptions opts;
  opts.max_depth = 16;
  opts.reject_duplicate_keys = true;
  auto json = Json::parse(text, opts);
  if (!json.ok()) return make_error(source + ": corrupt header: " + json.message());
  if (!json->is_object()) return make_error(source + ": header is not a JSON object");

  for (const auto& [name, v] : json->as_object()) {
    if (name == "__metadata__") {
      if (!v.is_object()) return make_error(source + ": __metadata__ must be an object of strings");
      for (const auto& [k, s] : v.as_object()) {
        if (!s.is_string())
          return make_error(source + ": __metadata__[\"" + k + "\"] must be a string, got " + s.type_name());
        h.metadata.emplace_back(k, s.as_string());
      }
      continue;
    }
    MUSE_ASSIGN_OR_RETURN(TensorInfo t, parse_entry(name, v, source));
    h.tensors.push_back(std::move(t));
  }

  // Sorted by offset, the entries must tile the data buffer exactly.
  std::stable_sort(h.tensors.begin(), h.tensors.end(), [](const TensorInfo& a, const TensorInfo& b) {
    return a.begin != b.begin ? a.begin < b.begin : a.end < b.end;
  });
  const uint64_t buffer = size - h.data_offset;
  uint64_t pos = 0;
  const TensorInfo* prev = nullptr;
  for (const TensorInfo& t : h.tensors) {
    if (t.begin > pos)
      return make_error(source + ": corrupt header: " + std::to_string(t.begin - pos) + "-byte hole before tensor \"" +
                        t.name + "\" (data_offsets begin " + std::to_string(t.begin) + ", expected " +
                        std::to_string(pos) + ")");
    if (t.begin < pos)
      return make_error(source + ": corrupt header: tensor \"" + t.name + "\" (data_offsets [" +
                        std::to_string(t.begin) + ", " + std::to_string(t.end) + "]) overlaps tensor \"" +
                        (prev ? prev->name : std::string("?")) + "\" (ends at " + std::to_string(pos) + ")");
    pos = t.end;
    prev = &t;
  }
  if (pos > buffer)
    return make_error(source + ": file is truncated: tensor \"" + (prev ? prev->name : std::string()) +
                      "\" ends at data offset " + std::to_string(pos) + " but the data buffer has only " +
                      std::to_string(buffer) + " bytes (file " + std::to_string(size) + " bytes, expected " +
                      std::to_string(h.data_offset + pos) + "); re-download it");
  if (pos < buffer)
    return make_error(source + ": " + std::to_string(buffer - pos) +
                      " bytes after the last tensor are not described by the header (corrupt file)");
  h.index.reserve(h.tensors.size());
  for (size_t i = 0; i < h.tensors.size(); ++i) h.index.emplace(h.tensors[i].name, i);
  return h;
}

Result<SafetensorsFile> SafetensorsFile::open(const std::string& path) {
  SafetensorsFile f;
  MUSE_ASSIGN_OR_RETURN(f.file_, MappedFile::open(path));
  MUSE_ASSIGN_OR_RETURN(f.header_, parse_safetensors(f.file_.data(), f.file_.size(), path));
  return f;
}

Result<ShardIndex> parse_shard_index(std::string_view json_text, const std::string& source) {
  JsonParseOptions opts;
  opts.max_depth = 16;
  opts.reject_duplicate_keys = true;
  auto json = Json::parse(json_text, opts);
  if (!json.ok()) return make_error(source + ": " + json.message());
  if (!json->is_object()) return make_error(source + ": the top level must be a JSON object");
  const Json* map = json->find("weight_map");
  if (!map || !map->is_object()) return make_error(source + ": missing \"weight_map\" object");
  ShardIndex idx;
  std::unordered_map<std::string, bool> seen;
  for (const auto& [tensor, file] : map->as_object()) {
    if (!file.is_string())
      return make_error(source + ": weight_map[\"" + tensor + "\"] must be a file name, got " + file.type_name());
    const std::string& f = file.as_string();
    if (f.empty() || f.find('/') != std::string::npos || f.find('\\') != std::string::npos || f == "." || f == "..")
      return make_error(source + ": weight_map[\"" + tensor + "\"] = \"" + f +
                        "\" is not a file name inside the model directory");
    idx.weight_map.emplace_back(tensor, f);
    if (seen.emplace(f, true).second) idx.files.push_back(f);
  }
  return idx;
}

namespace {

struct Layout {
  std::string header;  // padded JSON
  std::vector<size_t> order;
  uint64_t data_bytes = 0;
};

Result<Layout> plan_layout(const std::vector<TensorToWrite>& tensors,
                           const std::vector<std::pair<std::string, std::string>>& metadata) {
  Layout l;
  l.order.resize(tensors.size());
  for (size_t i = 0; i < tensors.size(); ++i) l.order[i] = i;
  std::sort(l.order.begin(), l.order.end(), [&](size_t a, size_t b) {
    int ba = dtype_bits(tensors[a].dtype), bb = dtype_bits(tensors[b].dtype);
    return ba != bb ? ba > bb : tensors[a].name < tensors[b].name;
  });
  Json header = Json::object();
  if (!metadata.empty()) {
    Json meta = Json::object();
    for (const auto& [k, v] : metadata) meta.set(k, v);
    header.set("__metadata__", meta);
  }
  uint64_t offset = 0;
  for (size_t i : l.order) {
    const TensorToWrite& t = tensors[i];
    if (t.name == "__metadata__" || header.contains(t.name))
      return make_error("write_safetensors: duplicate or reserved tensor name \"" + t.name + "\"");
    int64_t numel = 1;
    Json shape = Json::array();
    for (int64_t d : t.shape) {
      if (d < 0) return make_error("write_safetensors: tensor \"" + t.name + "\" has a negative dimension");
      numel *= d;
      shape.push_back(d);
    }
    uint64_t bytes = 0;
    if (!storage_bytes(t.dtype, numel, &bytes) || bytes != t.data.size())
      return make_error("write_safetensors: tensor \"" + t.name + "\" " + shape_text(t.shape) + " " +
                        std::string(dtype_name(t.dtype)) + " needs " + std::to_string(bytes) + " bytes, got " +
                        std::to_string(t.data.size()));
    Json e = Json::object();
    e.set("dtype", std::string(dtype_name(t.dtype)));
    e.set("shape", shape);
    e.set("data_offsets", Json(JsonArray{Json(int64_t(offset)), Json(int64_t(offset + bytes))}));
    header.set(t.name, e);
    offset += bytes;
  }
  l.header = header.dump();
  while ((8 + l.header.size()) % 8 != 0) l.header.push_back(' ');
  l.data_bytes = offset;
  return l;
}

std::string u64_le(uint64_t v) {
  std::string s(8, '\0');
  for (int i = 0; i < 8; ++i) s[size_t(i)] = char((v >> (8 * i)) & 0xff);
  return s;
}

}  // namespace

Result<std::string> serialize_safetensors(const std::vector<TensorToWrite>& tensors,
                                          const std::vector<std::pair<std::string, std::string>>& metadata) {
  MUSE_ASSIGN_OR_RETURN(Layout l, plan_layout(tensors, metadata));
  std::string out = u64_le(l.header.size()) + l.header;
  out.reserve(out.size() + l.data_bytes);
  for (size_t i : l.order) out.append(tensors[i].data);
  return out;
}

Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::vector<std::pair<std::string, std::string>>& metadata) {
  MUSE_ASSIGN_OR_RETURN(Layout l, plan_layout(tensors, metadata));
  FILE* fp = std::fopen(path.c_str(), "wb");
  if (!fp) return make_error("cannot create " + path + ": " + std::strerror(errno));
  std::string head = u64_le(l.header.size()) + l.header;
  bool ok = std::fwrite(head.data(), 1, head.size(), fp) == head.size();
  for (size_t i : l.order) {
    if (!ok) break;
    const auto& d = tensors[i].data;
    ok = d.empty() || std::fwrite(d.data(), 1, d.size(), fp) == d.size();
  }
  ok = (std::fclose(fp) == 0) && ok;
  if (!ok) return make_error("cannot write " + path + " (disk full?)");
  return Status::Ok();
}

Status write_shard_index(const std::string& path, const std::vector<std::pair<std::string, std::string>>& weight_map,
                         uint64_t total_size) {
  Json root = Json::object();
  Json meta = Json::object();
  meta.set("total_size", int64_t(total_size));
  root.set("metadata", meta);
  Json map = Json::object();
  for (const auto& [t, f] : weight_map) map.set(t, f);
  root.set("weight_map", map);
  return write_file(path, root.dump(JsonDumpOptions::python(2, false)) + "\n");
}

std::string tensor_bytes_f32(const std::vector<float>& values, DType dtype) {
  std::string out;
  switch (dtype) {
    case DType::F32:
      out.resize(values.size() * 4);
      if (!values.empty()) std::memcpy(out.data(), values.data(), out.size());
      break;
    case DType::BF16:
    case DType::F16:
      out.resize(values.size() * 2);
      for (size_t i = 0; i < values.size(); ++i) {
        uint16_t h = dtype == DType::BF16 ? f32_to_bf16(values[i]) : f32_to_f16(values[i]);
        std::memcpy(out.data() + 2 * i, &h, 2);
      }
      break;
    default:
      break;  // other dtypes: build the bytes directly
  }
  return out;
}

}  // namespace muse
