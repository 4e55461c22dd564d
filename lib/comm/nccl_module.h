// The NCCL backend as the CUDA backend module hands it over (part Nccl of
// lib/core/cuda_module.h): make_world_communicator reaches NcclCommunicator
// (lib/comm/nccl/, library ds_comm_nccl, linked only by the module and GPU
// tests) through this table, so ds_comm never links the CUDA runtime.
#pragma once
#include <chrono>
#include <memory>

namespace ds {

class Communicator;
class TcpStore;

struct NcclModuleApi {
  // NcclCommunicator::create_world.
  std::unique_ptr<Communicator> (*create_world)(std::shared_ptr<TcpStore> store, int rank, int size,
                                                int local_rank, std::chrono::milliseconds op_timeout) = nullptr;
};

}  // namespace ds
