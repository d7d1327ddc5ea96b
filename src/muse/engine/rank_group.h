// Tensor/expert parallelism inside the engine (EngineOptions::parallel): the
// ranks 1..N-1 of a group (rank 0 is the engine's own backend, model and
// KV), their communicators, and the runner that steps every rank at once.
// Each rank has its own backend, its own shard of the weights
// (model/shard_source.h over the one memory-mapped checkpoint) and its own
// KV storage for its KV heads; the page bookkeeping is rank 0's (the KV
// pools have the same pages on every rank, so one page table serves all).
// On the CPU the ranks are threads of this process (parallel/in_process.h).
#pragma once

#include <memory>
#include <span>
#include <vector>

#include "muse/backends/factory/backend_factory.h"
#include "muse/kv/kv_cache.h"
#include "muse/model/muse_model.h"
#include "muse/model/shard_source.h"
#include "muse/parallel/in_process.h"

namespace muse {

class RankGroup {
 public:
  // The group's communicators and runner; ranks are added by add_rank.
  static Result<std::unique_ptr<RankGroup>> create(const ModelConfig& config, const ParallelOptions& parallel,
                                                   const BackendOptions& backend);
  int size() const { return int(comms_.size()); }
  ParallelRank rank(int r) const { return ParallelRank{size(), r, parallel_.expert_parallel}; }
  Communicator& comm(int r) const { return *comms_[size_t(r)]; }
  // Backend options of every rank: the CPU threads shared out between them.
  const BackendOptions& backend_options() const { return backend_; }
  // Rank r's view of `source` (rank 0's too): it must live as long as the
  // rank's model, because sliced weights live in it.
  const WeightSource& shard_source(int r, const WeightSource& source);

  // Ranks 1..N-1: backend, model shard, KV storage with `kv` (same pages as rank 0's).
  Status add_ranks(const ModelConfig& config, const WeightSource& source, ModelOptions model, const KvCacheOptions& kv);

  // One step on every rank at once; rank 0 writes the logits.
  Status forward(MuseModel& rank0, std::span<const KvLayerStorage> kv0, const StepPlanBuilder& plan, float* logits);

 private:
  struct Rank {
    std::unique_ptr<Backend> backend;
    std::unique_ptr<MuseModel> model;
    std::unique_ptr<KvCache> kv;
  };
  ModelConfig config_;
  ParallelOptions parallel_;
  BackendOptions backend_;
  std::vector<std::unique_ptr<Communicator>> comms_;
  std::vector<std::unique_ptr<ShardWeightSource>> sources_;  // per rank
  std::vector<Rank> ranks_;                                  // ranks 1..N-1
  std::unique_ptr<RankRunner> runner_;
  std::vector<Status> status_;  // each rank's last step (kept: a step allocates nothing)
};

}  // namespace muse
