// Collectives on the CUDA backend: the communicator (NCCL) enqueues them on
// this backend's stream when the step reaches them, between the kernels
// around them, so a step with collectives is still one ordered stream.
#include "muse/backends/cuda/cuda_impl.cuh"
#include "muse/parallel/communicator.h"

namespace muse::cuda {

void CudaBackend::all_reduce_sum(const Tensor& t, Communicator& comm) {
  if (!check(t.dtype == DType::F32 || t.dtype == DType::BF16, "all_reduce_sum", [&] { return describe(t); })) return;
  Communicator* c = &comm;
  enqueue("all_reduce_sum", [=](cudaStream_t s) {
    return c->all_reduce_sum(t.data, t.numel(), t.dtype, s).ok() ? cudaSuccess : cudaErrorUnknown;
  });
}

void CudaBackend::all_gather(const Tensor& out, const Tensor& in, Communicator& comm) {
  if (!check(out.dtype == in.dtype && out.numel() == in.numel() * comm.size(), "all_gather",
             [&] { return describe(out) + " <- " + describe(in); }))
    return;
  Communicator* c = &comm;
  enqueue("all_gather", [=](cudaStream_t s) {
    return c->all_gather(in.data, out.data, in.numel(), in.dtype, s).ok() ? cudaSuccess : cudaErrorUnknown;
  });
}

void CudaBackend::all_to_all(const Tensor& out, const Tensor& in, Communicator& comm) {
  if (!check(out.dtype == in.dtype && out.numel() == in.numel() && in.numel() % comm.size() == 0, "all_to_all",
             [&] { return describe(out) + " <- " + describe(in); }))
    return;
  Communicator* c = &comm;
  enqueue("all_to_all", [=](cudaStream_t s) {
    return c->all_to_all(in.data, out.data, in.numel() / c->size(), in.dtype, s).ok() ? cudaSuccess
                                                                                       : cudaErrorUnknown;
  });
}

}  // namespace muse::cuda
