// The NCCL communicator (the CUDA toolkit's libnccl; nothing home-made):
// one rank per GPU, collectives enqueued on the calling backend's stream.
// Built only when CMake finds NCCL (MUSE_HAVE_NCCL). Two ways to make one:
//  - make_nccl_local_group: every GPU of one host from one process
//    (ncclCommInitAll), ranks driven by RankRunner threads as on the CPU;
//  - make_nccl_rank: one rank of a multi-process group (ranks started by
//    `mpirun`, one per GPU, across hosts): rank 0 makes the unique id
//    (nccl_unique_id) and the launcher hands it to every rank.
// muse never sets NCCL environment variables (NCCL_NVLS_ENABLE stays as
// the machine has it: 0, no NVLink multicast).
#pragma once

#include <array>
#include <memory>
#include <vector>

#include "muse/parallel/communicator.h"

namespace muse {

using NcclId = std::array<char, 128>;  // ncclUniqueId's bytes

Result<std::vector<std::unique_ptr<Communicator>>> make_nccl_local_group(const std::vector<int>& devices);
Result<NcclId> nccl_unique_id();
// Call with the rank's GPU current (cudaSetDevice).
Result<std::unique_ptr<Communicator>> make_nccl_rank(int rank, int size, const NcclId& id);

}  // namespace muse
