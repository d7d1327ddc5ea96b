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

// A CUDA backend with options o, or null with a test failure saying why.
inline std::unique_ptr<Backend> backend_with(const CudaBackendOptions& o) {
  auto r = create_cuda_backend(o);
  EXPECT_TRUE(r.ok()) << r.message();
  return r.ok() ? std::move(r).value() : nullptr;
}
// A CUDA backend whose products all go through kernel `variant`
// (CudaBackendOptions::gemv_variant; 0: the shape rule).
inline std::unique_ptr<Backend> backend_with_product_kernel(int variant) {
  CudaBackendOptions o;
  o.gemv_variant = variant;
  return backend_with(o);
}

// A CUDA backend whose latent experts take CudaBackendOptions::expert_gemm
// `mode` (1 the per-tile kernels, 2 / 3 the grouped GEMM in tiles of 256 /
// 128 pairs).
inline std::unique_ptr<Backend> backend_with_expert_gemm(int mode) {
  CudaBackendOptions o;
  o.expert_gemm = mode;
  return backend_with(o);
}

// Two downloads of F32 outputs that should hold the same bits, told apart in
// a line (a bit-equality failure's message: how many elements differ, the
// first, and the largest difference relative to the largest |value|).
inline std::string describe_f32_difference(const std::vector<char>& want, const std::vector<char>& got) {
  if (want.size() != got.size())
    return "sizes differ: " + std::to_string(want.size()) + " vs " + std::to_string(got.size()) + " bytes";
  const size_t n = want.size() / sizeof(float);
  std::vector<float> a(n), b(n);
  std::memcpy(a.data(), want.data(), n * sizeof(float));
  std::memcpy(b.data(), got.data(), n * sizeof(float));
  size_t differ = 0, first = n;
  double max_diff = 0, max_abs = 0;
  for (size_t i = 0; i < n; ++i) {
    max_abs = std::max(max_abs, double(std::fabs(a[i])));
    if (std::memcmp(&a[i], &b[i], sizeof(float)) == 0) continue;
    if (first == n) first = i;
    ++differ;
    max_diff = std::max(max_diff, std::fabs(double(a[i]) - double(b[i])));
  }
  if (differ == 0) return "same bits";
  return std::to_string(differ) + " of " + std::to_string(n) + " elements differ; first [" + std::to_string(first) +
         "] " + std::to_string(a[first]) + " vs " + std::to_string(b[first]) + "; max |difference| " +
         std::to_string(max_diff) + " (" + std::to_string(max_abs > 0 ? max_diff / max_abs : 0.0) +
         " of max |value|)";
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

// ---- latent experts: the double reference (moe_test.cc, quant_test.cc) ----
struct ExpertCase {
  int64_t T, E, K, Hm, I;
  DType wdt;
};

// The double reference and its error bound (the fp32 roundings propagated
// through silu, the down product, the norm and the weighted sum).
// a_bf16: the tensor-core path (BF16 activations and experts, widths
// multiples of 8) stores a = silu(γ) ⊙ υ in bf16 before the down product:
// one more rounding of at most 2^-8 |a| (bf16's unit roundoff).
inline void experts_ref(const ExpertCase& c, const std::vector<float>& u, const std::vector<float>& gu,
                 const std::vector<float>& dn, const std::vector<float>& gain, const std::vector<int32_t>& ids,
                 const std::vector<float>& w, double eps, std::vector<double>& want, std::vector<double>& tol,
                 bool a_bf16) {
  const int64_t Hm = c.Hm, I = c.I;
  want.assign(static_cast<size_t>(c.T * Hm), 0.0);
  tol.assign(static_cast<size_t>(c.T * Hm), 0.0);
  const double n1 = double(Hm) / 32 + 8, n2 = double(I) / 32 + 8;
  std::vector<double> a(static_cast<size_t>(I)), aerr(static_cast<size_t>(I)), y(static_cast<size_t>(Hm)), yerr(static_cast<size_t>(Hm)), mag(static_cast<size_t>(Hm));
  for (int64_t t = 0; t < c.T; ++t) {
    std::fill(mag.begin(), mag.end(), 0.0);
    for (int64_t k = 0; k < c.K; ++k) {
      const int64_t e = ids[size_t(t * c.K + k)];
      for (int64_t i = 0; i < I; ++i) {
        double g = 0, ga = 0, v = 0, va = 0;
        for (int64_t h = 0; h < Hm; ++h) {
          const double x = u[size_t(t * Hm + h)];
          const double wg = gu[size_t((e * 2 * I + i) * Hm + h)], wu = gu[size_t((e * 2 * I + I + i) * Hm + h)];
          g += x * wg, ga += std::fabs(x * wg), v += x * wu, va += std::fabs(x * wu);
        }
        const double s = g / (1.0 + std::exp(-g));
        a[size_t(i)] = s * v;
        aerr[size_t(i)] = kU * (n1 * (1.1 * ga * std::fabs(v) + std::fabs(s) * va) + 8 * std::fabs(a[size_t(i)]));
        if (a_bf16) aerr[size_t(i)] += 1.01 * std::ldexp(std::fabs(a[size_t(i)]), -8);
      }
      double ss = 0, dss = 0;
      for (int64_t n = 0; n < Hm; ++n) {
        double s = 0, sa = 0, se = 0;
        for (int64_t i = 0; i < I; ++i) {
          const double wd = dn[size_t((e * Hm + n) * I + i)];
          s += wd * a[size_t(i)], sa += std::fabs(wd * a[size_t(i)]), se += std::fabs(wd) * aerr[size_t(i)];
        }
        y[size_t(n)] = s;
        yerr[size_t(n)] = n2 * kU * sa + se;
        const double zc = s * gain[size_t(n)];
        ss += zc * zc;
        dss += std::fabs(zc * gain[size_t(n)]) * yerr[size_t(n)];
      }
      const double r = 1.0 / std::sqrt(ss / double(Hm) + eps);
      const double rho = (double(Hm) / 32 + 24) * kU + dss / (ss + double(Hm) * eps);
      const double wk = w[size_t(t * c.K + k)];
      for (int64_t n = 0; n < Hm; ++n) {
        const double yn = y[size_t(n)] * gain[size_t(n)] * r;
        want[size_t(t * Hm + n)] += wk * yn;
        const double ynerr = r * std::fabs(gain[size_t(n)]) * yerr[size_t(n)] + std::fabs(yn) * (rho + 3 * kU);
        tol[size_t(t * Hm + n)] += std::fabs(wk) * ynerr;
        mag[size_t(n)] += std::fabs(wk * yn);
      }
    }
    for (int64_t n = 0; n < Hm; ++n) tol[size_t(t * Hm + n)] += double(c.K + 2) * kU * mag[size_t(n)];
  }
}

// ids: K distinct experts per token (as the router gives), repeated across tokens.
inline std::vector<int32_t> random_ids(int64_t T, int64_t E, int64_t K, uint32_t seed) {
  std::mt19937 rng(seed);
  std::vector<int32_t> ids;
  for (int64_t t = 0; t < T; ++t) {
    std::vector<int32_t> all(static_cast<size_t>(E));
    for (int64_t e = 0; e < E; ++e) all[size_t(e)] = int32_t(e);
    std::shuffle(all.begin(), all.end(), rng);
    ids.insert(ids.end(), all.begin(), all.begin() + K);
  }
  return ids;
}

}  // namespace muse::cuda_testing
