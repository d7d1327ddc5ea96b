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

Result<HostQuantView> CheckpointWeightSource::quantized(const WeightSpec& spec) const {
  const ResolvedWeight* w = ck_.find(spec.slot, spec.layer);
  if (!w || !w->quantized()) return HostQuantView{};
  const ResolvedWeight::Quantized& q = w->quant;
  HostQuantView v;
  v.format = q.format;
  v.code_dtype = q.format.kind == QuantKind::Fp8 ? DType::F8_E4M3 : DType::F4;
  v.codes = w->tensor.data, v.codes_bytes = w->tensor.nbytes;
  v.scales = q.scales.data, v.scales_bytes = q.scales.nbytes;
  v.scale_shape = q.scales.shape.empty() ? std::vector<int64_t>{1} : q.scales.shape;
  if (q.zeros.data) v.zeros = q.zeros.data, v.zeros_bytes = q.zeros.nbytes, v.zero_shape = q.zeros.shape;
  v.global = q.global;
  return v;
}

}  // namespace muse
