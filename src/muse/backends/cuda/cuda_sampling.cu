// sample_rows on the GPU: the token (and logprobs) drawn where the logits
// are, so a decode step sends down a few bytes per sequence instead of the
// vocabulary's logits. One block per row runs sample_row_host's sequence
// (sampling/row_sampling.cc): edits, argmax or temperature → min_p → top_k
// → top_p → the inverse-CDF draw with the sequence's own variate, and the
// logprobs.
//
// The host sorts candidates; here every "by rank" question (the k-th best,
// the prefix whose mass reaches top_p, where the draw lands, the top
// logprobs) is a radix descent over a unique 64-bit key per id — the value's
// order-preserving bits, then the id reversed, so a larger key is exactly
// the host's "better" (higher value, ties to the lower id) — four bits per
// level, with 16 per-thread bins summed in one fixed order. Probabilities
// are fp64 as on the host; the only difference is the order of the sums
// (a tree instead of id order), so a draw differs only when the variate
// lands within rounding of a boundary. No atomics touch a result.
#include <cmath>
#include <cstdint>

#include "muse/backends/cuda/cuda_impl.cuh"
#include "muse/sampling/row_sampling.h"

namespace muse::cuda {
namespace {

constexpr int kThreads = 512;
constexpr int kWarps = kThreads / 32;
constexpr int kBins = 16;

struct SampleShared {
  double bins[kWarps][kBins];
  double bin_total[kBins];
  double d[kWarps];
  unsigned long long u[kWarps];
  unsigned long long key;  // broadcast slot
  double value;            // broadcast slot
  int flag;
  int top_n;
  int top_id[kRowSampleMaxTop];
  float top_value[kRowSampleMaxTop];
};

__device__ __forceinline__ float canonical(float v) { return v == 0.0f ? 0.0f : v; }  // -0 ties +0, as on the host
__device__ __forceinline__ uint32_t ordered_bits(float v) {
  const uint32_t u = __float_as_uint(canonical(v));
  return (u & 0x80000000u) ? ~u : (u | 0x80000000u);
}

__device__ __forceinline__ float from_ordered_bits(uint32_t o) {
  return __uint_as_float((o & 0x80000000u) ? (o & 0x7fffffffu) : ~o);
}

// The smallest scaled logit the host keeps as a candidate: exp(s - max) is
// not 0 and not below min_p. The predicate is monotone in s, so a binary
// search over the floats in order (32 exps, one thread) turns every later
// candidate test into one comparison instead of an fp64 exp per id per pass.
__device__ float candidate_floor(float mx, double min_p) {
  auto keeps = [&](float s) {
    const double p = exp(double(s) - double(mx));
    return p != 0.0 && !(min_p > 0.0 && p < min_p);
  };
  uint32_t lo = ordered_bits(-INFINITY), hi = ordered_bits(mx);  // keeps(hi); not keeps(lo)
  if (keeps(from_ordered_bits(lo))) return -INFINITY;
  while (hi - lo > 1) {
    const uint32_t mid = lo + (hi - lo) / 2;
    if (keeps(from_ordered_bits(mid))) hi = mid;
    else lo = mid;
  }
  return from_ordered_bits(hi);
}

// Keys: larger is better. `id_bits` holds every id < n.
struct Keys {
  int id_bits = 1;
  int levels = 1;  // 4-bit digits of a rank key (id-order keys use fewer: see select)
  __device__ unsigned long long rank(float v, int id) const {
    return (static_cast<unsigned long long>(ordered_bits(v)) << id_bits) | static_cast<unsigned long long>(((1u << id_bits) - 1u) - uint32_t(id));
  }
  __device__ unsigned long long by_id(int id) const { return ((1u << id_bits) - 1u) - uint32_t(id); }
  __device__ int id_of(unsigned long long key) const {
    return int(((1u << id_bits) - 1u) - uint32_t(key & ((1ull << id_bits) - 1ull)));
  }
};

__device__ double block_sum_d(double v, SampleShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  __syncthreads();
  if (lane == 0) sh.d[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    double s = 0.0;
    for (int w = 0; w < kWarps; ++w) s += sh.d[w];
    sh.value = s;
  }
  __syncthreads();
  return sh.value;
}

// Max (or min) of a key over the block.
__device__ unsigned long long block_ext_u64(unsigned long long v, bool want_max, SampleShared& sh) {
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) {
    const unsigned long long w = __shfl_xor_sync(0xffffffffu, v, o);
    v = want_max ? (w > v ? w : v) : (w < v ? w : v);
  }
  __syncthreads();
  if (lane == 0) sh.u[warp] = v;
  __syncthreads();
  if (threadIdx.x == 0) {
    unsigned long long r = sh.u[0];
    for (int w = 1; w < kWarps; ++w) r = want_max ? (sh.u[w] > r ? sh.u[w] : r) : (sh.u[w] < r ? sh.u[w] : r);
    sh.key = r;
  }
  __syncthreads();
  return sh.key;
}

// f(i, x[i]) for this thread's ids i < n, in increasing order (the order
// its sums take), with four loads in flight per step: a pass over a row is
// bound by load latency, not bandwidth, at one block per row.
// (for_each_value_in: the ids [lo, hi) over a block of THREADS threads.)
template <int THREADS, class F>
__device__ __forceinline__ void for_each_value_in(const float* x, int lo, int hi, F f) {
  for (int i0 = lo + int(threadIdx.x); i0 < hi; i0 += 4 * THREADS) {
    float v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = i0 + u * THREADS;
      v[u] = i < hi ? x[i] : 0.0f;
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      const int i = i0 + u * THREADS;
      if (i < hi) f(i, v[u]);
    }
  }
}
template <class F>
__device__ __forceinline__ void for_each_value(const float* x, int n, F f) {
  for_each_value_in<kThreads>(x, 0, n, f);
}

// The radix descent. Among members in descending key order, finds the
// element e whose running weight first reaches `target` (inclusive: sum >=
// target, strict: sum > target). False when the total does not reach it.
// key(i, x[i]) must be < 2^(4·levels); member and weight take (i, x[i]) too.
template <class Member, class Weight, class Key>
__device__ bool select_key(const float* x, int n, int levels, double target, bool strict, Member member, Weight weight,
                           Key key, SampleShared& sh, unsigned long long* out) {
  unsigned long long prefix = 0;
  double above = 0.0;  // weight of the members whose key is above the current prefix's range
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  for (int level = 0; level < levels; ++level) {
    const int shift = 4 * (levels - 1 - level);
    double bins[kBins];
#pragma unroll
    for (int j = 0; j < kBins; ++j) bins[j] = 0.0;
    for_each_value(x, n, [&](int i, float v) {
      const unsigned long long k = key(i, v);
      if (shift + 4 < 64 && (k >> (shift + 4)) != (prefix >> (shift + 4))) return;
      if (!member(i, v)) return;
      const int d = int((k >> shift) & 15ull);
      const double w = weight(i, v);
#pragma unroll
      for (int j = 0; j < kBins; ++j) bins[j] += d == j ? w : 0.0;
    });
#pragma unroll
    for (int j = 0; j < kBins; ++j) {
      double v = bins[j];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      bins[j] = v;
    }
    __syncthreads();
    if (lane == 0)
#pragma unroll
      for (int j = 0; j < kBins; ++j) sh.bins[warp][j] = bins[j];
    __syncthreads();
    if (threadIdx.x < kBins) {
      double s = 0.0;
      for (int w = 0; w < kWarps; ++w) s += sh.bins[w][threadIdx.x];
      sh.bin_total[threadIdx.x] = s;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      int chosen = -1;
      double acc = above;
      for (int d = kBins - 1; d >= 0; --d) {
        const double next = acc + sh.bin_total[d];
        if (sh.bin_total[d] > 0.0 && (strict ? next > target : next >= target)) {
          chosen = d;
          break;
        }
        acc = next;
      }
      if (chosen < 0 && level > 0) {
        // Rounding (the bins of this range sum to a hair less than the
        // range did one level up): the range's last member.
        for (int d = 0; d < kBins && chosen < 0; ++d)
          if (sh.bin_total[d] > 0.0) chosen = d;
        acc = above;
        for (int d = kBins - 1; d > chosen; --d) acc += sh.bin_total[d];
      }
      sh.flag = chosen;
      if (chosen >= 0) {
        sh.value = acc;
        sh.key = prefix | (static_cast<unsigned long long>(chosen) << shift);
      }
    }
    __syncthreads();
    if (sh.flag < 0) return false;
    above = sh.value;
    prefix = sh.key;
    __syncthreads();
  }
  *out = prefix;
  return true;
}

// The top `k` entries by key among ids < n (keys unique): into sh.top_*,
// best first, with value(i, x[i]) beside each id.
template <class Value>
__device__ void top_entries(const float* x, int n, int k, const Keys& keys, Value value, SampleShared& sh) {
  if (threadIdx.x == 0) sh.top_n = 0;
  __syncthreads();
  if (k <= 0) return;
  const int levels = (32 + keys.id_bits + 3) / 4;
  unsigned long long kth = 0;
  const bool found = select_key(
      x, n, levels, double(k), false, [](int, float) { return true; }, [](int, float) { return 1.0; },
      [&](int i, float xv) { return keys.rank(value(i, xv), i); }, sh, &kth);
  if (!found) kth = 0;  // fewer than k ids: all of them
  __syncthreads();
  for_each_value(x, n, [&](int i, float xv) {
    const float v = value(i, xv);
    if (keys.rank(v, i) >= kth) {
      const int slot = atomicAdd(&sh.top_n, 1);  // a slot only; the order is fixed below
      if (slot < kRowSampleMaxTop) {
        sh.top_id[slot] = i;
        sh.top_value[slot] = v;
      }
    }
  });
  __syncthreads();
  if (threadIdx.x == 0) {
    const int m = sh.top_n < kRowSampleMaxTop ? sh.top_n : kRowSampleMaxTop;
    for (int a = 1; a < m; ++a) {  // insertion sort by key, best first
      const int id = sh.top_id[a];
      const float v = sh.top_value[a];
      const unsigned long long ka = keys.rank(v, id);
      int b = a - 1;
      while (b >= 0 && keys.rank(sh.top_value[b], sh.top_id[b]) < ka) {
        sh.top_id[b + 1] = sh.top_id[b];
        sh.top_value[b + 1] = sh.top_value[b];
        --b;
      }
      sh.top_id[b + 1] = id;
      sh.top_value[b + 1] = v;
    }
    sh.top_n = m;
  }
  __syncthreads();
}

__device__ __forceinline__ float logprob_of(float v, double lse, bool finite) {
  if (v == -INFINITY || !finite) return kMinLogprob;
  const float lp = float(double(v) - lse);
  return lp > kMinLogprob ? lp : kMinLogprob;
}

// Whether a row's draw is a plain argmax: greedy, no edits, no logprobs
// (the pre-pass below may then do its one pass).
__device__ __forceinline__ bool plain_argmax(const RowSampleSpec& sp) {
  return (sp.flags & kRowGreedy) && sp.edit_count == 0 && sp.top_logprobs < 0;
}

// The greedy argmax's pass spread over kArgmaxSlices blocks a row, for
// steps of few rows (one block a row took ~46 µs for a 202,048-wide row at
// batch 1, on the critical path at the end of every step): block (s, r)
// writes the largest key of slice s of row r's ids; sample_rows_kernel then
// takes the largest of the row's slice keys. Keys are unique, so the max of
// the slices' maxima is the full pass's: the same id. Rows that are not a
// plain argmax are left to the full kernel (their slice keys are not read).
constexpr int kArgmaxSlices = 32;
constexpr int64_t kArgmaxSliceRows = 16;  // steps of at most this many sampled rows take the pre-pass
constexpr int kArgmaxThreads = 256;
__global__ void __launch_bounds__(kArgmaxThreads) argmax_slices_kernel(unsigned long long* slice_keys,
                                                                        const float* logits, int64_t V, int64_t R,
                                                                        const char* buffer) {
  const auto* specs = reinterpret_cast<const RowSampleSpec*>(buffer + sizeof(RowSampleHeader));
  const RowSampleSpec sp = specs[blockIdx.y];
  if (!plain_argmax(sp) || sp.logit_row < 0 || sp.logit_row >= R) return;
  const int n = int(sp.limit < V ? sp.limit : V);
  if (n < 1) return;
  Keys keys;
  while (keys.id_bits < 31 && (1 << keys.id_bits) < n) ++keys.id_bits;
  const float* x = logits + int64_t(sp.logit_row) * V;
  const int per = (n + kArgmaxSlices - 1) / kArgmaxSlices, lo = int(blockIdx.x) * per;
  const int hi = lo + per < n ? lo + per : n;
  unsigned long long m = 0;
  for_each_value_in<kArgmaxThreads>(x, lo, hi, [&](int i, float v) { m = max(m, keys.rank(v, i)); });
#pragma unroll
  for (int o = 16; o > 0; o >>= 1) m = max(m, __shfl_xor_sync(0xffffffffu, m, o));
  __shared__ unsigned long long wm[kArgmaxThreads / 32];
  if ((threadIdx.x & 31) == 0) wm[threadIdx.x >> 5] = m;
  __syncthreads();
  if (threadIdx.x == 0) {
    for (int w = 1; w < kArgmaxThreads / 32; ++w) m = max(m, wm[w]);
    slice_keys[int64_t(blockIdx.y) * kArgmaxSlices + blockIdx.x] = m;
  }
}

__global__ void __launch_bounds__(kThreads) sample_rows_kernel(RowSampleResult* results, float* logits, int64_t V,
                                                               int64_t R, const char* buffer, int rows, int edit_total,
                                                               const unsigned long long* slice_keys, DeviceError* err,
                                                               int op) {
  __shared__ SampleShared sh;
  const auto* specs = reinterpret_cast<const RowSampleSpec*>(buffer + sizeof(RowSampleHeader));
  const auto* all_edits = reinterpret_cast<const RowEdit*>(specs + rows);
  float* edit_raw = const_cast<float*>(reinterpret_cast<const float*>(all_edits + edit_total));
  const RowSampleSpec sp = specs[blockIdx.x];
  if (sp.logit_row < 0 || sp.logit_row >= R || sp.edit_begin < 0 || sp.edit_count < 0 ||
      int64_t(sp.edit_begin) + sp.edit_count > edit_total) {
    if (threadIdx.x == 0) report_error(err, op, kErrRow, sp.logit_row, int(R));
    return;
  }
  float* x = logits + int64_t(sp.logit_row) * V;
  const int n = int(sp.limit < V ? sp.limit : V);
  RowSampleResult* res = results + blockIdx.x;
  if (n < 1) {  // nothing to draw from: id 0, as sample_row_host gives
    if (threadIdx.x == 0) {
      res->id = 0;
      res->logprob = kMinLogprob;
      res->top_count = 0;
    }
    return;
  }
  const RowEdit* edits = all_edits + sp.edit_begin;
  float* raw_saved = edit_raw + sp.edit_begin;
  const bool want = sp.top_logprobs >= 0, raw_mode = (sp.flags & kRowRawLogprobs) != 0;
  const int top_k_lp = sp.top_logprobs > 0 ? (sp.top_logprobs < n ? sp.top_logprobs : n) : 0;
  Keys keys;
  while (keys.id_bits < 31 && (1 << keys.id_bits) < n) ++keys.id_bits;
  const int rank_levels = (32 + keys.id_bits + 3) / 4, id_levels = (keys.id_bits + 3) / 4;

  // Raw logprobs: the raw distribution before any edit.
  double raw_lse = 0.0;
  bool raw_finite = false;
  if (want && raw_mode) {
    unsigned long long m = 0;
    for_each_value(x, n, [&](int i, float v) { m = max(m, keys.rank(v, i)); });
    const float mx = x[keys.id_of(block_ext_u64(m, true, sh))];
    raw_finite = mx != -INFINITY;
    double s = 0.0;
    if (raw_finite)
      for_each_value(x, n, [&](int, float v) {
        if (v != -INFINITY) s += exp(double(v) - double(mx));
      });
    s = block_sum_d(s, sh);
    raw_lse = raw_finite ? double(mx) + log(s) : 0.0;
    top_entries(x, n, top_k_lp, keys, [](int, float v) { return v; }, sh);
  }
  __syncthreads();
  // The processors (edits are one per id).
  for (int e = threadIdx.x; e < sp.edit_count; e += kThreads) {
    const RowEdit ed = edits[e];
    if (ed.id < 0 || ed.id >= n) continue;
    float v = x[ed.id];
    raw_saved[e] = v;
    if (ed.flags & kEditBias) v += ed.bias;
    if (ed.flags & kEditBlocked) v = -INFINITY;
    if (ed.flags & kEditRepeat) v = v > 0 ? v / sp.repetition_penalty : v * sp.repetition_penalty;
    if (ed.flags & kEditSubtract) v -= ed.subtract;
    x[ed.id] = v;
  }
  __syncthreads();

  int chosen = 0;
  if (sp.flags & kRowGreedy) {
    unsigned long long m = 0;
    if (slice_keys && plain_argmax(sp)) {  // argmax_slices_kernel made the pass
      if (threadIdx.x < kArgmaxSlices) m = slice_keys[int64_t(blockIdx.x) * kArgmaxSlices + threadIdx.x];
    } else {
      for_each_value(x, n, [&](int i, float v) { m = max(m, keys.rank(v, i)); });
    }
    chosen = keys.id_of(block_ext_u64(m, true, sh));
    if (want && !raw_mode) {
      const float mx = x[chosen];
      const bool finite = mx != -INFINITY;
      double s = 0.0;
      if (finite)
        for_each_value(x, n, [&](int, float v) {
          if (v != -INFINITY) s += exp(double(v) - double(mx));
        });
      s = block_sum_d(s, sh);
      const double lse = finite ? double(mx) + log(s) : 0.0;
      top_entries(x, n, top_k_lp, keys, [](int, float v) { return v; }, sh);
      if (threadIdx.x == 0) {
        res->logprob = logprob_of(mx, lse, finite);
        for (int j = 0; j < sh.top_n; ++j) {
          res->top_id[j] = sh.top_id[j];
          res->top_logprob[j] = logprob_of(sh.top_value[j], lse, finite);
        }
        res->top_count = sh.top_n;
      }
    }
  } else {
    const float inv_t = sp.inv_temperature;
    auto scaled = [&](float v) { return v * inv_t; };  // the host's in-place multiply
    unsigned long long m = 0;
    for_each_value(x, n, [&](int i, float v) { m = max(m, keys.rank(scaled(v), i)); });
    const float mx = scaled(x[keys.id_of(block_ext_u64(m, true, sh))]);
    const double mxd = double(mx);
    const bool any = mx != -INFINITY;
    // Candidates: finite, p > 0, p >= min_p (relative to the most likely).
    auto prob = [&](int, float v) { return exp(double(scaled(v)) - mxd); };
    if (threadIdx.x == 0) sh.value = any ? double(candidate_floor(mx, sp.min_p)) : 0.0;
    __syncthreads();
    const float floor_value = float(sh.value);
    __syncthreads();
    auto candidate = [&](int, float v) {
      const float s = scaled(v);
      return s != -INFINITY && s >= floor_value;
    };
    const bool by_rank = (sp.top_k > 0 && sp.top_k < n) || sp.top_p < 1.0;
    unsigned long long kth = 0, pth = 0;  // key thresholds (0: none)
    auto rank_key = [&](int i, float v) { return keys.rank(scaled(v), i); };
    auto kept2 = [&](int i, float v) { return candidate(i, v) && rank_key(i, v) >= kth; };
    auto kept3 = [&](int i, float v) { return kept2(i, v) && rank_key(i, v) >= pth; };
    double sum3 = 1.0;
    if (any) {
      if (sp.top_k > 0) {
        double c = 0.0;
        for_each_value(x, n, [&](int i, float v) { c += candidate(i, v) ? 1.0 : 0.0; });
        c = block_sum_d(c, sh);
        if (double(sp.top_k) < c)
          select_key(x, n, rank_levels, double(sp.top_k), false, candidate, [](int, float) { return 1.0; }, rank_key,
                     sh, &kth);
      }
      double sum2 = 0.0;
      for_each_value(x, n, [&](int i, float v) {
        if (kept2(i, v)) sum2 += prob(i, v);
      });
      sum2 = block_sum_d(sum2, sh);
      if (sp.top_p < 1.0) {
        unsigned long long k = 0;
        if (select_key(x, n, rank_levels, sp.top_p, false, kept2, [&](int i, float v) { return prob(i, v) / sum2; },
                       rank_key, sh, &k))
          pth = k;
      }
      sum3 = 0.0;
      for_each_value(x, n, [&](int i, float v) {
        if (kept3(i, v)) sum3 += prob(i, v);
      });
      sum3 = block_sum_d(sum3, sh);
      const double target = sp.uniform * sum3;
      unsigned long long k = 0;
      bool hit;
      if (by_rank)
        hit = select_key(x, n, rank_levels, target, true, kept3, prob, rank_key, sh, &k);
      else
        hit = select_key(x, n, id_levels, target, true, kept3, prob, [&](int i, float) { return keys.by_id(i); }, sh, &k);
      if (hit) {
        chosen = keys.id_of(k);
      } else {  // rounding left the variate past the total: the last candidate in draw order
        unsigned long long lo = ~0ull;
        for_each_value(x, n, [&](int i, float v) {
          if (kept3(i, v)) {
            const unsigned long long ki = by_rank ? rank_key(i, v) : keys.by_id(i);
            lo = ki < lo ? ki : lo;
          }
        });
        chosen = keys.id_of(block_ext_u64(lo, false, sh));
      }
    }
    if (want && !raw_mode) {
      // The distribution the draw used: kept ids at their scaled logits, the rest -inf.
      const double lse = any ? mxd + log(sum3) : 0.0;
      auto kept_value = [&](int i, float v) { return any && kept3(i, v) ? scaled(v) : -INFINITY; };
      top_entries(x, n, top_k_lp, keys, kept_value, sh);
      if (threadIdx.x == 0) {
        res->logprob = logprob_of(kept_value(chosen, x[chosen]), lse, any);
        for (int j = 0; j < sh.top_n; ++j) {
          res->top_id[j] = sh.top_id[j];
          res->top_logprob[j] = logprob_of(sh.top_value[j], lse, any);
        }
        res->top_count = sh.top_n;
      }
    }
  }
  if (threadIdx.x == 0) {
    res->id = chosen;
    if (want && raw_mode) {
      // The chosen id's raw logit: saved by its edit, else unchanged.
      float v = x[chosen];
      int lo = 0, hi = sp.edit_count - 1;
      while (lo <= hi) {
        const int mid = (lo + hi) / 2;
        if (edits[mid].id == chosen) {
          v = raw_saved[mid];
          break;
        }
        if (edits[mid].id < chosen) lo = mid + 1;
        else hi = mid - 1;
      }
      res->logprob = logprob_of(v, raw_lse, raw_finite);
      for (int j = 0; j < sh.top_n; ++j) {
        res->top_id[j] = sh.top_id[j];
        res->top_logprob[j] = logprob_of(sh.top_value[j], raw_lse, raw_finite);
      }
      res->top_count = sh.top_n;
    }
    if (!want) {
      res->logprob = 0.0f;
      res->top_count = 0;
    }
  }
}

}  // namespace

void CudaBackend::sample_rows(const Tensor& out, const Tensor& logits, const Tensor& specs, int64_t rows,
                              int64_t edits) {
  const size_t need = sizeof(RowSampleHeader) + size_t(rows) * sizeof(RowSampleSpec) + size_t(edits) * sizeof(RowEdit) +
                      size_t(edits) * sizeof(float);
  if (!check(logits.dtype == DType::F32 && logits.rank == 2 && specs.bytes() >= need &&
                 out.bytes() >= size_t(rows) * sizeof(RowSampleResult) && logits.cols() < (int64_t(1) << 31) &&
                 edits < (int64_t(1) << 31),
             "sample_rows", [&] { return describe(out) + " <- " + describe(logits) + " by " + describe(specs); }))
    return;
  if (rows == 0) return;
  const int op = op_index();
  // Few rows: their argmax passes spread over the GPU first (rows that are
  // not a plain argmax ignore them). Many rows fill the GPU one block each.
  const bool slices = rows <= kArgmaxSliceRows && try_reserve_scratch(size_t(rows) * kArgmaxSlices * 8);
  enqueue("sample_rows", [=, this](cudaStream_t s) {
    auto* keys = slices ? static_cast<unsigned long long*>(scratch()) : nullptr;
    if (slices) {
      argmax_slices_kernel<<<dim3(kArgmaxSlices, unsigned(rows)), kArgmaxThreads, 0, s>>>(
          keys, static_cast<const float*>(logits.data), logits.cols(), logits.rows(), static_cast<const char*>(specs.data));
      if (cudaError_t e = cudaGetLastError(); e != cudaSuccess) return e;
    }
    sample_rows_kernel<<<unsigned(rows), kThreads, 0, s>>>(
        static_cast<RowSampleResult*>(out.data), static_cast<float*>(logits.data), logits.cols(), logits.rows(),
        static_cast<const char*>(specs.data), int(rows), int(edits), keys, dev_error(), op);
    return cudaGetLastError();
  });
}

}  // namespace muse::cuda
