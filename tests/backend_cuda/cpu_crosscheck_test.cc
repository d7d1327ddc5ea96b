// The CUDA backend against the CPU backend (the fp32 reference) on one
// model-shaped pipeline of every op, driven by step plans exactly as the
// engine drives them: three steps of chunked prefill + decode for two
// sequences, a ring (sliding) layer and a paged (full) layer with a gappy
// block table, the MLP, the latent MoE and the softcapped head. The CUDA
// backend runs with F32 activations and an F32 cache here, so both compute
// the same function in fp32 with different summation orders.
//
// Tolerance: each op adds O(n·u) relative error (n ≤ the longest reduction,
// 224 here, ÷ the parallel split), the norms keep the pipeline from growing
// them, and about 25 ops feed the logits: we allow 1e-5 of the compared
// tensor's max |value| (≈ 170 u). The CPU backend's own scalar and AVX
// kernels (other summation orders) differ by ≤ 2e-7 of it on this pipeline.
#include "cuda_test_util.h"
#include "muse/backends/cpu/cpu_backend.h"
#include "muse/backends/step_plan.h"

namespace muse::cuda_testing {
namespace {

struct Weights {  // host copies, uploaded to each backend
  std::vector<float> table, g1, g2, g3, g4, alpha, beta, wq, wk, wv, wg, wo, wgate, wup, wdown, wu, wr, bias, gu, dn,
      pg, head;
};

constexpr int64_t H = 160, d = 32, hq = 4, hk = 2, qd = hq * d, kvd = hk * d, I2 = 224, V = 301, Hm = 64, E = 8,
                  K = 2, I = 48, W = 6, BS = 4;

struct Side {
  Backend* b;
  Tensor table, g1, g2, g3, g4, alpha, beta, wq[2], wk[2], wv[2], wg[2], wo[2], wgate, wup, wdown, wu, wr, bias, gu,
      dn, pg, head;
  KvLayerStorage cache[2];
  Tensor plan;
};

Tensor upload(Backend& b, std::initializer_list<int64_t> shape, const std::vector<float>& v, DType dt = DType::F32) {
  Result<Tensor> t = Tensor{};
  if (dt == DType::BF16) {
    std::vector<uint16_t> h(v.size());
    for (size_t i = 0; i < v.size(); ++i) h[i] = f32_to_bf16(v[i]);
    t = b.import_weight(dt, shape, h.data(), false);
  } else {
    t = b.import_weight(dt, shape, v.data(), false);
  }
  EXPECT_TRUE(t.ok());
  return t.ok() ? *t : Tensor{};
}
Tensor fresh(Backend& b, DType dt, std::initializer_list<int64_t> shape) {
  auto t = b.alloc(dt, shape);
  EXPECT_TRUE(t.ok());
  return t.ok() ? *t : Tensor{};
}
std::vector<float> fetch(Backend& b, const Tensor& t) {
  std::vector<float> v(static_cast<size_t>(t.numel()));
  Status s = b.download(t, v.data());
  EXPECT_TRUE(s.ok()) << s.message();
  return v;
}

void expect_near_cpu(const std::string& what, const std::vector<float>& cuda, const std::vector<float>& cpu) {
  ASSERT_EQ(cuda.size(), cpu.size()) << what;
  double mx = 0, worst = 0;
  for (float x : cpu) mx = std::max(mx, double(std::fabs(x)));
  const double tol = 1e-5 * mx;
  int bad = 0;
  for (size_t i = 0; i < cpu.size(); ++i) {
    const double e = std::fabs(double(cuda[i]) - cpu[i]);
    worst = std::max(worst, std::isnan(e) ? INFINITY : e);
    if (!(e <= tol) && ++bad <= 5) ADD_FAILURE() << what << " [" << i << "]: cuda " << cuda[i] << " cpu " << cpu[i];
  }
  EXPECT_EQ(bad, 0) << what;
  auto& row = ErrorTable::get().rows["cpu vs cuda: " + what];
  row.max_abs = std::max(row.max_abs, worst);
  row.max_ratio = std::max(row.max_ratio, worst / tol);
  row.checked += long(cpu.size());
}

class CpuCrossCheck : public CudaTest, public ::testing::WithParamInterface<DType> {};

TEST_P(CpuCrossCheck, ModelShapedPipelineMatchesTheCpuBackend) {
  const DType wdt = GetParam();  // weights as stored on both backends
  CpuBackendOptions co;
  co.threads = 4;
  auto cpu_r = create_cpu_backend(co);
  ASSERT_TRUE(cpu_r.ok()) << cpu_r.message();
  std::unique_ptr<Backend> cpu = std::move(cpu_r).value();
  uint32_t seed = 7000;
  Weights w;
  auto rnd = [&](int64_t n, float scale = 1.0f, float off = 0.0f) {
    auto v = random_floats(static_cast<size_t>(n), ++seed, scale, off);
    return wdt == DType::BF16 ? as_stored(v, DType::BF16) : v;
  };
  w.table = rnd(V * H);
  w.g1 = rnd(H, 0.1f, 1.0f), w.g2 = rnd(H, 0.1f, 0.3f), w.g3 = rnd(H, 0.1f, 1.0f), w.g4 = rnd(H, 0.1f, 0.5f);
  w.alpha = rnd(H, 0.05f, 0.9f), w.beta = rnd(H, 0.05f, 0.2f);
  w.wq = rnd(2 * qd * H, 0.08f), w.wk = rnd(2 * kvd * H, 0.08f), w.wv = rnd(2 * kvd * H, 0.08f);
  w.wg = rnd(2 * qd * H, 0.08f), w.wo = rnd(2 * H * qd, 0.08f);
  w.wgate = rnd(I2 * H, 0.08f), w.wup = rnd(I2 * H, 0.08f), w.wdown = rnd(H * I2, 0.07f);
  w.wu = rnd(Hm * H, 0.08f), w.wr = rnd(E * H, 0.3f), w.bias = rnd(E, 0.05f);
  w.gu = rnd(E * 2 * I * Hm, 0.12f), w.dn = rnd(E * Hm * I, 0.14f), w.pg = rnd(Hm, 0.1f, 1.0f), w.head = rnd(V * H, 0.08f);

  StepPlanCapacity cap{16, 3, 4, 16};
  StepPlanBuilder pb(cap);
  Side sides[2];
  sides[0].b = &b();
  sides[1].b = cpu.get();
  for (Side& s : sides) {
    Backend& be = *s.b;
    const DType g = DType::F32;  // gains, α, β, bias are F32 by contract
    s.table = upload(be, {V, H}, w.table, wdt);
    s.g1 = upload(be, {H}, w.g1, g), s.g2 = upload(be, {H}, w.g2, g), s.g3 = upload(be, {H}, w.g3, g),
    s.g4 = upload(be, {H}, w.g4, g);
    s.alpha = upload(be, {H}, w.alpha, g), s.beta = upload(be, {H}, w.beta, g);
    for (int l = 0; l < 2; ++l) {
      auto part = [&](const std::vector<float>& all, int64_t rows, int64_t cols) {
        return std::vector<float>(all.begin() + l * rows * cols, all.begin() + (l + 1) * rows * cols);
      };
      s.wq[l] = upload(be, {qd, H}, part(w.wq, qd, H), wdt);
      s.wk[l] = upload(be, {kvd, H}, part(w.wk, kvd, H), wdt);
      s.wv[l] = upload(be, {kvd, H}, part(w.wv, kvd, H), wdt);
      s.wg[l] = upload(be, {qd, H}, part(w.wg, qd, H), wdt);
      s.wo[l] = upload(be, {H, qd}, part(w.wo, H, qd), wdt);
    }
    s.wgate = upload(be, {I2, H}, w.wgate, wdt), s.wup = upload(be, {I2, H}, w.wup, wdt);
    s.wdown = upload(be, {H, I2}, w.wdown, wdt), s.wu = upload(be, {Hm, H}, w.wu, wdt);
    s.wr = upload(be, {E, H}, w.wr, wdt), s.bias = upload(be, {E}, w.bias, g);
    s.gu = upload(be, {E, 2 * I, Hm}, w.gu, wdt), s.dn = upload(be, {E, Hm, I}, w.dn, wdt);
    s.pg = upload(be, {Hm}, w.pg, g), s.head = upload(be, {V, H}, w.head, wdt);
    // Layer 0 sliding, layer 1 full, each over its own pool of one-layer pages.
    s.cache[0].layout = KvLayout::Sliding;
    s.cache[0].k = fresh(be, DType::F32, {6, 1, BS, kvd}), s.cache[0].v = fresh(be, DType::F32, {6, 1, BS, kvd});
    s.cache[1].layout = KvLayout::Paged;
    s.cache[1].k = fresh(be, DType::F32, {12, 1, BS, kvd}), s.cache[1].v = fresh(be, DType::F32, {12, 1, BS, kvd});
    s.plan = fresh(be, DType::I32, {pb.layout().total});
  }
  const std::vector<std::vector<int64_t>> chunks = {{9, 1, 1}, {1, 5, 1}};
  const std::vector<std::vector<int32_t>> blocks = {{7, 2, 10}, {0, 9}};  // full-layer pages
  const std::vector<std::vector<int32_t>> slide = {{4, 0, 2}, {5, 1}};     // sliding-layer pages
  std::vector<int64_t> done = {0, 0};
  std::mt19937 rng(77);
  for (size_t step = 0; step < 3; ++step) {
    pb.reset();
    for (size_t q = 0; q < 2; ++q) {
      std::vector<int32_t> tok(static_cast<size_t>(chunks[q][step]));
      for (auto& t : tok) t = int32_t(rng() % uint32_t(V));
      pb.add(tok, done[q], blocks[q], slide[q], 0, false, true);
    }
    const int64_t T = pb.rows(), L = pb.logit_rows();
    std::vector<std::vector<float>> out[2];
    for (int si = 0; si < 2; ++si) {
      Side& s = sides[si];
      Backend& be = *s.b;
      be.set_input(s.plan, pb.data(), pb.upload_bytes());
      const StepPlanLayout& lay = pb.layout();
      StepPlanView view;
      view.buffer = s.plan, view.layout = lay, view.window = W, view.block_size = BS;
      view.tokens = s.plan.rows(lay.tokens, T);
      view.positions = s.plan.rows(lay.positions, T);
      view.logit_rows = s.plan.rows(lay.logit_rows, L);
      const DType f = DType::F32;
      Tensor x = fresh(be, f, {T, H}), h = fresh(be, f, {T, H}), q = fresh(be, f, {T, qd}), k = fresh(be, f, {T, kvd}),
             v = fresh(be, f, {T, kvd}), g = fresh(be, f, {T, qd}), o = fresh(be, f, {T, qd}), a = fresh(be, f, {T, H}),
             cs = fresh(be, f, {T, d / 2}), sn = fresh(be, f, {T, d / 2}), gate = fresh(be, f, {T, I2}),
             upv = fresh(be, f, {T, I2}), u = fresh(be, f, {T, Hm}), rl = fresh(be, f, {T, E}),
             ids = fresh(be, DType::I32, {T, K}), rw = fresh(be, f, {T, K}), y = fresh(be, f, {T, Hm}),
             hl = fresh(be, f, {L, H}), logits = fresh(be, f, {L, V});
      be.embed(x, s.table, view.tokens);
      be.rms_norm(h, x, s.g1, NormGain::After, 1e-6f);
      be.rope_tables(cs, sn, view.positions, 1e4, d);
      for (int l = 0; l < 2; ++l) {
        Projection ps[4] = {{s.wq[l], q}, {s.wk[l], k}, {s.wv[l], v}, {s.wg[l], g}};
        be.project(h, ps);
        be.qk_norm_rope(q, k, cs, sn, d, 1e-6f, 1.0f);
        be.attention(o, q, k, v, s.cache[l], view, d, l == 0 ? W : 0, 1.0f / std::sqrt(float(d)));
        be.kv_store(s.cache[l], k, v, view);
        be.output_gate(o, g, d, l == 1, 1e-6f);
        be.matmul(a, o, s.wo[l]);
        be.residual_norm(x, a, s.g2, NormGain::After, Tensor{}, Tensor{}, 1e-6f);
        be.rms_norm(h, x, s.g3, NormGain::After, 1e-6f);
      }
      Projection mlp[2] = {{s.wgate, gate}, {s.wup, upv}};
      be.project(h, mlp);
      be.swiglu(gate, gate, upv);
      be.matmul(a, gate, s.wdown);
      be.residual_norm(x, a, s.g4, NormGain::Before, s.alpha, s.beta, 1e-6f);
      be.rms_norm(h, x, s.g1, NormGain::After, 1e-6f);
      Projection moe[2] = {{s.wu, u}, {s.wr, rl}};
      be.project(h, moe);
      be.moe_route(ids, rw, rl, s.bias, 1.0f, 2.0f);
      be.moe_experts(y, u, s.gu, s.dn, s.pg, ids, rw, 1e-6f);
      be.rms_norm(y, y, Tensor{}, NormGain::None, 1e-6f, 16, 0.5f);
      be.gather_rows(hl, h, view.logit_rows);
      be.matmul(logits, hl, s.head);
      be.softcap(logits, 1.0f, 30.0f);
      Status st = be.execute();
      ASSERT_TRUE(st.ok()) << be.name() << ": " << st.message();
      out[si] = {fetch(be, x), fetch(be, y), fetch(be, logits), fetch(be, rw)};
      std::vector<int32_t> id(static_cast<size_t>(T * K));
      ASSERT_TRUE(be.download(ids, id.data()).ok());
      std::vector<float> idf(id.begin(), id.end());
      out[si].push_back(idf);
      for (Tensor* t : {&x, &h, &q, &k, &v, &g, &o, &a, &cs, &sn, &gate, &upv, &u, &rl, &ids, &rw, &y, &hl, &logits})
        be.release(*t);
    }
    const std::string at = " (step " + std::to_string(step) + ", weights " + dtype_label(wdt) + ")";
    EXPECT_EQ(out[0][4], out[1][4]) << "router ids differ" << at;
    expect_near_cpu("residual stream", out[0][0], out[1][0]);
    expect_near_cpu("moe output", out[0][1], out[1][1]);
    expect_near_cpu("router weights", out[0][3], out[1][3]);
    expect_near_cpu("logits", out[0][2], out[1][2]);
    for (size_t q = 0; q < 2; ++q) done[q] += chunks[q][step];
  }
}

INSTANTIATE_TEST_SUITE_P(Weights, CpuCrossCheck, ::testing::Values(DType::F32, DType::BF16),
                         [](const ::testing::TestParamInfo<DType>& i) { return std::string(dtype_label(i.param)); });

}  // namespace
}  // namespace muse::cuda_testing
