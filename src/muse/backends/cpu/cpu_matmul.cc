// Projections: out = x · Wᵀ for one or several weights sharing an input, in
// one thread-pool dispatch. Work is split over weight rows (and, for
// prefill, over blocks of x rows); each output element belongs to one task,
// and the kernels compute it the same way in any block, so the split never
// changes a result.
#include <algorithm>

#include "muse/backends/cpu/cpu_backend_impl.h"

namespace muse::cpu {

namespace {

// The kernels' view of one quantized matrix: expert e of a [E, N, K]
// weight (e = 0 for a 2-D one), every part offset to that expert.
QuantMatrix quant_matrix(const Tensor& w, int64_t e) {
  const QuantParts& qp = *w.quant;
  const QuantFormat& f = qp.format;
  QuantMatrix m;
  const int64_t N = w.dim(w.rank - 2), K = w.cols();
  m.rows = N;
  m.cols = K;
  m.codes = static_cast<const uint8_t*>(w.data) + size_t(e * N * K) * size_t(dtype_bits(w.dtype)) / 8;
  m.block_rows = f.block_rows;
  m.block_cols = f.block_cols;
  const int64_t per_expert_scales = qp.scales.numel() / (w.rank == 3 ? w.dim(0) : 1);
  m.scales = static_cast<const uint8_t*>(qp.scales.data) + size_t(e * per_expert_scales) * qp.scales.element_bytes();
  if (f.kind == QuantKind::Int4) {
    m.kind = QuantMatrix::Int4;
    m.zero_offset = f.zero_offset;
    m.bf16_scales = f.scale_dtype == DType::BF16;
    if (!qp.zeros.empty())
      m.zeros = static_cast<const uint8_t*>(qp.zeros.data) + size_t(e) * (qp.zeros.bytes() / size_t(w.rank == 3 ? w.dim(0) : 1));
    return m;
  }
  m.kind = f.kind == QuantKind::Fp8 ? QuantMatrix::Fp8 : QuantMatrix::Fp4;
  m.scale_ld = (K + f.block_cols - 1) / f.block_cols;
  m.scale_lut = f.scale_dtype == DType::F8_E4M3 ? e4m3_table()
                : f.scale_dtype == DType::F8_E8M0 ? e8m0_table()
                                                  : nullptr;
  m.global_rows = N;
  if (f.global_parts > 0) {
    const float* g = static_cast<const float*>(qp.global.data) + e * f.global_parts;
    m.global[0] = g[0];
    m.global[1] = g[f.global_parts - 1];
    m.global_rows = N / f.global_parts;
  }
  return m;
}

}  // namespace

void CpuBackend::matmul_block(const float* x, int64_t ldx, int64_t T, const Tensor& w, int64_t expert, int64_t n0,
                              int64_t N, float* out, int64_t ldo) const {
  const int64_t K = w.cols();
  if (w.quant) {
    k_.matmul_quant(x, ldx, T, quant_matrix(w, expert), n0, N, out, ldo);
    return;
  }
  const size_t base = size_t(expert * w.dim(w.rank - 2) + n0) * size_t(K);
  if (w.dtype == DType::BF16) {
    k_.matmul_bf16(x, ldx, T, static_cast<const uint16_t*>(w.data) + base, K, N, K, out, ldo);
  } else {
    k_.matmul_f32(x, ldx, T, static_cast<const float*>(w.data) + base, K, N, K, out, ldo);
  }
}

int64_t CpuBackend::task_rows(const Tensor& w, int64_t rows) const {
  // Int4 codes run along K with N contiguous: the kernel keeps int4_cols
  // output columns in flight, so a task gets whole multiples of them.
  if (!w.quant || w.quant->format.kind != QuantKind::Int4) return rows;
  const int64_t a = k_.int4_cols;
  return std::max(a, (rows + a / 2) / a * a);
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
    const int64_t rows = task_rows(*j.w, rows_per_task);
    for (int64_t t0 = 0; t0 < j.T; t0 += kRowsPerXBlock) {
      for (int64_t n0 = 0; n0 < j.N; n0 += rows) {
        tasks.push_back({int(i), n0, std::min(rows, j.N - n0), t0, std::min(kRowsPerXBlock, j.T - t0)});
      }
    }
  }
  pool_.run(int64_t(tasks.size()), [&](int64_t ti, int) {
    const MatmulTask& t = tasks[size_t(ti)];
    const MatmulJob& j = jobs[size_t(t.job)];
    matmul_block(j.x + t.t0 * j.ldx, j.ldx, t.T, *j.w, j.expert, j.w_row0 + t.n0, t.N, j.out + t.t0 * j.ldo + t.n0,
                 j.ldo);
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
                   (p.weight.quant || p.weight.dtype == DType::F32 || p.weight.dtype == DType::BF16) && p.weight.rank == 2 &&
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
      jobs.push_back({static_cast<const float*>(x.data), x.cols(), x.rows(), &p.weight, 0, 0, p.weight.rows(),
                      static_cast<float*>(p.out.data), p.out.cols()});
    }
    run_matmuls(jobs);
  });
}

}  // namespace muse::cpu
