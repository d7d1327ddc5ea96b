// The sigmoid router and the latent experts.
//
// Experts run per token: rows choosing expert e are gathered and multiplied
// by e's weights (so prefill reads each chosen expert once per step, and
// decode reads exactly the k chosen ones), then each row's k outputs are
// normed and summed in the router's order. Every value is computed by the
// same kernel sequence whatever the grouping, so a token's result does not
// depend on which other tokens share the step.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "muse/backends/cpu/cpu_backend_impl.h"

namespace muse::cpu {

void CpuBackend::moe_route(const Tensor& ids, const Tensor& weights, const Tensor& logits, const Tensor& bias,
                           float multiplier, float scaling) {
  const int64_t E = logits.cols(), K = ids.cols();
  if (!MUSE_CPU_CHECK(ids.dtype == DType::I32 && weights.dtype == DType::F32 && logits.dtype == DType::F32 &&
                 ids.numel() == weights.numel() && ids.rows() == logits.rows() && K >= 1 && K <= E &&
                 (bias.empty() || (bias.dtype == DType::F32 && bias.numel() == E)),
             "moe_route", describe(logits) + " -> " + describe(ids)))
    return;
  enqueue(__func__, [this, ids, weights, logits, bias, multiplier, scaling, E, K] {
    reserve_scratch(size_t(E) * 2 * sizeof(float));
    pool_.run(logits.rows(), [&](int64_t t, int thread) {
      const float* z = static_cast<const float*>(logits.data) + t * E;
      const float* b = static_cast<const float*>(bias.data);
      float* p = reinterpret_cast<float*>(scratch(thread));
      float* sel = p + E;  // selection score; -inf once taken
      for (int64_t e = 0; e < E; ++e) {
        p[e] = 1.0f / (1.0f + std::exp(-(z[e] * multiplier)));
        sel[e] = b ? p[e] + b[e] : p[e];
      }
      int32_t* id = static_cast<int32_t*>(ids.data) + t * K;
      float* w = static_cast<float*>(weights.data) + t * K;
      float sum = 0.0f;
      for (int64_t k = 0; k < K; ++k) {
        int64_t best = -1;
        for (int64_t e = 0; e < E; ++e)  // strictly greater: ties go to the lower index
          if (sel[e] != -INFINITY && (best < 0 || sel[e] > sel[best])) best = e;
        if (best < 0) best = 0;  // all NaN: degenerate, keep a valid id
        sel[best] = -INFINITY;
        id[k] = int32_t(best);
        w[k] = p[best];
        sum += p[best];
      }
      const float denom = sum + 1e-15f;
      for (int64_t k = 0; k < K; ++k) w[k] = w[k] / denom * scaling;
    });
  });
}

void CpuBackend::moe_experts(const Tensor& out, const Tensor& u, const Tensor& gate_up, const Tensor& down,
                             const Tensor& post_gain, const Tensor& ids, const Tensor& weights, float eps,
                             int64_t expert_base) {
  const int64_t E = gate_up.dim(0), I2 = gate_up.dim(1), Hm = u.cols();
  if (!MUSE_CPU_CHECK(gate_up.rank == 3 && down.rank == 3 && down.dim(0) == E && gate_up.dim(2) == Hm && down.dim(1) == Hm &&
                 down.dim(2) * 2 == I2 && out.numel() == u.numel() && ids.rows() == u.rows() &&
                 ids.dtype == DType::I32 && weights.numel() == ids.numel() && post_gain.numel() == Hm &&
                 ((!gate_up.quant && !down.quant && gate_up.dtype == down.dtype &&
                   (gate_up.dtype == DType::F32 || gate_up.dtype == DType::BF16)) ||
                  (gate_up.quant && down.quant)),
             "moe_experts", describe(u) + " experts " + describe(gate_up) + " / " + describe(down)))
    return;
  enqueue(__func__, [this, out, u, gate_up, down, post_gain, ids, weights, eps, E, I2, Hm, expert_base] {
    const int64_t T = u.rows(), K = ids.cols(), I = I2 / 2, R = T * K;
    const int32_t* id = static_cast<const int32_t*>(ids.data);
    // Slots are grouped by local expert; -1: routed to another rank's expert (skipped).
    auto local = [&](int64_t r) -> int64_t {
      const int64_t e = expert_base < 0 ? int64_t(id[r]) : int64_t(id[r]) - expert_base;
      return e >= 0 && e < E ? e : -1;
    };
    for (int64_t r = 0; r < R; ++r) {
      if (expert_base < 0 && (id[r] < 0 || id[r] >= E))
        return fail("moe_experts: expert id " + std::to_string(id[r]) + " out of range");
    }
    // Group the (token, slot) pairs by expert, tokens in order.
    // Index vectors are members, reused step after step (a step allocates nothing).
    MoeScratch& ms = moe_index_;
    auto& count = ms.count;
    auto& order = ms.order;
    auto& start = ms.start;
    auto& fill = ms.fill;
    auto& slot_of = ms.slot_of;  // pair r -> row in the grouped buffers
    count.assign(size_t(E) + 1, 0);
    order.resize(size_t(R));
    start.assign(size_t(E) + 1, 0);
    slot_of.resize(size_t(R));
    for (int64_t r = 0; r < R; ++r)
      if (local(r) >= 0) ++count[size_t(local(r))];
    for (int64_t e = 0; e < E; ++e) start[size_t(e) + 1] = start[size_t(e)] + count[size_t(e)];
    fill.assign(start.begin(), start.end() - 1);
    for (int64_t r = 0; r < R; ++r) {
      const int64_t e = local(r);
      if (e < 0) {
        slot_of[size_t(r)] = -1;
        continue;
      }
      int64_t g = fill[size_t(e)]++;
      order[size_t(g)] = r;
      slot_of[size_t(r)] = g;
    }
    // Scratch: gathered inputs [R, Hm] (prefill only), activations [R, I], outputs [R, Hm].
    const size_t need = size_t(R) * size_t(Hm + I + Hm);
    if (moe_scratch_.size() < need) moe_scratch_.resize(need);
    float* X = moe_scratch_.data();
    float* A = X + R * Hm;
    float* Y = A + R * I;
    // Decode (one token) reads its row in place; prefill gathers each
    // expert's rows so they are contiguous.
    const bool gather = T > 1;
    auto x_rows = [&](int64_t e) -> const float* {
      return gather ? X + start[size_t(e)] * Hm : static_cast<const float*>(u.data);
    };
    if (gather) {
      pool_.run(start[size_t(E)], [&](int64_t g, int) {  // the slots routed here
        std::memcpy(X + g * Hm, static_cast<const float*>(u.data) + (order[size_t(g)] / K) * Hm, size_t(Hm) * 4);
      });
    }
    // Gate and up rows i..i+c of an expert in one task, then silu(γ) ⊙ υ:
    // one pass, one dispatch. Tasks: (expert, block of ≤ 64 rows of x, rows of I).
    constexpr int64_t kRowsPerXBlock = 64;
    int64_t active_rows = 0;
    for (int64_t e = 0; e < E; ++e) active_rows += count[size_t(e)] ? I : 0;
    const int64_t c = task_rows(gate_up, std::max<int64_t>(8, (active_rows / (pool_.size() * 4) + 7) / 8 * 8));
    auto& gu_tasks = ms.gu_tasks;
    gu_tasks.clear();
    for (int64_t e = 0; e < E; ++e)
      for (int64_t t0 = 0; t0 < count[size_t(e)]; t0 += kRowsPerXBlock)
        for (int64_t i0 = 0; i0 < I; i0 += c)
          gu_tasks.push_back({e, t0, std::min(kRowsPerXBlock, count[size_t(e)] - t0), i0, std::min(c, I - i0)});
    reserve_scratch(size_t(2 * kRowsPerXBlock * c) * sizeof(float));
    pool_.run(int64_t(gu_tasks.size()), [&](int64_t ti, int thread) {
      const MoeScratch::GuTask& tk = gu_tasks[size_t(ti)];
      float* g = reinterpret_cast<float*>(scratch(thread));
      float* up = g + tk.tn * tk.in;
      const float* x = x_rows(tk.e) + (gather ? tk.t0 * Hm : 0);
      const int64_t ldx = gather ? Hm : 0;  // decode: every slot reads the same row
      matmul_block(x, ldx, tk.tn, gate_up, tk.e, tk.i0, tk.in, g, tk.in);
      matmul_block(x, ldx, tk.tn, gate_up, tk.e, I + tk.i0, tk.in, up, tk.in);
      for (int64_t r = 0; r < tk.tn; ++r) {
        float* a = A + (start[size_t(tk.e)] + tk.t0 + r) * I + tk.i0;
        for (int64_t i = 0; i < tk.in; ++i) {
          const float gv = g[r * tk.in + i];
          a[i] = gv / (1.0f + std::exp(-gv)) * up[r * tk.in + i];
        }
      }
    });
    auto& jobs = ms.jobs;
    jobs.clear();
    for (int64_t e = 0; e < E; ++e) {
      if (!count[size_t(e)]) continue;
      jobs.push_back({A + start[size_t(e)] * I, I, count[size_t(e)], &down, e, 0, Hm,
                      Y + start[size_t(e)] * Hm, Hm});
    }
    run_matmuls(jobs);
    // ŷ = rms(y ⊙ c) per pair, then the weighted sum in router order.
    reserve_scratch(size_t(Hm) * sizeof(float));
    const float* gain = static_cast<const float*>(post_gain.data);
    const float* w = static_cast<const float*>(weights.data);
    pool_.run(T, [&](int64_t t, int thread) {
      float* o = static_cast<float*>(out.data) + t * Hm;
      float* yn = reinterpret_cast<float*>(scratch(thread));
      std::memset(o, 0, size_t(Hm) * 4);
      for (int64_t k = 0; k < K; ++k) {
        const int64_t g = slot_of[size_t(t * K + k)];
        if (g < 0) continue;  // another rank's expert
        norm_row(yn, Y + g * Hm, Hm, gain, NormGain::Before, eps, 1.0f);
        k_.axpy(w[t * K + k], yn, o, Hm);
      }
    });
  });
}

}  // namespace muse::cpu
