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

// Row address of position `pos` of a sequence in one cache tensor (K or V).
inline const float* cache_row(const KvLayerStorage& c, const Tensor& t, const SequenceSlice& s, int64_t pos,
                              int64_t kv_dim) {
  const float* base = static_cast<const float*>(t.data);
  if (c.layout == KvLayout::Ring) {
    const int64_t w = t.dim(1);
    return base + (int64_t(s.ring_slot) * w + pos % w) * kv_dim;
  }
  const int64_t bs = t.dim(1);
  return base + (int64_t(s.blocks[size_t(pos / bs)]) * bs + pos % bs) * kv_dim;
}

std::string check_batch(const KvLayerStorage& c, const AttentionBatch& b, int64_t rows, int64_t window) {
  const int64_t slots = c.k.dim(0), per = c.k.dim(1);
  if (c.k.rank != 3 || c.v.rank != 3 || c.k.dtype != DType::F32 || c.v.dtype != DType::F32)
    return "cache tensors must be F32 [slots, rows, kv_dim]";
  if (b.total_rows() != rows) return "batch rows do not match the activations";
  if (c.layout == KvLayout::Ring && window > per) return "ring smaller than the window";
  for (const auto& s : b.seqs) {
    if (s.num_rows < 1 || s.pos_begin < 0) return "empty sequence slice";
    if (c.layout == KvLayout::Ring) {
      if (s.ring_slot < 0 || s.ring_slot >= slots) return "ring slot out of range";
    } else {
      int64_t need = (s.pos_begin + s.num_rows + per - 1) / per;
      if (int64_t(s.blocks.size()) < need) return "block table shorter than the sequence";
      for (int64_t i = 0; i < need; ++i)
        if (s.blocks[size_t(i)] < 0 || s.blocks[size_t(i)] >= slots) return "block id out of range";
    }
  }
  return {};
}

}  // namespace

void CpuBackend::attention(const Tensor& out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                           const KvLayerStorage& cache, const AttentionBatchRef& batch, int64_t head_dim,
                           int64_t window, float scale) {
  const int64_t d = head_dim;
  if (!check(batch != nullptr && q.dtype == DType::F32 && out.numel() == q.numel() && q.cols() % d == 0 &&
                 k_new.cols() % d == 0 && k_new.numel() == v_new.numel() && k_new.rows() == q.rows() &&
                 (q.cols() / d) % (k_new.cols() / d) == 0 && cache.k.dim(2) == k_new.cols(),
             "attention", describe(q) + " k " + describe(k_new) + " cache " + describe(cache.k)))
    return;
  std::string bad = check_batch(cache, *batch, q.rows(), window);
  if (!check(bad.empty(), "attention", bad)) return;
  enqueue(__func__, [this, out, q, k_new, v_new, cache, batch, d, window, scale] {
    const int64_t hq = q.cols() / d, kv_dim = k_new.cols(), group = hq / (kv_dim / d);
    constexpr int64_t kRowBlock = 8;
    struct Task {
      int seq;
      int64_t row0, rows, head;
    };
    std::vector<Task> tasks;
    int64_t max_keys = 0;
    for (size_t si = 0; si < batch->seqs.size(); ++si) {
      const auto& s = batch->seqs[si];
      max_keys = std::max(max_keys, s.pos_begin + s.num_rows);
      for (int64_t r = 0; r < s.num_rows; r += kRowBlock)
        for (int64_t h = 0; h < hq; ++h) tasks.push_back({int(si), r, std::min(kRowBlock, s.num_rows - r), h});
    }
    if (window > 0) max_keys = std::min(max_keys, window);
    reserve_scratch(size_t(max_keys) * (2 * sizeof(float*) + sizeof(float)));
    pool_.run(int64_t(tasks.size()), [&](int64_t ti, int thread) {
      const Task& tk = tasks[size_t(ti)];
      const SequenceSlice& s = batch->seqs[size_t(tk.seq)];
      const float** krows = reinterpret_cast<const float**>(scratch(thread));
      const float** vrows = krows + max_keys;
      float* scores = reinterpret_cast<float*>(vrows + max_keys);
      const int64_t kv_offset = (tk.head / group) * d;
      for (int64_t r = tk.row0; r < tk.row0 + tk.rows; ++r) {
        const int64_t row = s.row_begin + r, p = s.pos_begin + r;
        const int64_t lo = window > 0 ? std::max<int64_t>(0, p - window + 1) : 0;
        int64_t n = 0;
        for (int64_t j = lo; j <= p; ++j, ++n) {
          if (j >= s.pos_begin) {
            const int64_t src = s.row_begin + (j - s.pos_begin);
            krows[n] = static_cast<const float*>(k_new.data) + src * kv_dim;
            vrows[n] = static_cast<const float*>(v_new.data) + src * kv_dim;
          } else {
            krows[n] = cache_row(cache, cache.k, s, j, kv_dim);
            vrows[n] = cache_row(cache, cache.v, s, j, kv_dim);
          }
        }
        k_.attend(static_cast<const float*>(q.data) + row * q.cols() + tk.head * d, krows, vrows, kv_offset, n, d,
                  scale, scores, static_cast<float*>(out.data) + row * out.cols() + tk.head * d);
      }
    });
  });
}

void CpuBackend::kv_store(const KvLayerStorage& cache, const Tensor& k_new, const Tensor& v_new,
                          const AttentionBatchRef& batch) {
  if (!check(batch != nullptr && k_new.numel() == v_new.numel() && cache.k.dim(2) == k_new.cols(), "kv_store",
             describe(k_new) + " into " + describe(cache.k)))
    return;
  std::string bad = check_batch(cache, *batch, k_new.rows(), 0);
  if (!check(bad.empty(), "kv_store", bad)) return;
  enqueue(__func__, [this, cache, k_new, v_new, batch] {
    const int64_t kv_dim = k_new.cols();
    pool_.run(int64_t(batch->seqs.size()), [&](int64_t si, int) {
      const SequenceSlice& s = batch->seqs[size_t(si)];
      int64_t first = 0;
      // A ring keeps only the last `window` positions of the chunk.
      if (cache.layout == KvLayout::Ring) first = std::max<int64_t>(0, s.num_rows - cache.k.dim(1));
      for (int64_t r = first; r < s.num_rows; ++r) {
        const int64_t p = s.pos_begin + r, row = s.row_begin + r;
        std::memcpy(const_cast<float*>(cache_row(cache, cache.k, s, p, kv_dim)),
                    static_cast<const float*>(k_new.data) + row * kv_dim, size_t(kv_dim) * 4);
        std::memcpy(const_cast<float*>(cache_row(cache, cache.v, s, p, kv_dim)),
                    static_cast<const float*>(v_new.data) + row * kv_dim, size_t(kv_dim) * 4);
      }
    });
  });
}

}  // namespace muse::cpu
