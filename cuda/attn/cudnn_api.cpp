// Run-time loading of cuDNN (cudnn_api.h). The search mirrors the NCCL
// loader's (lib/comm/nccl/nccl_api.cpp); cuda/ does not depend on lib/comm,
// so the few lines that list Python site-packages directories are repeated.
#include "cuda/attn/cudnn_api.h"

#include <dlfcn.h>
#include <glob.h>

#include <algorithm>
#include <cstdlib>
#include <mutex>

#include "lib/core/error.h"

namespace ds::cuda {
namespace {

std::vector<std::string> glob_paths(const std::string& pattern) {
  std::vector<std::string> out;
  glob_t g{};
  if (::glob(pattern.c_str(), 0, nullptr, &g) == 0)
    for (size_t i = 0; i < g.gl_pathc; ++i) out.emplace_back(g.gl_pathv[i]);
  ::globfree(&g);
  return out;
}

// site-packages style directories that may hold nvidia/cudnn/lib.
std::vector<std::string> python_roots() {
  std::vector<std::string> roots;
  auto env = [](const char* k) { const char* v = std::getenv(k); return std::string(v ? v : ""); };
  if (!env("VIRTUAL_ENV").empty())
    for (const std::string& d : glob_paths(env("VIRTUAL_ENV") + "/lib/python3*/site-packages")) roots.push_back(d);
  const std::string pp = env("PYTHONPATH");
  for (size_t at = 0; !pp.empty() && at <= pp.size();) {
    const size_t colon = std::min(pp.find(':', at), pp.size());
    if (colon > at) roots.push_back(pp.substr(at, colon - at));
    at = colon + 1;
  }
  if (!env("HOME").empty())
    for (const std::string& d : glob_paths(env("HOME") + "/.local/lib/python3*/site-packages")) roots.push_back(d);
  for (const char* pat : {"/usr/local/lib/python3*/dist-packages", "/usr/local/lib/python3*/site-packages",
                          "/usr/lib/python3/dist-packages", "/usr/lib/python3*/site-packages",
                          "/opt/conda/lib/python3*/site-packages"})
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
std::string try_load(const std::string& path, CudnnApi& api) {
  void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
  if (!lib) {
    const char* e = ::dlerror();
    return e ? e : "cannot be loaded";
  }
  std::string why;
  const bool ok = resolve(lib, "cudnnGetVersion", api.GetVersion, why) &&
                  resolve(lib, "cudnnGetErrorString", api.GetErrorString, why) &&
                  resolve(lib, "cudnnGetLastErrorString", api.GetLastErrorString, why) &&
                  resolve(lib, "cudnnCreate", api.Create, why) && resolve(lib, "cudnnSetStream", api.SetStream, why) &&
                  resolve(lib, "cudnnBackendCreateDescriptor", api.BackendCreateDescriptor, why) &&
                  resolve(lib, "cudnnBackendDestroyDescriptor", api.BackendDestroyDescriptor, why) &&
                  resolve(lib, "cudnnBackendSetAttribute", api.BackendSetAttribute, why) &&
                  resolve(lib, "cudnnBackendGetAttribute", api.BackendGetAttribute, why) &&
                  resolve(lib, "cudnnBackendFinalize", api.BackendFinalize, why) &&
                  resolve(lib, "cudnnBackendExecute", api.BackendExecute, why);
  if (ok) {
    api.version = api.GetVersion();
    if (api.version < 90000) why = "version " + std::to_string(api.version) + " is older than 9.0";
  }
  if (!why.empty()) {
    ::dlclose(lib);
    return why;
  }
  api.path = path;
  return "";
}

std::once_flag g_once;
CudnnApi g_api;
std::string g_error;

void load_once() {
  std::call_once(g_once, [] {
    const char* o = std::getenv("DS_CUDNN_LIBRARY");
    try {
      g_api = load_cudnn(o ? o : "");
    } catch (const UserError& e) {
      g_error = e.what();
    }
  });
}

}  // namespace

std::vector<std::string> cudnn_library_candidates(const std::string& override_path) {
  if (!override_path.empty()) return {override_path};
  std::vector<std::string> c = {"libcudnn.so.9", "/usr/local/cuda/lib64/libcudnn.so.9",
                                "/usr/lib/x86_64-linux-gnu/libcudnn.so.9"};
  for (const std::string& root : python_roots())
    for (const std::string& p : glob_paths(root + "/nvidia/cudnn/lib/libcudnn.so.9*")) c.push_back(p);
  return c;
}

CudnnApi load_cudnn(const std::string& override_path) {
  std::string tried;
  for (const std::string& path : cudnn_library_candidates(override_path)) {
    CudnnApi api;
    const std::string why = try_load(path, api);
    if (why.empty()) return api;
    tried += (tried.empty() ? "" : "; ") + path + ": " + why;
  }
  throw UserError("attention backend 'cudnn': cannot load cuDNN 9 (" + tried +
                  "); install it (e.g. pip install nvidia-cudnn-cu13), set DS_CUDNN_LIBRARY to libcudnn.so.9, "
                  "or choose --attention-backend flash");
}

const CudnnApi& cudnn() {
  load_once();
  if (!g_error.empty()) throw UserError(g_error);
  return g_api;
}

std::string cudnn_load_error() {
  load_once();
  return g_error;
}

}  // namespace ds::cuda
