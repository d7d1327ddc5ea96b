#include "muse/backends/factory/backend_factory.h"

#if MUSE_HAVE_CUDA
#include "muse/backends/cuda/cuda_backend.h"
#endif

namespace muse {

Result<Device> parse_device(std::string_view name) {
  if (name == "cpu") return Device::Cpu;
  if (name == "cuda") return Device::Cuda;
  return make_error("--device '" + std::string(name) + "' is not a device muse knows (cpu, cuda)");
}

const char* device_name(Device d) { return d == Device::Cuda ? "cuda" : "cpu"; }

bool cuda_backend_built() {
#if MUSE_HAVE_CUDA
  return true;
#else
  return false;
#endif
}

Status check_device(Device device) {
  if (device == Device::Cpu) return Status::Ok();
#if MUSE_HAVE_CUDA
  if (cuda_device_count() < 1) return make_error("--device cuda: no CUDA GPU is visible to this process");
  return Status::Ok();
#else
  return make_error(
      "--device cuda: this muse was built without the CUDA backend (build on a machine with the CUDA "
      "toolkit, with -DMUSE_CUDA=ON; see scripts/test-cuda.sh)");
#endif
}

Status check_devices(Device device, int64_t ranks) {
  MUSE_RETURN_IF_ERROR(check_device(device));
  if (device == Device::Cpu || ranks <= 1) return Status::Ok();
  int visible = 0;
#if MUSE_HAVE_CUDA
  visible = cuda_device_count();
#endif
  if (visible < ranks)
    return make_error("--tensor-parallel-size " + std::to_string(ranks) + " --device cuda: needs " +
                      std::to_string(ranks) + " GPUs (one per rank), but this process sees " + std::to_string(visible) +
                      " (CUDA_VISIBLE_DEVICES, or a machine with more GPUs); --device cpu runs the ranks as threads");
  return Status::Ok();
}

Result<std::unique_ptr<Backend>> create_backend(const BackendOptions& options) {
  switch (options.device) {
    case Device::Cpu:
      return create_cpu_backend(options.cpu);
    case Device::Cuda: {
#if MUSE_HAVE_CUDA
      CudaBackendOptions o;
      o.device = options.gpu;
      o.profile = options.gpu_profile || options.cpu.profile;
      o.gemv_variant = options.gpu_product_kernel;
      o.expert_kernel = options.gpu_expert_kernel;
      o.expert_gemm = options.gpu_expert_gemm;
      o.attention_merge = options.gpu_attention_merge;
      o.moe_combine = options.gpu_moe_combine;
      o.stream_stages = options.gpu_stream_stages;
      o.skip_ops = options.gpu_skip_ops;
      o.side_stream = options.gpu_side_stream;
      o.graphs = options.gpu_graphs;
      auto b = create_cuda_backend(o);
      if (!b.ok()) return make_error("--device cuda: " + b.message());
      return b;
#else
      return check_device(Device::Cuda).error();
#endif
    }
  }
  return make_error("unknown device");
}

}  // namespace muse
