// attention + kv_store on the GPU over the hybrid cache: ring (sliding,
// wrap-around, chunks longer than the window) and paged (block tables with
// gaps), chunked prefill and decode of several sequences per step (some
// absent in some steps), short and long contexts, F32/BF16 activations and
// F32/BF16 caches, against a double reference over the whole history; and
// batch invariance of a decode row (alone vs in a batch of 64); the prefill
// kernel's rows bitwise equal to the split kernels'.
#include <numeric>

#include "cuda_test_util.h"
#include "muse/backends/step_plan.h"

namespace muse::cuda_testing {
namespace {

struct Params {
  DType act, kv;
};
class Attention : public CudaTest, public ::testing::WithParamInterface<Params> {
 public:
  DType act() const { return GetParam().act; }
  DType kv() const { return GetParam().kv; }

  // Two caches of `slots` pages holding the same random K/V (one per way
  // of running a step that is to give the same bytes).
  std::pair<KvLayerStorage, KvLayerStorage> twin_caches(KvLayout layout, int64_t slots, int64_t per, int64_t kvd,
                                                        uint32_t seed) {
    auto ck = random_floats(size_t(slots * per * kvd), seed), cv = random_floats(size_t(slots * per * kvd), seed + 1);
    KvLayerStorage c1, c2;
    c1.layout = c2.layout = layout;
    c1.k = up(kv(), {slots, 1, per, kvd}, ck), c1.v = up(kv(), {slots, 1, per, kvd}, cv);
    c2.k = up(kv(), {slots, 1, per, kvd}, ck), c2.v = up(kv(), {slots, 1, per, kvd}, cv);
    return {c1, c2};
  }

  // The plan buffer and its view for `builder`'s current step (uploaded in stream order).
  StepPlanView plan_view(const StepPlanBuilder& builder, Tensor& buffer, int64_t window, int64_t block_size) {
    const StepPlanLayout& l = builder.layout();
    if (buffer.empty()) {
      auto t = b().alloc(DType::I32, {l.total});
      EXPECT_TRUE(t.ok());
      buffer = *t;
    }
    b().set_input(buffer, builder.data(), builder.upload_bytes());
    StepPlanView v;
    v.buffer = buffer;
    v.layout = l;
    v.window = window;
    v.block_size = block_size;
    auto view = [&](int64_t off, int64_t n) {
      Tensor t = buffer.rows(off, n);
      t.shape[0] = n;
      return t;
    };
    v.tokens = view(l.tokens, l.positions - l.tokens);
    v.positions = view(l.positions, l.row_seq - l.positions);
    v.logit_rows = view(l.logit_rows, l.block_table - l.logit_rows);
    return v;
  }
};

std::string param_name(const ::testing::TestParamInfo<Params>& i) {
  return std::string("act_") + dtype_label(i.param.act) + "_kv_" + dtype_label(i.param.kv);
}

struct SeqHistory {
  std::vector<float> q, k, v;  // per position, as stored in the activation dtype
  std::vector<int64_t> chunks;  // rows per step (0: absent that step)
  std::vector<int32_t> blocks;
};

struct Case {
  std::string name;
  KvLayout layout;
  int64_t window;  // attention window (0: full)
  int64_t per;     // block size
  int64_t slots;   // pool pages
  int64_t d, hq, hk;
  std::vector<std::vector<int64_t>> chunks;
  std::vector<std::vector<int32_t>> blocks;
};

// Runs the sequences step by step (attention then kv_store) and compares
// every output row with a double reference over the full history.
void run_case(Attention& T, const Case& c) {
  Backend& b = T.b();
  const int64_t d = c.d, qd = c.hq * d, kvd = c.hk * d;
  const float scale = 1.0f / std::sqrt(float(d));
  const size_t S = c.chunks.size();
  std::vector<SeqHistory> seqs(S);
  int64_t max_rows = 0, max_blocks = 0;
  for (size_t s = 0; s < S; ++s) {
    seqs[s].chunks = c.chunks[s];
    const int64_t n = std::accumulate(seqs[s].chunks.begin(), seqs[s].chunks.end(), int64_t(0));
    if (c.layout == KvLayout::Paged) {
      seqs[s].blocks = c.blocks[s];
    } else {  // sliding table from block 0, pages of distinct sequences interleaved, descending
      const int64_t nb = (n + c.per - 1) / c.per;
      for (int64_t j = 0; j < nb; ++j) seqs[s].blocks.push_back(int32_t(c.slots - 1 - (j * int64_t(S) + int64_t(s))));
    }
    seqs[s].q = as_stored(random_floats(static_cast<size_t>(n * qd), 300 + uint32_t(s), 1.0f), T.act());
    seqs[s].k = as_stored(random_floats(static_cast<size_t>(n * kvd), 310 + uint32_t(s), 1.0f), T.act());
    seqs[s].v = as_stored(random_floats(static_cast<size_t>(n * kvd), 320 + uint32_t(s), 1.0f), T.act());
    max_blocks += int64_t(seqs[s].blocks.size());
  }
  const size_t steps = c.chunks[0].size();
  for (size_t st = 0; st < steps; ++st) {
    int64_t rows = 0;
    for (auto& s : seqs) rows += s.chunks[st];
    max_rows = std::max(max_rows, rows);
  }
  StepPlanCapacity cap;
  cap.max_rows = max_rows + 3;  // capacity larger than any step: ops must use the plan's own counts
  cap.max_seqs = int64_t(S) + 1;
  cap.max_logit_rows = int64_t(S);
  cap.max_blocks = max_blocks + 5;
  StepPlanBuilder builder(cap);
  Tensor plan_buf;
  KvLayerStorage cache;
  cache.layout = c.layout;
  {
    auto k = b.alloc(T.kv(), {c.slots, 1, c.per, kvd});
    auto v = b.alloc(T.kv(), {c.slots, 1, c.per, kvd});
    ASSERT_TRUE(k.ok() && v.ok());
    cache.k = *k, cache.v = *v;
  }
  std::vector<int64_t> done(S, 0);
  for (size_t st = 0; st < steps; ++st) {
    builder.reset();
    std::vector<float> q, k, v;
    std::vector<std::pair<size_t, int64_t>> row_of;  // (seq, position) per row
    for (size_t s = 0; s < S; ++s) {
      const int64_t n = seqs[s].chunks[st];
      if (n == 0) continue;
      std::vector<int32_t> tokens(static_cast<size_t>(n), 7);
      const std::vector<int32_t> none;
      const bool paged = c.layout == KvLayout::Paged;
      builder.add(tokens, done[s], paged ? seqs[s].blocks : none, paged ? none : seqs[s].blocks, 0, false, true);
      auto take = [&](std::vector<float>& dst, const std::vector<float>& src, int64_t w) {
        dst.insert(dst.end(), src.begin() + done[s] * w, src.begin() + (done[s] + n) * w);
      };
      take(q, seqs[s].q, qd), take(k, seqs[s].k, kvd), take(v, seqs[s].v, kvd);
      for (int64_t r = 0; r < n; ++r) row_of.push_back({s, done[s] + r});
    }
    const int64_t rows = int64_t(row_of.size());
    StepPlanView view = T.plan_view(builder, plan_buf, c.window, c.per);
    Tensor tq = T.up(T.act(), {rows, qd}, q), tk = T.up(T.act(), {rows, kvd}, k), tv = T.up(T.act(), {rows, kvd}, v);
    Tensor out = T.poisoned(T.act(), {rows, qd});
    b.attention(out, tq, tk, tv, cache, view, d, c.window, scale);
    b.kv_store(cache, tk, tv, view);
    T.run();
    auto got = T.get(out);
    std::vector<double> want, tol;
    for (int64_t r = 0; r < rows; ++r) {
      const auto [s, p] = row_of[size_t(r)];
      const auto& h = seqs[s];
      const int64_t lo = c.window > 0 ? std::max<int64_t>(0, p - c.window + 1) : 0;
      const int64_t nkeys = p - lo + 1;
      // Keys before this step were stored in the cache's dtype.
      auto key = [&](const std::vector<float>& src, int64_t j, int64_t i) {
        const float x = src[size_t(j * kvd + i)];
        return j < done[s] && T.kv() == DType::BF16 ? double(round_bf16(x)) : double(x);
      };
      for (int64_t hh = 0; hh < c.hq; ++hh) {
        const int64_t off = (hh / (c.hq / c.hk)) * d;
        std::vector<double> sc(static_cast<size_t>(nkeys));
        double mx = -INFINITY, smax = 0;
        for (int64_t j = lo; j <= p; ++j) {
          double dot = 0, mag = 0;
          for (int64_t i = 0; i < d; ++i) {
            const double t = double(h.q[size_t(p * qd + hh * d + i)]) * key(h.k, j, off + i);
            dot += t, mag += std::fabs(t);
          }
          sc[size_t(j - lo)] = dot * scale;
          smax = std::max(smax, mag * scale);
          mx = std::max(mx, sc[size_t(j - lo)]);
        }
        double sum = 0;
        for (auto& x : sc) x = std::exp(x - mx), sum += x;
        for (int64_t i = 0; i < d; ++i) {
          double o = 0, mag = 0;
          for (int64_t j = lo; j <= p; ++j) {
            const double pj = sc[size_t(j - lo)] / sum, vj = key(h.v, j, off + i);
            o += pj * vj, mag += pj * std::fabs(vj);
          }
          want.push_back(o);
          // Scores: a d-term fp32 dot and the scale (error (d+2)u·smax each,
          // doubled through the softmax); exp, the online rescaling and the
          // per-lane sums over nkeys/8 keys; the final merge and divide.
          // The tensor-core kernel (all BF16, heads of 64 or 128) rounds the
          // softmax weights to bf16 for the P·V product: at most 2^-8 (bf16's
          // unit roundoff) of each term.
          const bool mma = T.act() == DType::BF16 && T.kv() == DType::BF16 && (d == 64 || d == 128) &&
                           c.hq / c.hk <= 16;
          tol.push_back(kU * mag * (2.0 * double(d + 2) * smax + double(nkeys) / 8 + 64) +
                        (mma ? 1.01 * std::ldexp(mag, -8) : 0.0));
        }
      }
    }
    expect_close("attention", got, want, tol, T.act() == DType::BF16, c.name + " step " + std::to_string(st));
    for (size_t s = 0; s < S; ++s) done[s] += seqs[s].chunks[st];
  }
}

TEST_P(Attention, SlidingWithChunksLongerThanTheWindow) {
  Case c{"sliding", KvLayout::Sliding, 5, 4, 48, 36, 4, 2,
         {{7, 1, 1, 6, 1, 3}, {1, 1, 4, 1, 1, 1}, {0, 2, 0, 9, 1, 0}}, {}};
  run_case(*this, c);
}

TEST_P(Attention, PagedBlockTablesWithGaps) {
  Case c{"paged", KvLayout::Paged, 0, 4, 16, 64, 4, 1,
         {{7, 1, 1, 6, 1, 3}, {1, 1, 4, 1, 1, 1}, {0, 3, 0, 2, 1, 5}},
         {{5, 2, 7, 0, 9}, {1, 3, 14}, {15, 6, 11, 8}}};
  run_case(*this, c);
}

TEST_P(Attention, HeadDim256AndGroupOfEight) {
  Case c{"d256", KvLayout::Paged, 0, 8, 8, 256, 8, 1, {{13, 1, 2}, {2, 1, 1}}, {{3, 6}, {7}}};
  run_case(*this, c);
}

TEST_P(Attention, LongContextSliding) {
  Case c{"long sliding", KvLayout::Sliding, 200, 16, 128, 128, 8, 2, {{150, 330, 1, 1, 100, 1}, {1, 1, 260, 1, 1, 40}}, {}};
  run_case(*this, c);
}

TEST_P(Attention, LongContextPaged) {
  std::vector<int32_t> b0, b1;
  for (int i = 0; i < 40; ++i) b0.push_back(int32_t(79 - 2 * i));  // every other block, descending
  for (int i = 0; i < 20; ++i) b1.push_back(int32_t(2 * i + 2));
  Case c{"long paged", KvLayout::Paged, 0, 16, 80, 128, 8, 2, {{300, 300, 1, 1, 1}, {1, 200, 1, 100, 1}}, {b0, b1}};
  run_case(*this, c);
}

// A decode row alone vs the same row inside a batch of 64 unrelated
// sequences: bitwise equal (full and sliding tables).
TEST_P(Attention, DecodeRowIsBatchInvariant) {
  const int64_t d = 128, hq = 8, hk = 2, kvd = hk * d, qd = hq * d, B = 64, at = 20;
  for (KvLayout layout : {KvLayout::Paged, KvLayout::Sliding}) {
    const bool paged = layout == KvLayout::Paged;
    const int64_t per = 16, slots = 400, window = paged ? 0 : 128;
    KvLayerStorage cache;
    cache.layout = layout;
    auto ck = random_floats(static_cast<size_t>(slots * per * kvd), 900), cv = random_floats(static_cast<size_t>(slots * per * kvd), 901);
    cache.k = up(kv(), {slots, 1, per, kvd}, ck);
    cache.v = up(kv(), {slots, 1, per, kvd}, cv);
    std::mt19937 rng(902);
    std::vector<int64_t> len(static_cast<size_t>(B));
    std::vector<std::vector<int32_t>> blocks(static_cast<size_t>(B));
    for (int64_t s = 0; s < B; ++s) {
      len[size_t(s)] = s == at ? 300 : int64_t(rng() % 500);
      const int64_t nb = (len[size_t(s)] + 1 + per - 1) / per;
      for (int64_t i = 0; i < nb; ++i) blocks[size_t(s)].push_back(int32_t(rng() % uint32_t(slots)));
    }
    auto q = random_floats(static_cast<size_t>(B * qd), 903), k = random_floats(static_cast<size_t>(B * kvd), 904),
         v = random_floats(static_cast<size_t>(B * kvd), 905);
    Tensor tq = up(act(), {B, qd}, q), tk = up(act(), {B, kvd}, k), tv = up(act(), {B, kvd}, v);
    StepPlanCapacity cap{B, B, B, 64 * 40};
    StepPlanBuilder batch(cap), alone(cap);
    for (int64_t s = 0; s < B; ++s) {
      std::vector<int32_t> tok = {1};
      const std::vector<int32_t> none;
      const std::vector<int32_t>& bl = blocks[size_t(s)];
      batch.add(tok, len[size_t(s)], paged ? bl : none, paged ? none : bl, 0, false, true);
      if (s == at) alone.add(tok, len[size_t(s)], paged ? bl : none, paged ? none : bl, 0, false, true);
    }
    Tensor buf_b, buf_a;
    StepPlanView vb = plan_view(batch, buf_b, window, per);
    StepPlanView va = plan_view(alone, buf_a, window, per);
    Tensor ob = poisoned(act(), {B, qd}), oa = poisoned(act(), {1, qd}), ob2 = poisoned(act(), {B, qd});
    b().attention(ob, tq, tk, tv, cache, vb, d, window, 0.088f);
    b().attention(oa, tq.rows(at, 1), tk.rows(at, 1), tv.rows(at, 1), cache, va, d, window, 0.088f);
    b().attention(ob2, tq, tk, tv, cache, vb, d, window, 0.088f);
    run();
    auto rb = get_bytes(ob), ra = get_bytes(oa), rb2 = get_bytes(ob2);
    const size_t row = size_t(qd) * ob.element_bytes();
    EXPECT_EQ(0, std::memcmp(rb.data() + size_t(at) * row, ra.data(), row))
        << (paged ? "paged" : "sliding") << ": the decode row differs alone and in a batch of 64";
    EXPECT_EQ(rb, rb2) << "the same attention twice differs";
  }
}

// B decode rows (sequence 3 with nothing cached) and one sequence of `chunk`
// rows, at random lengths below 300, over pages handed out in order; the
// step's row count.
int64_t add_rows_and_chunk(StepPlanBuilder& pb, int64_t B, int64_t chunk, int64_t per, int64_t slots, bool paged,
                           uint32_t seed) {
  std::mt19937 rng(seed);
  int64_t rows = 0, used = 0;
  for (int64_t s = 0; s <= B; ++s) {
    const int64_t n = s == B ? chunk : 1, len = s == 3 ? 0 : 1 + int64_t(rng() % 300);
    std::vector<int32_t> tok(size_t(n), 1), bl;
    for (int64_t i = 0; i < (len + n + per - 1) / per; ++i) bl.push_back(int32_t(used++ % slots));
    const std::vector<int32_t> none;
    pb.add(tok, len, paged ? bl : none, paged ? none : bl, 0, false, true);
    rows += n;
  }
  return rows;
}

// attention_store_gate (the split path's merge gating its outputs and
// storing the step's k/v; with a 70-row chunk in BF16 the prefill kernel
// gating them, kv_store after it) against attention, kv_store and
// output_gate run one after another: the same output and cache bytes, with
// and without the head norm, paged and sliding, decode rows and a 5- or
// 70-row chunk.
TEST_P(Attention, StoreGateFusedGivesTheSameBits) {
  const int64_t d = 128, hq = 8, hk = 2, kvd = hk * d, qd = hq * d, B = 12;
  for (int64_t chunk : {int64_t(5), int64_t(70)})
    for (KvLayout layout : {KvLayout::Paged, KvLayout::Sliding})
      for (bool head_norm : {false, true}) {
        const bool paged = layout == KvLayout::Paged;
        const int64_t per = 16, slots = 400, window = paged ? 0 : 96;
        auto [c1, c2] = twin_caches(layout, slots, per, kvd, 940);
        StepPlanBuilder pb(StepPlanCapacity{B + chunk, B + 1, B + chunk, 64 * 40});
        const int64_t rows = add_rows_and_chunk(pb, B, chunk, per, slots, paged, 942);
        auto q = random_floats(size_t(rows * qd), 943), k = random_floats(size_t(rows * kvd), 944),
             v = random_floats(size_t(rows * kvd), 945), g = random_floats(size_t(rows * qd), 946, 3.0f);
        Tensor tq = up(act(), {rows, qd}, q), tk = up(act(), {rows, kvd}, k), tv = up(act(), {rows, kvd}, v),
               tg = up(act(), {rows, qd}, g);
        Tensor buf;
        StepPlanView view = plan_view(pb, buf, window, per);
        view.max_seq_rows = pb.max_seq_rows(), view.max_seq_end = pb.max_seq_end();
        Tensor o1 = poisoned(act(), {rows, qd}), o2 = poisoned(act(), {rows, qd});
        b().attention(o1, tq, tk, tv, c1, view, d, window, 0.088f);
        b().kv_store(c1, tk, tv, view);
        b().output_gate(o1, tg, d, head_norm, 1e-6f);
        b().attention_store_gate(o2, tq, tk, tv, c2, view, d, window, 0.088f, {tg, head_norm, 1e-6f});
        run();
        const std::string what = std::string(paged ? "paged" : "sliding") + (head_norm ? ", head norm" : "") +
                                 ", chunk " + std::to_string(chunk);
        EXPECT_EQ(get_bytes(o1), get_bytes(o2)) << what << ": the fused output differs";
        EXPECT_EQ(get_bytes(c1.k), get_bytes(c2.k)) << what << ": the fused K cache differs";
        EXPECT_EQ(get_bytes(c1.v), get_bytes(c2.v)) << what << ": the fused V cache differs";
      }
}

// The output gate's product inside the attention op (OutputGate::x,
// weight; MuseModel::attention_block at 1..4 rows): launched between the
// chunk kernel and the merge, reading x without waiting and waiting for the
// chunks before it exits. The same gate, output and cache bytes as the
// product run before attention, with and without the head norm, paged and
// sliding, eager and recorded; the gate is poisoned before each step, so a
// merge that read it early shows.
TEST_P(Attention, GateProductInAttentionGivesTheSameBits) {
  // A gate of 8192 rows (Spark's; the rule takes gates that fill a wave)
  const int64_t d = 128, hq = 64, hk = 4, kvd = hk * d, qd = hq * d, B = 3, K = 1024;
  for (KvLayout layout : {KvLayout::Paged, KvLayout::Sliding})
    for (bool head_norm : {false, true}) {
      const bool paged = layout == KvLayout::Paged;
      const int64_t per = 16, slots = 400, window = paged ? 0 : 96;
      auto [c1, c2] = twin_caches(layout, slots, per, kvd, 980);
      StepPlanBuilder pb(StepPlanCapacity{B + 1, B + 1, B + 1, 64 * 40});
      const int64_t rows = add_rows_and_chunk(pb, B, 1, per, slots, paged, 982);  // 4 one-row sequences
      auto q = random_floats(size_t(rows * qd), 983), k = random_floats(size_t(rows * kvd), 984),
           v = random_floats(size_t(rows * kvd), 985), h = random_floats(size_t(rows * K), 986),
           w = random_floats(size_t(qd * K), 987, 0.05f);
      Tensor tq = up(act(), {rows, qd}, q), tk = up(act(), {rows, kvd}, k), tv = up(act(), {rows, kvd}, v),
             th = up(DType::BF16, {rows, K}, h), tw = up(DType::BF16, {qd, K}, w);
      EXPECT_TRUE(b().gate_in_attention(th, tw)) << "a BF16 product of " << rows << " rows runs inside attention";
      Tensor buf;
      StepPlanView view = plan_view(pb, buf, window, per);
      view.max_seq_rows = pb.max_seq_rows(), view.max_seq_end = pb.max_seq_end();
      Tensor g1 = poisoned(act(), {rows, qd}), o1 = poisoned(act(), {rows, qd});
      b().matmul(g1, th, tw);
      b().attention_store_gate(o1, tq, tk, tv, c1, view, d, window, 0.088f, {g1, head_norm, 1e-6f});
      run();
      const std::vector<uint8_t> want[] = {get_bytes(g1), get_bytes(o1), get_bytes(c1.k), get_bytes(c1.v)};
      Tensor g2 = poisoned(act(), {rows, qd}), o2 = poisoned(act(), {rows, qd});
      for (int step = 0; step < 3; ++step) {  // recorded at the second, replayed at the third (graphs on)
        std::vector<uint8_t> nan(g2.bytes(), 0xff);
        b().set_input(g2, nan.data(), nan.size());
        b().set_input(o2, nan.data(), nan.size());
        b().begin_graph(0x6a7e0001u + uint64_t(paged) + 2 * uint64_t(head_norm));
        b().attention_store_gate(o2, tq, tk, tv, c2, view, d, window, 0.088f, {g2, head_norm, 1e-6f, &th, &tw});
        b().end_graph();
        run();
        const std::string what = std::string(paged ? "paged" : "sliding") + (head_norm ? ", head norm" : "") +
                                 ", step " + std::to_string(step);
        const char* names[] = {"gate", "output", "K cache", "V cache"};
        const std::vector<uint8_t> got[] = {get_bytes(g2), get_bytes(o2), get_bytes(c2.k), get_bytes(c2.v)};
        for (size_t i = 0; i < 4; ++i) EXPECT_EQ(got[i], want[i]) << what << ": the " << names[i] << " differs";
      }
    }
}

// Above 16 rows the fused merge (and the gating prefill kernel, a 70-row
// chunk) also writes its outputs in the wgmma products' order for the o
// projection after it (which then skips its permute): the same output,
// cache and product bytes as with an op between them (the product permutes
// the output itself), with and without the head norm, paged and sliding,
// 20 decode rows and a 5- or 70-row chunk.
TEST_P(Attention, StoreGateWritesTheProductsX) {
  const int64_t d = 128, hq = 8, hk = 2, kvd = hk * d, qd = hq * d, B = 20, N = 72;
  for (int64_t chunk : {int64_t(5), int64_t(70)})
    for (KvLayout layout : {KvLayout::Paged, KvLayout::Sliding})
      for (bool head_norm : {false, true}) {
        const bool paged = layout == KvLayout::Paged;
        const int64_t per = 16, slots = 400, window = paged ? 0 : 96;
        auto ck = random_floats(size_t(slots * per * kvd), 960), cv = random_floats(size_t(slots * per * kvd), 961);
        StepPlanBuilder pb(StepPlanCapacity{B + chunk, B + 1, B + chunk, 64 * 40});
        const int64_t rows = add_rows_and_chunk(pb, B, chunk, per, slots, paged, 962);
        auto q = random_floats(size_t(rows * qd), 963), k = random_floats(size_t(rows * kvd), 964),
             v = random_floats(size_t(rows * kvd), 965), g = random_floats(size_t(rows * qd), 966, 3.0f);
        auto w = random_floats(size_t(N * qd), 967, 0.05f), d8 = random_floats(8, 968);
        Tensor tq = up(act(), {rows, qd}, q), tk = up(act(), {rows, kvd}, k), tv = up(act(), {rows, kvd}, v),
               tg = up(act(), {rows, qd}, g), tw = up(DType::BF16, {N, qd}, w), dummy = up(act(), {1, 8}, d8);
        Tensor buf;
        StepPlanView view = plan_view(pb, buf, window, per);
        view.max_seq_rows = pb.max_seq_rows(), view.max_seq_end = pb.max_seq_end();
        std::vector<std::vector<uint8_t>> res[2];
        for (int between = 0; between < 2; ++between) {
          KvLayerStorage c;
          c.layout = layout;
          c.k = up(kv(), {slots, 1, per, kvd}, ck), c.v = up(kv(), {slots, 1, per, kvd}, cv);
          Tensor o = poisoned(act(), {rows, qd}), p = poisoned(DType::F32, {rows, N});
          b().attention_store_gate(o, tq, tk, tv, c, view, d, window, 0.088f, {tg, head_norm, 1e-6f});
          if (between) b().swiglu(dummy, dummy, dummy);  // an op between: the product permutes o itself
          b().matmul(p, o, tw);
          run();
          res[between] = {get_bytes(o), get_bytes(p), get_bytes(c.k), get_bytes(c.v)};
        }
        const std::string what = std::string(paged ? "paged" : "sliding") + (head_norm ? ", head norm" : "") +
                                 ", chunk " + std::to_string(chunk);
        const char* names[] = {"output", "o product", "K cache", "V cache"};
        for (size_t i = 0; i < 4; ++i) EXPECT_EQ(res[0][i], res[1][i]) << what << ": the " << names[i] << " differs";
      }
}

// The split path's two merges (CudaBackendOptions::attention_merge 2: a
// warp a row and q head, 1: a block of 128 threads) give the same
// output, cache and o-product bytes: heads of 128 and 64 (the tensor-core
// chunks when BF16) and of 80 and 256 (lanes with dims past the head), the
// plain merge, the gate with and without its head norm and the store of
// the step's k/v, paged and sliding, 20 decode rows beside a 5-row chunk
// (the merge also writes the o product's permuted x) and a row 5,000 keys
// in (40 chunks: more chunks than a warp has lanes).
TEST_P(Attention, WarpMergeGivesTheBlockMergeBits) {
  CudaBackendOptions bo;
  bo.attention_merge = 1;
  auto blk = backend_with(bo);
  bo.attention_merge = 2;
  auto wrp = backend_with(bo);
  ASSERT_TRUE(blk && wrp);
  struct Shape {
    int64_t d, hq, hk;
  };
  const int64_t B = 20, chunk = 5, per = 16, slots = 1024, N = 40, far = 5000;
  for (const Shape sh : {Shape{128, 32, 2}, Shape{64, 16, 2}, Shape{80, 8, 2}, Shape{256, 8, 1}})
    for (KvLayout layout : {KvLayout::Paged, KvLayout::Sliding})
      for (int tail = 0; tail < 3; ++tail) {  // 0: attention alone; 1: gate and store; 2: the gate's head norm too
        const bool paged = layout == KvLayout::Paged;
        const int64_t d = sh.d, qd = sh.hq * d, kvd = sh.hk * d, window = paged ? 0 : 4500;
        auto [c1, c2] = twin_caches(layout, slots, per, kvd, 990);
        StepPlanBuilder pb(StepPlanCapacity{B + chunk + 1, B + 2, B + chunk + 1, 1024});
        int64_t rows = add_rows_and_chunk(pb, B, chunk, per, slots / 2, paged, 991);
        {  // the far row, on pages of its own
          std::vector<int32_t> bl;
          for (int64_t i = 0; i <= far / per; ++i) bl.push_back(int32_t(slots / 2 + i));
          const std::vector<int32_t> tok = {1}, none;
          pb.add(tok, far, paged ? bl : none, paged ? none : bl, 0, false, true);
          rows += 1;
        }
        auto q = random_floats(size_t(rows * qd), 992), k = random_floats(size_t(rows * kvd), 993),
             v = random_floats(size_t(rows * kvd), 994), g = random_floats(size_t(rows * qd), 995, 3.0f);
        auto w = random_floats(size_t(N * qd), 996, 0.05f);
        Tensor tq = up(act(), {rows, qd}, q), tk = up(act(), {rows, kvd}, k), tv = up(act(), {rows, kvd}, v),
               tg = up(act(), {rows, qd}, g), tw = up(DType::BF16, {N, qd}, w);
        Tensor buf;
        StepPlanView view = plan_view(pb, buf, window, per);
        view.max_seq_rows = pb.max_seq_rows(), view.max_seq_end = pb.max_seq_end();
        std::vector<uint8_t> res[2][4];
        for (int which = 0; which < 2; ++which) {
          Backend& be = which == 0 ? *wrp : *blk;  // each its own outputs, queue and downloads
          KvLayerStorage& c = which == 0 ? c1 : c2;
          auto o = be.alloc(act(), {rows, qd}), p = be.alloc(DType::F32, {rows, N});
          ASSERT_TRUE(o.ok() && p.ok());
          for (const Tensor& t : {*o, *p}) {
            std::vector<uint8_t> nan(t.bytes(), 0xff);
            be.set_input(t, nan.data(), nan.size());
          }
          if (tail == 0) be.attention(*o, tq, tk, tv, c, view, d, window, 0.088f);
          else be.attention_store_gate(*o, tq, tk, tv, c, view, d, window, 0.088f, {tg, tail == 2, 1e-6f});
          be.matmul(*p, *o, tw);
          ASSERT_TRUE(be.execute().ok());
          const Tensor* ts[] = {&*o, &*p, &c.k, &c.v};
          for (size_t i = 0; i < 4; ++i) {
            res[which][i].resize(ts[i]->bytes());
            ASSERT_TRUE(be.download(*ts[i], res[which][i].data()).ok());
          }
          be.release(*o), be.release(*p);
        }
        const std::string what = "d " + std::to_string(d) + (paged ? ", paged" : ", sliding") +
                                 (tail == 0 ? "" : tail == 1 ? ", gate" : ", gate with head norm");
        const char* names[] = {"output", "o product", "K cache", "V cache"};
        for (size_t i = 0; i < 4; ++i) EXPECT_EQ(res[0][i], res[1][i]) << what << ": the " << names[i] << " differs";
      }
}

// Steps of at least 64 rows (all BF16) run the prefill kernel; the same
// rows replayed as single-row sequences, fewer than 64 a step, run the
// split kernels. Every row's bytes must be equal: chunked prefill and
// prefix caching give the same tokens whatever the step. Cache history
// before the step, several sequences (blocks of 8 rows across sequence
// boundaries), full and sliding layers, heads of 64 and 128, groups of 16
// and fewer, 64 to 300 rows, and a context past 32768 keys (chunks of more
// than 4 tiles: the kernel's per-row mode).
TEST_P(Attention, PrefillMatchesSplitBitwise) {
  if (act() != DType::BF16 || kv() != DType::BF16) GTEST_SKIP() << "the prefill kernel is the all-BF16 one";
  struct Shape {
    const char* name;
    KvLayout layout;
    int64_t window, d, hq, hk;
    std::vector<std::pair<int64_t, int64_t>> seqs;  // (positions in the cache, rows in the step)
  };
  const std::vector<Shape> shapes = {
      {"full d128 g16", KvLayout::Paged, 0, 128, 32, 2, {{37, 150}, {0, 1}, {200, 77}, {5, 9}}},
      {"full d64 g16, 64 rows", KvLayout::Paged, 0, 64, 16, 1, {{500, 64}}},
      {"sliding d64 g3", KvLayout::Sliding, 100, 64, 12, 4, {{0, 300}}},
      {"sliding d128 g8", KvLayout::Sliding, 37, 128, 8, 1, {{60, 70}, {3, 1}, {0, 40}}},
      {"sliding d128 g16", KvLayout::Sliding, 300, 128, 16, 1, {{400, 120}, {2, 3}}},
      {"full d64 g16, 33K keys", KvLayout::Paged, 0, 64, 16, 1, {{33000, 70}}},
  };
  const int64_t per = 16, kGroup = 63;  // replay rows per step: below the prefill threshold
  for (const Shape& c : shapes) {
    SCOPED_TRACE(c.name);
    const bool paged = c.layout == KvLayout::Paged;
    const int64_t d = c.d, qd = c.hq * d, kvd = c.hk * d;
    const float scale = 1.0f / std::sqrt(float(d));
    std::vector<std::vector<int32_t>> pages;
    int64_t slots = 0, T = 0, max_nb = 0;
    for (const auto& [hist, rows] : c.seqs) {
      const int64_t nb = (hist + rows + per - 1) / per;
      pages.emplace_back(size_t(nb));
      slots += nb, T += rows, max_nb = std::max(max_nb, nb);
    }
    slots += 3;
    std::vector<int32_t> perm(static_cast<size_t>(slots));
    std::iota(perm.begin(), perm.end(), 0);
    std::shuffle(perm.begin(), perm.end(), std::mt19937(77));
    size_t next = 0;
    for (auto& pg : pages)
      for (auto& x : pg) x = perm[next++];
    KvLayerStorage cache;
    cache.layout = c.layout;
    auto ck = random_floats(size_t(slots * per * kvd), 610), cv = random_floats(size_t(slots * per * kvd), 611);
    cache.k = up(kv(), {slots, 1, per, kvd}, ck);
    cache.v = up(kv(), {slots, 1, per, kvd}, cv);
    auto q = random_floats(size_t(T * qd), 612), k = random_floats(size_t(T * kvd), 613),
         v = random_floats(size_t(T * kvd), 614);
    Tensor tq = up(act(), {T, qd}, q), tk = up(act(), {T, kvd}, k), tv = up(act(), {T, kvd}, v);
    StepPlanCapacity cap{T + 1, std::max<int64_t>(int64_t(c.seqs.size()), kGroup) + 1, T + kGroup,
                         (kGroup + int64_t(c.seqs.size())) * max_nb};
    StepPlanBuilder step(cap);
    step.reset();
    std::vector<std::pair<size_t, int64_t>> row_of;  // (sequence, position) per row
    const std::vector<int32_t> none;
    for (size_t s = 0; s < c.seqs.size(); ++s) {
      const auto [hist, rows] = c.seqs[s];
      std::vector<int32_t> tokens(size_t(rows), 7);
      step.add(tokens, hist, paged ? pages[s] : none, paged ? none : pages[s], 0, false, true);
      for (int64_t r = 0; r < rows; ++r) row_of.push_back({s, hist + r});
    }
    Tensor plan_buf;
    StepPlanView view = plan_view(step, plan_buf, c.window, per);
    Tensor out = poisoned(act(), {T, qd});
    b().attention(out, tq, tk, tv, cache, view, d, c.window, scale);
    b().kv_store(cache, tk, tv, view);  // the replay reads the step's keys from the cache
    run();
    const auto prefill = get_bytes(out);
    const size_t row_bytes = size_t(qd) * out.element_bytes();
    Tensor replay_buf;
    int64_t mismatched = 0, first_bad = -1;
    for (int64_t r0 = 0; r0 < T; r0 += kGroup) {
      const int64_t n = std::min(kGroup, T - r0);
      StepPlanBuilder one(cap);
      one.reset();
      std::vector<float> gq, gk, gv;
      for (int64_t r = r0; r < r0 + n; ++r) {
        const auto [s, p] = row_of[size_t(r)];
        const std::vector<int32_t> tok = {7};
        one.add(tok, p, paged ? pages[s] : none, paged ? none : pages[s], 0, false, true);
        gq.insert(gq.end(), q.begin() + r * qd, q.begin() + (r + 1) * qd);
        gk.insert(gk.end(), k.begin() + r * kvd, k.begin() + (r + 1) * kvd);
        gv.insert(gv.end(), v.begin() + r * kvd, v.begin() + (r + 1) * kvd);
      }
      Tensor rq = up(act(), {n, qd}, gq), rk = up(act(), {n, kvd}, gk), rv = up(act(), {n, kvd}, gv);
      Tensor rout = poisoned(act(), {n, qd});
      b().attention(rout, rq, rk, rv, cache, plan_view(one, replay_buf, c.window, per), d, c.window, scale);
      run();
      const auto split = get_bytes(rout);
      for (int64_t r = 0; r < n; ++r)
        if (std::memcmp(prefill.data() + size_t(r0 + r) * row_bytes, split.data() + size_t(r) * row_bytes,
                        row_bytes) != 0) {
          ++mismatched;
          if (first_bad < 0) first_bad = r0 + r;
        }
    }
    EXPECT_EQ(mismatched, 0) << c.name << ": " << mismatched << " of " << T
                             << " rows differ between the prefill and split kernels, first row " << first_bad;
  }
}

// The plan's max_seq_end hint trims the split path's chunk blocks to those
// some row has: the same bytes as without the hint; a hint too small for a
// row is reported, not silently wrong.
TEST_P(Attention, ChunkHintKeepsBitsAndCatchesWrongHints) {
  const int64_t d = 64, hq = 4, hk = 1, kvd = hk * d, qd = hq * d, per = 16, slots = 48, at = 700;
  KvLayerStorage cache;
  cache.layout = KvLayout::Paged;
  auto ck = random_floats(size_t(slots * per * kvd), 620), cv = random_floats(size_t(slots * per * kvd), 621);
  cache.k = up(kv(), {slots, 1, per, kvd}, ck);
  cache.v = up(kv(), {slots, 1, per, kvd}, cv);
  std::vector<int32_t> blocks;
  for (int64_t i = 0; i < (at + per) / per; ++i) blocks.push_back(int32_t(slots - 1 - i));
  auto q = random_floats(size_t(qd), 622), k = random_floats(size_t(kvd), 623), v = random_floats(size_t(kvd), 624);
  Tensor tq = up(act(), {1, qd}, q), tk = up(act(), {1, kvd}, k), tv = up(act(), {1, kvd}, v);
  StepPlanBuilder pb(StepPlanCapacity{1, 1, 1, 64});
  const std::vector<int32_t> tok = {1};
  pb.add(tok, at, blocks, {}, 0, false, true);
  EXPECT_EQ(pb.max_seq_rows(), 1);
  EXPECT_EQ(pb.max_seq_end(), at + 1);
  Tensor buf;
  StepPlanView plain = plan_view(pb, buf, 0, per), hinted = plain;
  hinted.max_seq_rows = pb.max_seq_rows(), hinted.max_seq_end = pb.max_seq_end();
  Tensor o1 = poisoned(act(), {1, qd}), o2 = poisoned(act(), {1, qd});
  b().attention(o1, tq, tk, tv, cache, plain, d, 0, 0.125f);
  b().attention(o2, tq, tk, tv, cache, hinted, d, 0, 0.125f);
  run();
  EXPECT_EQ(get_bytes(o1), get_bytes(o2)) << "the chunk hint changed a result";
  StepPlanView wrong = hinted;
  wrong.max_seq_end = 100;  // 2 chunk blocks for a row with 11
  b().attention(o2, tq, tk, tv, cache, wrong, d, 0, 0.125f);
  Status s = b().execute();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("max_seq_end"), std::string::npos) << s.message();
  // The failed step leaves nothing behind: the next steps give the same
  // bytes, twice.
  const std::vector<uint8_t> want = get_bytes(o1);
  for (int rep = 0; rep < 2; ++rep) {
    b().attention(o2, tq, tk, tv, cache, hinted, d, 0, 0.125f);
    ASSERT_TRUE(b().execute().ok());
    EXPECT_EQ(get_bytes(o2), want) << "after the failed step, run " << rep;
  }
}

// The prefill kernel against the double reference (steps of 64 rows and
// more; groups of 16 q heads, heads of 64 and 128, full and sliding).
TEST_P(Attention, PrefillGroupOfSixteen) {
  Case c{"prefill paged g16", KvLayout::Paged, 0, 16, 64, 64, 32, 2,
         {{70, 1, 130}, {5, 1, 0}}, {{3, 9, 27, 41, 50, 12, 6, 33, 60, 1, 17, 22, 45}, {58}}};
  run_case(*this, c);
  Case s{"prefill sliding g16", KvLayout::Sliding, 50, 16, 48, 128, 16, 1, {{100, 1, 90}, {1, 0, 2}}, {}};
  run_case(*this, s);
}

TEST_P(Attention, BadBlockIdIsAnErrorNotAFault) {
  const int64_t d = 64, kvd = d;
  KvLayerStorage cache;
  cache.layout = KvLayout::Paged;
  cache.k = *b().alloc(kv(), {4, 1, 4, kvd});
  cache.v = *b().alloc(kv(), {4, 1, 4, kvd});
  StepPlanBuilder pb(StepPlanCapacity{4, 1, 1, 4});
  std::vector<int32_t> tok = {1};
  std::vector<int32_t> blocks = {0, 9};  // position 5 lives in block 9 of a 4-block pool
  pb.add(tok, 5, blocks, {}, 0, false, true);
  Tensor buf;
  StepPlanView view = plan_view(pb, buf, 0, 4);
  auto q = random_floats(static_cast<size_t>(d), 1), k = random_floats(static_cast<size_t>(kvd), 2);
  Tensor tq = up(act(), {1, d}, q), tk = up(act(), {1, kvd}, k);
  Tensor out = poisoned(act(), {1, d});
  b().kv_store(cache, tk, tk, view);
  Status s = b().execute();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("kv_store"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("block id 9"), std::string::npos) << s.message();
  b().attention(out, tq, tk, tk, cache, plan_view(pb, buf, 0, 4), d, 0, 0.1f);
  s = b().execute();
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("attention"), std::string::npos) << s.message();
}

INSTANTIATE_TEST_SUITE_P(Dtypes, Attention,
                         ::testing::Values(Params{DType::F32, DType::F32}, Params{DType::F32, DType::BF16},
                                           Params{DType::BF16, DType::BF16}, Params{DType::BF16, DType::F32}),
                         param_name);

}  // namespace
}  // namespace muse::cuda_testing
