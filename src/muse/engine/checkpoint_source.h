// A WeightSource over an opened Checkpoint: F32/BF16 tensors are handed out
// in place (mmap'd, zero copy); other dtypes and per-expert layouts are
// converted to f32 by the loader; quantized slots are handed out as stored.
#pragma once

#include <memory>
#include <unordered_set>
#include <vector>

#include "muse/loading/checkpoint.h"
#include "muse/model/weights.h"

namespace muse {

class CheckpointWeightSource final : public WeightSource {
 public:
  explicit CheckpointWeightSource(const Checkpoint& checkpoint) : ck_(checkpoint) {}
  Result<HostTensor> view(const WeightSpec& spec) const override;
  Status read_f32(const WeightSpec& spec, float* dst) const override;
  // Quantized slots as stored: codes, scales and zeros point into the mapping.
  Result<HostQuantView> quantized(const WeightSpec& spec) const override;
  uint64_t stored_quantized_bytes(const WeightSpec& spec) const override;
  std::vector<std::array<float, 2>> kv_scales() const override { return ck_.kv_scales(); }

 private:
  const Checkpoint& ck_;
  // Per-expert quantized pieces stacked into the fused layout (a copy: the
  // pieces are separate tensors in the file); kept as long as the source.
  mutable std::vector<std::unique_ptr<HostQuantWeight>> stacked_;
  mutable std::vector<std::unique_ptr<std::vector<float>>> widened_;  // FP8 scales stored F16 / BF16, as F32
  mutable std::unordered_set<const ResolvedWeight*> scales_checked_;  // scale values scanned already
  Result<HostQuantView> check_once(const HostQuantView& v, const ResolvedWeight& w) const;
};

}  // namespace muse
