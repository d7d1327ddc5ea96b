// Every CPU operation against a double-precision scalar reference on fresh
// random inputs, for each instruction set this CPU has (scalar, AVX2,
// AVX-512; the missing ones are skipped with a message).
#include <algorithm>

#include "backend_test_util.h"

namespace muse::testing {
namespace {

using cpu::Isa;

double rms_scale(const float* x, int64_t n, double eps) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) ss += double(x[i]) * x[i];
  return 1.0 / std::sqrt(ss / double(n) + eps);
}

// ---------------------------------------------------------------------------
// Projections.
// ---------------------------------------------------------------------------
void check_matmul(Backend& b, DType wdt, int64_t T, int64_t K, int64_t N, uint32_t seed) {
  auto x = random_floats(size_t(T * K), seed);
  auto w = random_floats(size_t(N * K), seed + 1, 0.5f);
  auto w2 = random_floats(size_t(3 * K), seed + 2);
  if (wdt == DType::BF16) {  // the reference sees exactly the bf16 values
    w = from_bf16(to_bf16(w));
    w2 = from_bf16(to_bf16(w2));
  }
  Tensor tx = upload(b, DType::F32, {T, K}, x);
  Tensor tw = wdt == DType::BF16 ? upload(b, wdt, {N, K}, to_bf16(w)) : upload(b, wdt, {N, K}, w);
  Tensor tw2 = wdt == DType::BF16 ? upload(b, wdt, {3, K}, to_bf16(w2)) : upload(b, wdt, {3, K}, w2);
  Tensor out = zeros(b, DType::F32, {T, N}), out2 = zeros(b, DType::F32, {T, 3});
  Projection p[] = {{tw, out}, {tw2, out2}};
  b.project(tx, p);
  run(b);
  auto got = fetch(b, out), got2 = fetch(b, out2);
  std::vector<double> want, scale, want2, scale2;
  for (int64_t t = 0; t < T; ++t) {
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < K; ++k) s += double(x[t * K + k]) * w[n * K + k], a += std::fabs(x[t * K + k] * w[n * K + k]);
      want.push_back(s), scale.push_back(a);
    }
    for (int64_t n = 0; n < 3; ++n) {
      double s = 0, a = 0;
      for (int64_t k = 0; k < K; ++k) s += double(x[t * K + k]) * w2[n * K + k], a += std::fabs(x[t * K + k] * w2[n * K + k]);
      want2.push_back(s), scale2.push_back(a);
    }
  }
  std::string what = std::string(dtype_name(wdt)) + " T=" + std::to_string(T) + " K=" + std::to_string(K) +
                     " N=" + std::to_string(N);
  // fp32 accumulation over K terms, relative to Σ|x·w|: measured at most
  // 1.3e-7 (K=3) to 2.1e-7 (K=67) on scalar, AVX2 and AVX-512; the bound is
  // 4-7× that and grows as √K (rounding errors add like a random walk). The
  // old worst case, 2e-7·K + 1e-6, sat 330× above at K=256.
  double rel = 6e-7 + 3e-8 * std::sqrt(double(K));
  expect_close(got, want, scale, rel, what);
  expect_close(got2, want2, scale2, rel, what + " (second output)");
}

class Kernels : public IsaTest {};

TEST_P(Kernels, MatmulF32AndBf16) {
  uint32_t seed = 100;
  for (DType dt : {DType::F32, DType::BF16}) {
    for (int64_t T : {1, 2, 5, 70}) {
      for (int64_t K : {3, 8, 16, 67, 256}) {
        for (int64_t N : {1, 9, 33}) check_matmul(b(), dt, T, K, N, seed++);
      }
    }
  }
}

// A row's result is bit-identical whether it is computed alone (decode)
// or inside a batch (prefill), and whatever the thread count.
TEST_P(Kernels, MatmulBatchAndThreadInvariant) {
  const int64_t T = 37, K = 301, N = 75;
  auto x = random_floats(size_t(T * K), 7), w = random_floats(size_t(N * K), 8);
  auto wb = to_bf16(w);
  std::vector<std::vector<float>> results;
  for (int threads : {1, 2, 3}) {
    auto be = make_backend(GetParam(), threads);
    Tensor tw = upload(*be, DType::BF16, {N, K}, wb);
    Tensor tx = upload(*be, DType::F32, {T, K}, x);
    Tensor out = zeros(*be, DType::F32, {T, N});
    be->matmul(out, tx, tw);
    run(*be);
    results.push_back(fetch(*be, out));
    // Each row alone.
    std::vector<float> rows;
    for (int64_t t = 0; t < T; ++t) {
      Tensor o1 = zeros(*be, DType::F32, {1, N});
      be->matmul(o1, tx.rows(t, 1), tw);
      run(*be);
      auto r = fetch(*be, o1);
      rows.insert(rows.end(), r.begin(), r.end());
    }
    results.push_back(rows);
  }
  for (size_t i = 1; i < results.size(); ++i)
    EXPECT_EQ(0, std::memcmp(results[0].data(), results[i].data(), results[0].size() * 4)) << "variant " << i;
}

// ---------------------------------------------------------------------------
// Norms.
// ---------------------------------------------------------------------------
TEST_P(Kernels, RmsNormModes) {
  const int64_t T = 5, C = 96;
  for (int64_t group : {int64_t(0), int64_t(32)}) {
    for (NormGain mode : {NormGain::None, NormGain::After, NormGain::Before}) {
      const int64_t g = group ? group : C;
      auto x = random_floats(size_t(T * C), 11, 3.0f, 0.5f);
      auto c = random_floats(size_t(g), 12, 0.3f, 1.0f);
      const float eps = 1e-5f, scale = group ? 3.87f : 1.0f;
      Tensor tx = upload(b(), DType::F32, {T, C}, x), tc = upload(b(), DType::F32, {g}, c);
      Tensor out = zeros(b(), DType::F32, {T, C});
      b().rms_norm(out, tx, mode == NormGain::None ? Tensor{} : tc, mode, eps, group, scale);
      run(b());
      std::vector<double> want(x.size());
      for (int64_t i = 0; i < T * C; i += g) {
        std::vector<float> v(x.begin() + i, x.begin() + i + g);
        if (mode == NormGain::Before)
          for (int64_t j = 0; j < g; ++j) v[size_t(j)] = float(double(v[size_t(j)]) * c[size_t(j)]);
        double r = rms_scale(v.data(), g, eps);
        for (int64_t j = 0; j < g; ++j)
          want[size_t(i + j)] = double(v[size_t(j)]) * r * (mode == NormGain::After ? c[size_t(j)] : 1.0) * scale;
      }
      expect_close(fetch(b(), out), want, 2e-6, "rms_norm mode " + std::to_string(int(mode)));
    }
  }
}

TEST_P(Kernels, ResidualNormPlainAndGated) {
  const int64_t T = 3, H = 80;
  for (bool gated : {false, true}) {
    auto s = random_floats(size_t(T * H), 21, 2.0f), a = random_floats(size_t(T * H), 22, 5.0f);
    auto c = random_floats(size_t(H), 23, 0.2f, 1.0f);
    auto al = random_floats(size_t(H), 24, 0.1f, 0.8f), be = random_floats(size_t(H), 25, 0.1f, 0.5f);
    Tensor ts = upload(b(), DType::F32, {T, H}, s), ta = upload(b(), DType::F32, {T, H}, a);
    Tensor tc = upload(b(), DType::F32, {H}, c), tal = upload(b(), DType::F32, {H}, al);
    Tensor tbe = upload(b(), DType::F32, {H}, be);
    const float eps = 1e-8f;
    NormGain mode = gated ? NormGain::Before : NormGain::After;
    b().residual_norm(ts, ta, tc, mode, gated ? tal : Tensor{}, gated ? tbe : Tensor{}, eps);
    run(b());
    std::vector<double> want(s.size());
    for (int64_t t = 0; t < T; ++t) {
      std::vector<float> v(a.begin() + t * H, a.begin() + (t + 1) * H);
      if (gated)
        for (int64_t j = 0; j < H; ++j) v[size_t(j)] = float(double(v[size_t(j)]) * c[size_t(j)]);
      double r = rms_scale(v.data(), H, eps);
      for (int64_t j = 0; j < H; ++j) {
        double n = v[size_t(j)] * r * (gated ? 1.0 : c[size_t(j)]);
        size_t i = size_t(t * H + j);
        want[i] = gated ? al[size_t(j)] * double(s[i]) + be[size_t(j)] * n : s[i] + n;
      }
    }
    expect_close(fetch(b(), ts), want, 2e-6, gated ? "gated residual" : "plain residual");
  }
}

// ---------------------------------------------------------------------------
// RoPE + QK-norm.
// ---------------------------------------------------------------------------
TEST_P(Kernels, QkNormRope) {
  const int64_t T = 4, d = 16, hq = 4, hk = 2;
  const double theta = 500000.0;
  std::vector<int32_t> pos = {0, 7, 4095, 100000};
  auto q = random_floats(size_t(T * hq * d), 31, 2.0f), k = random_floats(size_t(T * hk * d), 32, 2.0f);
  Tensor tq = upload(b(), DType::F32, {T, hq * d}, q), tk = upload(b(), DType::F32, {T, hk * d}, k);
  Tensor tp = upload(b(), DType::I32, {T}, pos);
  Tensor cs = zeros(b(), DType::F32, {T, d / 2}), sn = zeros(b(), DType::F32, {T, d / 2});
  b().rope_tables(cs, sn, tp, theta, d);
  b().qk_norm_rope(tq, tk, cs, sn, d, 1e-5f, 3.87f);
  run(b());
  auto reference = [&](const std::vector<float>& src, int64_t heads, double scale) {
    std::vector<double> out(src.size());
    for (int64_t t = 0; t < T; ++t) {
      for (int64_t h = 0; h < heads; ++h) {
        const float* v = src.data() + (t * heads + h) * d;
        double r = rms_scale(v, d, 1e-5);
        for (int64_t j = 0; j < d / 2; ++j) {
          // transformers' fp32 angle: fp32 inv_freq times the fp32 position.
          float inv = 1.0f / float(std::pow(theta, double(float(2 * j) / float(d))));
          double a = double(float(pos[size_t(t)]) * inv);
          double x1 = v[j] * r * scale, x2 = v[j + d / 2] * r * scale;
          out[size_t((t * heads + h) * d + j)] = x1 * std::cos(a) - x2 * std::sin(a);
          out[size_t((t * heads + h) * d + j + d / 2)] = x2 * std::cos(a) + x1 * std::sin(a);
        }
      }
    }
    return out;
  };
  expect_close(fetch(b(), tq), reference(q, hq, 3.87), 3e-6, "q");
  expect_close(fetch(b(), tk), reference(k, hk, 1.0), 3e-6, "k");
}

// ---------------------------------------------------------------------------
// Gates, SwiGLU, softcap, gather, embedding.
// ---------------------------------------------------------------------------
TEST_P(Kernels, OutputGateSwigluSoftcap) {
  const int64_t T = 3, d = 8, H = 4, C = H * d;
  for (bool head_norm : {false, true}) {
    auto o = random_floats(size_t(T * C), 41, 2.0f), g = random_floats(size_t(T * C), 42, 3.0f);
    Tensor to = upload(b(), DType::F32, {T, C}, o), tg = upload(b(), DType::F32, {T, C}, g);
    b().output_gate(to, tg, d, head_norm, 1e-5f);
    run(b());
    std::vector<double> want(o.size());
    for (int64_t i = 0; i < T * C; i += d) {
      double r = head_norm ? rms_scale(o.data() + i, d, 1e-5) : 1.0;
      for (int64_t j = i; j < i + d; ++j) want[size_t(j)] = o[size_t(j)] * r / (1.0 + std::exp(-double(g[size_t(j)])));
    }
    expect_close(fetch(b(), to), want, 2e-6, head_norm ? "head-norm gate" : "gate");
  }
  {
    auto g = random_floats(5000, 43, 4.0f), u = random_floats(5000, 44);
    Tensor tg = upload(b(), DType::F32, {50, 100}, g), tu = upload(b(), DType::F32, {50, 100}, u);
    Tensor out = zeros(b(), DType::F32, {50, 100});
    b().swiglu(out, tg, tu);
    run(b());
    std::vector<double> want(g.size());
    for (size_t i = 0; i < g.size(); ++i) want[i] = g[i] / (1.0 + std::exp(-double(g[i]))) * u[i];
    expect_close(fetch(b(), out), want, 2e-6, "swiglu");
  }
  {
    auto x = random_floats(9000, 45, 200.0f);
    Tensor tx = upload(b(), DType::F32, {3, 3000}, x);
    b().softcap(tx, 0.17677669529663687f, 20.0f);
    run(b());
    std::vector<double> want(x.size());
    for (size_t i = 0; i < x.size(); ++i) want[i] = 20.0 * std::tanh(x[i] * 0.17677669529663687 / 20.0);
    expect_close(fetch(b(), tx), want, 2e-6, "softcap");
  }
}

TEST_P(Kernels, EmbedAndGather) {
  const int64_t V = 50, H = 24;
  auto table = random_floats(size_t(V * H), 51);
  std::vector<int32_t> ids = {3, 0, 49, 3, 17};
  for (DType dt : {DType::F32, DType::BF16}) {
    auto ref = dt == DType::BF16 ? from_bf16(to_bf16(table)) : table;
    Tensor tt = dt == DType::BF16 ? upload(b(), dt, {V, H}, to_bf16(table)) : upload(b(), dt, {V, H}, table);
    Tensor tid = upload(b(), DType::I32, {5}, ids);
    Tensor out = zeros(b(), DType::F32, {5, H});
    b().embed(out, tt, tid);
    std::vector<int32_t> rows = {4, 1};
    Tensor tr = upload(b(), DType::I32, {2}, rows);
    Tensor g = zeros(b(), DType::F32, {2, H});
    b().gather_rows(g, out, tr);
    run(b());
    auto got = fetch(b(), out), gg = fetch(b(), g);
    for (int64_t t = 0; t < 5; ++t)
      for (int64_t i = 0; i < H; ++i) EXPECT_EQ(got[size_t(t * H + i)], ref[size_t(ids[size_t(t)] * H + i)]);
    for (int64_t i = 0; i < H; ++i) EXPECT_EQ(gg[size_t(i)], got[size_t(4 * H + i)]);
    // An id outside the table is an error, not a crash.
    std::vector<int32_t> bad = {1, 50};
    Tensor tb = upload(b(), DType::I32, {2}, bad);
    Tensor o2 = zeros(b(), DType::F32, {2, H});
    b().embed(o2, tt, tb);
    Status s = b().execute();
    EXPECT_FALSE(s.ok());
    EXPECT_NE(s.message().find("50"), std::string::npos) << s.message();
  }
}

// Shape errors found at enqueue time are reported by execute(), not crashes.
TEST_P(Kernels, ShapeErrorsAreReported) {
  Tensor x = zeros(b(), DType::F32, {2, 8}), w = zeros(b(), DType::F32, {4, 9}), out = zeros(b(), DType::F32, {2, 4});
  b().matmul(out, x, w);
  Status s = b().execute();
  EXPECT_FALSE(s.ok());
  EXPECT_NE(s.message().find("project"), std::string::npos) << s.message();
  EXPECT_TRUE(b().execute().ok());  // the queue was cleared
}

INSTANTIATE_TEST_SUITE_P(Isa, Kernels, ::testing::Values(Isa::Scalar, Isa::Avx2, Isa::Avx512), isa_param_name);

}  // namespace
}  // namespace muse::testing
