#include "muse/model/random_weights.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstring>
#include <thread>

#include "muse/core/random.h"

namespace muse {
namespace {

uint64_t hash_slot(const WeightSpec& s, uint64_t seed) {
  uint64_t h = seed * 0x100000001b3ull ^ uint64_t(s.layer + 7) * 0x9e3779b97f4a7c15ull;
  for (char c : s.slot) h = (h ^ uint8_t(c)) * 0x100000001b3ull;
  return h;
}

bool is_norm_offset(const std::string& slot) {
  return slot.rfind("norm.", 0) == 0 || slot == "moe.pre_expert_norm" || slot == "moe.post_expert_norm";
}

bool is_matrix(const WeightSpec& s) { return s.shape.size() >= 2 && s.reference_dtype != DType::F32; }

// Matrices ~ U(±sqrt(3/in)) keep activations at unit scale; embeddings U(±1).
float matrix_scale(const WeightSpec& s) { return s.slot == "embed_tokens" ? 1.0f : std::sqrt(3.0f / float(s.shape.back())); }

}  // namespace

RandomWeightSource::RandomWeightSource(const ModelConfig& config, const RandomWeightOptions& options)
    : tied_(config.tie_word_embeddings), on_backend_(options.matrices_on_backend), seed_(options.seed) {
  for (const WeightSpec& spec : describe_weights(config)) {
    if (tied_ && spec.slot == "lm_head") continue;
    Entry e;
    e.spec = spec;
    const bool matrix = is_matrix(spec);
    e.dtype = matrix ? options.dtype : DType::F32;
    if (matrix && on_backend_) continue;  // made by create_on, where it lives
    e.data.resize(size_t(spec.numel()) * size_t(dtype_bits(e.dtype) / 8));
    entries_.push_back(std::move(e));
  }
  // Fill in parallel, in fixed chunks, so the values never depend on the thread count.
  constexpr int64_t kChunk = 1 << 20;
  struct Job {
    size_t entry;
    int64_t begin, end;
  };
  std::vector<Job> jobs;
  for (size_t i = 0; i < entries_.size(); ++i)
    for (int64_t b = 0; b < entries_[i].spec.numel(); b += kChunk)
      jobs.push_back({i, b, std::min(entries_[i].spec.numel(), b + kChunk)});
  std::atomic<size_t> next{0};
  auto worker = [&] {
    for (size_t j; (j = next.fetch_add(1)) < jobs.size();) {
      Entry& e = entries_[jobs[j].entry];
      const WeightSpec& s = e.spec;
      SplitMix64 rng{hash_slot(s, options.seed) ^ uint64_t(jobs[j].begin)};
      float scale = 1.0f, offset = 0.0f;
      if (s.shape.size() >= 2) scale = std::sqrt(3.0f / float(s.shape.back()));
      if (is_matrix(s)) scale = matrix_scale(s);
      if (is_norm_offset(s.slot)) scale = 0.1f;
      if (s.slot == "final_norm") scale = 0.1f, offset = 1.0f;
      if (s.slot.rfind("resid_gate.", 0) == 0) scale = 1.0f;
      if (s.slot == "moe.router_bias") scale = 0.01f;
      for (int64_t i = jobs[j].begin; i < jobs[j].end; ++i) {
        float v = offset + scale * rng.uniform();
        if (e.dtype == DType::BF16) {
          uint16_t h = f32_to_bf16(v);
          std::memcpy(e.data.data() + size_t(i) * 2, &h, 2);
        } else {
          std::memcpy(e.data.data() + size_t(i) * 4, &v, 4);
        }
      }
    }
  };
  int threads = options.threads > 0 ? options.threads : int(std::max(1u, std::thread::hardware_concurrency()));
  std::vector<std::thread> pool;
  for (int t = 1; t < threads; ++t) pool.emplace_back(worker);
  worker();
  for (auto& t : pool) t.join();
}

Result<Tensor> RandomWeightSource::create_on(Backend& backend, const WeightSpec& spec, DType dtype) const {
  if (!on_backend_ || !is_matrix(spec)) return Tensor{};
  Result<Tensor> t = make_error("unsupported rank");
  if (spec.shape.size() == 2) t = backend.alloc(dtype, {spec.shape[0], spec.shape[1]});
  if (spec.shape.size() == 3) t = backend.alloc(dtype, {spec.shape[0], spec.shape[1], spec.shape[2]});
  if (!t.ok()) return t.error();
  if (Status st = backend.fill_uniform(*t, hash_slot(spec, seed_), matrix_scale(spec), 0.0f); !st.ok()) {
    backend.release(*t);
    return st.error();
  }
  return t;
}

Result<HostTensor> RandomWeightSource::view(const WeightSpec& spec) const {
  const std::string slot = tied_ && spec.slot == "lm_head" ? "embed_tokens" : spec.slot;
  for (const auto& e : entries_) {
    if (e.spec.slot == slot && e.spec.layer == spec.layer)
      return HostTensor{e.dtype, e.spec.shape, e.data.data(), e.data.size()};
  }
  return make_error("no random tensor for this slot");
}

Status RandomWeightSource::read_f32(const WeightSpec& spec, float* dst) const {
  auto v = view(spec);
  if (!v.ok()) return v.error();
  const int64_t n = spec.numel();
  if (v->dtype == DType::F32) {
    std::memcpy(dst, v->data, size_t(n) * 4);
  } else {
    const uint16_t* h = static_cast<const uint16_t*>(v->data);
    for (int64_t i = 0; i < n; ++i) dst[i] = bf16_to_f32(h[i]);
  }
  return Status::Ok();
}

uint64_t RandomWeightSource::bytes() const {
  uint64_t b = 0;
  for (const auto& e : entries_) b += e.data.size();
  return b;
}

}  // namespace muse
