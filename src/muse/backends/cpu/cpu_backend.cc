// CpuBackend: memory, the op queue, and the row-wise operations (embedding,
// norms, RoPE, gates, SwiGLU, gathers, softcap). Matmuls, attention and the
// MoE live in their own files.
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "muse/backends/profile_table.h"
#include "muse/backends/cpu/cpu_backend_impl.h"
#include "muse/parallel/communicator.h"
#include "muse/sampling/row_sampling.h"

namespace muse {

Result<std::unique_ptr<Backend>> create_cpu_backend(const CpuBackendOptions& options) {
  const cpu::KernelTable* k = options.isa ? cpu::kernels_for(*options.isa) : &cpu::best_kernels();
  if (!k) {
    return make_error(std::string("the CPU backend was asked for ") + cpu::isa_name(*options.isa) +
                      " kernels, but this CPU does not support that instruction set");
  }
  int threads = options.threads > 0 ? options.threads : cpu::available_cpus();
  if (threads > 1024) return make_error("--threads " + std::to_string(threads) + " is more than 1024");
  return std::unique_ptr<Backend>(new cpu::CpuBackend(*k, threads, options.profile));
}

namespace cpu {
namespace {

// Splits [0, n) into about `parts` chunks of at least `min_chunk`.
int64_t chunk_size(int64_t n, int64_t parts, int64_t min_chunk) {
  int64_t c = (n + parts - 1) / (parts > 0 ? parts : 1);
  return c < min_chunk ? min_chunk : c;
}

inline float sigmoid(float x) { return 1.0f / (1.0f + std::exp(-x)); }

}  // namespace

CpuBackend::CpuBackend(const KernelTable& kernels, int threads, bool profile)
    : k_(kernels), pool_(threads), profile_(profile) {
  scratch_.resize(size_t(pool_.size()));
  // A start that covers decode at a few thousand positions of context, so
  // ordinary steps never grow it.
  reserve_scratch(size_t(64) << 10);
}

CpuBackend::~CpuBackend() {
  for (void* p : owned_) std::free(p);
}

std::string CpuBackend::name() const {
  return std::string("cpu (") + isa_name(k_.isa) + ", " + std::to_string(pool_.size()) + " threads)";
}

std::string CpuBackend::profile_report() const {
  return profile_times_.empty() ? std::string() : profile_table(profile_times_);
}

Result<Tensor> CpuBackend::alloc(DType dtype, std::initializer_list<int64_t> shape) {
  Tensor t;
  t.dtype = dtype;
  if (shape.size() < 1 || shape.size() > 4) return make_error("tensor rank must be 1..4");
  for (int64_t d : shape) {
    if (d < 0) return make_error("negative tensor dimension");
    t.shape[size_t(t.rank++)] = d;
  }
  size_t bytes = (t.bytes() + 63) / 64 * 64;
  void* p = std::aligned_alloc(64, bytes ? bytes : 64);
  if (!p) return make_error("out of host memory allocating " + describe(t));
  std::memset(p, 0, bytes);
  owned_.insert(p);
  ++buffers_created_;
  t.data = p;
  return t;
}

Result<Tensor> CpuBackend::import_weight(DType dtype, std::initializer_list<int64_t> shape, const void* host,
                                         bool host_outlives) {
  if (host_outlives) {
    Tensor t;
    t.dtype = dtype;
    for (int64_t d : shape) t.shape[size_t(t.rank++)] = d;
    t.data = const_cast<void*>(host);
    return t;
  }
  MUSE_ASSIGN_OR_RETURN(Tensor t, alloc(dtype, shape));
  std::memcpy(t.data, host, t.bytes());
  return t;
}

void CpuBackend::release(Tensor& t) {
  auto it = owned_.find(t.data);
  if (it != owned_.end()) {
    std::free(*it);
    owned_.erase(it);
  }
  t = Tensor{};
}

Status CpuBackend::fill_uniform(const Tensor& t, uint64_t seed, float scale, float offset) {
  if (t.dtype != DType::F32 && t.dtype != DType::BF16) return make_error("fill_uniform: F32 or BF16 only");
  // The same counter-based values as the CUDA backend's fill (cuda_bench.cu).
  const int64_t n = t.numel();
  pool_.run((n + 65535) / 65536, [&](int64_t task, int) {
    for (int64_t i = task * 65536, e = std::min(n, i + 65536); i < e; ++i) {
      uint64_t z = seed + 0x9e3779b97f4a7c15ull * uint64_t(i + 1);
      z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
      z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
      z ^= z >> 31;
      const float v = offset + scale * (float(z >> 40) * (1.0f / 16777216.0f) * 2.0f - 1.0f);
      if (t.dtype == DType::BF16)
        static_cast<uint16_t*>(t.data)[i] = f32_to_bf16(v);
      else
        static_cast<float*>(t.data)[i] = v;
    }
  });
  return Status::Ok();
}

Status CpuBackend::download(const Tensor& t, void* host) {
  if (!ops_.empty()) return make_error("download() with operations still queued: call execute() first");
  std::memcpy(host, t.data, t.bytes());
  return Status::Ok();
}

void CpuBackend::set_input(const Tensor& dst, const void* host, size_t bytes) {
  if (!MUSE_CPU_CHECK(bytes <= dst.bytes(), "set_input", describe(dst) + " is smaller than the input")) return;
  // Captured now into the staging area (kept across steps), copied when the step runs.
  const size_t at = staging_.size();
  // Grown geometrically: a plan that grows by a block per step must not
  // reallocate every step.
  if (at + bytes > staging_.capacity()) staging_.reserve(2 * (at + bytes));
  staging_.insert(staging_.end(), static_cast<const char*>(host), static_cast<const char*>(host) + bytes);
  enqueue(__func__, [this, dst, at, bytes] { std::memcpy(dst.data, staging_.data() + at, bytes); });
}

bool CpuBackend::check(bool ok, const char* op, const std::string& what) {
  if (!ok && enqueue_error_.empty()) enqueue_error_ = std::string("cpu backend: ") + op + ": " + what;
  return ok;
}

void CpuBackend::fail(std::string message) {
  if (exec_error_.empty()) exec_error_ = std::move(message);
}

Status CpuBackend::execute() {
  // The queue and the staging area are cleared, not freed: their capacity
  // carries over to the next step.
  struct ClearQueue {
    CpuBackend* b;
    ~ClearQueue() {
      b->ops_.clear();
      b->staging_.clear();
    }
  } clear_queue{this};
  if (!enqueue_error_.empty()) {
    std::string e = std::move(enqueue_error_);
    enqueue_error_.clear();
    return make_error(e);
  }
  for (auto& op : ops_) {
    if (profile_) {
      auto t0 = std::chrono::steady_clock::now();
      op.run();
      const char* name = op.name();
      double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      auto it = std::find_if(profile_times_.begin(), profile_times_.end(),
                             [&](const auto& p) { return std::strcmp(p.first, name) == 0; });
      if (it == profile_times_.end()) it = profile_times_.insert(profile_times_.end(), {name, OpTime{}});
      it->second.count++;
      it->second.seconds += dt;
    } else {
      op.run();
    }
    if (!exec_error_.empty()) break;
  }
  if (!exec_error_.empty()) {
    std::string e = std::move(exec_error_);
    exec_error_.clear();
    return make_error(e);
  }
  return Status::Ok();
}

void CpuBackend::reserve_scratch(size_t bytes) {
  // Geometric growth: attention's scratch grows with the context, and must
  // not reallocate at every step of a decode.
  for (auto& s : scratch_)
    if (s.size() < bytes) s.resize(std::max(bytes, 2 * s.size()));
}

// ---------------------------------------------------------------------------
// Row-wise operations.
// ---------------------------------------------------------------------------

void CpuBackend::embed(const Tensor& out, const Tensor& table, const Tensor& ids) {
  if (!MUSE_CPU_CHECK(out.dtype == DType::F32 && ids.dtype == DType::I32 && out.rows() == ids.numel() &&
                 out.cols() == table.cols() && (table.dtype == DType::F32 || table.dtype == DType::BF16),
             "embed", describe(out) + " <- " + describe(table) + "[" + describe(ids) + "]"))
    return;
  enqueue(__func__, [this, out, table, ids] {
    const int32_t* id = static_cast<const int32_t*>(ids.data);
    const int64_t T = ids.numel(), H = table.cols(), V = table.rows();
    for (int64_t t = 0; t < T; ++t) {
      if (id[t] < 0 || id[t] >= V) {
        fail("token id " + std::to_string(id[t]) + " is outside the vocabulary [0, " + std::to_string(V) + ")");
        return;
      }
    }
    pool_.run(T, [&](int64_t t, int) {
      float* y = static_cast<float*>(out.data) + t * H;
      if (table.dtype == DType::F32) {
        std::memcpy(y, static_cast<const float*>(table.data) + id[t] * H, size_t(H) * 4);
      } else {
        const uint16_t* src = static_cast<const uint16_t*>(table.data) + id[t] * H;
        for (int64_t i = 0; i < H; ++i) y[i] = bf16_to_f32(src[i]);
      }
    });
  });
}

void CpuBackend::norm_row(float* y, const float* x, int64_t n, const float* gain, NormGain mode, float eps,
                          float scale) const {
  if (mode == NormGain::Before) {
    k_.scale_gain(y, x, 1.0f, gain, n);  // y = x ⊙ c, then a weightless norm of y
    float r = 1.0f / std::sqrt(k_.sum_squares(y, n) / float(n) + eps);
    k_.scale_gain(y, y, r * scale, nullptr, n);
    return;
  }
  float r = 1.0f / std::sqrt(k_.sum_squares(x, n) / float(n) + eps);
  if (scale != 1.0f) {
    k_.scale_gain(y, x, r, mode == NormGain::After ? gain : nullptr, n);
    k_.scale_gain(y, y, scale, nullptr, n);
  } else {
    k_.scale_gain(y, x, r, mode == NormGain::After ? gain : nullptr, n);
  }
}

void CpuBackend::rms_norm(const Tensor& out, const Tensor& in, const Tensor& gain, NormGain mode, float eps,
                          int64_t group, float scale) {
  const int64_t g = group > 0 ? group : in.cols();
  if (!MUSE_CPU_CHECK(in.dtype == DType::F32 && out.dtype == DType::F32 && out.numel() == in.numel() && g > 0 &&
                 in.cols() % g == 0 && (mode == NormGain::None || (gain.dtype == DType::F32 && gain.numel() == g)),
             "rms_norm", describe(in) + " group " + std::to_string(g) + " gain " + describe(gain)))
    return;
  enqueue(__func__, [this, out, in, gain, mode, eps, g, scale] {
    const int64_t groups = in.numel() / g;
    const int64_t chunk = chunk_size(groups, pool_.size() * 4, 8);
    const int64_t tasks = (groups + chunk - 1) / chunk;
    pool_.run(tasks, [&](int64_t task, int) {
      int64_t end = std::min(groups, (task + 1) * chunk);
      for (int64_t i = task * chunk; i < end; ++i) {
        norm_row(static_cast<float*>(out.data) + i * g, static_cast<const float*>(in.data) + i * g, g,
                 static_cast<const float*>(gain.data), mode, eps, scale);
      }
    });
  });
}

void CpuBackend::residual_norm(const Tensor& stream, const Tensor& update, const Tensor& gain, NormGain mode,
                               const Tensor& alpha, const Tensor& beta, float eps) {
  const int64_t H = stream.cols();
  if (!MUSE_CPU_CHECK(stream.dtype == DType::F32 && update.dtype == DType::F32 && update.numel() == stream.numel() &&
                 (mode == NormGain::None || gain.numel() == H) && (alpha.empty() || alpha.numel() == H) &&
                 (beta.empty() || beta.numel() == H),
             "residual_norm", describe(stream) + " += norm(" + describe(update) + ")"))
    return;
  enqueue(__func__, [this, stream, update, gain, mode, alpha, beta, eps, H] {
    reserve_scratch(size_t(H) * sizeof(float));
    const float* a = static_cast<const float*>(alpha.data);
    const float* b = static_cast<const float*>(beta.data);
    pool_.run(stream.rows(), [&](int64_t t, int thread) {
      float* n = reinterpret_cast<float*>(scratch(thread));
      float* s = static_cast<float*>(stream.data) + t * H;
      norm_row(n, static_cast<const float*>(update.data) + t * H, H, static_cast<const float*>(gain.data), mode, eps,
               1.0f);
      if (a && b) {
        for (int64_t i = 0; i < H; ++i) s[i] = a[i] * s[i] + b[i] * n[i];
      } else {
        for (int64_t i = 0; i < H; ++i) s[i] += n[i];
      }
    });
  });
}

void CpuBackend::rope_tables(const Tensor& cos, const Tensor& sin, const Tensor& positions, double theta,
                             int64_t head_dim) {
  const int64_t half = head_dim / 2;
  if (!MUSE_CPU_CHECK(positions.dtype == DType::I32 && cos.numel() == positions.numel() * half &&
                 sin.numel() == cos.numel() && head_dim % 2 == 0 && theta > 0,
             "rope_tables", describe(cos) + " for " + describe(positions)))
    return;
  enqueue(__func__, [this, cos, sin, positions, theta, head_dim, half] {
    // inv_freq as transformers computes it: fp32 exponent, fp32 power, fp32 reciprocal.
    std::vector<float>& inv = rope_inv_;
    inv.resize(size_t(half));
    for (int64_t i = 0; i < half; ++i) {
      float e = float(2 * i) / float(head_dim);
      inv[size_t(i)] = 1.0f / float(std::pow(theta, double(e)));
    }
    const int32_t* pos = static_cast<const int32_t*>(positions.data);
    pool_.run(positions.numel(), [&](int64_t t, int) {
      float* c = static_cast<float*>(cos.data) + t * half;
      float* s = static_cast<float*>(sin.data) + t * half;
      for (int64_t i = 0; i < half; ++i) {
        float angle = float(pos[t]) * inv[size_t(i)];
        c[i] = float(std::cos(double(angle)));
        s[i] = float(std::sin(double(angle)));
      }
    });
  });
}

void CpuBackend::qk_norm_rope(const Tensor& q, const Tensor& k, const Tensor& cos, const Tensor& sin,
                              int64_t head_dim, float eps, float q_scale) {
  const int64_t d = head_dim, half = d / 2;
  if (!MUSE_CPU_CHECK(q.dtype == DType::F32 && k.dtype == DType::F32 && q.rows() == k.rows() && d % 2 == 0 &&
                 q.cols() % d == 0 && k.cols() % d == 0 && (cos.empty() || cos.numel() == q.rows() * half),
             "qk_norm_rope", describe(q) + ", " + describe(k)))
    return;
  enqueue(__func__, [this, q, k, cos, sin, d, half, eps, q_scale] {
    const int64_t T = q.rows(), hq = q.cols() / d, hk = k.cols() / d;
    pool_.run(T, [&](int64_t t, int) {
      const float* c = cos.empty() ? nullptr : static_cast<const float*>(cos.data) + t * half;
      const float* s = cos.empty() ? nullptr : static_cast<const float*>(sin.data) + t * half;
      auto one = [&](float* v, float scale) {
        norm_row(v, v, d, nullptr, NormGain::None, eps, scale);
        if (!c) return;
        for (int64_t j = 0; j < half; ++j) {
          float x1 = v[j], x2 = v[j + half];
          v[j] = x1 * c[j] - x2 * s[j];
          v[j + half] = x2 * c[j] + x1 * s[j];
        }
      };
      for (int64_t h = 0; h < hq; ++h) one(static_cast<float*>(q.data) + t * q.cols() + h * d, q_scale);
      for (int64_t h = 0; h < hk; ++h) one(static_cast<float*>(k.data) + t * k.cols() + h * d, 1.0f);
    });
  });
}

void CpuBackend::output_gate(const Tensor& o, const Tensor& g, int64_t head_dim, bool head_norm, float eps) {
  if (!MUSE_CPU_CHECK(o.dtype == DType::F32 && g.dtype == DType::F32 && o.numel() == g.numel() && o.cols() % head_dim == 0,
             "output_gate", describe(o) + " gate " + describe(g)))
    return;
  enqueue(__func__, [this, o, g, head_dim, head_norm, eps] {
    // Tasks over (row, block of heads), so a single decode row still uses
    // every thread (a sigmoid per element is not free).
    const int64_t C = o.cols(), heads = C / head_dim, T = o.rows();
    const int64_t per = std::max<int64_t>(1, (T * heads + pool_.size() * 2 - 1) / (pool_.size() * 2));
    const int64_t blocks = (heads + per - 1) / per;
    pool_.run(T * blocks, [&](int64_t task, int) {
      const int64_t t = task / blocks, h0 = (task % blocks) * per, h1 = std::min(heads, h0 + per);
      float* y = static_cast<float*>(o.data) + t * C;
      const float* gt = static_cast<const float*>(g.data) + t * C;
      for (int64_t h = h0; h < h1; ++h) {
        float* yh = y + h * head_dim;
        if (head_norm) norm_row(yh, yh, head_dim, nullptr, NormGain::None, eps, 1.0f);
        for (int64_t i = h * head_dim; i < (h + 1) * head_dim; ++i) y[i] *= sigmoid(gt[i]);
      }
    });
  });
}

void CpuBackend::swiglu(const Tensor& out, const Tensor& gate, const Tensor& up) {
  if (!MUSE_CPU_CHECK(out.numel() == gate.numel() && up.numel() == gate.numel() && gate.dtype == DType::F32,
             "swiglu", describe(out)))
    return;
  enqueue(__func__, [this, out, gate, up] {
    const int64_t n = out.numel(), chunk = chunk_size(n, pool_.size() * 4, 512);
    pool_.run((n + chunk - 1) / chunk, [&](int64_t task, int) {
      const float* a = static_cast<const float*>(gate.data);
      const float* b = static_cast<const float*>(up.data);
      float* y = static_cast<float*>(out.data);
      for (int64_t i = task * chunk, e = std::min(n, i + chunk); i < e; ++i) y[i] = a[i] * sigmoid(a[i]) * b[i];
    });
  });
}

void CpuBackend::gather_rows(const Tensor& out, const Tensor& in, const Tensor& rows) {
  if (!MUSE_CPU_CHECK(out.cols() == in.cols() && out.rows() == rows.numel() && rows.dtype == DType::I32 &&
                 out.dtype == in.dtype,
             "gather_rows", describe(out) + " <- " + describe(in)))
    return;
  enqueue(__func__, [this, out, in, rows] {
    const int32_t* r = static_cast<const int32_t*>(rows.data);
    const size_t row_bytes = size_t(in.cols()) * in.element_bytes();
    for (int64_t i = 0; i < rows.numel(); ++i) {
      if (r[i] < 0 || r[i] >= in.rows()) return fail("gather_rows: row " + std::to_string(r[i]) + " out of range");
      std::memcpy(static_cast<char*>(out.data) + size_t(i) * row_bytes,
                  static_cast<const char*>(in.data) + size_t(r[i]) * row_bytes, row_bytes);
    }
  });
}

void CpuBackend::softcap(const Tensor& x, float multiplier, float cap) {
  if (!MUSE_CPU_CHECK(x.dtype == DType::F32, "softcap", describe(x))) return;
  enqueue(__func__, [this, x, multiplier, cap] {
    const int64_t n = x.numel(), chunk = chunk_size(n, pool_.size() * 4, 512);  // tanh is slow: spread it
    pool_.run((n + chunk - 1) / chunk, [&](int64_t task, int) {
      float* v = static_cast<float*>(x.data);
      for (int64_t i = task * chunk, e = std::min(n, i + chunk); i < e; ++i) {
        float z = v[i] * multiplier;  // same operation order as transformers
        v[i] = cap > 0 ? std::tanh(z / cap) * cap : z;
      }
    });
  });
}

void CpuBackend::sample_rows(const Tensor& out, const Tensor& logits, const Tensor& specs, int64_t rows,
                             int64_t edits) {
  const size_t need = sizeof(RowSampleHeader) + size_t(rows) * sizeof(RowSampleSpec) + size_t(edits) * sizeof(RowEdit);
  if (!MUSE_CPU_CHECK(logits.dtype == DType::F32 && logits.rank == 2 && specs.bytes() >= need &&
                          out.bytes() >= size_t(rows) * sizeof(RowSampleResult),
                      "sample_rows", describe(out) + " <- " + describe(logits)))
    return;
  enqueue(__func__, [this, out, logits, specs, rows, edits] {
    const char* base = static_cast<const char*>(specs.data);
    const auto* spec = reinterpret_cast<const RowSampleSpec*>(base + sizeof(RowSampleHeader));
    const auto* edit = reinterpret_cast<const RowEdit*>(spec + rows);
    auto* res = static_cast<RowSampleResult*>(out.data);
    const int64_t V = logits.cols();
    for (int64_t r = 0; r < rows; ++r) {
      const RowSampleSpec& sp = spec[r];
      if (sp.logit_row < 0 || sp.logit_row >= logits.rows() || sp.edit_begin < 0 || sp.edit_count < 0 ||
          sp.edit_begin + int64_t(sp.edit_count) > edits)
        return fail("sample_rows: row " + std::to_string(r) + " is malformed");
    }
    pool_.run(rows, [&](int64_t r, int) {
      const RowSampleSpec& sp = spec[r];
      std::span<float> row(static_cast<float*>(logits.data) + sp.logit_row * V, size_t(V));
      res[r] = sample_row_host(sp, std::span<const RowEdit>(edit + sp.edit_begin, size_t(sp.edit_count)), row);
    });
  });
}

// Collectives: run on the executing thread when the step reaches them (the
// communicator blocks until every rank is there).
void CpuBackend::all_reduce_sum(const Tensor& t, Communicator& comm) {
  if (!MUSE_CPU_CHECK(t.dtype == DType::F32, "all_reduce_sum", describe(t))) return;
  Communicator* c = &comm;
  enqueue(__func__, [this, t, c] {
    if (Status s = c->all_reduce_sum(t.data, t.numel(), t.dtype, nullptr); !s.ok()) fail(s.message());
  });
}

void CpuBackend::all_gather(const Tensor& out, const Tensor& in, Communicator& comm) {
  if (!MUSE_CPU_CHECK(out.dtype == in.dtype && out.numel() == in.numel() * comm.size(), "all_gather",
                      describe(out) + " <- " + describe(in)))
    return;
  Communicator* c = &comm;
  enqueue(__func__, [this, out, in, c] {
    if (Status s = c->all_gather(in.data, out.data, in.numel(), in.dtype, nullptr); !s.ok()) fail(s.message());
  });
}

void CpuBackend::all_to_all(const Tensor& out, const Tensor& in, Communicator& comm) {
  if (!MUSE_CPU_CHECK(out.dtype == in.dtype && out.numel() == in.numel() && in.numel() % comm.size() == 0,
                      "all_to_all", describe(out) + " <- " + describe(in)))
    return;
  Communicator* c = &comm;
  enqueue(__func__, [this, out, in, c] {
    if (Status s = c->all_to_all(in.data, out.data, in.numel() / c->size(), in.dtype, nullptr); !s.ok())
      fail(s.message());
  });
}

}  // namespace cpu
}  // namespace muse
