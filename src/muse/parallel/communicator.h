// Collectives between the ranks of a tensor/expert-parallel group. The
// interface the backends call when a step reaches a collective op
// (backend.h all_reduce_sum / all_gather / all_to_all); two implementations:
//  - InProcessGroup (in_process.h): N ranks as threads of one process, each
//    with its own backend, model shard and KV; what CI tests and what
//    `muse serve --device cpu --tensor-parallel-size N` runs;
//  - NcclCommunicator (nccl/nccl_communicator.h): the CUDA toolkit's NCCL,
//    one rank per GPU, built when CMake finds libnccl.
// Buffers are backend memory (host memory for the in-process group, device
// memory for NCCL); `stream` is the backend's stream (a cudaStream_t for
// NCCL, null on the CPU). Every rank calls the same collectives in the same
// order with the same counts.
#pragma once

#include <cstdint>
#include <string>

#include "muse/core/dtype.h"
#include "muse/core/status.h"

namespace muse {

// Bytes a rank sent through each collective since creation (the traffic
// figures docs/parallel.md reports; NCCL counts what it was asked to send).
struct CollectiveTraffic {
  uint64_t all_reduce = 0, all_gather = 0, all_to_all = 0;
  uint64_t calls = 0;
};

class Communicator {
 public:
  virtual ~Communicator() = default;
  virtual int rank() const = 0;
  virtual int size() const = 0;
  virtual std::string name() const = 0;

  // data[i] ← Σ_ranks data[i], in place; every rank ends with the same bits
  // (the in-process group adds in rank order; NCCL's ring reduces each
  // element once and broadcasts it). F32 (the CPU) or BF16 (the GPU).
  virtual Status all_reduce_sum(void* data, int64_t count, DType dtype, void* stream) = 0;
  // recv = concat over ranks of each rank's `count` elements (rank-major);
  // recv holds size() · count elements.
  virtual Status all_gather(const void* send, void* recv, int64_t count, DType dtype, void* stream) = 0;
  // send and recv hold size() blocks of `count` elements: block j of send
  // goes to rank j, block i of recv came from rank i (EP dispatch/combine).
  virtual Status all_to_all(const void* send, void* recv, int64_t count, DType dtype, void* stream) = 0;

  // Wakes every rank waiting in a collective with an error and fails every
  // later one: a rank whose step failed calls it so the others do not wait
  // for it forever. The group is then unusable.
  virtual void abort() = 0;

  const CollectiveTraffic& traffic() const { return traffic_; }

 protected:
  CollectiveTraffic traffic_;
};

}  // namespace muse
