// Random rows for the row-sampling tests (sampling/row_sampling.h): logits
// with ties, -inf entries and a sampled vocabulary below the width, and
// specs covering greedy and random draws, every truncation, both logprob
// modes and every kind of edit. Shared by the CPU and CUDA tests.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "muse/sampling/row_sampling.h"

namespace muse::testing {

struct RowSampleCase {
  int64_t vocab = 0;                // columns of the logits
  std::vector<float> logits;        // [rows, vocab]
  std::vector<RowSampleSpec> specs; // logit_row r, edits indexed into `edits`
  std::vector<RowEdit> edits;

  // The buffer Backend::sample_rows reads (without the op's scratch room).
  std::vector<char> buffer() const {
    RowSampleHeader h;
    h.rows = int32_t(specs.size());
    h.edits = int32_t(edits.size());
    h.vocab = int32_t(vocab);
    std::vector<char> b(sizeof h + specs.size() * sizeof(RowSampleSpec) + edits.size() * sizeof(RowEdit));
    std::memcpy(b.data(), &h, sizeof h);
    std::memcpy(b.data() + sizeof h, specs.data(), specs.size() * sizeof(RowSampleSpec));
    if (!edits.empty())
      std::memcpy(b.data() + sizeof h + specs.size() * sizeof(RowSampleSpec), edits.data(), edits.size() * sizeof(RowEdit));
    return b;
  }
};

inline RowSampleCase make_row_sample_case(int rows, int64_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  std::normal_distribution<float> normal(0.0f, 3.0f);
  RowSampleCase c;
  c.vocab = vocab;
  c.logits.resize(size_t(rows) * size_t(vocab));
  for (int r = 0; r < rows; ++r) {
    const int style = int(g() % 4);  // 0 plain, 1 coarse (many ties), 2 peaked, 3 with -inf
    float* x = c.logits.data() + size_t(r) * size_t(vocab);
    for (int64_t i = 0; i < vocab; ++i) {
      float v = normal(g);
      if (style == 1) v = std::round(v * 4.0f) / 4.0f;
      if (style == 2 && i % 997 == 3) v += 12.0f;
      if (style == 3 && g() % 5 == 0) v = -std::numeric_limits<float>::infinity();
      x[i] = v;
    }
    RowSampleSpec s;
    s.logit_row = r;
    s.limit = int32_t(g() % 3 == 0 ? vocab - int64_t(g() % 17) : vocab);
    const bool greedy = g() % 4 == 0;
    s.flags = (greedy ? kRowGreedy : 0u) | (g() % 2 ? kRowRawLogprobs : 0u);
    const int lp[] = {-1, -1, 0, 1, 5, 20};
    s.top_logprobs = lp[g() % 6];
    if (!greedy) {
      const double temps[] = {0.3, 0.7, 1.0, 1.5};
      s.inv_temperature = float(1.0 / temps[g() % 4]);
      const int ks[] = {0, 0, 1, 5, 50, 1000};
      s.top_k = ks[g() % 6];
      const double ps[] = {1.0, 1.0, 0.9, 0.5, 0.99};
      s.top_p = ps[g() % 5];
      s.min_p = g() % 3 == 0 ? 0.05 : 0.0;
      s.uniform = u01(g);
    }
    s.repetition_penalty = g() % 2 ? 1.3f : 1.0f;
    // Edits: unique sorted ids below the limit.
    s.edit_begin = int32_t(c.edits.size());
    const int want = int(g() % 40);
    std::vector<int32_t> ids;
    for (int k = 0; k < want; ++k) ids.push_back(int32_t(g() % uint32_t(s.limit)));
    if (g() % 3 == 0) ids.push_back(int32_t(std::max<int64_t>(0, s.limit - 1)));
    std::sort(ids.begin(), ids.end());
    ids.erase(std::unique(ids.begin(), ids.end()), ids.end());
    for (int32_t id : ids) {
      RowEdit e;
      e.id = id;
      const uint32_t f = g();
      if (f & 1) e.flags |= kEditBias, e.bias = float(u01(g) * 20.0 - 10.0);
      if ((f & 6) == 6) e.flags |= kEditBlocked;
      if ((f & 8) && s.repetition_penalty != 1.0f) e.flags |= kEditRepeat;
      if (f & 16) e.flags |= kEditSubtract, e.subtract = float(u01(g) * 2.0);
      if (e.flags == 0) e.flags = kEditBias, e.bias = 5.0f;
      c.edits.push_back(e);
    }
    s.edit_count = int32_t(c.edits.size()) - s.edit_begin;
    c.specs.push_back(s);
  }
  return c;
}

}  // namespace muse::testing
