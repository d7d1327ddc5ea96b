// A rank's view of a weight source: it answers for the rank's local specs
// (model/sharding.h shard_weights) with that rank's slice of each logical
// tensor, so upload_weights loads a shard exactly as it loads a whole model.
// Slices along the outermost dimension (column-split rows, experts, vocab
// rows) are views into the inner source (zero copy from a memory-mapped
// checkpoint); others (row-split columns, the padded last vocab shard) are
// gathered once from the mapping into buffers this source owns, in the
// stored dtype. Either way only the shard's bytes are read.
#pragma once

#include <deque>
#include <map>
#include <utility>
#include <vector>

#include "muse/model/sharding.h"
#include "muse/model/weights.h"

namespace muse {

class ShardWeightSource final : public WeightSource {
 public:
  // `inner` must outlive this source; this source must outlive the model.
  ShardWeightSource(const WeightSource& inner, const ModelConfig& config, const ParallelRank& rank);

  Result<HostTensor> view(const WeightSpec& spec) const override;
  Status read_f32(const WeightSpec& spec, float* dst) const override;
  Result<Tensor> create_on(Backend& backend, const WeightSpec& spec, DType dtype) const override;
  Result<HostQuantView> quantized(const WeightSpec& spec) const override;
  std::vector<std::array<float, 2>> kv_scales() const override { return inner_.kv_scales(); }  // per layer, unsharded

 private:
  // The logical (unsharded) spec of a local one, and the rank's slice of it.
  Result<std::pair<const WeightSpec*, ShardSlice>> resolve(const WeightSpec& local) const;

  const WeightSource& inner_;
  ModelConfig config_;
  ParallelRank rank_;
  std::vector<WeightSpec> global_;
  std::map<std::pair<int, std::string>, size_t> index_;  // (layer, slot) -> global_
  mutable std::deque<std::vector<char>> owned_;          // gathered slices (stable addresses)
};

}  // namespace muse
