// The DFlash/DSpark block drafter (dspark.md §2–§4.2) on the host, in fp32:
// a fused context vector per committed target position (fc → hidden_norm
// over the target's tapped residual streams), L pre-norm layers whose
// queries come from the block [anchor, MASK×(k−1)] and whose keys/values
// are the context's (cached per sequence, a window of them) plus the
// block's own (transient), bidirectional inside the block; the target's raw
// embedding rows and lm_head; then the Markov head and the confidence head,
// serially over the rows.
//
// Why on the host and not through backends/backend.h: the drafter needs two
// operations the interface does not have yet (a weighted per-head q/k norm
// followed by RoPE, and attention of a block over a per-sequence context
// ring without a causal mask). At muse-tiny's size (hidden 256, 2 layers,
// 4 rows) a block costs well under a millisecond here; moving it onto the
// backend with those two ops is the CUDA-side follow-up (docs/speculative.md).
//
// Deterministic: every sum has one fixed order, independent of batch and threads.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "muse/core/status.h"
#include "muse/model/config.h"

namespace muse {

struct DrafterConfig {
  std::string source;  // the config.json path, for messages
  std::string model_type;
  int64_t hidden = 0, layers = 0, heads = 0, kv_heads = 0, head_dim = 0, intermediate = 0;
  int64_t sliding_window = 0;  // 0: no layer is windowed
  // A windowed layer's block row at position q sees the context positions p
  // with q − p <= window_reach. The two references differ by one: the
  // transformers Glimmer assistant (create_bidirectional_sliding_window_mask)
  // keeps distance == sliding_window, the DeepSpec-style drafters (muse-tiny's
  // is trained by scripts/tiny with the target's rule) stop below it.
  int64_t window_reach = 0;
  std::vector<bool> windowed_layers;  // per draft layer (layer_types): sliding_attention, else the whole context
  int64_t block_size = 0;
  std::vector<int> target_layer_ids;  // residual-stream outputs of these target layers
  bool final_hidden_state = false;    // the target's final (post-norm) state appended to the taps
  int64_t target_hidden = 0;
  int64_t markov_rank = 0;            // 0: no Markov head (plain DFlash)
  bool confidence_head = false, confidence_with_markov = false;
  double rms_norm_eps = 1e-6, rope_theta = 10000.0;
  int64_t vocab = 0, sampling_vocab = 0;  // draft logits of ids >= sampling_vocab are -inf
  int32_t mask_token_id = 0;
  bool sample_from_anchor = true;  // DSpark: k rows emit; DFlash: the k−1 mask rows emit

  int64_t drafts_per_block() const { return sample_from_anchor ? block_size : block_size - 1; }
  int64_t taps() const { return int64_t(target_layer_ids.size()) + (final_hidden_state ? 1 : 0); }
  int64_t tap_width() const { return taps() * target_hidden; }
  // The most context positions before the anchor a block reads; 0: all of
  // them (some layer attends to the whole context).
  int64_t context_reach() const {
    for (bool w : windowed_layers)
      if (!w) return 0;
    return window_reach;
  }
  int64_t q_dim() const { return heads * head_dim; }
  int64_t kv_dim() const { return kv_heads * head_dim; }
};

// Reads `dir`/config.json (DeepSpec/HF keys, dspark.md §3a; the speculators
// spellings where they differ) and checks it against the target.
Result<DrafterConfig> load_drafter_config(const std::string& dir, const ModelConfig& target);

// One sequence's drafter state: K/V of the fused context vectors of
// committed positions, per layer, in a ring of the positions a block can
// see (context_reach(), or the whole sequence). Positions need not start at
// 0 (a prefix-cache hit has no taps below where computing started).
struct DraftContext {
  int64_t slots = 0;          // ring size
  int64_t next_pos = 0;       // one past the last position appended
  std::vector<int64_t> pos;   // [slots]: the position a slot holds, -1 none
  std::vector<float> k, v;    // [layers][slots][kv_dim]
  void clear() {
    next_pos = 0;
    std::fill(pos.begin(), pos.end(), -1);
  }
};

// How a block's drafts are drawn (dspark.md §4.2).
struct DraftSampling {
  bool probabilistic = false;  // false: argmax
  double temperature = 1.0;
  int64_t top_k = 0;
  double top_p = 1.0;
  uint64_t seed = 0;  // noise keyed on (seed, position)
};

struct DraftBlock {
  int64_t anchor_pos = 0;
  std::vector<int32_t> tokens;      // drafts_per_block(); draft i is for position anchor_pos + 1 + i
  std::vector<float> confidence;    // σ(ℓ_i) per draft (1 without a confidence head)
  std::vector<float> q;             // [drafts, sampling_vocab]: the distributions drawn from (probabilistic only)
};

class Drafter {
 public:
  // `embed` and `lm_head` are the target's [vocab, target_hidden] rows in
  // fp32 (copied: the drafter keeps its own).
  static Result<std::unique_ptr<Drafter>> load(const std::string& dir, const ModelConfig& target,
                                               std::vector<float> embed, std::vector<float> lm_head);
  // From weights already in memory (tests): `tensors` by checkpoint name, fp32.
  static Result<std::unique_ptr<Drafter>> create(DrafterConfig config,
                                                 const std::function<Status(const std::string& name,
                                                                            std::span<const int64_t> shape,
                                                                            std::vector<float>* out)>& read,
                                                 std::vector<float> embed, std::vector<float> lm_head);
  ~Drafter();

  const DrafterConfig& config() const { return c_; }
  // A context for a sequence of at most `max_positions` positions (the ring
  // holds all of them when some layer reads the whole context).
  DraftContext new_context(int64_t max_positions) const;
  // Appends committed positions first_pos .. first_pos+n−1 from their taps
  // ([n, tap_width], the layers in target_layer_ids order). Positions must
  // follow on from what the context holds, or restart it (a gap clears it).
  void append_context(DraftContext& ctx, const float* taps, int64_t n, int64_t first_pos) const;
  // Drafts one block for `anchor` at `anchor_pos` (the context holds
  // positions < anchor_pos).
  void draft(const DraftContext& ctx, int32_t anchor, int64_t anchor_pos, const DraftSampling& sampling,
             DraftBlock* out) const;
  // The backbone's draft logits, U = lm_head(h) of the emitting rows
  // ([drafts_per_block, sampling_vocab], before any Markov bias): what a
  // DFlash drafter's argmax reads (the parity test compares them).
  void base_logits(const DraftContext& ctx, int32_t anchor, int64_t anchor_pos, std::vector<float>* out) const;

 private:
  struct Weights;
  Drafter() = default;
  // The block's final-norm hidden states h [block_size, hidden].
  void backbone(const DraftContext& ctx, int32_t anchor, int64_t anchor_pos, std::vector<float>* h) const;
  DrafterConfig c_;
  std::unique_ptr<Weights> w_;
};

}  // namespace muse
