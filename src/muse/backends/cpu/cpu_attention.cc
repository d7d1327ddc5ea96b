// Attention over the paged KV cache, and the cache writes.
//
// A query at position p of a sequence sees positions [lo, p], lo = p-window+1
// on sliding layers (0 on full ones). Positions before the step's first row
// come from the cache (the page of logical block p / block_size in the
// layer's table, see step_plan.h); positions inside the step come straight
// from this step's k/v rows. The cache is written after attention
// (kv_store), and only where the sequence keeps a page (sliding blocks that
// the step already leaves behind get none).
//
// Caches stored in BF16 or F8_E4M3 are decoded per task (one sequence, up
// to 8 rows, one head) into scratch; this step's own k/v rows are rounded
// through the same dtype first, so every key reads the same bits whether it
// came from the cache or from this step: outputs do not depend on chunking
// nor on prefix caching.
#include <algorithm>
#include <cstring>

#include "muse/backends/cpu/cpu_backend_impl.h"

namespace muse::cpu {
namespace {

// Element offset of position `pos` of sequence `s` in the layer's pool
// tensor, or -1 when the sequence keeps no page there.
inline int64_t cache_offset(const KvLayerStorage& c, const StepPlanReader& plan, int64_t s, int64_t pos) {
  const int64_t G = c.k.dim(1), bs = c.k.dim(2), kv_dim = c.k.dim(3);
  const int64_t j = pos / bs;
  const int32_t page = c.layout == KvLayout::Sliding ? plan.slide_page(s, j, c.group, c.pages_per_block)
                                                     : plan.full_page(s, j, c.group, c.pages_per_block);
  if (page < 0) return -1;
  return ((int64_t(page) * G + c.slot) * bs + pos % bs) * kv_dim;
}

// The plan is read when the op runs (it lives in backend memory), so it is
// checked then too: an inconsistent plan is an engine bug, reported, never
// a wild read. `window` > 0: the cached keys attention reads must have pages.
bool plan_ok(const KvLayerStorage& c, const StepPlanReader& p, int64_t rows, int64_t window, bool reading) {
  const int64_t pages = c.k.dim(0), bs = c.k.dim(2), n = c.pages_per_block;
  if (p.rows() != rows || p.seqs() < 1 || p.row_begin(0) != 0 || p.row_begin(p.seqs()) != rows) return false;
  if (c.slot < 0 || c.slot >= c.k.dim(1) || c.group < 0 || c.group >= n) return false;
  for (int64_t s = 0; s < p.seqs(); ++s) {
    if (p.num_rows(s) < 1 || p.pos_begin(s) < 0) return false;
    const int64_t end = p.pos_begin(s) + p.num_rows(s), blocks = (end + bs - 1) / bs;
    if (c.layout == KvLayout::Paged) {
      if (p.full_count(s) < blocks * n) return false;
      for (int64_t j = 0; j < blocks; ++j) {
        const int32_t pg = p.full_page(s, j, c.group, n);
        if (pg < 0 || pg >= pages) return false;
      }
    } else {
      if (p.slide_first(s) < 0 || p.slide_count(s) < (blocks - p.slide_first(s)) * n) return false;
      for (int64_t j = p.slide_first(s); j < blocks; ++j)
        if (p.slide_page(s, j, c.group, n) >= pages) return false;
      if (reading) {  // cached keys read: [max(0, pos_begin - window + 1), pos_begin)
        const int64_t lo = std::max<int64_t>(0, p.pos_begin(s) - window + 1);
        for (int64_t j = lo / bs; j * bs < p.pos_begin(s); ++j)
          if (p.slide_page(s, j, c.group, n) < 0) return false;
      }
    }
  }
  return true;
}

bool cache_dtype_ok(DType t) { return t == DType::F32 || t == DType::BF16 || t == DType::F8_E4M3; }

bool cache_ok(const KvLayerStorage& c) {
  return c.k.rank == 4 && c.v.rank == 4 && c.k.shape == c.v.shape && c.k.dtype == c.v.dtype &&
         cache_dtype_ok(c.k.dtype) && c.pages_per_block >= 1;
}

// Decodes `count` cache values at element `at` into dst (× scale for F8).
inline void load(float* dst, const void* base, DType dt, int64_t at, int64_t count, float scale) {
  if (dt == DType::BF16) {
    const uint16_t* src = static_cast<const uint16_t*>(base) + at;
    for (int64_t i = 0; i < count; ++i) dst[i] = bf16_to_f32(src[i]);
  } else if (dt == DType::F8_E4M3) {
    const uint8_t* src = static_cast<const uint8_t*>(base) + at;
    for (int64_t i = 0; i < count; ++i) dst[i] = f8_e4m3_to_f32(src[i]) * scale;
  } else {
    std::memcpy(dst, static_cast<const float*>(base) + at, size_t(count) * 4);
  }
}

// Encodes `count` floats into the cache at element `at` (÷ scale for F8).
inline void store(void* base, DType dt, int64_t at, const float* src, int64_t count, float scale) {
  if (dt == DType::BF16) {
    uint16_t* dst = static_cast<uint16_t*>(base) + at;
    for (int64_t i = 0; i < count; ++i) dst[i] = f32_to_bf16(src[i]);
  } else if (dt == DType::F8_E4M3) {
    uint8_t* dst = static_cast<uint8_t*>(base) + at;
    for (int64_t i = 0; i < count; ++i) dst[i] = f32_to_f8_e4m3(src[i] / scale);
  } else {
    std::memcpy(static_cast<float*>(base) + at, src, size_t(count) * 4);
  }
}

// What a value reads back as after a store in `dt`.
inline void round_trip(float* dst, const float* src, DType dt, int64_t count, float scale) {
  if (dt == DType::BF16) {
    for (int64_t i = 0; i < count; ++i) dst[i] = round_bf16(src[i]);
  } else if (dt == DType::F8_E4M3) {
    for (int64_t i = 0; i < count; ++i) dst[i] = f8_e4m3_to_f32(f32_to_f8_e4m3(src[i] / scale)) * scale;
  } else {
    std::memcpy(dst, src, size_t(count) * 4);
  }
}

}  // namespace

void CpuBackend::attention(const Tensor& out, const Tensor& q, const Tensor& k_new, const Tensor& v_new,
                           const KvLayerStorage& cache, const StepPlanView& plan, int64_t head_dim,
                           int64_t window, float scale) {
  const int64_t d = head_dim;
  if (!MUSE_CPU_CHECK(q.dtype == DType::F32 && out.numel() == q.numel() && q.cols() % d == 0 &&
                          k_new.cols() % d == 0 && k_new.numel() == v_new.numel() && k_new.rows() == q.rows() &&
                          (q.cols() / d) % (k_new.cols() / d) == 0 && cache.k.dim(3) == k_new.cols() &&
                          cache_ok(cache) && plan.buffer.dtype == DType::I32,
                      "attention", describe(q) + " k " + describe(k_new) + " cache " + describe(cache.k)))
    return;
  enqueue(__func__, [this, out, q, k_new, v_new, cache, plan, d, window, scale] {
    const StepPlanReader p{static_cast<const int32_t*>(plan.buffer.data), plan.layout};
    if (!plan_ok(cache, p, q.rows(), window, true)) return fail("attention: the step plan does not match the KV cache");
    const int64_t hq = q.cols() / d, kv_dim = k_new.cols(), group = hq / (kv_dim / d);
    const DType cdt = cache.k.dtype;
    const bool direct = cdt == DType::F32;  // F32 caches are read in place
    constexpr int64_t kRowBlock = 8;
    attention_tasks_.clear();
    int64_t max_keys = 0;
    for (int64_t si = 0; si < p.seqs(); ++si) {
      const int64_t n = p.num_rows(si);
      max_keys = std::max(max_keys, p.pos_begin(si) + n);
      for (int64_t r = 0; r < n; r += kRowBlock)
        for (int64_t h = 0; h < hq; ++h) attention_tasks_.push_back({si, r, std::min(kRowBlock, n - r), h});
    }
    if (window > 0) max_keys = std::min(max_keys, window + kRowBlock);
    reserve_scratch(size_t(max_keys) * (2 * sizeof(float*) + sizeof(float)) +
                    (direct ? 0 : size_t(max_keys) * size_t(d) * 2 * sizeof(float)));
    pool_.run(int64_t(attention_tasks_.size()), [&](int64_t ti, int thread) {
      const AttentionTask& tk = attention_tasks_[size_t(ti)];
      const int64_t row_begin = p.row_begin(tk.seq), pos_begin = p.pos_begin(tk.seq);
      const float** krows = reinterpret_cast<const float**>(scratch(thread));
      const float** vrows = krows + max_keys;
      float* scores = reinterpret_cast<float*>(vrows + max_keys);
      float* kdec = scores + max_keys;  // decoded keys/values of the task (non-F32 caches)
      float* vdec = kdec + (direct ? 0 : max_keys * d);
      const int64_t kv_offset = (tk.head / group) * d;
      // The task's keys: [klo, khi] (the union of its rows' ranges).
      const int64_t p_first = pos_begin + tk.row0, p_last = p_first + tk.rows - 1;
      const int64_t klo = window > 0 ? std::max<int64_t>(0, p_first - window + 1) : 0;
      const float* kbase = static_cast<const float*>(k_new.data);
      const float* vbase = static_cast<const float*>(v_new.data);
      if (!direct) {
        for (int64_t j = klo; j <= p_last; ++j) {
          float* kd = kdec + (j - klo) * d;
          float* vd = vdec + (j - klo) * d;
          if (j >= pos_begin) {
            const int64_t src = (row_begin + (j - pos_begin)) * kv_dim + kv_offset;
            round_trip(kd, kbase + src, cdt, d, cache.k_scale);
            round_trip(vd, vbase + src, cdt, d, cache.v_scale);
          } else {
            const int64_t at = cache_offset(cache, p, tk.seq, j) + kv_offset;
            load(kd, cache.k.data, cdt, at, d, cache.k_scale);
            load(vd, cache.v.data, cdt, at, d, cache.v_scale);
          }
        }
      }
      for (int64_t r = tk.row0; r < tk.row0 + tk.rows; ++r) {
        const int64_t row = row_begin + r, pos = pos_begin + r;
        const int64_t lo = window > 0 ? std::max<int64_t>(0, pos - window + 1) : 0;
        int64_t n = 0;
        for (int64_t j = lo; j <= pos; ++j, ++n) {
          if (!direct) {
            krows[n] = kdec + (j - klo) * d;
            vrows[n] = vdec + (j - klo) * d;
          } else if (j >= pos_begin) {
            const int64_t src = row_begin + (j - pos_begin);
            krows[n] = kbase + src * kv_dim;
            vrows[n] = vbase + src * kv_dim;
          } else {
            const int64_t at = cache_offset(cache, p, tk.seq, j);
            krows[n] = static_cast<const float*>(cache.k.data) + at;
            vrows[n] = static_cast<const float*>(cache.v.data) + at;
          }
        }
        k_.attend(static_cast<const float*>(q.data) + row * q.cols() + tk.head * d, krows, vrows,
                  direct ? kv_offset : 0, n, d, scale, scores,
                  static_cast<float*>(out.data) + row * out.cols() + tk.head * d);
      }
    });
  });
}

void CpuBackend::kv_store(const KvLayerStorage& cache, const Tensor& k_new, const Tensor& v_new,
                          const StepPlanView& plan) {
  if (!MUSE_CPU_CHECK(k_new.numel() == v_new.numel() && cache_ok(cache) && cache.k.dim(3) == k_new.cols() &&
                          k_new.dtype == DType::F32 && v_new.dtype == DType::F32,
                      "kv_store", describe(k_new) + " into " + describe(cache.k)))
    return;
  enqueue(__func__, [this, cache, k_new, v_new, plan] {
    const StepPlanReader p{static_cast<const int32_t*>(plan.buffer.data), plan.layout};
    if (!plan_ok(cache, p, k_new.rows(), 0, false)) return fail("kv_store: the step plan does not match the KV cache");
    const int64_t kv_dim = k_new.cols();
    const DType cdt = cache.k.dtype;
    pool_.run(p.seqs(), [&](int64_t si, int) {
      const int64_t n = p.num_rows(si), row_begin = p.row_begin(si), pos_begin = p.pos_begin(si);
      for (int64_t r = 0; r < n; ++r) {
        const int64_t at = cache_offset(cache, p, si, pos_begin + r), row = row_begin + r;
        if (at < 0) continue;  // a sliding block the sequence does not keep
        store(cache.k.data, cdt, at, static_cast<const float*>(k_new.data) + row * kv_dim, kv_dim, cache.k_scale);
        store(cache.v.data, cdt, at, static_cast<const float*>(v_new.data) + row * kv_dim, kv_dim, cache.v_scale);
      }
    });
  });
}

}  // namespace muse::cpu
