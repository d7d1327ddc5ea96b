// Quantized weights on the GPU (NVFP4, MXFP4, FP8 per tensor / per channel /
// 128×128 blocks, INT4 GPTQ): project and moe_experts decode codes and
// scales in the kernels' registers. Each product is checked
//  - against a double reference on the dequantized matrix (the element and
//    scale definitions of core/dtype.h, which loading/quant.cc's reference
//    decoders use), within the fp32 accumulation bound of the fixed-order
//    kernels plus, for bf16 outputs, the store's rounding;
//  - against the CPU backend's quantized kernels (themselves tested against
//    the reference decoders, tests/backend_cpu/quant_kernels_test.cc), on the
//    same bf16 activations, within twice that bound;
//  - for batch invariance: a row of a T-row product is bitwise the row alone
//    (and the same inside other batches), a token of the experts likewise.
// Codes are random and never zero; scales keep the values O(0.1..1); shapes
// are odd (N not a multiple of any tile, K tails, the kernels' unaligned
// path where K is not a multiple of 128).
#include <chrono>

#include "cuda_test_util.h"
#include "muse/backends/cpu/cpu_backend.h"
#include "muse/backends/cuda/cuda_bench.h"
#include "muse/model/quantize.h"
#include "muse/model/weights.h"

namespace muse::cuda_testing {
namespace {

enum class Fp8Grid { Tensor, Channel, Block };

struct QSpec {
  QuantKind kind;
  int parts = 1;                   // NVFP4 global scales per matrix
  Fp8Grid grid = Fp8Grid::Channel;  // FP8 scale grid
  int64_t group = 128;             // INT4 group size
  const char* name;
  bool int4_symmetric_bf16 = false;  // INT4 as compressed-tensors stores it: BF16 scales, no zero points (z = 8)
};

const QSpec kSpecs[] = {
    {QuantKind::Nvfp4, 1, Fp8Grid::Channel, 128, "nvfp4"},
    {QuantKind::Nvfp4, 2, Fp8Grid::Channel, 128, "nvfp4 (2 globals)"},
    {QuantKind::Mxfp4, 1, Fp8Grid::Channel, 128, "mxfp4"},
    {QuantKind::Fp8, 1, Fp8Grid::Tensor, 128, "fp8 per tensor"},
    {QuantKind::Fp8, 1, Fp8Grid::Channel, 128, "fp8 per channel"},
    {QuantKind::Fp8, 1, Fp8Grid::Block, 128, "fp8 128x128 blocks"},
    {QuantKind::Int4, 1, Fp8Grid::Channel, 128, "int4 gptq g128"},
    {QuantKind::Int4, 1, Fp8Grid::Channel, 128, "int4 symmetric bf16 scales", true},
};

// Random quantized weights [E, N, K] in the engine's layouts (tensor.h).
HostQuantWeight random_quant(const QSpec& q, int64_t E, int64_t N, int64_t K, uint32_t seed) {
  // xorshift64*: cheap enough for the timing test's Spark-sized weights.
  uint64_t st = 0x9E3779B97F4A7C15ull * (uint64_t(seed) + 1);
  auto next = [&] {
    st ^= st >> 12, st ^= st << 25, st ^= st >> 27;
    return st * 2685821657736338717ull;
  };
  auto uni = [&](double a, double b) { return float(a + (b - a) * double(next() >> 11) * 0x1p-53); };
  auto pick = [&](int a, int b) { return a + int(next() % uint64_t(b - a + 1)); };
  HostQuantWeight w;
  w.format.kind = q.kind;
  auto shape = [&](std::vector<int64_t> s) {
    if (E > 1) s.insert(s.begin(), E);
    return s;
  };
  switch (q.kind) {
    case QuantKind::Nvfp4:
    case QuantKind::Mxfp4: {
      const bool mx = q.kind == QuantKind::Mxfp4;
      w.code_dtype = DType::F4;
      w.codes.resize(size_t(E * N * K / 2));
      auto nibble = [&] { const int c = pick(1, 14); return uint8_t(c < 8 ? c : c + 1); };  // never ±0
      for (auto& b : w.codes) b = uint8_t(nibble() | (nibble() << 4));
      const int64_t bc = mx ? 32 : 16, ld = (K + bc - 1) / bc;
      w.format.scale_dtype = mx ? DType::F8_E8M0 : DType::F8_E4M3;
      w.format.block_rows = 1, w.format.block_cols = int32_t(bc);
      w.scales.resize(size_t(E * N * ld));
      for (auto& s : w.scales) {
        if (mx) s = uint8_t(127 + pick(-5, -1));
        else s = pick(0, 31) == 0 ? uint8_t(pick(1, 7)) /* subnormal E4M3 */ : f32_to_f8_e4m3(uni(0.25, 2.0));
      }
      w.scale_shape = shape({N, ld});
      if (!mx) {
        w.format.global_parts = q.parts;
        for (int64_t i = 0; i < E * q.parts; ++i) w.global.push_back(uni(0.02, 0.2));
      }
      break;
    }
    case QuantKind::Fp8: {
      w.code_dtype = DType::F8_E4M3;
      w.codes.resize(size_t(E * N * K));
      for (auto& b : w.codes) {
        int c;
        do c = pick(0, 255);
        while ((c & 0x7F) == 0 || (c & 0x7F) == 0x7F);  // never ±0 or NaN
        b = uint8_t(c);
      }
      w.format.scale_dtype = DType::F32;
      int64_t br = 1, bcols = K;
      if (q.grid == Fp8Grid::Tensor) br = N;
      if (q.grid == Fp8Grid::Block) br = 128, bcols = 128;
      w.format.block_rows = int32_t(br), w.format.block_cols = int32_t(bcols);
      const int64_t gr = (N + br - 1) / br, gc = (K + bcols - 1) / bcols;
      std::vector<float> s(size_t(E * gr * gc));
      for (auto& v : s) v = uni(0.5, 2.0) / 448.0f;
      w.scales.resize(s.size() * 4);
      std::memcpy(w.scales.data(), s.data(), w.scales.size());
      w.scale_shape = shape({gr, gc});
      break;
    }
    case QuantKind::Int4: {
      w.code_dtype = DType::F4;
      const int64_t G = q.group, groups = (K + G - 1) / G;
      const bool sym = q.int4_symmetric_bf16;
      w.format.scale_dtype = sym ? DType::BF16 : DType::F16;
      w.format.block_rows = 1, w.format.block_cols = int32_t(G);
      w.format.zero_offset = sym ? 0 : 1;
      w.codes.resize(size_t(E * (K / 8) * N * 4));
      for (auto& b : w.codes) b = uint8_t(pick(0, 255));
      std::vector<uint16_t> s(size_t(E * groups * N));
      for (auto& v : s) v = sym ? f32_to_bf16(uni(0.01, 0.04)) : f32_to_f16(uni(0.01, 0.04));
      w.scales.resize(s.size() * 2);
      std::memcpy(w.scales.data(), s.data(), w.scales.size());
      w.scale_shape = shape({groups, N});
      if (!sym) {
        w.zeros.resize(size_t(E * groups * (N / 8) * 4));
        for (auto& b : w.zeros) b = uint8_t(pick(0, 255));
        w.zero_shape = shape({groups, N / 8});
      }
      break;
    }
    case QuantKind::None: break;
  }
  return w;
}

// The dequantized values, as the reference decoders define them.
std::vector<float> dequantize(const HostQuantWeight& w, int64_t E, int64_t N, int64_t K) {
  std::vector<float> out(size_t(E * N * K));
  const QuantFormat& f = w.format;
  auto u32 = [](const std::vector<uint8_t>& v, size_t i) {
    uint32_t x;
    std::memcpy(&x, v.data() + 4 * i, 4);
    return x;
  };
  for (int64_t e = 0; e < E; ++e)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < K; ++k) {
        float v = 0;
        if (f.kind == QuantKind::Nvfp4 || f.kind == QuantKind::Mxfp4) {
          const uint8_t byte = w.codes[size_t(((e * N + n) * K + k) / 2)];
          const int64_t ld = (K + f.block_cols - 1) / f.block_cols;
          const uint8_t sb = w.scales[size_t((e * N + n) * ld + k / f.block_cols)];
          float s = f.kind == QuantKind::Mxfp4 ? f8_e8m0_to_f32(sb) : f8_e4m3_to_f32(sb);
          if (f.global_parts > 0) s *= w.global[size_t(e * f.global_parts + n / (N / f.global_parts))];
          v = e2m1_to_f32(k % 2 ? byte >> 4 : byte & 15) * s;
        } else if (f.kind == QuantKind::Fp8) {
          const int64_t gr = (N + f.block_rows - 1) / f.block_rows, gc = (K + f.block_cols - 1) / f.block_cols;
          float s;
          std::memcpy(&s, w.scales.data() + 4 * size_t((e * gr + n / f.block_rows) * gc + k / f.block_cols), 4);
          v = f8_e4m3_to_f32(w.codes[size_t((e * N + n) * K + k)]) * s;
        } else {
          const int64_t G = f.block_cols, groups = (K + G - 1) / G, g = k / G;
          const int q = int((u32(w.codes, size_t(e * (K / 8) * N + (k / 8) * N + n)) >> (4 * (k % 8))) & 15u);
          const int z = w.zeros.empty()
                            ? 8
                            : int((u32(w.zeros, size_t(e * groups * (N / 8) + g * (N / 8) + n / 8)) >> (4 * (n % 8))) &
                                  15u) + f.zero_offset;
          uint16_t h;
          std::memcpy(&h, w.scales.data() + 2 * size_t(e * groups * N + g * N + n), 2);
          v = (f.scale_dtype == DType::BF16 ? bf16_to_f32(h) : f16_to_f32(h)) * float(q - z);
        }
        out[size_t((e * N + n) * K + k)] = v;
      }
  return out;
}

class QuantTest : public CudaTest {
 public:
  void SetUp() override {
    CudaTest::SetUp();
    if (IsSkipped() || HasFatalFailure()) return;
    CpuBackendOptions co;
    co.threads = 8;
    auto r = create_cpu_backend(co);
    ASSERT_TRUE(r.ok()) << r.message();
    cpu_ = std::move(r).value();
  }
  void TearDown() override {
    if (cpu_) release_weights(*cpu_, cpu_owner_);
    if (backend_) release_weights(b(), gpu_owner_);
  }
  // Whether the GPU runs this kind; a note in the log when it does not.
  bool runs(const QSpec& q) {
    if (b().supports_quant(q.kind)) return true;
    std::printf("[ note ] %s: not run on this backend yet (supports_quant false)\n", q.name);
    return false;
  }
  // The same quantized weights on both backends.
  std::pair<Tensor, Tensor> import_both(const HostQuantWeight& w, const std::vector<int64_t>& shape) {
    auto g = import_quantized(b(), shape, quant_view(w), false, gpu_owner_);
    auto c = import_quantized(*cpu_, shape, quant_view(w), false, cpu_owner_);
    EXPECT_TRUE(g.ok()) << (g.ok() ? "" : g.message());
    EXPECT_TRUE(c.ok()) << (c.ok() ? "" : c.message());
    return {g.ok() ? *g : Tensor{}, c.ok() ? *c : Tensor{}};
  }
  Tensor cpu_f32(std::initializer_list<int64_t> shape, const std::vector<float>& v) {
    auto t = cpu_->import_weight(DType::F32, shape, v.data(), false);
    EXPECT_TRUE(t.ok());
    cpu_owner_.owned.push_back(*t);
    return *t;
  }
  Tensor cpu_i32(std::initializer_list<int64_t> shape, const std::vector<int32_t>& v) {
    auto t = cpu_->import_weight(DType::I32, shape, v.data(), false);
    EXPECT_TRUE(t.ok());
    cpu_owner_.owned.push_back(*t);
    return *t;
  }
  std::vector<float> cpu_get(const Tensor& t) {
    std::vector<float> out(size_t(t.numel()));
    Status s = cpu_->download(t, out.data());
    EXPECT_TRUE(s.ok()) << s.message();
    return out;
  }

  std::unique_ptr<Backend> cpu_;
  ModelWeights gpu_owner_, cpu_owner_;
};

// want[t, n] = Σ_k x[t, k] w[n, k]; scale = Σ_k |x w|.
void project_ref(const std::vector<float>& x, const std::vector<float>& w, int64_t T, int64_t N, int64_t K,
                 std::vector<double>& want, std::vector<double>& scale) {
  want.assign(size_t(T * N), 0.0);
  scale.assign(size_t(T * N), 0.0);
  for (int64_t t = 0; t < T; ++t)
    for (int64_t n = 0; n < N; ++n) {
      double s = 0, a = 0;
      const float* xr = x.data() + t * K;
      const float* wr = w.data() + n * K;
      for (int64_t k = 0; k < K; ++k) {
        const double p = double(xr[k]) * wr[k];
        s += p, a += std::fabs(p);
      }
      want[size_t(t * N + n)] = s, scale[size_t(t * N + n)] = a;
    }
}

// The fp32 roundings of a decoding product: K/64 mma steps per K-slice (as
// BF16's mma_gemv, whose bound is K/32 + 8), the slices' three additions,
// one multiply per scale group and the row factor.
double project_chain(int64_t K) { return double(K) / 32 + 16; }

struct Shape {
  int64_t N, K;
  std::vector<int64_t> Ts;
};

// K a multiple of every format's block (128 for INT4 groups and FP8 blocks
// where those apply); N never a multiple of a tile.
std::vector<Shape> shapes_for(const QSpec& q) {
  std::vector<Shape> s = {
      {1000, 4096, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16, 17, 33, 64}},
      {q.kind == QuantKind::Int4 ? 4104 : 4099, 640, {1, 8, 16, 33}},  // a partial last granule (INT4: N % 8 == 0)
  };
  if (q.kind == QuantKind::Nvfp4) s.push_back({77, 1040, {1, 9, 17, 64}});  // K % 128 != 0: the unaligned path
  if (q.kind == QuantKind::Nvfp4) s.push_back({45, 48, {1, 3, 16}});
  if (q.kind == QuantKind::Mxfp4) s.push_back({77, 1056, {1, 9, 17, 64}});
  if (q.kind == QuantKind::Fp8) s.push_back({301, 1000, {1, 9, 17, 64}});  // FP8: K % 16 == 0 only where blocks say
  if (q.kind == QuantKind::Int4) s.push_back({264, 1152, {1, 9, 17, 64}});
  return s;
}

TEST_F(QuantTest, ProjectMatchesReferenceAndCpuBackend) {
  uint32_t seed = 100;
  for (const QSpec& q : kSpecs) {
    if (!runs(q)) continue;
    for (const Shape& sh : shapes_for(q)) {
      if (q.kind == QuantKind::Fp8 && q.grid == Fp8Grid::Block && sh.K % 128) continue;
      const int64_t N = sh.N + (q.parts == 2 && sh.N % 2 ? 1 : 0), K = sh.K;  // two globals: two equal halves
      HostQuantWeight hw = random_quant(q, 1, N, K, ++seed);
      const std::vector<float> wd = dequantize(hw, 1, N, K);
      auto [tg, tc] = import_both(hw, {N, K});
      ASSERT_FALSE(tg.empty() || tc.empty()) << q.name;
      for (int64_t T : sh.Ts) {
        auto x = as_stored(random_floats(size_t(T * K), ++seed), DType::BF16);
        Tensor gx = up(DType::BF16, {T, K}, x);
        Tensor go = poisoned(DType::F32, {T, N}), gob = poisoned(DType::BF16, {T, N});
        b().matmul(go, gx, tg);
        if (T == 1 || T == 17) b().matmul(gob, gx, tg);
        run();
        Tensor cx = cpu_f32({T, K}, x);
        auto co = cpu_->alloc(DType::F32, {T, N});
        ASSERT_TRUE(co.ok());
        cpu_owner_.owned.push_back(*co);
        cpu_->matmul(*co, cx, tc);
        ASSERT_TRUE(cpu_->execute().ok());
        std::vector<double> want, scale;
        project_ref(x, wd, T, N, K, want, scale);
        const std::string what = std::string(q.name) + " N " + std::to_string(N) + " K " + std::to_string(K) + " T " +
                                 std::to_string(T);
        const auto got = get(go);
        const auto tol = fp32_tol(scale, project_chain(K));
        expect_close(std::string("project ") + q.name, got, want, tol, false, what);
        const auto cpu = cpu_get(*co);
        std::vector<double> cpu_d(cpu.begin(), cpu.end()), tol2(tol);
        for (auto& v : tol2) v *= 2;
        expect_close(std::string("project vs cpu ") + q.name, got, cpu_d, tol2, false, what + " (vs the CPU backend)");
        if (T == 1 || T == 17) expect_close(std::string("project ") + q.name, get(gob), want, tol, true, what + " bf16 out");
        if (HasFailure()) return;  // one shape's diagnostics are enough
      }
    }
  }
}

TEST_F(QuantTest, ProjectRowIsBatchInvariantAndDeterministic) {
  uint32_t seed = 500;
  for (const QSpec& q : kSpecs) {
    if (!runs(q)) continue;
    for (int64_t K : {int64_t(4096), int64_t(1152)}) {
      const int64_t N = 1000, B = 64;
      HostQuantWeight hw = random_quant(q, 1, N, K, ++seed);
      auto tw = import_quantized(b(), {N, K}, quant_view(hw), false, gpu_owner_);
      ASSERT_TRUE(tw.ok()) << tw.message();
      auto x = random_floats(size_t(B * K), ++seed);
      Tensor tx = up(DType::BF16, {B, K}, x);
      Tensor ob = poisoned(DType::BF16, {B, N}), ob2 = poisoned(DType::BF16, {B, N});
      b().matmul(ob, tx, *tw);
      b().matmul(ob2, tx, *tw);
      run();
      const auto all = get_bytes(ob), all2 = get_bytes(ob2);
      EXPECT_EQ(all, all2) << q.name << " K " << K << ": the same product twice differs";
      const size_t row = size_t(N) * 2;
      // Sub-batches of 1, 5, 16, 17 and 33 rows (every tile shape) holding rows of the batch.
      for (auto [first, count] : {std::pair<int64_t, int64_t>{37, 1}, {0, 1}, {63, 1}, {10, 5}, {30, 16}, {3, 17}, {20, 33}}) {
        std::vector<float> xs(x.begin() + first * K, x.begin() + (first + count) * K);
        Tensor txs = up(DType::BF16, {count, K}, xs);
        Tensor os = poisoned(DType::BF16, {count, N});
        b().matmul(os, txs, *tw);
        run();
        const auto sub = get_bytes(os);
        for (int64_t r = 0; r < count; ++r) {
          const int cmp = std::memcmp(all.data() + size_t(first + r) * row, sub.data() + size_t(r) * row, row);
          if (cmp != 0) {
            int64_t n = 0;
            while (n < N && std::memcmp(all.data() + size_t(first + r) * row + 2 * n, sub.data() + size_t(r) * row + 2 * n, 2) == 0) ++n;
            ADD_FAILURE() << q.name << " K " << K << ": row " << first + r << " of a batch of 64 differs from row " << r
                          << " of a batch of " << count << " (first at column " << n << ")";
            break;
          }
        }
      }
    }
  }
}

struct QExpertCase {
  int64_t T, E, K, Hm, I;
};

TEST_F(QuantTest, ExpertsMatchReferenceAndCpuBackendAndAreBatchInvariant) {
  const QExpertCase cases[] = {
      {1, 8, 4, 512, 256}, {16, 8, 4, 512, 384}, {33, 16, 8, 256, 128}, {64, 8, 8, 1024, 512}, {5, 4, 2, 1152, 256},
      {3, 4, 2, 96, 48},  // K % 128 != 0: the unaligned paths
      {4, 4, 2, 512, 96},  // aligned gate/up, unaligned down (FP8: block scales in one product only)
      // Gate/up K-slices of two granules (the FP4 ring's refills across
      // granules: Spark's latent width 4096), and of two and one (3072).
      {2, 4, 2, 4096, 128}, {3, 4, 2, 3072, 64},
  };
  uint32_t seed = 900;
  for (const QSpec& q : kSpecs) {
    if (!runs(q)) continue;
    for (const auto& c : cases) {
      const int64_t Hm = c.Hm, I = c.I, E = c.E, T = c.T;
      HostQuantWeight hg = random_quant(q, E, 2 * I, Hm, ++seed), hd = random_quant(q, E, Hm, I, ++seed);
      if (q.kind == QuantKind::Nvfp4) {  // gate and up halves get their own global (the release's layout)
        hg = random_quant(QSpec{q.kind, 2, q.grid, q.group, q.name, false}, E, 2 * I, Hm, seed + 1000);
      }
      const auto gud = dequantize(hg, E, 2 * I, Hm), dnd = dequantize(hd, E, Hm, I);
      auto [gg, cg] = import_both(hg, {E, 2 * I, Hm});
      auto [gd, cd] = import_both(hd, {E, Hm, I});
      ASSERT_FALSE(gg.empty() || cg.empty() || gd.empty() || cd.empty()) << q.name;
      auto u = as_stored(random_floats(size_t(T * Hm), ++seed), DType::BF16);
      auto gain = random_floats(size_t(Hm), ++seed, 0.3f, 1.0f);
      auto ids = random_ids(T, E, c.K, ++seed);
      auto wts = random_floats(size_t(T * c.K), ++seed, 0.2f, 0.5f);
      Tensor tu = up(DType::BF16, {T, Hm}, u), tg = up(DType::F32, {Hm}, gain), tw = up(DType::F32, {T, c.K}, wts);
      Tensor tids = up_i32({T, c.K}, ids);
      Tensor out = poisoned(DType::F32, {T, Hm}), outb = poisoned(DType::BF16, {T, Hm});
      b().moe_experts(out, tu, gg, gd, tg, tids, tw, 1e-6f);
      b().moe_experts(outb, tu, gg, gd, tg, tids, tw, 1e-6f);
      run();
      ExpertCase ec{T, E, c.K, Hm, I, DType::BF16};
      std::vector<double> want, tol;
      experts_ref(ec, u, gud, dnd, gain, ids, wts, 1e-6, want, tol, true);
      const std::string what = std::string(q.name) + " experts T " + std::to_string(T) + " E " + std::to_string(E) +
                               " Hm " + std::to_string(Hm) + " I " + std::to_string(I);
      const auto got = get(out);
      expect_close(std::string("moe_experts ") + q.name, got, want, tol, false, what);
      expect_close(std::string("moe_experts ") + q.name, get(outb), want, tol, true, what + " bf16 out");
      // The CPU backend's quantized experts (fp32 a, so within the same bound twice).
      Tensor cu = cpu_f32({T, Hm}, u), cgn = cpu_f32({Hm}, gain), cw = cpu_f32({T, c.K}, wts);
      Tensor cid = cpu_i32({T, c.K}, ids);
      auto co = cpu_->alloc(DType::F32, {T, Hm});
      ASSERT_TRUE(co.ok());
      cpu_owner_.owned.push_back(*co);
      cpu_->moe_experts(*co, cu, cg, cd, cgn, cid, cw, 1e-6f);
      ASSERT_TRUE(cpu_->execute().ok());
      const auto cpu = cpu_get(*co);
      std::vector<double> cpu_d(cpu.begin(), cpu.end()), tol2(tol);
      for (auto& v : tol2) v *= 2;
      expect_close(std::string("moe_experts vs cpu ") + q.name, got, cpu_d, tol2, false, what + " (vs the CPU backend)");
      // Each token alone gives its row of the batch, bit for bit.
      const auto all = get_bytes(out);
      for (int64_t t : {int64_t(0), T / 2, T - 1}) {
        std::vector<float> u1(u.begin() + t * Hm, u.begin() + (t + 1) * Hm), w1(wts.begin() + t * c.K, wts.begin() + (t + 1) * c.K);
        std::vector<int32_t> i1(ids.begin() + t * c.K, ids.begin() + (t + 1) * c.K);
        Tensor tu1 = up(DType::BF16, {1, Hm}, u1), tw1 = up(DType::F32, {1, c.K}, w1);
        Tensor ti1 = up_i32({1, c.K}, i1);
        Tensor o1 = poisoned(DType::F32, {1, Hm});
        b().moe_experts(o1, tu1, gg, gd, tg, ti1, tw1, 1e-6f);
        run();
        const auto one = get_bytes(o1);
        EXPECT_EQ(0, std::memcmp(one.data(), all.data() + size_t(t * Hm) * 4, size_t(Hm) * 4))
            << what << ": token " << t << " alone differs from the batch";
      }
      if (HasFailure()) return;
    }
  }
}

// The streaming FP4 down product (CudaBackendOptions::expert_kernel 2:
// wherever K % 512 == 0; a launch it cannot make is an error there, not
// the per-tile kernel), the per-tile one (1) and the rule with the gate/up
// kernel compiled for five blocks an SM (3) give the same bits: one
// granule (warps 1..3 with nothing to stream), slices of unequal length (9
// granules), more items than the GPU holds blocks (each block streaming
// several, across grouping tiles).
TEST_F(QuantTest, StreamingDownProductGivesThePerTileBits) {
  const QExpertCase cases[] = {
      {1, 8, 4, 512, 512}, {3, 4, 2, 1536, 2048}, {17, 16, 4, 512, 4608}, {64, 8, 8, 1024, 1024}, {40, 32, 8, 2048, 512},
  };
  constexpr int kModes[3] = {1, 2, 3};  // the reference (per-tile) first
  std::unique_ptr<Backend> backends[3];
  for (int k = 0; k < 3; ++k) {
    CudaBackendOptions o;
    o.expert_kernel = kModes[k];
    auto r = create_cuda_backend(o);
    ASSERT_TRUE(r.ok()) << r.message();
    backends[k] = std::move(r).value();
  }
  ModelWeights owners[3];
  struct Release {  // on every exit, before the backends go
    std::unique_ptr<Backend> (&be)[3];
    ModelWeights (&w)[3];
    ~Release() {
      for (int k = 0; k < 3; ++k) release_weights(*be[k], w[k]);
    }
  } release{backends, owners};
  uint32_t seed = 4100;
  for (const QSpec& q : {kSpecs[1], kSpecs[2]}) {  // NVFP4 with two globals, MXFP4
    if (!runs(q)) continue;
    for (const auto& c : cases) {
      const HostQuantWeight hg = random_quant(q, c.E, 2 * c.I, c.Hm, ++seed), hd = random_quant(q, c.E, c.Hm, c.I, ++seed);
      auto u = random_floats(size_t(c.T * c.Hm), ++seed);
      auto gain = random_floats(size_t(c.Hm), ++seed, 0.3f, 1.0f);
      const auto ids = random_ids(c.T, c.E, c.K, ++seed);
      auto wts = random_floats(size_t(c.T * c.K), ++seed, 0.2f, 0.5f);
      std::vector<uint8_t> got[3];
      for (int k = 0; k < 3; ++k) {
        Backend& be = *backends[k];
        ModelWeights& own = owners[k];
        auto gg = import_quantized(be, {c.E, 2 * c.I, c.Hm}, quant_view(hg), false, own);
        auto gd = import_quantized(be, {c.E, c.Hm, c.I}, quant_view(hd), false, own);
        ASSERT_TRUE(gg.ok() && gd.ok()) << q.name;
        std::vector<uint16_t> ub(u.size());
        for (size_t i = 0; i < u.size(); ++i) ub[i] = f32_to_bf16(u[i]);
        auto tu = be.import_weight(DType::BF16, {c.T, c.Hm}, ub.data(), false);
        auto tg = be.import_weight(DType::F32, {c.Hm}, gain.data(), false);
        auto tw = be.import_weight(DType::F32, {c.T, c.K}, wts.data(), false);
        auto ti = be.import_weight(DType::I32, {c.T, c.K}, ids.data(), false);
        auto out = be.alloc(DType::F32, {c.T, c.Hm});
        ASSERT_TRUE(tu.ok() && tg.ok() && tw.ok() && ti.ok() && out.ok());
        for (const Tensor& t : {*tu, *tg, *tw, *ti, *out}) own.owned.push_back(t);
        be.moe_experts(*out, *tu, *gg, *gd, *tg, *ti, *tw, 1e-6f);
        ASSERT_TRUE(be.execute().ok());
        got[k].resize(out->bytes());
        ASSERT_TRUE(be.download(*out, got[k].data()).ok());
      }
      for (int k = 1; k < 3; ++k)
        EXPECT_EQ(0, std::memcmp(got[0].data(), got[k].data(), got[0].size()))
            << q.name << " T " << c.T << " E " << c.E << " top " << c.K << " Hm " << c.Hm << " I " << c.I
            << ": expert_kernel " << kModes[k] << " differs from the per-tile kernels";
    }
  }
}

// The grouped wgmma GEMM with the FP4 / FP8 codes decoded in registers
// (CudaBackendOptions::expert_gemm 2 and 3: tiles of 256 and 128 pairs)
// gives the per-tile kernels' bits (1): one FP4 granule (three K-slices
// with nothing), three and five (unequal slices), Spark's latent width (two
// FP4 granules a slice), experts with more pairs than a tile, top-k up to
// 8, and one rank of two under expert parallelism; and it stays within the
// double reference's bound.
// Three CUDA backends made by make(k), k = 0..2, each with the weights it
// imports (released on every exit, before the backends go).
struct ThreeBackends {
  std::unique_ptr<Backend> be[3];
  ModelWeights own[3];
  template <class Make>
  explicit ThreeBackends(Make&& make) {
    for (int k = 0; k < 3; ++k) be[k] = make(k);
  }
  bool ok() const { return be[0] && be[1] && be[2]; }
  ~ThreeBackends() {
    for (int k = 0; k < 3; ++k)
      if (be[k]) release_weights(*be[k], own[k]);
  }
};

TEST_F(QuantTest, GroupedGemmGivesThePerTileBits) {
  struct Case {
    int64_t T, E, K, Hm, I, base;  // base >= 0: this rank holds experts [base, base + E / 2)
  };
  const Case cases[] = {{1, 2, 1, 512, 512, -1},     {8, 2, 1, 1024, 512, -1},  {300, 16, 4, 512, 1024, -1},
                        {520, 8, 3, 1536, 512, -1},  {1000, 64, 8, 512, 512, -1}, {200, 4, 2, 4096, 512, -1},
                        {64, 8, 8, 2560, 1536, -1},  {400, 16, 4, 512, 512, 8}};
  ThreeBackends three([](int k) { return backend_with_expert_gemm(k + 1); });
  ASSERT_TRUE(three.ok());
  auto& be = three.be;
  auto& own = three.own;
  uint32_t seed = 7100;
  // NVFP4 with two globals, MXFP4, FP8 per tensor and per channel, INT4
  // with zero points and symmetric.
  for (const QSpec& q : {kSpecs[1], kSpecs[2], kSpecs[3], kSpecs[4], kSpecs[6], kSpecs[7]}) {
    if (!runs(q)) continue;
    for (const Case& c : cases) {
      const int64_t E = c.base >= 0 ? c.E / 2 : c.E;  // experts this rank holds
      const HostQuantWeight hg = random_quant(q, E, 2 * c.I, c.Hm, ++seed), hd = random_quant(q, E, c.Hm, c.I, ++seed);
      const auto u = as_stored(random_floats(size_t(c.T * c.Hm), ++seed), DType::BF16);
      const auto gain = random_floats(size_t(c.Hm), ++seed, 0.3f, 1.0f);
      const auto ids = random_ids(c.T, c.E, c.K, ++seed);
      const auto wts = random_floats(size_t(c.T * c.K), ++seed, 0.2f, 0.5f);
      std::vector<uint16_t> ub(u.size());
      for (size_t i = 0; i < u.size(); ++i) ub[i] = f32_to_bf16(u[i]);
      std::vector<uint8_t> got[3];
      for (int k = 0; k < 3; ++k) {
        Backend& b = *be[k];
        auto gg = import_quantized(b, {E, 2 * c.I, c.Hm}, quant_view(hg), false, own[k]);
        auto gd = import_quantized(b, {E, c.Hm, c.I}, quant_view(hd), false, own[k]);
        ASSERT_TRUE(gg.ok() && gd.ok()) << q.name;
        auto tu = b.import_weight(DType::BF16, {c.T, c.Hm}, ub.data(), false);
        auto tg = b.import_weight(DType::F32, {c.Hm}, gain.data(), false);
        auto tw = b.import_weight(DType::F32, {c.T, c.K}, wts.data(), false);
        auto ti = b.import_weight(DType::I32, {c.T, c.K}, ids.data(), false);
        auto out = b.alloc(DType::F32, {c.T, c.Hm});
        ASSERT_TRUE(tu.ok() && tg.ok() && tw.ok() && ti.ok() && out.ok());
        for (const Tensor& t : {*tu, *tg, *tw, *ti, *out}) own[k].owned.push_back(t);
        b.moe_experts(*out, *tu, *gg, *gd, *tg, *ti, *tw, 1e-6f, c.base >= 0 ? c.base : -1);
        Status st = b.execute();
        ASSERT_TRUE(st.ok()) << q.name << ": " << st.message();
        got[k].resize(out->bytes());
        ASSERT_TRUE(b.download(*out, got[k].data()).ok());
        release_weights(b, own[k]);
      }
      const std::string what = std::string(q.name) + " T " + std::to_string(c.T) + " E " + std::to_string(c.E) +
                               " top " + std::to_string(c.K) + " Hm " + std::to_string(c.Hm) + " I " +
                               std::to_string(c.I) + " base " + std::to_string(c.base);
      for (int k = 1; k < 3; ++k) {
        std::vector<char> a(got[0].begin(), got[0].end()), g(got[k].begin(), got[k].end());
        EXPECT_EQ(0, std::memcmp(got[0].data(), got[k].data(), got[0].size()))
            << what << ": the grouped GEMM in tiles of " << (k == 1 ? 256 : 128)
            << " pairs differs from the per-tile kernels: " << describe_f32_difference(a, g);
      }
      if (c.base < 0 && c.T * c.K * c.Hm * c.I <= (int64_t(1) << 28)) {  // the double reference, where it is quick
        const auto gud = dequantize(hg, E, 2 * c.I, c.Hm), dnd = dequantize(hd, E, c.Hm, c.I);
        ExpertCase ec{c.T, E, c.K, c.Hm, c.I, DType::BF16};
        std::vector<double> want, tol;
        experts_ref(ec, u, gud, dnd, gain, ids, wts, 1e-6, want, tol, true);
        std::vector<float> f(got[2].size() / sizeof(float));
        std::memcpy(f.data(), got[2].data(), got[2].size());
        expect_close(std::string("moe_experts grouped ") + q.name, f, want, tol, false, what);
      }
      if (HasFailure()) return;
    }
  }
}

// The dense products' wgmma GEMM (cuda_quant_wgmma.cu: at every row count
// under variant 11; the rule's formats above 64 rows) gives the per-tile
// kernels' bits (any other variant), F32 and BF16 outputs, tile edges in
// both N and T; FP8 with block scales, unaligned K and INT4 zero points
// with N % 32 != 0 stay on the per-tile kernels under every variant.
TEST_F(QuantTest, ProjectGemmGivesThePerTileBits) {
  struct Case {
    int64_t N, K;
    std::vector<int64_t> Ts;
  };
  const Case cases[] = {{1000, 4096, {1, 17, 64, 65, 300}}, {4099, 1536, {1, 130, 257}}, {77, 512, {3, 128, 129}},
                        {300, 2560, {520}},                 {129, 1056, {200}},            {1024, 1536, {1, 100, 300}}};
  const int variants[3] = {3, 11, 0};  // the per-tile kernels, the GEMM, the rule
  ThreeBackends three([&](int k) { return backend_with_product_kernel(variants[k]); });
  ASSERT_TRUE(three.ok());
  auto& be = three.be;
  auto& own = three.own;
  uint32_t seed = 7700;
  for (const QSpec& q : kSpecs) {
    if (!runs(q)) continue;
    for (const Case& c : cases) {
      if (q.kind == QuantKind::Fp8 && q.grid == Fp8Grid::Block && c.K % 128) continue;
      // Two NVFP4 globals: two equal halves; INT4: N % 8 == 0 (with zero points the GEMM takes N % 32 == 0 only).
      const int64_t N = q.kind == QuantKind::Int4 ? (c.N + 7) / 8 * 8 : c.N + (q.parts == 2 && c.N % 2 ? 1 : 0);
      const int64_t K = c.K;
      const HostQuantWeight hw = random_quant(q, 1, N, K, ++seed);
      for (int64_t T : c.Ts) {
        const auto x = as_stored(random_floats(size_t(T * K), ++seed), DType::BF16);
        std::vector<uint16_t> xb(x.size());
        for (size_t i = 0; i < x.size(); ++i) xb[i] = f32_to_bf16(x[i]);
        std::vector<uint8_t> got[3][2];
        for (int k = 0; k < 3; ++k) {
          Backend& b = *be[k];
          auto tw = import_quantized(b, {N, K}, quant_view(hw), false, own[k]);
          ASSERT_TRUE(tw.ok()) << q.name << ": " << tw.message();
          auto tx = b.import_weight(DType::BF16, {T, K}, xb.data(), false);
          auto of = b.alloc(DType::F32, {T, N});
          auto ob = b.alloc(DType::BF16, {T, N});
          ASSERT_TRUE(tx.ok() && of.ok() && ob.ok());
          for (const Tensor& t : {*tx, *of, *ob}) own[k].owned.push_back(t);
          b.matmul(*of, *tx, *tw);
          b.matmul(*ob, *tx, *tw);
          Status st = b.execute();
          ASSERT_TRUE(st.ok()) << q.name << ": " << st.message();
          got[k][0].resize(of->bytes());
          got[k][1].resize(ob->bytes());
          ASSERT_TRUE(b.download(*of, got[k][0].data()).ok() && b.download(*ob, got[k][1].data()).ok());
          release_weights(b, own[k]);
        }
        const std::string what =
            std::string(q.name) + " N " + std::to_string(N) + " K " + std::to_string(K) + " T " + std::to_string(T);
        for (int k = 1; k < 3; ++k)
          for (int o = 0; o < 2; ++o) {
            std::vector<char> a(got[0][o].begin(), got[0][o].end()), g(got[k][o].begin(), got[k][o].end());
            EXPECT_EQ(0, std::memcmp(got[0][o].data(), got[k][o].data(), got[0][o].size()))
                << what << (o ? " (bf16 out)" : " (f32 out)") << ": product kernel " << variants[k]
                << " differs from the per-tile kernel: " << (o ? std::string("bf16 bytes differ") : describe_f32_difference(a, g));
          }
        if (T * N * K <= (int64_t(1) << 30)) {  // the double reference, where it is quick
          std::vector<double> want, scale;
          project_ref(x, dequantize(hw, 1, N, K), T, N, K, want, scale);
          std::vector<float> f(got[1][0].size() / sizeof(float));
          std::memcpy(f.data(), got[1][0].data(), got[1][0].size());
          expect_close(std::string("project gemm ") + q.name, f, want, fp32_tol(scale, project_chain(K)), false, what);
        }
        if (HasFailure()) return;
      }
    }
  }
}

// Layouts the kernels do not take are refused at enqueue, by name.
TEST_F(QuantTest, UnsupportedInputsAreRefusedByName) {
  const QSpec q = kSpecs[0];
  if (!runs(q)) return;
  HostQuantWeight hw = random_quant(q, 1, 32, 256, 7);
  auto tw = import_quantized(b(), {32, 256}, quant_view(hw), false, gpu_owner_);
  ASSERT_TRUE(tw.ok()) << tw.message();
  auto x = random_floats(size_t(2 * 256), 8);
  Tensor tx = up(DType::F32, {2, 256}, x);  // F32 activations: the decoding kernels take BF16
  Tensor o = poisoned(DType::F32, {2, 32});
  b().matmul(o, tx, *tw);
  Status s = b().execute();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("BF16 activations"), std::string::npos) << s.message();
}

// Timings of the quantized products at Muse Spark's shapes, beside BF16
// (DISABLED_: run with --gtest_also_run_disabled_tests
// --gtest_filter='*QuantTiming*'). Wall time of 20 ops in one execute(),
// the bytes each must read (codes and scales; for the experts the distinct
// experts the step routes to), and that as a share of the HBM read rate
// measured first. For tuning the kernels, not issue 13's figure (muse bench).
TEST_F(QuantTest, DISABLED_QuantTimingSparkShapes) {
  auto ceil = measure_gpu_ceilings(uint64_t(4) << 30, 4096, 3);
  ASSERT_TRUE(ceil.ok()) << ceil.message();
  const double hbm = ceil->hbm_read_gbps * 1e9;
  std::printf("HBM read %.0f GB/s\n", hbm * 1e-9);
  auto time_op = [&](auto&& op) {
    op();
    run();
    const int reps = 20;
    auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) op();
    run();
    return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count() / reps;
  };
  auto line = [&](const std::string& what, double s, double bytes) {
    std::printf("%-52s %9.1f us %8.1f GB/s %6.1f%% of HBM\n", what.c_str(), s * 1e6, bytes / s * 1e-9,
                100.0 * bytes / s / hbm);
  };
  auto bf16_random = [&](std::initializer_list<int64_t> shape, int64_t n, uint32_t seed) {
    std::vector<uint16_t> h(static_cast<size_t>(n));
    uint32_t x = seed * 2654435761u + 1;
    for (auto& v : h) x = x * 1664525u + 1013904223u, v = f32_to_bf16(float(int32_t(x >> 8) % 2001 - 1000) * 2e-5f);
    auto t = b().import_weight(DType::BF16, shape, h.data(), false);
    EXPECT_TRUE(t.ok());
    return *t;
  };
  const int64_t H = 8192, Hm = 4096, I = 4096, E = 16, topk = 8;
  const QSpec specs[] = {kSpecs[0], kSpecs[2], kSpecs[4], kSpecs[6]};  // nvfp4, mxfp4, fp8 per channel, int4
  // project: q/o/gate-shaped [8192, 8192] and k/v-shaped [1024, 8192].
  for (int64_t N : {H, int64_t(1024)}) {
    Tensor wb = bf16_random({N, H}, N * H, 1);
    for (int64_t T : {1, 16, 64}) {
      auto x = random_floats(size_t(T * H), 2);
      Tensor tx = up(DType::BF16, {T, H}, x);
      Tensor out = poisoned(DType::BF16, {T, N});
      line("bf16 project " + std::to_string(N) + "x8192 T " + std::to_string(T),
           time_op([&] { b().matmul(out, tx, wb); }), double(N * H * 2));
      for (const QSpec& q : specs) {
        HostQuantWeight hw = random_quant(q, 1, N, H, 3);
        auto tw = import_quantized(b(), {N, H}, quant_view(hw), false, gpu_owner_);
        ASSERT_TRUE(tw.ok()) << tw.message();
        line(std::string(q.name) + " project " + std::to_string(N) + "x8192 T " + std::to_string(T),
             time_op([&] { b().matmul(out, tx, *tw); }), double(weight_bytes(*tw)));
      }
    }
    b().release(wb);
  }
  // The latent experts: E experts of gate_up [2I, Hm] and down [Hm, I], top 8.
  auto gain = random_floats(size_t(Hm), 4, 0.3f, 1.0f);
  Tensor tg = up(DType::F32, {Hm}, gain);
  std::vector<Tensor> sets;  // [gate_up, down] per format, BF16 first
  sets.push_back(bf16_random({E, 2 * I, Hm}, E * 2 * I * Hm, 5));
  sets.push_back(bf16_random({E, Hm, I}, E * Hm * I, 6));
  for (const QSpec& q : specs) {
    const QSpec gq{q.kind, q.kind == QuantKind::Nvfp4 ? 2 : 1, q.grid, q.group, q.name, q.int4_symmetric_bf16};
    HostQuantWeight hg = random_quant(gq, E, 2 * I, Hm, 7), hd = random_quant(q, E, Hm, I, 8);
    auto g = import_quantized(b(), {E, 2 * I, Hm}, quant_view(hg), false, gpu_owner_);
    auto d = import_quantized(b(), {E, Hm, I}, quant_view(hd), false, gpu_owner_);
    ASSERT_TRUE(g.ok() && d.ok());
    sets.push_back(*g), sets.push_back(*d);
  }
  for (int64_t T : {1, 16, 64}) {
    auto u = random_floats(size_t(T * Hm), 9);
    auto ids = random_ids(T, E, topk, 10);
    auto wts = random_floats(size_t(T * topk), 11, 0.2f, 0.5f);
    std::vector<bool> used(size_t(E), false);
    for (int32_t id : ids) used[size_t(id)] = true;
    const int64_t distinct = std::count(used.begin(), used.end(), true);
    Tensor tu = up(DType::BF16, {T, Hm}, u), tw = up(DType::F32, {T, topk}, wts), tids = up_i32({T, topk}, ids);
    Tensor out = poisoned(DType::BF16, {T, Hm});
    for (size_t f = 0; f < sets.size(); f += 2) {
      const std::string name = f == 0 ? "bf16" : specs[f / 2 - 1].name;
      const double bytes = double(weight_bytes(sets[f]) + weight_bytes(sets[f + 1])) * double(distinct) / double(E);
      line(name + " experts " + std::to_string(distinct) + " of 3x4096x4096, T " + std::to_string(T),
           time_op([&] { b().moe_experts(out, tu, sets[f], sets[f + 1], tg, tids, tw, 1e-6f); }), bytes);
    }
  }
}

}  // namespace
}  // namespace muse::cuda_testing
