#include "muse/parallel/nccl/nccl_communicator.h"

#include <cstring>
#include <string>

#include <cuda_runtime.h>
#include <nccl.h>

namespace muse {
namespace {

Status check(ncclResult_t r, const char* what) {
  if (r == ncclSuccess) return Status::Ok();
  return make_error(std::string("NCCL ") + what + ": " + ncclGetErrorString(r));
}

Result<ncclDataType_t> nccl_type(DType t) {
  switch (t) {
    case DType::F32: return ncclFloat32;
    case DType::BF16: return ncclBfloat16;
    case DType::F16: return ncclFloat16;
    case DType::I32: return ncclInt32;
    case DType::U8: return ncclUint8;
    default: return make_error("NCCL: no data type for " + std::string(dtype_name(t)));
  }
}

class NcclCommunicator final : public Communicator {
 public:
  NcclCommunicator(ncclComm_t comm, int rank, int size) : comm_(comm), rank_(rank), size_(size) {}
  ~NcclCommunicator() override {
    if (comm_) ncclCommDestroy(comm_);
  }
  int rank() const override { return rank_; }
  int size() const override { return size_; }
  std::string name() const override { return "nccl (" + std::to_string(size_) + " ranks)"; }
  void abort() override {
    if (comm_) ncclCommAbort(comm_);
    comm_ = nullptr;
  }

  Status all_reduce_sum(void* data, int64_t count, DType dtype, void* stream) override {
    MUSE_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dtype));
    MUSE_RETURN_IF_ERROR(live());
    traffic_.all_reduce += 2 * bytes(count, dtype) * uint64_t(size_ - 1) / uint64_t(size_);
    ++traffic_.calls;
    return check(ncclAllReduce(data, data, size_t(count), t, ncclSum, comm_, cudaStream_t(stream)), "all_reduce");
  }

  Status all_gather(const void* send, void* recv, int64_t count, DType dtype, void* stream) override {
    MUSE_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dtype));
    MUSE_RETURN_IF_ERROR(live());
    traffic_.all_gather += bytes(count, dtype) * uint64_t(size_ - 1);
    ++traffic_.calls;
    return check(ncclAllGather(send, recv, size_t(count), t, comm_, cudaStream_t(stream)), "all_gather");
  }

  Status all_to_all(const void* send, void* recv, int64_t count, DType dtype, void* stream) override {
    MUSE_ASSIGN_OR_RETURN(ncclDataType_t t, nccl_type(dtype));
    MUSE_RETURN_IF_ERROR(live());
    const size_t b = size_t(bytes(count, dtype));
    traffic_.all_to_all += uint64_t(b) * uint64_t(size_ - 1);
    ++traffic_.calls;
    // Grouped point-to-point: NCCL's documented all-to-all.
    MUSE_RETURN_IF_ERROR(check(ncclGroupStart(), "group start"));
    for (int peer = 0; peer < size_; ++peer) {
      ncclSend(static_cast<const char*>(send) + size_t(peer) * b, size_t(count), t, peer, comm_, cudaStream_t(stream));
      ncclRecv(static_cast<char*>(recv) + size_t(peer) * b, size_t(count), t, peer, comm_, cudaStream_t(stream));
    }
    return check(ncclGroupEnd(), "all_to_all");
  }

 private:
  static uint64_t bytes(int64_t count, DType t) { return uint64_t(count) * uint64_t(dtype_bits(t)) / 8; }
  Status live() const { return comm_ ? Status::Ok() : make_error("NCCL communicator aborted"); }
  ncclComm_t comm_;
  int rank_, size_;
};

}  // namespace

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_local_group(const std::vector<int>& devices) {
  std::vector<ncclComm_t> comms(devices.size());
  MUSE_RETURN_IF_ERROR(check(ncclCommInitAll(comms.data(), int(devices.size()), devices.data()), "init"));
  std::vector<std::unique_ptr<Communicator>> out;
  for (size_t r = 0; r < comms.size(); ++r)
    out.push_back(std::make_unique<NcclCommunicator>(comms[r], int(r), int(comms.size())));
  return out;
}

Result<NcclId> nccl_unique_id() {
  ncclUniqueId id;
  MUSE_RETURN_IF_ERROR(check(ncclGetUniqueId(&id), "unique id"));
  NcclId out;
  std::memcpy(out.data(), id.internal, out.size());
  return out;
}

Result<std::unique_ptr<Communicator>> make_nccl_rank(int rank, int size, const NcclId& id) {
  ncclUniqueId uid;
  std::memcpy(uid.internal, id.data(), id.size());
  ncclComm_t comm = nullptr;
  MUSE_RETURN_IF_ERROR(check(ncclCommInitRank(&comm, size, uid, rank), "init rank"));
  return std::unique_ptr<Communicator>(std::make_unique<NcclCommunicator>(comm, rank, size));
}

}  // namespace muse
