// The NCCL entry points dstrain uses, loaded from libnccl at run time (dlopen)
// the first time a GPU job needs them, so that no binary links libnccl: CPU
// runs and the tests start where NCCL is absent, and the GPU bundle uses the
// NCCL installed on the device. Only nccl.h is needed at build time.
// Search order: $DS_NCCL_LIBRARY (only that, when set); libnccl.so.2 through
// the loader's path (LD_LIBRARY_PATH, ld.so.cache); /usr/local/cuda/lib64 and
// /usr/lib/x86_64-linux-gnu; the pip package nvidia-nccl-cu* under the usual
// Python site-packages directories ($VIRTUAL_ENV, $PYTHONPATH, ~/.local,
// /usr/local/lib, /usr/lib).
#pragma once
#include <nccl.h>

#include <string>
#include <vector>

#include "cuda/core/check.h"

namespace ds {

struct NcclApi {
  decltype(&::ncclGetUniqueId) GetUniqueId = nullptr;
  decltype(&::ncclCommInitRank) CommInitRank = nullptr;
  decltype(&::ncclCommDestroy) CommDestroy = nullptr;
  decltype(&::ncclCommAbort) CommAbort = nullptr;
  decltype(&::ncclCommGetAsyncError) CommGetAsyncError = nullptr;
  decltype(&::ncclGetErrorString) GetErrorString = nullptr;
  decltype(&::ncclGetLastError) GetLastError = nullptr;
  decltype(&::ncclAllReduce) AllReduce = nullptr;
  decltype(&::ncclReduceScatter) ReduceScatter = nullptr;
  decltype(&::ncclAllGather) AllGather = nullptr;
  decltype(&::ncclBroadcast) Broadcast = nullptr;
  decltype(&::ncclSend) Send = nullptr;
  decltype(&::ncclRecv) Recv = nullptr;
  decltype(&::ncclGroupStart) GroupStart = nullptr;
  decltype(&::ncclGroupEnd) GroupEnd = nullptr;
  std::string path;  // the library that was loaded
};

// The libraries tried, in order, for `override_path` ($DS_NCCL_LIBRARY; "" when
// unset): just that one when given, else the search order above.
std::vector<std::string> nccl_library_candidates(const std::string& override_path);
// Loads the first candidate that opens and resolves every symbol. UserError
// naming each path tried and why it failed (file missing, not loadable,
// symbol missing) when none does.
NcclApi load_nccl(const std::string& override_path);
// The process-wide table, loaded on first use from $DS_NCCL_LIBRARY or the
// search order (a failure is thrown again on every call).
const NcclApi& nccl();

}  // namespace ds

// The NCCL member of the check-macro family of cuda/core/check.h: `expr` is a
// call through the table (DS_NCCL_CHECK(nccl().GetUniqueId(&id))); a failure
// is "NCCL error <code> (<ncclGetErrorString>): <expr>" with file:line, host
// and rank. Calls on a communicator use NcclCommunicator::check, which also
// names the group, rank and device.
#define DS_NCCL_CHECK(expr)                                                          \
  do {                                                                               \
    const ncclResult_t ds_nr_ = (expr);                                              \
    if (ds_nr_ != ncclSuccess)                                                       \
      ::ds::cuda::check_fail("NCCL", static_cast<long>(ds_nr_),                      \
                             ::ds::nccl().GetErrorString(ds_nr_), #expr, __FILE__, __LINE__); \
  } while (0)
