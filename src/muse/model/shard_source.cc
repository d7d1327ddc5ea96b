#include "muse/model/shard_source.h"

#include <cstring>

namespace muse {
namespace {

// Copies `slice` of a row-major tensor of `shape` (elements of `elem` bytes)
// into dst, laid out as slice.shape; padding rows stay as dst holds them.
void copy_slice(const char* src, char* dst, size_t elem, const std::vector<int64_t>& shape, const ShardSlice& s) {
  int64_t outer = 1, inner = 1;
  for (int d = 0; d < s.dim; ++d) outer *= shape[size_t(d)];
  for (size_t d = size_t(s.dim) + 1; d < shape.size(); ++d) inner *= shape[d];
  const size_t run = size_t(s.count * inner) * elem;
  for (int64_t o = 0; o < outer; ++o)
    std::memcpy(dst + size_t(o * s.padded * inner) * elem, src + size_t((o * s.extent + s.begin) * inner) * elem, run);
}

bool plain(DType t) { return t == DType::F32 || t == DType::BF16; }

}  // namespace

ShardWeightSource::ShardWeightSource(const WeightSource& inner, const ModelConfig& config, const ParallelRank& rank)
    : inner_(inner), config_(config), rank_(rank), global_(describe_weights(config)) {
  for (size_t i = 0; i < global_.size(); ++i) index_[{global_[i].layer, global_[i].slot}] = i;
}

Result<std::pair<const WeightSpec*, ShardSlice>> ShardWeightSource::resolve(const WeightSpec& local) const {
  auto it = index_.find({local.layer, local.slot});
  if (it == index_.end()) return make_error("no weight slot " + local.slot + " in the model's table");
  const WeightSpec& g = global_[it->second];
  ShardSlice s = shard_of(g, config_, rank_);
  if (s.shape != local.shape) return make_error("weight " + local.slot + ": shard shape disagrees with the rank's table");
  return std::make_pair(&g, std::move(s));
}

Result<HostTensor> ShardWeightSource::view(const WeightSpec& local) const {
  MUSE_ASSIGN_OR_RETURN(auto r, resolve(local));
  const auto& [g, s] = r;
  if (s.whole()) return inner_.view(*g);
  MUSE_ASSIGN_OR_RETURN(HostTensor v, inner_.view(*g));
  if (!v.data || !plain(v.dtype) || v.shape != g->shape) return HostTensor{};  // the caller converts via read_f32
  const size_t elem = size_t(dtype_bits(v.dtype) / 8);
  HostTensor out;
  out.dtype = v.dtype;
  out.shape = s.shape;
  out.nbytes = size_t(s.numel()) * elem;
  if (s.dim == 0 && s.padded == s.count) {  // contiguous rows: a view
    int64_t inner = 1;
    for (size_t d = 1; d < g->shape.size(); ++d) inner *= g->shape[d];
    out.data = static_cast<const char*>(v.data) + size_t(s.begin * inner) * elem;
    return out;
  }
  std::vector<char>& buf = owned_.emplace_back(out.nbytes, char(0));
  copy_slice(static_cast<const char*>(v.data), buf.data(), elem, g->shape, s);
  out.data = buf.data();
  return out;
}

Status ShardWeightSource::read_f32(const WeightSpec& local, float* dst) const {
  MUSE_ASSIGN_OR_RETURN(auto r, resolve(local));
  const auto& [g, s] = r;
  if (s.whole()) return inner_.read_f32(*g, dst);
  auto v = view(local);
  if (v.ok() && v->data) {  // the slice as stored, widened
    const size_t n = size_t(s.numel());
    if (v->dtype == DType::F32) std::memcpy(dst, v->data, n * 4);
    else
      for (size_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(static_cast<const uint16_t*>(v->data)[i]);
    return Status::Ok();
  }
  // A source that converts (other dtypes, per-expert layouts): the whole
  // logical tensor in fp32, then the slice.
  std::vector<float> whole(size_t(g->numel()));
  MUSE_RETURN_IF_ERROR(inner_.read_f32(*g, whole.data()));
  std::memset(dst, 0, size_t(s.numel()) * 4);
  copy_slice(reinterpret_cast<const char*>(whole.data()), reinterpret_cast<char*>(dst), 4, g->shape, s);
  return Status::Ok();
}

Result<Tensor> ShardWeightSource::create_on(Backend& backend, const WeightSpec& local, DType dtype) const {
  MUSE_ASSIGN_OR_RETURN(auto r, resolve(local));
  if (r.second.whole()) return inner_.create_on(backend, *r.first, dtype);
  return Tensor{};  // sliced through view / read_f32
}

Result<HostQuantView> ShardWeightSource::quantized(const WeightSpec& local) const {
  MUSE_ASSIGN_OR_RETURN(auto r, resolve(local));
  MUSE_ASSIGN_OR_RETURN(HostQuantView q, inner_.quantized(*r.first));
  if (r.second.whole() || q.format.kind == QuantKind::None) return q;
  return make_error(std::string("a checkpoint stored as ") + quant_kind_name(q.format.kind) +
                    " cannot be split over tensor-parallel ranks yet (its scale grids are not sliced): load a BF16 "
                    "checkpoint, optionally with --quantization");
}

}  // namespace muse
