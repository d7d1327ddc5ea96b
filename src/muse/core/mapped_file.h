// A read-only memory-mapped file. Checkpoint tensors are views into these
// mappings, so loading copies nothing the layout lets us use in place.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "muse/core/status.h"

namespace muse {

class MappedFile {
 public:
  MappedFile() = default;
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;
  MappedFile(MappedFile&& o) noexcept;
  MappedFile& operator=(MappedFile&& o) noexcept;

  static Result<MappedFile> open(const std::string& path);

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }
  std::string_view view() const { return {reinterpret_cast<const char*>(data_), size_}; }

 private:
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
  std::string path_;
};

// Reads a whole (small) file into a string.
Result<std::string> read_file(const std::string& path);
// Writes a whole file, replacing it.
Status write_file(const std::string& path, std::string_view data);
bool file_exists(const std::string& path);

}  // namespace muse
