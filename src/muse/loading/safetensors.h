// safetensors: strict parsing (checkpoint-formats.md §1), a memory-mapped
// file with zero-copy tensor views, shard indexes, and a writer used by tests,
// fixtures and benchmarks to produce random models.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "muse/core/dtype.h"
#include "muse/core/mapped_file.h"
#include "muse/core/status.h"

namespace muse {

// The reference reader's limit on the JSON header (safetensors MAX_HEADER_SIZE).
inline constexpr uint64_t kMaxSafetensorsHeaderBytes = 100'000'000;

struct TensorInfo {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  uint64_t begin = 0;  // data_offsets, relative to the data buffer (file offset 8 + N + begin)
  uint64_t end = 0;    // exclusive

  int64_t numel() const;
  uint64_t nbytes() const { return end - begin; }
};

struct SafetensorsHeader {
  uint64_t header_bytes = 0;  // N, the JSON length (including padding)
  uint64_t data_offset = 0;   // 8 + N: where the data buffer starts in the file
  std::vector<TensorInfo> tensors;  // in data order (sorted by begin)
  std::vector<std::pair<std::string, std::string>> metadata;  // __metadata__, in file order

  const TensorInfo* find(std::string_view name) const;

  // name -> index into tensors (built by the parser).
  std::unordered_map<std::string, size_t> index;
};

// Parses and validates a complete safetensors file held in memory (a pure
// function of the bytes: the fuzz target calls it directly). `source` names
// the file in errors. Checks, per the reference reader: 8-byte length, header
// <= 100,000,000 bytes and inside the file, a JSON object starting with '{'
// (space padding allowed), no duplicate names, known dtypes, non-negative
// dims without overflow, numel·bits divisible by 8 and equal to END−BEGIN,
// entries that tile the data buffer exactly (no holes, no overlaps, nothing
// after the last tensor, nothing missing: a truncated file fails here), and a
// string→string __metadata__.
Result<SafetensorsHeader> parse_safetensors(const uint8_t* data, size_t size, const std::string& source = "safetensors");

// A mapped, validated safetensors file. Views point into the mapping, which
// stays valid (and at the same address) for the life of the object, moves included.
class SafetensorsFile {
 public:
  static Result<SafetensorsFile> open(const std::string& path);

  const std::string& path() const { return file_.path(); }
  const SafetensorsHeader& header() const { return header_; }
  const std::vector<TensorInfo>& tensors() const { return header_.tensors; }
  const TensorInfo* find(std::string_view name) const { return header_.find(name); }
  const uint8_t* data(const TensorInfo& t) const { return file_.data() + header_.data_offset + t.begin; }
  size_t file_size() const { return file_.size(); }

 private:
  MappedFile file_;
  SafetensorsHeader header_;
};

// model.safetensors.index.json: {"metadata": {...}, "weight_map": {tensor: file}}.
struct ShardIndex {
  std::vector<std::pair<std::string, std::string>> weight_map;  // tensor -> shard file name, file order
  std::vector<std::string> files;                               // distinct shard names, first-seen order
};
// File names must be plain names inside the model directory (no '/', no "..").
Result<ShardIndex> parse_shard_index(std::string_view json_text, const std::string& source = "model.safetensors.index.json");

// One tensor for the writer. `data` must hold exactly numel·bits/8 bytes.
struct TensorToWrite {
  std::string name;
  DType dtype = DType::F32;
  std::vector<int64_t> shape;
  std::string_view data;
};

// Writes a safetensors file the reference reader accepts: tensors ordered by
// element size (largest first, for alignment), then name; header padded with
// spaces to a multiple of 8. Streams tensor data, so multi-GB models are fine.
Status write_safetensors(const std::string& path, const std::vector<TensorToWrite>& tensors,
                         const std::vector<std::pair<std::string, std::string>>& metadata = {{"format", "pt"}});
// The same bytes in memory (tests, fuzz seeds).
Result<std::string> serialize_safetensors(const std::vector<TensorToWrite>& tensors,
                                          const std::vector<std::pair<std::string, std::string>>& metadata = {{"format", "pt"}});
// Writes model.safetensors.index.json for the given tensor -> file map.
Status write_shard_index(const std::string& path, const std::vector<std::pair<std::string, std::string>>& weight_map,
                         uint64_t total_size);

// Helpers for building TensorToWrite data.
std::string tensor_bytes_f32(const std::vector<float>& values, DType dtype);  // converts to F32/F16/BF16

}  // namespace muse
