#include "muse/engine/checkpoint_source.h"

namespace muse {

Result<HostTensor> CheckpointWeightSource::view(const WeightSpec& spec) const {
  const ResolvedWeight* w = ck_.find(spec.slot, spec.layer);
  if (!w) return make_error("not in the checkpoint");
  if (w->per_expert) return HostTensor{};  // stored one expert at a time: convert
  const TensorView& t = w->tensor;
  if (t.shape != spec.shape) return HostTensor{};  // let the loader reshape/convert
  return HostTensor{t.dtype, t.shape, t.data, t.nbytes};
}

Status CheckpointWeightSource::read_f32(const WeightSpec& spec, float* dst) const {
  return ck_.read_f32(spec.slot, spec.layer, dst);
}

}  // namespace muse
