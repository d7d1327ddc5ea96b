// Which backend runs a model: the one place that names the backends. The
// engine asks this factory for a `Backend` and never names one itself.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "muse/backends/backend.h"
#include "muse/backends/cpu/cpu_backend.h"

namespace muse {

enum class Device { Cpu, Cuda };

// "cpu" | "cuda"; an error names the accepted values.
Result<Device> parse_device(std::string_view name);
const char* device_name(Device d);

struct BackendOptions {
  Device device = Device::Cpu;
  CpuBackendOptions cpu;  // threads, ISA, profiling (CPU backend)
  int gpu = 0;            // CUDA device index
  bool gpu_profile = false;
  int gpu_product_kernel = 0;  // CudaBackendOptions::gemv_variant (0: the shape rule)
  int gpu_expert_kernel = 0;   // CudaBackendOptions::expert_kernel (0: the rule)
  int gpu_expert_gemm = 0;     // CudaBackendOptions::expert_gemm (0: the rule)
  int gpu_attention_merge = 0; // CudaBackendOptions::attention_merge (0: the rule)
  int gpu_moe_combine = 0;     // CudaBackendOptions::moe_combine (0: the rule)
  int gpu_stream_stages = 0;   // CudaBackendOptions::stream_stages (0: the rule)
  std::vector<std::string> gpu_skip_ops;  // CudaBackendOptions::skip_ops (timing probes only)
  bool gpu_graphs = true;                 // CudaBackendOptions::graphs (--enforce-eager turns them off)
  bool gpu_side_stream = true;            // CudaBackendOptions::side_stream (bench --one-stream turns it off)
};

// The backend for `options.device`; a clear error when that backend is not
// built into this binary or its hardware is absent.
Result<std::unique_ptr<Backend>> create_backend(const BackendOptions& options);

// Whether this binary has the CUDA backend compiled in.
bool cuda_backend_built();

// Quick check, before anything is loaded, that `device` can be created here:
// its backend is built in and its hardware is present. The message says
// which is missing.
Status check_device(Device device);
// The same for `ranks` ranks in this process (--tensor-parallel-size): on
// cuda, one visible GPU per rank; the message says how many are visible.
Status check_devices(Device device, int64_t ranks);

}  // namespace muse
