// Helpers for the CUDA backend tests: the backend (or a skip that says why),
// random tensors (never zeros), uploads in either dtype with the values the
// GPU really sees, and tolerance checks derived from the roundings involved.
//
// Tolerances. Every CUDA op computes in fp32 and rounds once, at the store.
// Against a double reference on the same (already rounded) inputs an element
// may be off by
//   bf16 store:  2^-8 · |want|            (round-to-nearest-even, 8-bit significand)
//   fp32 arithmetic:  n · u · scale       (u = 2^-24; n the longest chain of
//                                          roundings feeding the element; scale
//                                          the sum of the magnitudes it adds up)
// and each test states n and scale for its op.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "../backend_cpu/backend_test_util.h"
#include "muse/backends/cuda/cuda_backend.h"

namespace muse::cuda_testing {

constexpr double kU = 1.0 / 16777216.0;  // fp32 unit roundoff, 2^-24
constexpr double kBf16Store = 1.0 / 256.0;

using muse::testing::random_floats;  // the CPU tests' generator (never zeros)

// Values as stored in `dt` (bf16: rounded to nearest even).
inline std::vector<float> as_stored(std::vector<float> v, DType dt) {
  if (dt == DType::BF16)
    for (auto& x : v) x = round_bf16(x);
  return v;
}

// Per-op error summary, printed at the end of the run (the report's table).
struct ErrorTable {
  struct Row {
    double max_abs = 0, max_ratio = 0;  // max |got - want|, max |got - want| / tol
    long checked = 0;
  };
  std::map<std::string, Row> rows;
  static ErrorTable& get() {
    static ErrorTable t;
    return t;
  }
};

class CudaTest : public ::testing::Test {
 public:
  void SetUp() override {
#if !(defined(MUSE_HAVE_CUDA) && MUSE_HAVE_CUDA)
    GTEST_SKIP() << "this build has no CUDA backend (configure with -DMUSE_CUDA=ON: scripts/test-cuda.sh)";
#else
    if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA GPU on this machine: the CUDA backend is not tested here";
    auto r = create_cuda_backend();
    ASSERT_TRUE(r.ok()) << r.message();
    backend_ = std::move(r).value();
#endif
  }
  Backend& b() { return *backend_; }

  // Uploads `v` as `dt`; returns the tensor, and replaces v by the values stored.
  Tensor up(DType dt, std::initializer_list<int64_t> shape, std::vector<float>& v) {
    v = as_stored(v, dt);
    Result<Tensor> t = Tensor{};
    if (dt == DType::BF16) {
      std::vector<uint16_t> h(v.size());
      for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
      t = b().import_weight(dt, shape, h.data(), false);
    } else {
      t = b().import_weight(dt, shape, v.data(), false);
    }
    EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.message());
    if (!t.ok()) return Tensor{};
    EXPECT_EQ(size_t(t->numel()), v.size());
    return *t;
  }
  Tensor up_i32(std::initializer_list<int64_t> shape, const std::vector<int32_t>& v) {
    auto t = b().import_weight(DType::I32, shape, v.data(), false);
    EXPECT_TRUE(t.ok());
    return t.ok() ? *t : Tensor{};
  }
  // A tensor filled with garbage (NaN bit patterns), so unwritten outputs show.
  Tensor poisoned(DType dt, std::initializer_list<int64_t> shape) {
    auto t = b().alloc(dt, shape);
    EXPECT_TRUE(t.ok());
    std::vector<uint8_t> bytes(t->bytes(), 0xff);
    b().set_input(*t, bytes.data(), bytes.size());
    return *t;
  }
  std::vector<float> get(const Tensor& t) {
    std::vector<float> out(size_t(t.numel()));
    if (t.dtype == DType::BF16) {
      std::vector<uint16_t> h(out.size());
      Status s = b().download(t, h.data());
      EXPECT_TRUE(s.ok()) << s.message();
      for (size_t i = 0; i < h.size(); ++i) out[i] = bf16_to_f32(h[i]);
    } else {
      Status s = b().download(t, out.data());
      EXPECT_TRUE(s.ok()) << s.message();
    }
    return out;
  }
  std::vector<uint8_t> get_bytes(const Tensor& t) {
    std::vector<uint8_t> out(t.bytes());
    Status s = b().download(t, out.data());
    EXPECT_TRUE(s.ok()) << s.message();
    return out;
  }
  template <class T>
  std::vector<T> get_as(const Tensor& t) {
    std::vector<T> out(t.bytes() / sizeof(T));
    Status s = b().download(t, out.data());
    EXPECT_TRUE(s.ok()) << s.message();
    return out;
  }
  void run() {
    Status s = b().execute();
    ASSERT_TRUE(s.ok()) << s.message();
  }

  std::unique_ptr<Backend> backend_;
};

// Expects |got - want| <= (bf16 ? 2^-8 |want| : 0) + fp32_tol[i] for each element.
inline void expect_close(const std::string& op, const std::vector<float>& got, const std::vector<double>& want,
                         const std::vector<double>& fp32_tol, bool bf16_out, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  // One row per op and output dtype: bf16 rows are dominated by the store's
  // rounding, f32 rows show the fp32 arithmetic against its own bound.
  auto& row = ErrorTable::get().rows[op + (bf16_out ? " -> bf16" : " -> f32")];
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double tol = (bf16_out ? kBf16Store * std::fabs(want[i]) : 0.0) + fp32_tol[i] * (1 + kBf16Store) + 1e-37;
    const double err = std::fabs(double(got[i]) - want[i]);
    row.max_abs = std::max(row.max_abs, std::isnan(err) ? INFINITY : err);
    row.max_ratio = std::max(row.max_ratio, std::isnan(err) ? INFINITY : err / tol);
    ++row.checked;
    if (!(err <= tol)) {
      if (++bad <= 5)
        ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << " want " << want[i] << " tol " << tol;
    }
  }
  EXPECT_EQ(bad, 0) << what << ": " << bad << " of " << got.size() << " elements outside tolerance";
}

// fp32 tolerance n·u·scale[i] for each element.
inline std::vector<double> fp32_tol(const std::vector<double>& scale, double n) {
  std::vector<double> t(scale.size());
  for (size_t i = 0; i < scale.size(); ++i) t[i] = n * kU * scale[i];
  return t;
}
inline std::vector<double> abs_of(const std::vector<double>& v) {
  std::vector<double> a(v.size());
  for (size_t i = 0; i < v.size(); ++i) a[i] = std::fabs(v[i]);
  return a;
}

inline const char* dtype_label(DType t) { return t == DType::BF16 ? "bf16" : "f32"; }

}  // namespace muse::cuda_testing
