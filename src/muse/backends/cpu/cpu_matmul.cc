// Projections: out = x · Wᵀ for one or several weights sharing an input, in
// one thread-pool dispatch. Work is split over weight rows (and, for
// prefill, over blocks of x rows); each output element belongs to one task,
// and the kernels compute it the same way in any block, so the split never
// changes a result.
#include <algorithm>

#include "muse/backends/cpu/cpu_backend_impl.h"

namespace muse::cpu {

void CpuBackend::matmul_block(const float* x, int64_t ldx, int64_t T, const Tensor& w, int64_t n0, int64_t N,
                              float* out, int64_t ldo) const {
  const int64_t K = w.cols();
  if (w.dtype == DType::BF16) {
    k_.matmul_bf16(x, ldx, T, static_cast<const uint16_t*>(w.data) + n0 * K, K, N, K, out, ldo);
  } else {
    k_.matmul_f32(x, ldx, T, static_cast<const float*>(w.data) + n0 * K, K, N, K, out, ldo);
  }
}

void CpuBackend::run_matmuls(const std::vector<MatmulJob>& jobs) {
  // Task shape: weight-row chunks sized so every thread gets several tasks
  // (load balance) but each streams a contiguous slab of weights; x-row
  // blocks of 64 keep a block of activations cache-resident during prefill.
  constexpr int64_t kRowsPerXBlock = 64;
  int64_t total_rows = 0;
  for (const auto& j : jobs) total_rows += j.N;
  const int64_t threads = pool_.size();
  int64_t rows_per_task = total_rows / (threads * 4);
  rows_per_task = std::max<int64_t>(16, (rows_per_task + 7) / 8 * 8);

  auto& tasks = matmul_tasks_;
  tasks.clear();
  for (size_t i = 0; i < jobs.size(); ++i) {
    const auto& j = jobs[i];
    for (int64_t t0 = 0; t0 < j.T; t0 += kRowsPerXBlock) {
      for (int64_t n0 = 0; n0 < j.N; n0 += rows_per_task) {
        tasks.push_back({int(i), n0, std::min(rows_per_task, j.N - n0), t0, std::min(kRowsPerXBlock, j.T - t0)});
      }
    }
  }
  pool_.run(int64_t(tasks.size()), [&](int64_t ti, int) {
    const MatmulTask& t = tasks[size_t(ti)];
    const MatmulJob& j = jobs[size_t(t.job)];
    matmul_block(j.x + t.t0 * j.ldx, j.ldx, t.T, *j.w, j.w_row0 + t.n0, t.N, j.out + t.t0 * j.ldo + t.n0, j.ldo);
  });
}

void CpuBackend::project(const Tensor& x, std::span<const Projection> outputs) {
  // At most kMaxProjections outputs, held by value in the queued op.
  if (!MUSE_CPU_CHECK(outputs.size() >= 1 && outputs.size() <= kMaxProjections, "project",
                      std::to_string(outputs.size()) + " outputs"))
    return;
  ProjectionSet outs;
  outs.n = outputs.size();
  std::copy(outputs.begin(), outputs.end(), outs.p.begin());
  for (const auto& p : outputs) {
    if (!MUSE_CPU_CHECK(x.dtype == DType::F32 && p.out.dtype == DType::F32 &&
                   (p.weight.dtype == DType::F32 || p.weight.dtype == DType::BF16) && p.weight.rank == 2 &&
                   p.weight.cols() == x.cols() && p.out.rows() == x.rows() && p.out.cols() == p.weight.rows(),
               "project", describe(x) + " · " + describe(p.weight) + "ᵀ -> " + describe(p.out)))
      return;
  }
  const char* name = "project";
  if (profile_) {
    std::string n = "project";
    for (const auto& p : outputs) n += " " + describe(p.weight);
    name = intern(n);
  }
  enqueue(name, [this, x, outs] {
    auto& jobs = project_jobs_;
    jobs.clear();
    for (size_t i = 0; i < outs.n; ++i) {
      const Projection& p = outs.p[i];
      jobs.push_back({static_cast<const float*>(x.data), x.cols(), x.rows(), &p.weight, 0, p.weight.rows(),
                      static_cast<float*>(p.out.data), p.out.cols()});
    }
    run_matmuls(jobs);
  });
}

}  // namespace muse::cpu
