#include "muse/engine/checkpoint_source.h"

#include <cstring>

#include "muse/loading/convert.h"

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

namespace {

void append(std::vector<uint8_t>& v, const uint8_t* p, size_t n) { v.insert(v.end(), p, p + n); }

// FP8 scales as the kernels take them (F32), from F32, F16 or BF16.
Result<std::vector<float>> f32_scales(const TensorView& t) {
  std::vector<float> v(size_t(t.numel()));
  MUSE_RETURN_IF_ERROR(convert_to_f32(t.dtype, t.data, 0, int64_t(v.size()), v.data()));
  return v;
}

// Experts stored one by one, each piece quantized: the fused [E, N, K]
// layout of the same format. Row-major kinds append rows (NVFP4 keeps one
// global scale per piece: gate and up halves; FP8 per-tensor pieces become
// per-channel scales); INT4 (N contiguous) concatenates every row of words,
// scales and zero points along N.
Result<HostQuantWeight> stack_pieces(const ResolvedWeight& w) {
  const int64_t E = w.spec.shape[0], P = int64_t(w.experts[0].size()), N = w.spec.shape[1], K = w.spec.shape[2];
  const int64_t Np = N / P;
  HostQuantWeight h;
  h.format = w.quant.format;
  h.code_dtype = h.format.kind == QuantKind::Fp8 ? DType::F8_E4M3 : DType::F4;
  const bool fp8_tensor = h.format.kind == QuantKind::Fp8 && h.format.block_rows > 1 && h.format.block_rows != 128;
  if (fp8_tensor) h.format.block_rows = 1, h.format.block_cols = int32_t(K);
  for (int64_t e = 0; e < E; ++e) {
    const auto& pieces = w.experts[size_t(e)];
    const auto& qs = w.expert_quant[size_t(e)];
    if (h.format.kind == QuantKind::Int4) {
      const int64_t G = h.format.block_cols, groups = (K + G - 1) / G;
      for (int64_t r = 0; r < K / 8; ++r)
        for (int64_t p = 0; p < P; ++p) append(h.codes, pieces[size_t(p)].data + r * Np * 4, size_t(Np * 4));
      for (int64_t g = 0; g < groups; ++g)
        for (int64_t p = 0; p < P; ++p) {
          append(h.scales, qs[size_t(p)].scales.data + g * Np * 2, size_t(Np * 2));
          append(h.zeros, qs[size_t(p)].zeros.data + g * (Np / 8) * 4, size_t(Np / 8 * 4));
        }
      continue;
    }
    for (int64_t p = 0; p < P; ++p) {
      const ResolvedWeight::Quantized& q = qs[size_t(p)];
      append(h.codes, pieces[size_t(p)].data, pieces[size_t(p)].nbytes);
      if (h.format.kind == QuantKind::Fp8) {
        MUSE_ASSIGN_OR_RETURN(std::vector<float> s, f32_scales(q.scales));
        if (fp8_tensor) s.assign(size_t(Np), s.at(0));
        append(h.scales, reinterpret_cast<const uint8_t*>(s.data()), s.size() * 4);
      } else {
        append(h.scales, q.scales.data, q.scales.nbytes);
      }
      if (h.format.kind == QuantKind::Nvfp4) h.global.push_back(q.global.at(0));
    }
  }
  const int64_t scale_elems = int64_t(h.scales.size()) / (h.format.scale_dtype == DType::F32 ? 4 : h.format.scale_dtype == DType::F16 ? 2 : 1);
  h.scale_shape = {E, scale_elems / E};
  if (!h.zeros.empty()) h.zero_shape = {E, int64_t(h.zeros.size()) / 4 / E};
  return h;
}

// compressed-tensors pack-quantized INT4 in GPTQ's N-contiguous layout:
// word (c, n) of [K/8, N] is word (n, c) of [N, K/8] (the same nibbles in the
// same order), scales [N, K/G] -> [K/G, N]; symmetric, so no zero points.
HostQuantWeight transpose_ct_int4(const ResolvedWeight& w) {
  const bool fused = w.spec.shape.size() == 3;
  const int64_t E = fused ? w.spec.shape[0] : 1, N = w.spec.shape[fused ? 1 : 0], K = w.spec.shape.back();
  const int64_t C = K / 8, G = w.quant.format.block_cols, groups = (K + G - 1) / G;
  HostQuantWeight h;
  h.format = w.quant.format;
  h.code_dtype = DType::F4;
  h.codes.resize(size_t(E * N * C * 4));
  h.scales.resize(size_t(E * N * groups * 2));
  for (int64_t e = 0; e < E; ++e) {
    const uint8_t* src = w.tensor.data + e * N * C * 4;
    const uint8_t* ssrc = w.quant.scales.data + e * N * groups * 2;
    for (int64_t n = 0; n < N; ++n) {
      for (int64_t c = 0; c < C; ++c) std::memcpy(h.codes.data() + ((e * C + c) * N + n) * 4, src + (n * C + c) * 4, 4);
      for (int64_t g = 0; g < groups; ++g)
        std::memcpy(h.scales.data() + ((e * groups + g) * N + n) * 2, ssrc + (n * groups + g) * 2, 2);
    }
  }
  h.scale_shape = fused ? std::vector<int64_t>{E, groups, N} : std::vector<int64_t>{groups, N};
  return h;
}

}  // namespace

namespace {
// The scales' values, checked where they are read for the upload (their
// pages are about to be read anyway), naming the tensors they came from.
Result<HostQuantView> checked(const HostQuantView& v, const ResolvedWeight& w) {
  const std::string where = w.per_expert ? "the per-expert scales of slot " + w.spec.slot + " of layer " +
                                               std::to_string(w.spec.layer)
                                         : "tensor " + w.quant.scales.name + " in " + w.quant.scales.file;
  if (Status s = check_scale_values(v.format, v.scales, v.scales_bytes); !s.ok())
    return make_error(where + ": " + s.message() + "; the checkpoint's scales are corrupt");
  if (Status s = check_global_values(v.global); !s.ok()) {
    const bool ct = w.quant.scheme == QuantScheme::CompressedTensorsNvfp4;
    const std::string global = w.per_expert || w.quant.global_scale.name.empty()
                                   ? where
                                   : "tensor " + w.quant.global_scale.name + " in " + w.quant.global_scale.file;
    return make_error(global + ": " + s.message() +
                      (ct ? " (compressed-tensors stores the reciprocal: a stored 0 becomes infinite)" : "") +
                      "; the checkpoint's scales are corrupt");
  }
  return v;
}
}  // namespace

Result<HostQuantView> CheckpointWeightSource::quantized(const WeightSpec& spec) const {
  const ResolvedWeight* w = ck_.find(spec.slot, spec.layer);
  if (!w || !w->quantized()) return HostQuantView{};
  if (w->quant.n_major) {
    stacked_.push_back(std::make_unique<HostQuantWeight>(transpose_ct_int4(*w)));
    return check_once(quant_view(*stacked_.back()), *w);
  }
  if (w->per_expert) {
    MUSE_ASSIGN_OR_RETURN(HostQuantWeight h, stack_pieces(*w));
    stacked_.push_back(std::make_unique<HostQuantWeight>(std::move(h)));
    return check_once(quant_view(*stacked_.back()), *w);
  }
  const ResolvedWeight::Quantized& q = w->quant;
  HostQuantView v;
  v.format = q.format;
  v.code_dtype = q.format.kind == QuantKind::Fp8 ? DType::F8_E4M3 : DType::F4;
  v.codes = w->tensor.data, v.codes_bytes = w->tensor.nbytes;
  v.scales = q.scales.data, v.scales_bytes = q.scales.nbytes;
  if (q.format.kind == QuantKind::Fp8 && q.scales.dtype != DType::F32) {  // F16 / BF16 as stored: widened
    MUSE_ASSIGN_OR_RETURN(std::vector<float> f, f32_scales(q.scales));
    widened_.push_back(std::make_unique<std::vector<float>>(std::move(f)));
    v.scales = widened_.back()->data(), v.scales_bytes = widened_.back()->size() * 4;
  }
  v.scale_shape = q.scales.shape.empty() ? std::vector<int64_t>{1} : q.scales.shape;
  if (q.zeros.data) v.zeros = q.zeros.data, v.zeros_bytes = q.zeros.nbytes, v.zero_shape = q.zeros.shape;
  v.global = q.global;
  return check_once(v, *w);
}

// Tensor-parallel ranks each fetch the same weight: its scales are scanned
// for the first only.
Result<HostQuantView> CheckpointWeightSource::check_once(const HostQuantView& v, const ResolvedWeight& w) const {
  if (!scales_checked_.insert(&w).second) return v;
  return checked(v, w);
}

uint64_t CheckpointWeightSource::stored_quantized_bytes(const WeightSpec& spec) const {
  const ResolvedWeight* w = ck_.find(spec.slot, spec.layer);
  if (!w || !w->quantized()) return 0;
  auto parts = [](const ResolvedWeight::Quantized& q) {
    return uint64_t(q.scales.nbytes + q.zeros.nbytes) + 4 * uint64_t(q.global.size());
  };
  if (!w->per_expert) return uint64_t(w->tensor.nbytes) + parts(w->quant);
  uint64_t b = 0;
  for (size_t e = 0; e < w->experts.size(); ++e)
    for (size_t i = 0; i < w->experts[e].size(); ++i) {
      b += w->experts[e][i].nbytes;
      if (e < w->expert_quant.size() && i < w->expert_quant[e].size()) b += parts(w->expert_quant[e][i]);
    }
  return b;
}

}  // namespace muse
