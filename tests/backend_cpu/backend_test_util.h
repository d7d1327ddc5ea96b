// Helpers for the CPU backend tests: backends per ISA, random tensors
// (never zeros), and upload/download shorthands.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "muse/backends/cpu/cpu_backend.h"

namespace muse::testing {

inline std::vector<float> random_floats(size_t n, uint32_t seed, float scale = 1.0f, float offset = 0.0f) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> dist(0.0f, 1.0f);
  std::vector<float> v(n);
  for (auto& x : v) {
    float r = dist(rng);
    if (std::fabs(r) < 1e-3f) r = r < 0 ? -0.5f : 0.5f;  // never zero
    x = offset + scale * r;
  }
  return v;
}

inline std::vector<uint16_t> to_bf16(const std::vector<float>& v) {
  std::vector<uint16_t> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = f32_to_bf16(v[i]);
  return out;
}
inline std::vector<float> from_bf16(const std::vector<uint16_t>& v) {
  std::vector<float> out(v.size());
  for (size_t i = 0; i < v.size(); ++i) out[i] = bf16_to_f32(v[i]);
  return out;
}

// A backend of the requested ISA, or nullptr (the caller skips) when this
// CPU lacks it.
inline std::unique_ptr<Backend> make_backend(cpu::Isa isa, int threads) {
  CpuBackendOptions o;
  o.isa = isa;
  o.threads = threads;
  auto r = create_cpu_backend(o);
  if (!r.ok()) return nullptr;
  return std::move(r).value();
}

template <class T>
Tensor upload(Backend& b, DType dt, std::initializer_list<int64_t> shape, const std::vector<T>& data) {
  auto t = b.import_weight(dt, shape, data.data(), false);
  EXPECT_TRUE(t.ok()) << (t.ok() ? "" : t.message());
  EXPECT_EQ(t->bytes(), data.size() * sizeof(T));
  return *t;
}
inline Tensor zeros(Backend& b, DType dt, std::initializer_list<int64_t> shape) {
  auto t = b.alloc(dt, shape);
  EXPECT_TRUE(t.ok());
  return *t;
}
template <class T = float>
std::vector<T> fetch(Backend& b, const Tensor& t) {
  std::vector<T> v(t.bytes() / sizeof(T));
  Status s = b.download(t, v.data());
  EXPECT_TRUE(s.ok()) << s.message();
  return v;
}
inline void run(Backend& b) {
  Status s = b.execute();
  ASSERT_TRUE(s.ok()) << s.message();
}

// Expect |got - want| <= rel * scale + abs for each element.
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want,
                         const std::vector<double>& scale, double rel, const std::string& what) {
  ASSERT_EQ(got.size(), want.size()) << what;
  int bad = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    double tol = rel * scale[i] + 1e-30;
    if (!(std::fabs(double(got[i]) - want[i]) <= tol)) {
      if (++bad <= 5)
        ADD_FAILURE() << what << " [" << i << "]: got " << got[i] << " want " << want[i] << " tol " << tol;
    }
  }
  EXPECT_EQ(bad, 0) << what;
}
inline void expect_close(const std::vector<float>& got, const std::vector<double>& want, double rel,
                         const std::string& what) {
  std::vector<double> scale(want.size());
  for (size_t i = 0; i < want.size(); ++i) scale[i] = std::max(1.0, std::fabs(want[i]));
  expect_close(got, want, scale, rel, what);
}

// The ISAs every kernel test runs on.
inline std::string isa_param_name(const ::testing::TestParamInfo<cpu::Isa>& info) {
  return cpu::isa_name(info.param);
}

class IsaTest : public ::testing::TestWithParam<cpu::Isa> {
 protected:
  void SetUp() override {
    backend_ = make_backend(GetParam(), 2);
    if (!backend_)
      GTEST_SKIP() << "this CPU does not support " << cpu::isa_name(GetParam()) << "; its kernels are not tested here";
  }
  Backend& b() { return *backend_; }
  std::unique_ptr<Backend> backend_;
};

}  // namespace muse::testing
