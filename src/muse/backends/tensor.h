// Tensor: a handle to backend memory (data pointer, dtype, shape). Split from
// backend.h so the step plan (step_plan.h) can name it.
#pragma once

#include <array>
#include <cstddef>
#include <cstdint>
#include <initializer_list>
#include <string>

#include "muse/core/dtype.h"

namespace muse {

// A handle to backend memory: row-major, outermost dimension first.
struct Tensor {
  void* data = nullptr;  // backend address; never dereferenced outside the backend
  DType dtype = DType::F32;
  int rank = 0;
  std::array<int64_t, 4> shape{};

  bool empty() const { return data == nullptr; }
  int64_t dim(int i) const { return shape[size_t(i)]; }
  int64_t numel() const {
    int64_t n = rank ? 1 : 0;
    for (int i = 0; i < rank; ++i) n *= shape[size_t(i)];
    return n;
  }
  int64_t cols() const { return rank ? shape[size_t(rank - 1)] : 0; }  // innermost extent
  int64_t rows() const { return cols() ? numel() / cols() : 0; }      // everything else
  size_t element_bytes() const { return size_t(dtype_bits(dtype) / 8); }
  size_t bytes() const { return size_t(numel()) * element_bytes(); }

  // Rows [begin, begin+count) of the outermost dimension, as a tensor of the
  // same rank. Valid on every backend: it is pointer arithmetic only.
  Tensor rows(int64_t begin, int64_t count) const {
    Tensor t = *this;
    int64_t inner = numel() / shape[0];
    t.data = static_cast<char*>(data) + size_t(begin * inner) * element_bytes();
    t.shape[0] = count;
    return t;
  }
  // The same memory seen with another shape (same element count).
  Tensor reshaped(std::initializer_list<int64_t> dims) const {
    Tensor t = *this;
    t.rank = int(dims.size());
    t.shape = {};
    int i = 0;
    for (int64_t d : dims) t.shape[size_t(i++)] = d;
    return t;
  }
};

// "BF16[64, 128]", for error messages.
inline std::string describe(const Tensor& t) {
  std::string s(dtype_name(t.dtype));
  s += '[';
  for (int i = 0; i < t.rank; ++i) s += (i ? ", " : "") + std::to_string(t.shape[size_t(i)]);
  return s + ']';
}

}  // namespace muse
