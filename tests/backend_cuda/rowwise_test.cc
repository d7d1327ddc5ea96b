// The row-wise CUDA ops (embedding, norms, residuals, RoPE, gates, SwiGLU,
// gathers, softcap) against double references of the CPU backend's
// semantics, with F32 and BF16 activations.
#include "cuda_test_util.h"

namespace muse::cuda_testing {
namespace {

class Rowwise : public CudaTest, public ::testing::WithParamInterface<DType> {
 public:
  DType act() const { return GetParam(); }
  bool bf() const { return GetParam() == DType::BF16; }
};

std::string param_name(const ::testing::TestParamInfo<DType>& i) { return dtype_label(i.param); }

TEST_P(Rowwise, Embed) {
  const int64_t V = 37, H = 67, T = 6;
  for (DType tdt : {DType::F32, DType::BF16}) {
    auto table = random_floats(static_cast<size_t>(V * H), 11);
    Tensor tt = up(tdt, {V, H}, table);
    std::vector<int32_t> ids = {3, 36, 0, 3, 17, 29};
    Tensor ti = up_i32({T}, ids);
    Tensor out = poisoned(act(), {T, H});
    b().embed(out, tt, ti);
    run();
    auto got = get(out);
    std::vector<double> want;
    for (int64_t t = 0; t < T; ++t)
      for (int64_t i = 0; i < H; ++i) want.push_back(table[size_t(ids[size_t(t)] * H + i)]);
    expect_close("embed", got, want, std::vector<double>(want.size(), 0.0), bf(), "embed");
  }
}

TEST_P(Rowwise, EmbedRejectsBadId) {
  auto table = random_floats(40, 12);
  Tensor tt = up(DType::BF16, {4, 10}, table);
  Tensor ti = up_i32({2}, {1, 4});
  Tensor out = poisoned(act(), {2, 10});
  b().embed(out, tt, ti);
  Status s = b().execute();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("embed"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("token id 4"), std::string::npos) << s.message();
  // The backend stays usable.
  Tensor ti2 = up_i32({2}, {1, 3});
  b().embed(out, tt, ti2);
  run();
}

// Reference of one group: the CPU's sequence in double.
void norm_ref(const float* x, int64_t n, const float* gain, NormGain mode, double eps, double scale, double* y,
              double* mag) {
  double ss = 0;
  for (int64_t i = 0; i < n; ++i) {
    double v = mode == NormGain::Before ? double(x[i]) * gain[i] : double(x[i]);
    ss += v * v;
  }
  const double r = 1.0 / std::sqrt(ss / double(n) + eps);
  for (int64_t i = 0; i < n; ++i) {
    double g = mode == NormGain::None ? 1.0 : double(gain[i]);
    y[i] = double(x[i]) * g * r * scale;
    mag[i] = std::fabs(y[i]);
  }
}

TEST_P(Rowwise, RmsNormEveryModeGroupAndScale) {
  struct Case {
    int64_t rows, cols, group;
    NormGain mode;
    float scale;
    bool alias;
  };
  const Case cases[] = {
      {5, 3001, 0, NormGain::After, 1.0f, false},  {1, 111, 37, NormGain::None, 1.0f, false},
      {7, 111, 37, NormGain::After, 0.7f, false},  {3, 250, 0, NormGain::Before, 1.0f, false},
      {4, 96, 32, NormGain::Before, 1.3f, true},   {64, 200, 0, NormGain::After, 1.0f, true},
      {2, 8192, 0, NormGain::None, 0.5f, false},
  };
  uint32_t seed = 100;
  for (const auto& c : cases) {
    const int64_t g = c.group ? c.group : c.cols;
    auto x = random_floats(static_cast<size_t>(c.rows * c.cols), ++seed, 2.0f);
    auto gain = random_floats(static_cast<size_t>(g), ++seed, 0.3f, 1.0f);
    Tensor tx = up(act(), {c.rows, c.cols}, x);
    Tensor tg = up(DType::F32, {g}, gain);
    Tensor out = c.alias ? tx : poisoned(act(), {c.rows, c.cols});
    b().rms_norm(out, tx, tg, c.mode, 1e-6f, c.group, c.scale);
    run();
    auto got = get(out);
    std::vector<double> want(x.size()), mag(x.size());
    for (int64_t i = 0; i < c.rows * c.cols / g; ++i)
      norm_ref(x.data() + i * g, g, gain.data(), c.mode, 1e-6, c.scale, want.data() + i * g, mag.data() + i * g);
    // fp32: the sum of squares (g/blockDim sequential + 13 tree levels), sqrt,
    // divide, and up to three products; relative to |y|.
    const double n = double(g) / 32 + 24;
    expect_close("rms_norm", got, want, fp32_tol(mag, n), bf(),
                 "rms_norm rows " + std::to_string(c.rows) + " cols " + std::to_string(c.cols) + " group " +
                     std::to_string(g));
  }
}

TEST_P(Rowwise, ResidualNormGlimmerAndSpark) {
  const int64_t T = 9, H = 1037;
  for (int spark = 0; spark < 2; ++spark) {
    for (NormGain mode : {NormGain::None, NormGain::After, NormGain::Before}) {
      const DType sdt = spark ? DType::F32 : act();  // Spark's stream is fp32
      auto s0 = random_floats(static_cast<size_t>(T * H), 200 + spark, 3.0f);
      auto u = random_floats(static_cast<size_t>(T * H), 210 + spark);
      auto gain = random_floats(static_cast<size_t>(H), 220, 0.2f, 0.5f);
      auto alpha = random_floats(static_cast<size_t>(H), 230, 0.1f, 0.9f);
      auto beta = random_floats(static_cast<size_t>(H), 240, 0.05f, 0.2f);
      Tensor ts = up(sdt, {T, H}, s0), tu = up(act(), {T, H}, u), tg = up(DType::F32, {H}, gain);
      Tensor ta, tb;
      if (spark) ta = up(DType::F32, {H}, alpha), tb = up(DType::F32, {H}, beta);
      b().residual_norm(ts, tu, tg, mode, ta, tb, 1e-5f);
      run();
      auto got = get(ts);
      std::vector<double> want(s0.size()), scale(s0.size());
      std::vector<double> n(static_cast<size_t>(H)), mag(static_cast<size_t>(H));
      for (int64_t t = 0; t < T; ++t) {
        norm_ref(u.data() + t * H, H, gain.data(), mode, 1e-5, 1.0, n.data(), mag.data());
        for (int64_t i = 0; i < H; ++i) {
          const size_t k = size_t(t * H + i);
          const double a = spark ? alpha[size_t(i)] : 1.0, bb = spark ? beta[size_t(i)] : 1.0;
          want[k] = a * s0[k] + bb * n[size_t(i)];
          // norm (as above) times β, plus two products and a sum.
          scale[k] = (double(H) / 32 + 24) * std::fabs(bb * n[size_t(i)]) + 3 * (std::fabs(a * s0[k]) + std::fabs(want[k]));
        }
      }
      expect_close("residual_norm", got, want, fp32_tol(scale, 1.0), sdt == DType::BF16,
                   std::string("residual_norm ") + (spark ? "spark" : "glimmer") + " mode " + std::to_string(int(mode)));
    }
  }
}

// residual_norm_then_norm (one fused kernel) gives the bits of
// residual_norm followed by rms_norm of the stream, for both models' forms,
// every gain mode of the second norm, row widths across the register
// cache's edges, and batch sizes 1..9; at Glimmer's and Spark's widths also
// 300 rows, more than one wave of blocks holds (one block an SM there), so
// the fused op's blocks walk the rows with the next one's loads in flight.
TEST_P(Rowwise, ResidualThenNormEqualsTheTwoOps) {
  for (int64_t H : {int64_t(1), int64_t(37), int64_t(1037), int64_t(6656), int64_t(8192)})
    for (int64_t T : {int64_t(1), int64_t(9), int64_t(300)})
      for (int spark = 0; spark < 2 && (T < 300 || H >= 6656); ++spark)
        for (NormGain mode2 : {NormGain::None, NormGain::After, NormGain::Before}) {
          const DType sdt = spark ? DType::F32 : act();
          const NormGain mode = spark ? NormGain::Before : NormGain::After;
          const uint32_t seed = uint32_t(300 + H + T + spark);
          auto s0 = random_floats(static_cast<size_t>(T * H), seed, 3.0f);
          auto u = random_floats(static_cast<size_t>(T * H), seed + 1);
          auto gain = random_floats(static_cast<size_t>(H), seed + 2, 0.2f, 0.5f);
          auto gain2 = random_floats(static_cast<size_t>(H), seed + 3, 0.2f, 0.5f);
          auto alpha = random_floats(static_cast<size_t>(H), seed + 4, 0.1f, 0.9f);
          auto beta = random_floats(static_cast<size_t>(H), seed + 5, 0.05f, 0.2f);
          auto s1 = s0;
          Tensor ts = up(sdt, {T, H}, s0), ts2 = up(sdt, {T, H}, s1), tu = up(act(), {T, H}, u);
          Tensor tg = up(DType::F32, {H}, gain), tg2 = up(DType::F32, {H}, gain2);
          Tensor ta, tb;
          if (spark) ta = up(DType::F32, {H}, alpha), tb = up(DType::F32, {H}, beta);
          Tensor fused_out = poisoned(act(), {T, H}), two_out = poisoned(act(), {T, H});
          b().residual_norm_then_norm(ts, tu, tg, mode, ta, tb, 1e-5f, {fused_out, tg2, mode2, 1e-6f});
          b().residual_norm(ts2, tu, tg, mode, ta, tb, 1e-5f);
          b().rms_norm(two_out, ts2, tg2, mode2, 1e-6f);
          run();
          const std::string what = "H " + std::to_string(H) + " T " + std::to_string(T) + (spark ? " spark" : " glimmer") +
                                   " mode2 " + std::to_string(int(mode2));
          EXPECT_EQ(get_bytes(ts), get_bytes(ts2)) << "stream, " << what;
          EXPECT_EQ(get_bytes(fused_out), get_bytes(two_out)) << "normed output, " << what;
        }
}

TEST_P(Rowwise, RopeTablesMatchTheFp32Formula) {
  const int64_t T = 7, d = 128, half = d / 2;
  const double theta = 1e6;
  std::vector<int32_t> pos = {0, 1, 2, 1000, 4095, 65535, 131071};
  Tensor tp = up_i32({T}, pos);
  Tensor c = poisoned(DType::F32, {T, half}), s = poisoned(DType::F32, {T, half});
  b().rope_tables(c, s, tp, theta, d);
  run();
  auto gc = get(c), gs = get(s);
  std::vector<double> wc, ws, tol;
  for (int64_t t = 0; t < T; ++t)
    for (int64_t i = 0; i < half; ++i) {
      const float inv = 1.0f / float(std::pow(theta, double(float(2 * i) / float(d))));
      const float angle = float(pos[size_t(t)]) * inv;
      wc.push_back(std::cos(double(angle)));
      ws.push_back(std::sin(double(angle)));
      tol.push_back(kU);  // cos/sin of the same fp32 angle, rounded once: half an ulp of 1
    }
  expect_close("rope_tables", gc, wc, tol, false, "cos");
  expect_close("rope_tables", gs, ws, tol, false, "sin");
}

TEST_P(Rowwise, QkNormRope) {
  for (int64_t d : {24, 64, 128, 160}) {
    for (bool rope : {false, true}) {
      const int64_t T = 5, hq = 6, hk = 2, half = d / 2;
      const float q_scale = 0.3f, eps = 1e-6f;
      auto q = random_floats(static_cast<size_t>(T * hq * d), 300 + uint32_t(d), 1.5f);
      auto k = random_floats(static_cast<size_t>(T * hk * d), 310 + uint32_t(d), 0.7f);
      auto cs = random_floats(static_cast<size_t>(T * half), 320), sn(cs);
      for (size_t i = 0; i < cs.size(); ++i) {
        const double a = 0.37 * double(i) + 0.1;
        cs[i] = float(std::cos(a)), sn[i] = float(std::sin(a));
      }
      Tensor tq = up(act(), {T, hq * d}, q), tk = up(act(), {T, hk * d}, k);
      Tensor tc = up(DType::F32, {T, half}, cs), ts = up(DType::F32, {T, half}, sn);
      b().qk_norm_rope(tq, tk, rope ? tc : Tensor{}, rope ? ts : Tensor{}, d, eps, q_scale);
      run();
      auto gq = get(tq), gk = get(tk);
      auto ref = [&](const std::vector<float>& v, int64_t heads, double scale) {
        std::vector<double> out(v.size()), mag(v.size());
        std::vector<double> y(static_cast<size_t>(d)), m(static_cast<size_t>(d));
        for (int64_t t = 0; t < T; ++t)
          for (int64_t h = 0; h < heads; ++h) {
            const float* x = v.data() + (t * heads + h) * d;
            norm_ref(x, d, nullptr, NormGain::None, eps, scale, y.data(), m.data());
            for (int64_t j = 0; j < half; ++j) {
              double y1 = y[size_t(j)], y2 = y[size_t(j + half)];
              double o1 = y1, o2 = y2;
              if (rope) {
                const double c = cs[size_t(t * half + j)], s = sn[size_t(t * half + j)];
                o1 = y1 * c - y2 * s, o2 = y2 * c + y1 * s;
              }
              const size_t base = size_t((t * heads + h) * d);
              out[base + size_t(j)] = o1, out[base + size_t(j + half)] = o2;
              mag[base + size_t(j)] = mag[base + size_t(j + half)] = std::fabs(y1) + std::fabs(y2);
            }
          }
        return std::make_pair(out, mag);
      };
      auto [wq, mq] = ref(q, hq, q_scale);
      auto [wk, mk] = ref(k, hk, 1.0);
      const double n = double(d) / 32 + 30;  // norm chain plus rotation (two products, one sum)
      const std::string what = "qk_norm_rope d " + std::to_string(d) + (rope ? " rope" : "");
      expect_close("qk_norm_rope", gq, wq, fp32_tol(mq, n), bf(), what + " q");
      expect_close("qk_norm_rope", gk, wk, fp32_tol(mk, n), bf(), what + " k");
    }
  }
}

TEST_P(Rowwise, OutputGateBothForms) {
  const int64_t T = 7, heads = 3, d = 40;
  for (bool head_norm : {false, true}) {
    auto o = random_floats(static_cast<size_t>(T * heads * d), 400, 2.0f);
    auto g = random_floats(static_cast<size_t>(T * heads * d), 401, 2.0f);
    Tensor to = up(act(), {T, heads * d}, o), tg = up(act(), {T, heads * d}, g);
    b().output_gate(to, tg, d, head_norm, 1e-6f);
    run();
    auto got = get(to);
    std::vector<double> want(o.size()), mag(o.size());
    std::vector<double> y(static_cast<size_t>(d)), m(static_cast<size_t>(d));
    for (int64_t u = 0; u < T * heads; ++u) {
      if (head_norm) {
        norm_ref(o.data() + u * d, d, nullptr, NormGain::None, 1e-6, 1.0, y.data(), m.data());
      } else {
        for (int64_t i = 0; i < d; ++i) y[size_t(i)] = o[size_t(u * d + i)];
      }
      for (int64_t i = 0; i < d; ++i) {
        const size_t k = size_t(u * d + i);
        want[k] = y[size_t(i)] / (1.0 + std::exp(-double(g[k])));
        mag[k] = std::fabs(want[k]);
      }
    }
    // exp (2 ulp), the sigmoid's add and divide, the product; plus the norm chain.
    expect_close("output_gate", got, want, fp32_tol(mag, head_norm ? double(d) / 32 + 30 : 8), bf(),
                 head_norm ? "output_gate head_norm" : "output_gate");
  }
}

TEST_P(Rowwise, SwigluAliasingGate) {
  const int64_t n = 1001;
  auto g = random_floats(static_cast<size_t>(n), 500, 3.0f), u = random_floats(static_cast<size_t>(n), 501);
  Tensor tg = up(act(), {1, n}, g), tu = up(act(), {1, n}, u);
  b().swiglu(tg, tg, tu);
  run();
  auto got = get(tg);
  std::vector<double> want(static_cast<size_t>(n)), mag(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const double a = g[size_t(i)];
    want[size_t(i)] = a / (1.0 + std::exp(-a)) * u[size_t(i)];
    mag[size_t(i)] = std::fabs(want[size_t(i)]);
  }
  expect_close("swiglu", got, want, fp32_tol(mag, 10), bf(), "swiglu");
}

TEST_P(Rowwise, GatherRows) {
  const int64_t R = 11, C = 333;
  auto x = random_floats(static_cast<size_t>(R * C), 600);
  Tensor tx = up(act(), {R, C}, x);
  std::vector<int32_t> rows = {10, 0, 4, 4, 7};
  Tensor tr = up_i32({int64_t(rows.size())}, rows);
  Tensor out = poisoned(act(), {int64_t(rows.size()), C});
  b().gather_rows(out, tx, tr);
  run();
  auto got = get(out);
  std::vector<double> want;
  for (int32_t r : rows)
    for (int64_t c = 0; c < C; ++c) want.push_back(x[size_t(r * C + c)]);
  expect_close("gather_rows", got, want, std::vector<double>(want.size(), 0.0), false, "gather_rows");
  // I32 rows (expert ids): every bit pattern copied as is, small values
  // (float denormals) and negatives included.
  std::vector<int32_t> ints(static_cast<size_t>(R * 4));
  for (size_t i = 0; i < ints.size(); ++i) ints[i] = int32_t(i % 7) - 3 + int32_t(i) * 1000003;
  Tensor ti = up_i32({R, 4}, ints), oi = b().alloc(DType::I32, {int64_t(rows.size()), 4}).value();
  b().gather_rows(oi, ti, tr);
  run();
  auto bytes = get_bytes(oi);
  std::vector<int32_t> got_i(rows.size() * 4);
  std::memcpy(got_i.data(), bytes.data(), got_i.size() * 4);
  for (size_t i = 0; i < rows.size(); ++i)
    for (size_t c = 0; c < 4; ++c) EXPECT_EQ(got_i[i * 4 + c], ints[size_t(rows[i]) * 4 + c]) << i << "," << c;
  Tensor bad = up_i32({1}, {11});
  b().gather_rows(out.rows(0, 1), tx, bad);
  Status s = b().execute();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("gather_rows"), std::string::npos) << s.message();
}

// flush() launches what is queued and the step goes on: set_input copies
// made before and after it (the second large enough to grow the pinned
// arena while the first may still be in flight) and ops on both sides give
// the step's results; an enqueue error after a flush still fails execute(),
// and the next step runs normally.
TEST_P(Rowwise, FlushThenTheRestOfTheStep) {
  const int64_t R = 7, C = 129, big = int64_t(1) << 22;  // 16 MiB of F32: more than the arena has grown to
  auto x = random_floats(static_cast<size_t>(R * C), 610);
  Tensor tx = b().alloc(DType::F32, {R, C}).value(), tbig = b().alloc(DType::F32, {big}).value();
  std::vector<float> fill(static_cast<size_t>(big));
  for (size_t i = 0; i < fill.size(); ++i) fill[i] = float(i % 1000);
  std::vector<int32_t> rows = {6, 0, 3};
  Tensor tr = up_i32({3}, rows);
  Tensor o1 = poisoned(DType::F32, {3, C}), o2 = poisoned(DType::F32, {3, C});
  b().set_input(tx, x.data(), x.size() * sizeof(float));
  b().gather_rows(o1, tx, tr);
  b().flush();
  b().set_input(tbig, fill.data(), fill.size() * sizeof(float));
  b().softcap(tx, 2.0f, 0.0f);
  b().gather_rows(o2, tx, tr);
  run();
  auto g1 = get(o1), g2 = get(o2);
  for (size_t i = 0; i < rows.size(); ++i)
    for (int64_t c = 0; c < C; ++c) {
      const float want = x[size_t(rows[i] * C + c)];
      EXPECT_EQ(g1[i * size_t(C) + size_t(c)], want) << i << "," << c;
      EXPECT_EQ(g2[i * size_t(C) + size_t(c)], want * 2.0f) << i << "," << c;
    }
  auto gb = get(tbig);
  EXPECT_EQ(gb[123456], fill[123456]);
  EXPECT_EQ(gb[size_t(big - 1)], fill[size_t(big - 1)]);
  // An enqueue error after a flush (softcap of I32 values): execute()
  // reports it; so does a device-side error (a row id out of range).
  b().gather_rows(o1, tx, tr);
  b().flush();
  b().softcap(tr, 1.0f, 0.0f);
  b().flush();  // launches nothing more
  Status s = b().execute();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("softcap"), std::string::npos) << s.message();
  Tensor bad = up_i32({1}, {int32_t(R)});
  b().gather_rows(o1, tx, tr);
  b().flush();
  b().gather_rows(o2.rows(0, 1), tx, bad);
  s = b().execute();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("gather_rows"), std::string::npos) << s.message();
  b().gather_rows(o2, tx, tr);
  run();
  EXPECT_EQ(get(o2), g2);
}

TEST_P(Rowwise, Softcap) {
  const int64_t n = 5003;
  for (float cap : {0.0f, 30.0f}) {
    auto x = random_floats(static_cast<size_t>(n), 700, 40.0f);
    Tensor tx = up(act(), {1, n}, x);
    b().softcap(tx, 0.5f, cap);
    run();
    auto got = get(tx);
    std::vector<double> want(static_cast<size_t>(n)), mag(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      const double z = double(x[size_t(i)]) * 0.5;
      want[size_t(i)] = cap > 0 ? std::tanh(z / cap) * cap : z;
      mag[size_t(i)] = cap > 0 ? std::fabs(want[size_t(i)]) + std::fabs(z) : std::fabs(z);  // tanh: ~2 ulp
    }
    expect_close("softcap", got, want, fp32_tol(mag, 8), bf(), "softcap cap " + std::to_string(cap));
  }
}

// fill_uniform makes the same counter-based values as the CPU backend's
// (offset 0: bitwise; with an offset the GPU may fuse the multiply-add: 1 ulp).
TEST_P(Rowwise, FillUniformMatchesTheCounterHash) {
  const int64_t n = 100003;
  for (float offset : {0.0f, 0.5f}) {
    auto t = b().alloc(act(), {n});
    ASSERT_TRUE(t.ok());
    Status st = b().fill_uniform(*t, 1234567, 0.02f, offset);
    ASSERT_TRUE(st.ok()) << st.message();
    auto got = get(*t);
    std::vector<double> want(static_cast<size_t>(n)), tol(static_cast<size_t>(n));
    for (int64_t i = 0; i < n; ++i) {
      uint64_t z = 1234567 + 0x9e3779b97f4a7c15ull * uint64_t(i + 1);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      const float u = float(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f;
      const float v = offset + 0.02f * u;
      want[size_t(i)] = bf() ? double(round_bf16(v)) : double(v);
      // A fused multiply-add moves v by an fp32 ulp, which can move its bf16 rounding by one bf16 ulp.
      tol[size_t(i)] = offset == 0.0f ? 0.0 : (bf() ? 2 * kBf16Store : 2 * kU) * std::fabs(v);
    }
    expect_close("fill_uniform", got, want, tol, false, "fill_uniform offset " + std::to_string(offset));
    b().release(*t);
  }
}

TEST_P(Rowwise, ReportsTheBackend) {
  EXPECT_NE(b().name().find("cuda"), std::string::npos);
  EXPECT_EQ(b().activation_dtype(), DType::BF16);
  EXPECT_EQ(b().kv_dtype(), DType::BF16);
  auto m = b().memory();
  EXPECT_GT(m.total, 0u);
  EXPECT_LE(m.free, m.total);
}

// The residual norm and SwiGLU write their output also in the wgmma
// products' order where the next op is a product that reads it so (above 16
// rows): the product then skips its own permute. The same output, stream
// and product bytes as with an op between them (the product permutes x
// itself), with a flush between producer and product (the model flushes
// after its first layer) and without; widths whose permuted rows are padded
// (200: 256) or not (6656), rows 1 (no copy), 17, 64, 65 and 300. A side
// branch between them (Spark's router: an F32 product of x and its top-k)
// leaves the copy to the product after it; one whose product needs the
// scratch runs in order and takes the copy itself (then the product after
// permutes x itself): the same bits every way.
TEST_P(Rowwise, ProducersPermutedXGivesTheSameBits) {
  if (!bf()) GTEST_SKIP() << "the permuted copy is BF16 (the products' activations)";
  for (int64_t H : {int64_t(200), int64_t(6656)})
    for (int64_t T : {int64_t(1), int64_t(5), int64_t(12), int64_t(17), int64_t(64), int64_t(65), int64_t(300)})
      for (bool flush : {false, true}) {
        const int64_t N = 136, F = 264;  // product rows; SwiGLU width
        const std::string what = "H " + std::to_string(H) + " T " + std::to_string(T) + (flush ? " flush" : "");
        auto s0 = random_floats(size_t(T * H), 500, 3.0f), u = random_floats(size_t(T * H), 501);
        auto g1 = random_floats(size_t(H), 502, 0.2f, 0.5f), g2 = random_floats(size_t(H), 503, 0.2f, 0.5f);
        auto w = random_floats(size_t(N * H), 504, 0.05f), wd = random_floats(size_t(N * F), 505, 0.05f);
        auto ga = random_floats(size_t(T * F), 506, 2.0f), upv = random_floats(size_t(T * F), 507);
        Tensor tu = up(act(), {T, H}, u), tg1 = up(act(), {H}, g1), tg2 = up(act(), {H}, g2);
        Tensor tw = up(DType::BF16, {N, H}, w), twd = up(DType::BF16, {N, F}, wd), tup = up(act(), {T, F}, upv);
        auto d8 = random_floats(8, 508);
        Tensor dummy = up(act(), {1, 8}, d8);
        // Once a width (flush, 17 rows), a larger product after the first
        // one grows the scratch before that one launches: the producer wrote
        // the old one, so the product must permute x itself (10 and 53 MB
        // of permuted x, more than twice the scratch the runs before grew).
        const int64_t grow = flush && T == 17 ? (H == 200 ? 20000 : 4000) : 0;
        auto xb = random_floats(size_t(std::max<int64_t>(grow, 1) * H), 509);
        Tensor txb = up(act(), {std::max<int64_t>(grow, 1), H}, xb);
        Tensor twf = up(DType::F32, {N, H}, w), twdf = up(DType::F32, {N, F}, wd);
        // between: 0 nothing, 1 an op, 2 a side branch, 3 a side branch with
        // a product that needs the scratch (BF16 weights, above 4 rows)
        auto op_between = [&](int between, const Tensor& x, const Tensor& wf, const Tensor& wb, const Tensor& out) {
          if (between == 1) b().swiglu(dummy, dummy, dummy);  // the product permutes x itself
          if (between < 2) return;
          b().begin_side();
          b().matmul(out, x, between == 2 ? wf : wb);
          if (between == 2) b().softcap(out, 0.9f, 3.0f);
          b().end_side();
        };
        std::vector<std::vector<uint8_t>> res[4], side[4];
        for (int between = 0; between < 4; ++between) {
          Tensor ts = up(DType::F32, {T, H}, s0), h = poisoned(act(), {T, H}), o = poisoned(DType::F32, {T, N});
          Tensor tga = up(act(), {T, F}, ga), od = poisoned(DType::F32, {T, N});
          Tensor sb = poisoned(DType::F32, {T, N}), sd = poisoned(DType::F32, {T, N});
          b().residual_norm_then_norm(ts, tu, tg1, NormGain::After, Tensor{}, Tensor{}, 1e-6f,
                                      {h, tg2, NormGain::After, 1e-5f});
          if (flush) b().flush();
          op_between(between, h, twf, tw, sb);
          b().matmul(o, h, tw);
          b().join_side();
          Tensor ob = poisoned(DType::F32, {std::max<int64_t>(grow, 1), N});
          if (grow) b().matmul(ob, txb, tw);
          b().swiglu(tga, tga, tup);
          if (flush) b().flush();
          op_between(between, tga, twdf, twd, sd);
          b().matmul(od, tga, twd);
          b().join_side();
          run();
          res[between] = {get_bytes(ts), get_bytes(h), get_bytes(o), get_bytes(tga), get_bytes(od)};
          side[between] = {get_bytes(sb), get_bytes(sd)};
        }
        const char* names[] = {"stream", "norm output", "product", "SwiGLU output", "down product"};
        for (int between = 1; between < 4; ++between)
          for (size_t i = 0; i < 5; ++i)
            EXPECT_EQ(res[0][i], res[between][i])
                << what << ", " << (between == 1 ? "an op" : between == 2 ? "a side branch" : "a side branch in order")
                << " between: the " << names[i] << " differs";
        // the in-order branch's products (the first through the copy): the
        // main products' bits
        EXPECT_EQ(side[3][0], res[0][2]) << what << ": the side branch's product differs";
        EXPECT_EQ(side[3][1], res[0][4]) << what << ": the side branch's down product differs";
      }
}

INSTANTIATE_TEST_SUITE_P(Act, Rowwise, ::testing::Values(DType::F32, DType::BF16), param_name);

}  // namespace
}  // namespace muse::cuda_testing
