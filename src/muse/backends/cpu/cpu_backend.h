// The CPU implementation of backends/backend.h: multithreaded (own fork-join
// pool), vectorized with AVX-512 or AVX2 chosen at run time (scalar
// otherwise), deterministic for any thread count.
#pragma once

#include <memory>
#include <optional>

#include "muse/backends/backend.h"
#include "muse/backends/cpu/kernels.h"

namespace muse {

struct CpuBackendOptions {
  int threads = 0;              // 0: every CPU this process may run on
  std::optional<cpu::Isa> isa;  // default: the best this CPU supports; asking for one it lacks is an error
  bool profile = false;         // time every operation (Backend::profile_report)
};

// The backend; an error names what is missing (e.g. AVX-512 on this CPU).
Result<std::unique_ptr<Backend>> create_cpu_backend(const CpuBackendOptions& options = {});

}  // namespace muse
