#include "muse/engine/rank_group.h"

#include <algorithm>

#include "muse/backends/cpu/thread_pool.h"
#if defined(MUSE_HAVE_NCCL) && MUSE_HAVE_NCCL
#include "muse/parallel/nccl/nccl_communicator.h"
#endif

namespace muse {

Result<std::unique_ptr<RankGroup>> RankGroup::create(const ModelConfig& config, const ParallelOptions& parallel,
                                                     const BackendOptions& backend) {
  const int N = int(parallel.tensor_parallel_size);
  MUSE_RETURN_IF_ERROR(check_devices(backend.device, N));  // the machine first, then the model's shape
  MUSE_RETURN_IF_ERROR(check_parallel(config, parallel));
  auto g = std::unique_ptr<RankGroup>(new RankGroup());
  g->config_ = config;
  g->parallel_ = parallel;
  g->backend_ = backend;
  if (backend.device == Device::Cuda) {
    // One rank per GPU (devices 0..N-1), NCCL between them, the ranks
    // driven by this process's threads as on the CPU. Compiled, not yet run
    // (docs/parallel.md "What is left").
#if defined(MUSE_HAVE_NCCL) && MUSE_HAVE_NCCL
    std::vector<int> devices;
    for (int r = 0; r < N; ++r) devices.push_back(r);
    MUSE_ASSIGN_OR_RETURN(g->comms_, make_nccl_local_group(devices));
    g->backend_.gpu = 0;
#else
    return make_error("--tensor-parallel-size " + std::to_string(N) +
                      " --device cuda: this muse was built without NCCL (the CUDA toolkit's libnccl was not found "
                      "at configure time); --device cpu runs the ranks as threads");
#endif
  } else {
    // The machine's threads shared out: N pools of threads/N, not N pools of all of them.
    const int threads = backend.cpu.threads > 0 ? backend.cpu.threads : cpu::available_cpus();
    g->backend_.cpu.threads = std::max(1, threads / N);
    g->comms_ = make_in_process_group(N);
  }
  g->sources_.resize(size_t(N));
  g->runner_ = std::make_unique<RankRunner>(N);
  g->status_.resize(size_t(N));
  return g;
}

const WeightSource& RankGroup::shard_source(int r, const WeightSource& source) {
  sources_[size_t(r)] = std::make_unique<ShardWeightSource>(source, config_, rank(r));
  return *sources_[size_t(r)];
}

Status RankGroup::add_ranks(const ModelConfig& config, const WeightSource& source, ModelOptions mo,
                            const KvCacheOptions& ko) {
  for (int r = 1; r < size(); ++r) {
    Rank rk;
    BackendOptions bo = backend_;
    bo.gpu = r;  // CUDA: rank r on device r
    MUSE_ASSIGN_OR_RETURN(rk.backend, create_backend(bo));
    mo.weights.shard = rank(r);
    mo.comm = comms_[size_t(r)].get();
    auto model = MuseModel::create(*rk.backend, config, shard_source(r, source), mo);
    if (!model.ok()) return make_error("rank " + std::to_string(r) + ": " + model.message());
    rk.model = std::move(model).value();
    MUSE_ASSIGN_OR_RETURN(rk.kv, KvCache::create(*rk.backend, rank_kv_config(config, rank(r)), ko));
    ranks_.push_back(std::move(rk));
  }
  return Status::Ok();
}

Status RankGroup::forward(MuseModel& rank0, std::span<const KvLayerStorage> kv0, const StepPlanBuilder& plan,
                          float* logits) {
  auto step = [&](int r) -> Status {
    Status s = r == 0 ? rank0.forward(plan, kv0, logits)
                      : ranks_[size_t(r - 1)].model->forward(plan, ranks_[size_t(r - 1)].kv->layers(), nullptr);
    // A rank that fails must not leave the others waiting in a collective
    // (the group is unusable afterwards: such failures are engine bugs).
    if (!s.ok()) comms_[size_t(r)]->abort();
    status_[size_t(r)] = s;  // read once run() has joined every rank
    return s;
  };
  if (runner_->run(step).ok()) return Status::Ok();
  // Report the rank that failed first, not the ones its abort woke.
  for (int r = 0; r < size(); ++r)
    if (!status_[size_t(r)].ok() && status_[size_t(r)].message().find(kAbortedMark) == std::string::npos)
      return make_error("rank " + std::to_string(r) + ": " + status_[size_t(r)].message());
  return make_error("rank 0: " + status_[0].message());
}

}  // namespace muse
