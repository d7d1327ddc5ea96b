// Quantized products (project, moe_experts) on every ISA, against the same
// products on the matrix the reference decoders (loading/quant.h) produce
// from the same codes and scales. Row-major formats (NVFP4, MXFP4, FP8) must
// agree bit for bit with the f32 kernel on the dequantized matrix (the
// kernels promise it); INT4 (vectorized over N) within fp32 accumulation
// error of a double reference. Odd shapes: tails in every direction.
#include <cmath>
#include <cstring>

#include "backend_test_util.h"
#include "muse/loading/quant.h"
#include "muse/model/weights.h"

namespace muse::testing {
namespace {

using cpu::Isa;

// An FP8 weight with 128×128 block scales (DeepSeek / fine-grained FP8):
// scale = amax_block / 448, codes e4m3(x / scale).
HostQuantWeight fp8_block(const std::vector<float>& w, int64_t N, int64_t K) {
  HostQuantWeight q;
  q.format.kind = QuantKind::Fp8;
  q.format.scale_dtype = DType::F32;
  q.format.block_rows = 128, q.format.block_cols = 128;
  q.code_dtype = DType::F8_E4M3;
  const int64_t br = (N + 127) / 128, bc = (K + 127) / 128;
  std::vector<float> s(size_t(br * bc), 0.0f);
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) {
      float& m = s[size_t((n / 128) * bc + k / 128)];
      m = std::max(m, std::fabs(w[size_t(n * K + k)]));
    }
  for (float& v : s) v = v > 0 ? v / 448.0f : 1.0f;
  q.codes.resize(size_t(N * K));
  for (int64_t n = 0; n < N; ++n)
    for (int64_t k = 0; k < K; ++k) q.codes[size_t(n * K + k)] = f32_to_f8_e4m3(w[size_t(n * K + k)] / s[size_t((n / 128) * bc + k / 128)]);
  q.scales.resize(s.size() * 4);
  std::memcpy(q.scales.data(), s.data(), q.scales.size());
  q.scale_shape = {br, bc};
  return q;
}

// The reference decoders over every expert of a quantized [E, N, K] set.
std::vector<float> dequantize(const HostQuantWeight& q, int64_t E, int64_t N, int64_t K) {
  std::vector<float> out(size_t(E * N * K));
  const QuantFormat& f = q.format;
  for (int64_t e = 0; e < E; ++e) {
    float* o = out.data() + e * N * K;
    Status s = Status::Ok();
    switch (f.kind) {
      case QuantKind::Nvfp4: {
        const int64_t rows = N / f.global_parts;
        for (int64_t h = 0; h < f.global_parts && s.ok(); ++h) {
          const int64_t r0 = e * N + h * rows;
          s = decode_nvfp4({q.codes.data() + r0 * K / 2, size_t(rows * K / 2), DType::U8},
                           {q.scales.data() + r0 * K / 16, size_t(rows * K / 16), DType::F8_E4M3},
                           q.global[size_t(e * f.global_parts + h)], rows, K, o + h * rows * K);
        }
        break;
      }
      case QuantKind::Mxfp4:
        s = decode_mxfp4({q.codes.data() + e * N * K / 2, size_t(N * K / 2), DType::U8},
                         {q.scales.data() + e * N * K / 32, size_t(N * K / 32), DType::U8}, N, K, o);
        break;
      case QuantKind::Fp8: {
        const bool block = f.block_rows > 1;
        const size_t sb = q.scales.size() / size_t(E);
        s = decode_fp8({q.codes.data() + e * N * K, size_t(N * K), DType::F8_E4M3},
                       {q.scales.data() + size_t(e) * sb, sb, DType::F32}, block ? Fp8Scaling::Block : Fp8Scaling::PerChannel,
                       N, K, o, f.block_rows, f.block_cols);
        break;
      }
      case QuantKind::Int4: {
        const int64_t G = f.block_cols, groups = (K + G - 1) / G;
        GptqArgs a;
        a.qweight = {q.codes.data() + e * (K / 8) * N * 4, size_t(K / 8 * N * 4), DType::I32};
        a.qzeros = {q.zeros.data() + e * groups * (N / 8) * 4, size_t(groups * (N / 8) * 4), DType::I32};
        a.scales = {q.scales.data() + e * groups * N * 2, size_t(groups * N * 2), DType::F16};
        a.in_features = K, a.out_features = N, a.group_size = G, a.zeros_minus_one = f.zero_offset == 1;
        s = decode_gptq_int4(a, o);
        break;
      }
      case QuantKind::None: break;
    }
    EXPECT_TRUE(s.ok()) << s.message();
  }
  return out;
}

struct Case {
  QuantKind kind;
  bool block = false;  // FP8 128×128 blocks instead of per channel
  int64_t N, K;
  const char* name;
};

const Case kCases[] = {
    {QuantKind::Nvfp4, false, 38, 48, "nvfp4"},  // two global halves of 19 rows
    {QuantKind::Mxfp4, false, 37, 96, "mxfp4"},
    {QuantKind::Fp8, false, 37, 131, "fp8 per-channel"},
    {QuantKind::Fp8, true, 150, 300, "fp8 128x128 blocks"},
    {QuantKind::Int4, false, 40, 200, "int4 gptq g128"},  // a partial group, a partial 16-lane register
};

HostQuantWeight make_quant(const Case& c, const std::vector<float>& w, int64_t E) {
  if (c.block) return fp8_block(w, c.N, c.K);
  std::vector<int64_t> shape = {c.N, c.K};
  if (E > 1) shape.insert(shape.begin(), E);
  auto q = quantize_weight(c.kind, w.data(), shape, c.kind == QuantKind::Nvfp4 ? 2 : 1);
  EXPECT_TRUE(q.ok()) << q.message();
  return *q;
}

class QuantKernels : public IsaTest {};

TEST_P(QuantKernels, ProjectMatchesDequantizedReference) {
  for (const Case& c : kCases) {
    auto w = random_floats(size_t(c.N * c.K), 11, 0.3f);
    HostQuantWeight q = make_quant(c, w, 1);
    std::vector<float> wd = dequantize(q, 1, c.N, c.K);
    ModelWeights owner;
    auto tq = import_quantized(b(), {c.N, c.K}, quant_view(q), false, owner);
    ASSERT_TRUE(tq.ok()) << c.name << ": " << tq.message();
    Tensor tf = upload(b(), DType::F32, {c.N, c.K}, wd);
    for (int64_t T : {1, 3, 7}) {
      auto x = random_floats(size_t(T * c.K), 12 + uint32_t(T));
      Tensor tx = upload(b(), DType::F32, {T, c.K}, x);
      Tensor oq = zeros(b(), DType::F32, {T, c.N}), of = zeros(b(), DType::F32, {T, c.N});
      b().matmul(oq, tx, *tq);
      b().matmul(of, tx, tf);
      run(b());
      auto got = fetch(b(), oq), ref = fetch(b(), of);
      const std::string what = std::string(c.name) + " T=" + std::to_string(T);
      if (c.kind == QuantKind::Int4) {
        std::vector<double> want, scale;
        for (int64_t t = 0; t < T; ++t)
          for (int64_t n = 0; n < c.N; ++n) {
            double s = 0, a = 0;
            for (int64_t k = 0; k < c.K; ++k)
              s += double(x[size_t(t * c.K + k)]) * wd[size_t(n * c.K + k)], a += std::fabs(x[size_t(t * c.K + k)] * wd[size_t(n * c.K + k)]);
            want.push_back(s), scale.push_back(a);
          }
        // The INT4 kernels factor scale and zero out of each group
        // (s·(Σ x·q − z·Σ x)): a few ulps more cancellation than a plain dot.
        expect_close(got, want, scale, 1e-6 * double(c.K) + 1e-6, what);
      } else {
        EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * 4)) << what << ": not bit-identical to the f32 kernel on the dequantized matrix";
      }
      // Each row alone gives the batched result bit for bit.
      for (int64_t t = 0; t < T; ++t) {
        Tensor o1 = zeros(b(), DType::F32, {1, c.N});
        b().matmul(o1, tx.rows(t, 1), *tq);
        run(b());
        auto r = fetch(b(), o1);
        EXPECT_EQ(0, std::memcmp(r.data(), got.data() + t * c.N, size_t(c.N) * 4)) << what << " row " << t;
      }
    }
    release_weights(b(), owner);
  }
}

// INT4 work is split in multiples of the kernel's column block (64 on
// AVX-512), and the columns left at a matrix's end run as one block of 1..4
// registers, the last partial. Every split computes each output by the same
// sequence, so 1, 2, 3, 7 and 16 threads give the same bits, for every tail
// width, at decode (T 1) and batched.
TEST_P(QuantKernels, Int4GivesTheSameBitsAtAnyThreadCountAndTail) {
  const int64_t K = 256;
  for (int64_t N : {int64_t(8), int64_t(24), int64_t(40), int64_t(56), int64_t(64), int64_t(344), int64_t(1016)}) {
    const Case c{QuantKind::Int4, false, N, K, "int4"};
    auto w = random_floats(size_t(N * K), 41, 0.3f);
    HostQuantWeight q = make_quant(c, w, 1);
    for (int64_t T : {1, 5}) {
      auto x = random_floats(size_t(T * K), 42 + uint32_t(T));
      std::vector<float> first;
      for (int threads : {1, 2, 3, 7, 16}) {
        auto be = make_backend(GetParam(), threads);
        ASSERT_TRUE(be);
        ModelWeights owner;
        auto tq = import_quantized(*be, {N, K}, quant_view(q), false, owner);
        ASSERT_TRUE(tq.ok()) << tq.message();
        Tensor tx = upload(*be, DType::F32, {T, K}, x);
        Tensor o = zeros(*be, DType::F32, {T, N});
        be->matmul(o, tx, *tq);
        run(*be);
        auto got = fetch(*be, o);
        if (first.empty()) {
          first = got;
          std::vector<double> want, scale;
          const std::vector<float> wd = dequantize(q, 1, N, K);
          for (int64_t t = 0; t < T; ++t)
            for (int64_t n = 0; n < N; ++n) {
              double sum = 0, a = 0;
              for (int64_t k = 0; k < K; ++k) {
                const double p = double(x[size_t(t * K + k)]) * wd[size_t(n * K + k)];
                sum += p, a += std::fabs(p);
              }
              want.push_back(sum), scale.push_back(a);
            }
          expect_close(got, want, scale, 1e-6 * double(K) + 1e-6, "int4 N " + std::to_string(N));
        } else {
          EXPECT_EQ(0, std::memcmp(got.data(), first.data(), got.size() * 4))
              << "N " << N << " T " << T << ": " << threads << " threads differ from 1";
        }
        release_weights(*be, owner);
      }
    }
  }
}

// FP8 rows whose scale is 2^8 or more take the plain decode (the kernels
// fold 2^120 into smaller scales), rows of both kinds share register
// blocks, and NaN codes (0x7F, 0xFF) give NaN exactly where the reference's
// NaN weights do; everything else bit-identical to the f32 kernel on the
// dequantized matrix.
TEST_P(QuantKernels, Fp8LargeScalesAndNanCodes) {
  const int64_t N = 37, K = 131;
  auto w = random_floats(size_t(N * K), 31, 0.3f);
  for (int64_t n = 0; n < N; n += 3)
    for (int64_t k = 0; k < K; ++k) w[size_t(n * K + k)] *= 1e6f;  // per-channel scale ~ 670
  const Case c{QuantKind::Fp8, false, N, K, "fp8 per-channel"};
  for (bool nan_codes : {false, true}) {
    HostQuantWeight q = make_quant(c, w, 1);
    if (nan_codes)
      for (int64_t i : {int64_t(5), int64_t(K + 17), int64_t(6 * K + 130), int64_t(20 * K)})
        q.codes[size_t(i)] = i % 2 ? 0x7F : 0xFF;
    std::vector<float> wd = dequantize(q, 1, N, K);
    ModelWeights owner;
    auto tq = import_quantized(b(), {N, K}, quant_view(q), false, owner);
    ASSERT_TRUE(tq.ok()) << tq.message();
    Tensor tf = upload(b(), DType::F32, {N, K}, wd);
    for (int64_t T : {1, 3}) {
      auto x = random_floats(size_t(T * K), 32 + uint32_t(T));
      Tensor tx = upload(b(), DType::F32, {T, K}, x);
      Tensor oq = zeros(b(), DType::F32, {T, N}), of = zeros(b(), DType::F32, {T, N});
      b().matmul(oq, tx, *tq);
      b().matmul(of, tx, tf);
      run(b());
      auto got = fetch(b(), oq), ref = fetch(b(), of);
      int nans = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        ASSERT_EQ(std::isnan(got[i]), std::isnan(ref[i])) << "output " << i << " T " << T;
        if (std::isnan(ref[i])) {
          ++nans;
          continue;
        }
        uint32_t a, r;
        std::memcpy(&a, &got[i], 4), std::memcpy(&r, &ref[i], 4);
        EXPECT_EQ(a, r) << "output " << i << " T " << T << (nan_codes ? " (NaN codes)" : "");
      }
      EXPECT_EQ(nans > 0, nan_codes);
    }
    release_weights(b(), owner);
  }
}

TEST_P(QuantKernels, LatentExpertsMatchDequantizedExperts) {
  const int64_t T = 5, E = 4, K = 2, Hm = 64, I = 48;  // gate_up [4, 96, 64], down [4, 64, 48]
  for (QuantKind kind : {QuantKind::Nvfp4, QuantKind::Mxfp4, QuantKind::Fp8, QuantKind::Int4}) {
    const int64_t Ik = kind == QuantKind::Mxfp4 ? 64 : I;
    auto gu = random_floats(size_t(E * 2 * Ik * Hm), 21, 0.3f), dn = random_floats(size_t(E * Hm * Ik), 22, 0.3f);
    Case cg{kind, false, 2 * Ik, Hm, quant_kind_name(kind)}, cd{kind, false, Hm, Ik, quant_kind_name(kind)};
    HostQuantWeight qg = make_quant(cg, gu, E), qd = make_quant(cd, dn, E);
    auto gud = dequantize(qg, E, 2 * Ik, Hm), dnd = dequantize(qd, E, Hm, Ik);
    ModelWeights owner;
    auto tqg = import_quantized(b(), {E, 2 * Ik, Hm}, quant_view(qg), false, owner);
    auto tqd = import_quantized(b(), {E, Hm, Ik}, quant_view(qd), false, owner);
    ASSERT_TRUE(tqg.ok() && tqd.ok()) << (tqg.ok() ? tqd.message() : tqg.message());
    Tensor tfg = upload(b(), DType::F32, {E, 2 * Ik, Hm}, gud), tfd = upload(b(), DType::F32, {E, Hm, Ik}, dnd);
    auto u = random_floats(size_t(T * Hm), 23);
    auto c = random_floats(size_t(Hm), 24, 0.2f, 1.0f);
    std::vector<int32_t> ids = {0, 3, 3, 1, 2, 0, 3, 2, 1, 1};
    auto wt = random_floats(size_t(T * K), 25, 0.2f, 0.5f);
    Tensor tu = upload(b(), DType::F32, {T, Hm}, u), tc = upload(b(), DType::F32, {Hm}, c);
    Tensor tid = upload(b(), DType::I32, {T, K}, ids), tw = upload(b(), DType::F32, {T, K}, wt);
    Tensor oq = zeros(b(), DType::F32, {T, Hm}), of = zeros(b(), DType::F32, {T, Hm});
    b().moe_experts(oq, tu, *tqg, *tqd, tc, tid, tw, 1e-8f);
    b().moe_experts(of, tu, tfg, tfd, tc, tid, tw, 1e-8f);
    run(b());
    auto got = fetch(b(), oq), ref = fetch(b(), of);
    const std::string what = std::string("moe ") + quant_kind_name(kind);
    if (kind == QuantKind::Int4) {
      std::vector<double> want(ref.begin(), ref.end());
      expect_close(got, want, 1e-4, what);
    } else {
      EXPECT_EQ(0, std::memcmp(got.data(), ref.data(), got.size() * 4)) << what;
    }
    for (int64_t t = 0; t < T; ++t) {
      Tensor o1 = zeros(b(), DType::F32, {1, Hm});
      b().moe_experts(o1, tu.rows(t, 1), *tqg, *tqd, tc, tid.rows(t, 1), tw.rows(t, 1), 1e-8f);
      run(b());
      auto r = fetch(b(), o1);
      EXPECT_EQ(0, std::memcmp(r.data(), got.data() + t * Hm, size_t(Hm) * 4)) << what << " token " << t;
    }
    release_weights(b(), owner);
  }
}

INSTANTIATE_TEST_SUITE_P(Isa, QuantKernels, ::testing::Values(Isa::Scalar, Isa::Avx2, Isa::Avx512), isa_param_name);

}  // namespace
}  // namespace muse::testing
