// Random weights for a ModelConfig, generated in memory: for forward tests
// without fixtures, determinism tests and the CPU decode benchmark. Values
// are scaled like a trained model's (matrices ~ U(±sqrt(3/in)), so
// activations keep unit scale through the layers; norm offsets small;
// residual-gate logits of order one).
#pragma once

#include <cstdint>
#include <vector>

#include "muse/model/weights.h"

namespace muse {

struct RandomWeightOptions {
  uint64_t seed = 1;
  DType dtype = DType::BF16;  // matrices and embeddings; norms, gates and the router are F32
  int threads = 0;            // generation threads (0: all CPUs)
  // Matrices made by the backend where they live (Backend::fill_uniform),
  // so a GPU benchmark of a 60 GB shape generates nothing on the host.
  bool matrices_on_backend = false;
};

class RandomWeightSource final : public WeightSource {
 public:
  RandomWeightSource(const ModelConfig& config, const RandomWeightOptions& options = {});
  Result<HostTensor> view(const WeightSpec& spec) const override;
  Status read_f32(const WeightSpec& spec, float* dst) const override;
  Result<Tensor> create_on(Backend& backend, const WeightSpec& spec, DType dtype) const override;
  uint64_t bytes() const;

 private:
  struct Entry {
    WeightSpec spec;
    DType dtype;
    std::vector<uint8_t> data;
  };
  std::vector<Entry> entries_;
  bool tied_ = false;
  bool on_backend_ = false;
  uint64_t seed_ = 1;
};

}  // namespace muse
