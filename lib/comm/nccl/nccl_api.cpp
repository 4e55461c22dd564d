// Run-time loading of NCCL (nccl_api.h).
#include "lib/comm/nccl/nccl_api.h"

#include <dlfcn.h>
#include <glob.h>

#include <cstdlib>
#include <mutex>

#include "lib/core/error.h"

namespace ds {
namespace {

std::vector<std::string> glob_paths(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  return out;
}

// site-packages style directories that may hold nvidia/nccl/lib.
std::vector<std::string> python_roots() {
  std::vector<std::string> roots;
  auto env = [](const char* k) { const char* v = std::getenv(k); return std::string(v ? v : ""); };
  if (!env("VIRTUAL_ENV").empty()) {
    for (const std::string& d : glob_paths(env("VIRTUAL_ENV") + "/lib/python3*/site-packages")) roots.push_back(d);
  }
  std::string pp = env("PYTHONPATH");
  for (size_t at = 0; !pp.empty() && at <= pp.size();) {
    const size_t colon = std::min(pp.find(':', at), pp.size());
    if (colon > at) roots.push_back(pp.substr(at, colon - at));
    at = colon + 1;
  }
  if (!env("HOME").empty())
    for (const std::string& d : glob_paths(env("HOME") + "/.local/lib/python3*/site-packages")) roots.push_back(d);
  for (const char* pat : {"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
                          "/usr/lib/python3/dist-packages", "/opt/conda/lib/python3*/site-packages"})
    for (const std::string& d : glob_paths(pat)) roots.push_back(d);
  return roots;
}

template <class F>
bool resolve(void* lib, const char* name, F& slot, std::string& why) {
  slot = reinterpret_cast<F>(::dlsym(lib, name));
  if (!slot) why = std::string("symbol ") + name + " missing";
  return slot != nullptr;
}

// Opens `path` and fills every entry; "" on success, else why it failed.
std::string try_load(const std::string& path, NcclApi& api) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = ::dlerror();
    return e ? e : "cannot be loaded";
  }
  std::string why;
  const bool ok = resolve(lib, "ncclGetUniqueId", api.GetUniqueId, why) &&
                  resolve(lib, "ncclCommInitRank", api.CommInitRank, why) &&
                  resolve(lib, "ncclCommDestroy", api.CommDestroy, why) &&
                  resolve(lib, "ncclCommAbort", api.CommAbort, why) &&
                  resolve(lib, "ncclCommGetAsyncError", api.CommGetAsyncError, why) &&
                  resolve(lib, "ncclGetErrorString", api.GetErrorString, why) &&
                  resolve(lib, "ncclGetLastError", api.GetLastError, why) &&
                  resolve(lib, "ncclAllReduce", api.AllReduce, why) &&
                  resolve(lib, "ncclReduceScatter", api.ReduceScatter, why) &&
                  resolve(lib, "ncclAllGather", api.AllGather, why) &&
                  resolve(lib, "ncclBroadcast", api.Broadcast, why) &&
                  resolve(lib, "ncclSend", api.Send, why) && resolve(lib, "ncclRecv", api.Recv, why) &&
                  resolve(lib, "ncclGroupStart", api.GroupStart, why) &&
                  resolve(lib, "ncclGroupEnd", api.GroupEnd, why);
  if (!ok) {
    ::dlclose(lib);
    return why;
  }
  api.path = path;
  return "";
}

}  // namespace

std::vector<std::string> nccl_library_candidates(const std::string& override_path) {
  if (!override_path.empty()) return {override_path};
  std::vector<std::string> c = {"libnccl.so.2", "/usr/local/cuda/lib64/libnccl.so.2",
                                "/usr/lib/x86_64-linux-gnu/libnccl.so.2"};
  for (const std::string& root : python_roots())
    for (const std::string& p : glob_paths(root + "/nvidia/nccl/lib/libnccl.so*")) c.push_back(p);
  return c;
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
