// The step plan: everything the operations of one forward step need to know
// beyond their tensors (token ids, positions, which sequence each row is,
// each sequence's KV place and block table, the rows whose logits are
// wanted), laid out flat in one I32 buffer of fixed capacity.
//
// Why flat and fixed: the engine fills a host image of the plan and uploads
// it with one set_input per step; every op reads it from backend memory when
// it runs. Nothing about a step is captured in host vectors or freshly
// allocated objects, so a step allocates nothing and a GPU backend can copy
// one small buffer up and replay a recorded graph.
//
// Layout (int32 elements; offsets in StepPlanLayout):
//   header[8]             rows, seqs, logit_rows, blocks used, 0...
//   tokens[max_rows]      token id of each row
//   positions[max_rows]   absolute position of each row
//   row_seq[max_rows]     sequence index of each row
//   seq_row_begin[max_seqs+1]   rows of sequence s: [seq_row_begin[s], seq_row_begin[s+1])
//   seq_pos_begin[max_seqs]     position of the sequence's first row in this step
//   seq_full_begin[max_seqs]    its full-layer pages: block_table[seq_full_begin[s] ...]
//   seq_full_count[max_seqs]    ... that many entries (pages_per_block per logical block, block-major)
//   seq_slide_begin[max_seqs]   its sliding-layer pages: block_table[seq_slide_begin[s] ...]
//   seq_slide_count[max_seqs]   ... that many entries, -1 where a block is not kept
//   seq_slide_first[max_seqs]   logical block of its first sliding entry
//   logit_rows[max_logit_rows]  rows whose logits are produced, in output order
//   block_table[max_blocks]     page ids (see kv_cache.h), both kinds, all sequences
// Rows of a sequence are consecutive and its positions consecutive. Page
// of logical block j, group g (a layer's page within the block, of n per
// block): full  block_table[full_begin + j*n + g];
//        sliding block_table[slide_begin + (j - slide_first)*n + g].
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "muse/backends/tensor.h"

namespace muse {

struct StepPlanCapacity {
  int64_t max_rows = 1;        // token rows per step
  int64_t max_seqs = 1;        // sequences per step
  int64_t max_logit_rows = 1;  // rows whose logits a step produces
  int64_t max_blocks = 1;      // page-table entries per step, both kinds, all sequences together
};

struct StepPlanLayout {
  static constexpr int64_t kRows = 0, kSeqs = 1, kLogitRows = 2, kBlocks = 3, kHeader = 8;
  int64_t tokens = 0, positions = 0, row_seq = 0, seq_row_begin = 0, seq_pos_begin = 0, seq_full_begin = 0,
          seq_full_count = 0, seq_slide_begin = 0, seq_slide_count = 0, seq_slide_first = 0, logit_rows = 0,
          block_table = 0, total = 0;

  static StepPlanLayout for_capacity(const StepPlanCapacity& c) {
    StepPlanLayout l;
    int64_t at = kHeader;
    auto take = [&at](int64_t n) { int64_t o = at; at += n; return o; };
    l.tokens = take(c.max_rows);
    l.positions = take(c.max_rows);
    l.row_seq = take(c.max_rows);
    l.seq_row_begin = take(c.max_seqs + 1);
    l.seq_pos_begin = take(c.max_seqs);
    l.seq_full_begin = take(c.max_seqs);
    l.seq_full_count = take(c.max_seqs);
    l.seq_slide_begin = take(c.max_seqs);
    l.seq_slide_count = take(c.max_seqs);
    l.seq_slide_first = take(c.max_seqs);
    l.logit_rows = take(c.max_logit_rows);
    l.block_table = take(c.max_blocks);
    l.total = at;
    return l;
  }
};

// What ops receive: the plan buffer in backend memory, its layout, and the
// step-independent attention geometry. `tokens`, `positions` and
// `logit_rows` are views of the buffer, for ops that take plain tensors.
struct StepPlanView {
  Tensor buffer;  // I32 [layout.total]
  StepPlanLayout layout;
  int64_t window = 0;      // sliding window (keys visible to a query, itself included)
  int64_t block_size = 0;  // positions per block
  Tensor tokens, positions, logit_rows;  // I32 [capacity] views
  // Host hints for the step being enqueued (0: not known): the most rows of
  // one sequence, and the highest position + 1 of any row. Backends may pick
  // a kernel or a launch size by them (a prefill kernel for long runs of
  // rows; no blocks for keys no row sees), never change a result by them.
  int64_t max_seq_rows = 0, max_seq_end = 0;

  // The view of `buffer` (I32, at least layout.total elements) for a plan of
  // `capacity`.
  static StepPlanView over(const Tensor& buffer, const StepPlanCapacity& capacity, int64_t window,
                           int64_t block_size) {
    StepPlanView v;
    v.buffer = buffer;
    v.layout = StepPlanLayout::for_capacity(capacity);
    v.window = window;
    v.block_size = block_size;
    v.tokens = buffer.rows(v.layout.tokens, capacity.max_rows);
    v.positions = buffer.rows(v.layout.positions, capacity.max_rows);
    v.logit_rows = buffer.rows(v.layout.logit_rows, capacity.max_logit_rows);
    return v;
  }
};

// A max_seq_end hint rounded up to a coarse value (at most 25% more, and a
// multiple of 128): steps whose sequences grow by a token each keep the
// same hint, so a recorded step (Backend::begin_graph) keyed by it is
// replayed for hundreds of steps, not one. 0 (not known) stays 0.
inline int64_t coarse_seq_end(int64_t end) {
  if (end <= 0) return 0;
  int64_t grain = 128;
  while (grain * 8 <= end) grain *= 2;  // end / 8 < grain <= end / 4, at least 128
  return (end + grain - 1) / grain * grain;
}

// Reads a plan image (host memory, or backend memory on a host backend).
struct StepPlanReader {
  const int32_t* p;
  const StepPlanLayout& l;
  int64_t rows() const { return p[StepPlanLayout::kRows]; }
  int64_t seqs() const { return p[StepPlanLayout::kSeqs]; }
  int64_t logit_rows() const { return p[StepPlanLayout::kLogitRows]; }
  int64_t row_begin(int64_t s) const { return p[l.seq_row_begin + s]; }
  int64_t num_rows(int64_t s) const { return p[l.seq_row_begin + s + 1] - p[l.seq_row_begin + s]; }
  int64_t pos_begin(int64_t s) const { return p[l.seq_pos_begin + s]; }
  int64_t full_count(int64_t s) const { return p[l.seq_full_count + s]; }
  int64_t slide_count(int64_t s) const { return p[l.seq_slide_count + s]; }
  int64_t slide_first(int64_t s) const { return p[l.seq_slide_first + s]; }
  // Page of logical block j, group g of n per block; -1 when the table has none.
  int32_t full_page(int64_t s, int64_t j, int64_t g, int64_t n) const {
    const int64_t i = j * n + g;
    return j >= 0 && i < full_count(s) ? p[l.block_table + p[l.seq_full_begin + s] + i] : -1;
  }
  int32_t slide_page(int64_t s, int64_t j, int64_t g, int64_t n) const {
    const int64_t jj = j - slide_first(s), i = jj * n + g;
    return jj >= 0 && i < slide_count(s) ? p[l.block_table + p[l.seq_slide_begin + s] + i] : -1;
  }
  int64_t table_entries() const { return p[StepPlanLayout::kBlocks]; }
};

// Builds the host image of a plan, step after step, in memory allocated
// once. Sequences are added in row order.
class StepPlanBuilder {
 public:
  explicit StepPlanBuilder(const StepPlanCapacity& c = {})
      : cap_(c), layout_(StepPlanLayout::for_capacity(c)), image_(size_t(layout_.total), 0) {}

  const StepPlanCapacity& capacity() const { return cap_; }
  const StepPlanLayout& layout() const { return layout_; }

  void reset() {
    rows_ = seqs_ = logits_ = blocks_ = max_seq_rows_ = max_seq_end_ = 0;
    image_[size_t(layout_.seq_row_begin)] = 0;
    write_header();
  }
  // Whether a sequence of this many rows, logit rows and table entries still fits.
  bool fits(int64_t rows, int64_t logit_rows, int64_t blocks) const {
    return rows_ + rows <= cap_.max_rows && seqs_ + 1 <= cap_.max_seqs && logits_ + logit_rows <= cap_.max_logit_rows &&
           blocks_ + blocks <= cap_.max_blocks;
  }
  // Appends one sequence: `tokens` at positions pos_begin..., its full and
  // sliding page tables; logits for its last row (last_logit) or every row
  // (all_logits). The caller checks fits() first.
  void add(std::span<const int32_t> tokens, int64_t pos_begin, std::span<const int32_t> full_pages,
           std::span<const int32_t> slide_pages, int64_t slide_first, bool all_logits, bool last_logit) {
    int32_t* im = image_.data();
    const int64_t n = int64_t(tokens.size());
    for (int64_t r = 0; r < n; ++r) {
      im[layout_.tokens + rows_ + r] = tokens[size_t(r)];
      im[layout_.positions + rows_ + r] = int32_t(pos_begin + r);
      im[layout_.row_seq + rows_ + r] = int32_t(seqs_);
      if (all_logits || (last_logit && r == n - 1)) im[layout_.logit_rows + logits_++] = int32_t(rows_ + r);
    }
    im[layout_.seq_pos_begin + seqs_] = int32_t(pos_begin);
    im[layout_.seq_full_begin + seqs_] = int32_t(blocks_);
    im[layout_.seq_full_count + seqs_] = int32_t(full_pages.size());
    for (size_t b = 0; b < full_pages.size(); ++b) im[layout_.block_table + blocks_ + int64_t(b)] = full_pages[b];
    blocks_ += int64_t(full_pages.size());
    im[layout_.seq_slide_begin + seqs_] = int32_t(blocks_);
    im[layout_.seq_slide_count + seqs_] = int32_t(slide_pages.size());
    im[layout_.seq_slide_first + seqs_] = int32_t(slide_first);
    for (size_t b = 0; b < slide_pages.size(); ++b) im[layout_.block_table + blocks_ + int64_t(b)] = slide_pages[b];
    blocks_ += int64_t(slide_pages.size());
    rows_ += n;
    max_seq_rows_ = n > max_seq_rows_ ? n : max_seq_rows_;
    max_seq_end_ = pos_begin + n > max_seq_end_ ? pos_begin + n : max_seq_end_;
    ++seqs_;
    im[layout_.seq_row_begin + seqs_] = int32_t(rows_);
    write_header();
  }

  int64_t rows() const { return rows_; }
  int64_t seqs() const { return seqs_; }
  int64_t logit_rows() const { return logits_; }
  int64_t max_seq_rows() const { return max_seq_rows_; }  // the most rows of one sequence
  int64_t max_seq_end() const { return max_seq_end_; }    // the highest position + 1
  const int32_t* data() const { return image_.data(); }
  StepPlanReader reader() const { return {image_.data(), layout_}; }
  // Bytes to upload: everything before the block table, plus the used part of it.
  size_t upload_bytes() const { return size_t(layout_.block_table + blocks_) * sizeof(int32_t); }

 private:
  void write_header() {
    image_[StepPlanLayout::kRows] = int32_t(rows_);
    image_[StepPlanLayout::kSeqs] = int32_t(seqs_);
    image_[StepPlanLayout::kLogitRows] = int32_t(logits_);
    image_[StepPlanLayout::kBlocks] = int32_t(blocks_);
  }
  StepPlanCapacity cap_;
  StepPlanLayout layout_;
  std::vector<int32_t> image_;
  int64_t rows_ = 0, seqs_ = 0, logits_ = 0, blocks_ = 0, max_seq_rows_ = 0, max_seq_end_ = 0;
};

}  // namespace muse
