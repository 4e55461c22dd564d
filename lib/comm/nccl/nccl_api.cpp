// Run-time loading of NCCL (nccl_api.h).
#include "lib/comm/nccl/nccl_api.h"

#include <cstdlib>
#include <mutex>

#include "lib/core/error.h"
#include "lib/core/shared_library.h"

namespace ds {
namespace {

// Opens `path` and fills every entry; "" on success, else why it failed.
std::string try_load(const std::string& path, NcclApi& api) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = ::dlerror();
    return e ? e : "cannot be loaded";
  }
  std::string why;
  const bool ok = resolve_symbol(lib, "ncclGetUniqueId", api.GetUniqueId, why) &&
                  resolve_symbol(lib, "ncclCommInitRank", api.CommInitRank, why) &&
                  resolve_symbol(lib, "ncclCommDestroy", api.CommDestroy, why) &&
                  resolve_symbol(lib, "ncclCommAbort", api.CommAbort, why) &&
                  resolve_symbol(lib, "ncclCommGetAsyncError", api.CommGetAsyncError, why) &&
                  resolve_symbol(lib, "ncclGetErrorString", api.GetErrorString, why) &&
                  resolve_symbol(lib, "ncclGetLastError", api.GetLastError, why) &&
                  resolve_symbol(lib, "ncclAllReduce", api.AllReduce, why) &&
                  resolve_symbol(lib, "ncclReduceScatter", api.ReduceScatter, why) &&
                  resolve_symbol(lib, "ncclAllGather", api.AllGather, why) &&
                  resolve_symbol(lib, "ncclBroadcast", api.Broadcast, why) &&
                  resolve_symbol(lib, "ncclSend", api.Send, why) && resolve_symbol(lib, "ncclRecv", api.Recv, why) &&
                  resolve_symbol(lib, "ncclGroupStart", api.GroupStart, why) &&
                  resolve_symbol(lib, "ncclGroupEnd", api.GroupEnd, why);
  if (!ok) {
    ::dlclose(lib);
    return why;
  }
  api.path = path;
  return "";
}

}  // namespace

std::vector<std::string> nccl_library_candidates(const std::string& override_path) {
  return shared_library_candidates(override_path, "libnccl.so.2", "nvidia/nccl/lib/libnccl.so*");
}

NcclApi load_nccl(const std::string& override_path) {
  std::string tried;
  for (const std::string& path : nccl_library_candidates(override_path)) {
    NcclApi api;
    const std::string why = try_load(path, api);
    if (why.empty()) return api;
    tried += (tried.empty() ? "" : "; ") + path + ": " + why;
  }
  throw UserError("cannot load NCCL for a GPU job (" + tried +
                  "); install NCCL (e.g. pip install nvidia-nccl-cu13, or the CUDA toolkit's libnccl) or set "
                  "DS_NCCL_LIBRARY to libnccl.so.2");
}

const NcclApi& nccl() {
  static std::once_flag once;
  static NcclApi api;
  static std::string error;
  std::call_once(once, [] {
    const char* o = std::getenv("DS_NCCL_LIBRARY");
    try {
      api = load_nccl(o ? o : "");
    } catch (const UserError& e) {
      error = e.what();
    }
  });
  if (!error.empty()) throw UserError(error);
  return api;
}

}  // namespace ds
