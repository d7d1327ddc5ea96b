// Attention over the hybrid KV cache, and the cache writes.
//
// A query at position p of a sequence sees positions [lo, p], lo = p-window+1
// on sliding layers (0 on full ones). Positions before the step's first row
// come from the cache (ring slot p % window, or block table[p / block_size]);
// positions inside the step come straight from this step's k/v rows. So a
// prefill chunk longer than the window never reads a ring row it has
// already overwritten: the cache is written only after attention
// (kv_store), and a ring keeps exactly the last `window` positions.
#include <algorithm>
#include <cstring>

#include "muse/backends/cpu/cpu_backend_impl.h"

namespace muse::cpu {
namespace {

// Row address of position `pos` of sequence `s` in one cache tensor (K or V).
inline const float* cache_row(const KvLayerStorage& c, const Tensor& t, const StepPlanReader& plan, int64_t s,
                              int64_t pos, int64_t kv_dim) {
  const float* base = static_cast<const float*>(t.data);
  if (c.layout == KvLayout::Ring) {
    const int64_t w = t.dim(1);
    return base + (int64_t(plan.ring_slot(s)) * w + pos % w) * kv_dim;
  }
  const int64_t bs = t.dim(1);
  return base + (int64_t(plan.blocks(s)[pos / bs]) * bs + pos % bs) * kv_dim;
}

// The plan is read when the op runs (it lives in backend memory), so it is
// checked then too: an inconsistent plan is an engine bug, reported, never
// a wild read.
bool plan_ok(const KvLayerStorage& c, const StepPlanReader& p, int64_t rows, int64_t window) {
  const int64_t slots = c.k.dim(0), per = c.k.dim(1);
  if (p.rows() != rows || p.seqs() < 1 || p.row_begin(0) != 0 || p.row_begin(p.seqs()) != rows) return false;
  if (c.layout == KvLayout::Ring && window > per) return false;
  for (int64_t s = 0; s < p.seqs(); ++s) {
    if (p.num_rows(s) < 1 || p.pos_begin(s) < 0) return false;
    if (c.layout == KvLayout::Ring) {
      if (p.ring_slot(s) < 0 || p.ring_slot(s) >= slots) return false;
    } else {
      const int64_t need = (p.pos_begin(s) + p.num_rows(s) + per - 1) / per;
      if (p.num_blocks(s) < need) return false;
      for (int64_t i = 0; i < need; ++i)
        if (p.blocks(s)[i] < 0 || p.blocks(s)[i] >= slots) return false;
    }
  }
  return true;
}

bool cache_ok(const KvLayerStorage& c) {
  return c.k.rank == 3 && c.v.rank == 3 && c.k.dtype == DType::F32 && c.v.dtype == DType::F32;
}

}  // namespace

void CpuBackend::attention(const Tensor& out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                           const KvLayerStorage& cache, const StepPlanView& plan, int64_t head_dim,
                           int64_t window, float scale) {
  const int64_t d = head_dim;
  if (!MUSE_CPU_CHECK(q.dtype == DType::F32 && out.numel() == q.numel() && q.cols() % d == 0 &&
                          k_new.cols() % d == 0 && k_new.numel() == v_new.numel() && k_new.rows() == q.rows() &&
                          (q.cols() / d) % (k_new.cols() / d) == 0 && cache.k.dim(2) == k_new.cols() &&
                          cache_ok(cache) && plan.buffer.dtype == DType::I32,
                      "attention", describe(q) + " k " + describe(k_new) + " cache " + describe(cache.k)))
    return;
  enqueue(__func__, [this, out, q, k_new, v_new, cache, plan, d, window, scale] {
    const StepPlanReader p{static_cast<const int32_t*>(plan.buffer.data), plan.layout};
    if (!plan_ok(cache, p, q.rows(), window)) return fail("attention: the step plan does not match the KV cache");
    const int64_t hq = q.cols() / d, kv_dim = k_new.cols(), group = hq / (kv_dim / d);
    constexpr int64_t kRowBlock = 8;
    attention_tasks_.clear();
    int64_t max_keys = 0;
    for (int64_t si = 0; si < p.seqs(); ++si) {
      const int64_t n = p.num_rows(si);
      max_keys = std::max(max_keys, p.pos_begin(si) + n);
      for (int64_t r = 0; r < n; r += kRowBlock)
        for (int64_t h = 0; h < hq; ++h) attention_tasks_.push_back({si, r, std::min(kRowBlock, n - r), h});
    }
    if (window > 0) max_keys = std::min(max_keys, window);
    reserve_scratch(size_t(max_keys) * (2 * sizeof(float*) + sizeof(float)));
    pool_.run(int64_t(attention_tasks_.size()), [&](int64_t ti, int thread) {
      const AttentionTask& tk = attention_tasks_[size_t(ti)];
      const int64_t row_begin = p.row_begin(tk.seq), pos_begin = p.pos_begin(tk.seq);
      const float** krows = reinterpret_cast<const float**>(scratch(thread));
      const float** vrows = krows + max_keys;
      float* scores = reinterpret_cast<float*>(vrows + max_keys);
      const int64_t kv_offset = (tk.head / group) * d;
      for (int64_t r = tk.row0; r < tk.row0 + tk.rows; ++r) {
        const int64_t row = row_begin + r, pos = pos_begin + r;
        const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
        int64_t n = 0;
        for (int64_t j = lo; j <= pos; ++j, ++n) {
          if (j >= pos_begin) {
            const int64_t src = row_begin + (j - pos_begin);
            krows[n] = static_cast<const float*>(k_new.data) + src * kv_dim;
            vrows[n] = static_cast<const float*>(v_new.data) + src * kv_dim;
          } else {
            krows[n] = cache_row(cache, cache.k, p, tk.seq, j, kv_dim);
            vrows[n] = cache_row(cache, cache.v, p, tk.seq, j, kv_dim);
          }
        }
        k_.attend(static_cast<const float*>(q.data) + row * q.cols() + tk.head * d, krows, vrows, kv_offset, n, d,
                  scale, scores, static_cast<float*>(out.data) + row * out.cols() + tk.head * d);
      }
    });
  });
}

void CpuBackend::kv_store(const KvLayerStorage& cache, const Tensor& k_new, const Tensor& v_new,
                          const StepPlanView& plan) {
  if (!MUSE_CPU_CHECK(k_new.numel() == v_new.numel() && cache.k.dim(2) == k_new.cols() && cache_ok(cache) &&
                          k_new.dtype == DType::F32 && v_new.dtype == DType::F32,
                      "kv_store", describe(k_new) + " into " + describe(cache.k)))
    return;
  enqueue(__func__, [this, cache, k_new, v_new, plan] {
    const StepPlanReader p{static_cast<const int32_t*>(plan.buffer.data), plan.layout};
    if (!plan_ok(cache, p, k_new.rows(), 0)) return fail("kv_store: the step plan does not match the KV cache");
    const int64_t kv_dim = k_new.cols();
    pool_.run(p.seqs(), [&](int64_t si, int) {
      const int64_t n = p.num_rows(si), row_begin = p.row_begin(si), pos_begin = p.pos_begin(si);
      int64_t first = 0;
      // A ring keeps only the last `window` positions of the chunk.
      if (cache.layout == KvLayout::Ring) first = std::max<int64_t>(0, n - cache.k.dim(1));
      for (int64_t r = first; r < n; ++r) {
        const int64_t pos = pos_begin + r, row = row_begin + r;
        std::memcpy(const_cast<float*>(cache_row(cache, cache.k, p, si, pos, kv_dim)),
                    static_cast<const float*>(k_new.data) + row * kv_dim, size_t(kv_dim) * 4);
        std::memcpy(const_cast<float*>(cache_row(cache, cache.v, p, si, pos, kv_dim)),
                    static_cast<const float*>(v_new.data) + row * kv_dim, size_t(kv_dim) * 4);
      }
    });
  });
}

}  // namespace muse::cpu
