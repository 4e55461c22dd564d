// Finding and loading the CUDA backend module (cuda_module.h).
#include "lib/core/cuda_module.h"

#include <dlfcn.h>
#include <unistd.h>

#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <mutex>

#include "lib/core/error.h"

namespace ds {

namespace {

struct Loaded {
  std::string error;  // "" when loaded
  std::string path;
  CudaModuleTable table;
};

std::atomic<bool> g_loaded{false};

std::string self_dir() {
  std::error_code ec;
  const std::filesystem::path exe = std::filesystem::read_symlink("/proc/self/exe", ec);
  return ec ? std::string() : exe.parent_path().string();
}

std::string dl_error() {
  const char* e = ::dlerror();
  return e ? e : "unknown dlopen error";
}

// Opens `path` and runs its entry point; "" on success.
std::string open_module(const std::string& path, Loaded& l) {
  void* h = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL | RTLD_NODELETE);
  if (!h) return dl_error();
  auto init = reinterpret_cast<CudaModuleInit>(::dlsym(h, kCudaModuleEntry));
  if (!init) return std::string("symbol ") + kCudaModuleEntry + " missing (not a dstrain CUDA backend module)";
  CudaModuleTable t;
  bool ok = false;
  try {
    ok = init(kCudaModuleAbi, &t);
  } catch (const std::exception& e) {
    return std::string("its entry point failed: ") + e.what();
  }
  if (!ok)
    return "module ABI " + std::to_string(t.abi) + ", this program expects " + std::to_string(kCudaModuleAbi) +
           " (a module from another build; rebuild, or point DS_CUDA_BACKEND at this build's)";
  l.path = path;
  l.table = t;
  return "";
}

Loaded load() {
  Loaded l;
  if (!cuda_module_built()) {
    l.error = "this build has no CUDA backend (nvcc was not found at configure time); use --device cpu";
    return l;
  }
  const char* env = std::getenv("DS_CUDA_BACKEND");
  const std::string override_path = env ? env : "";
  std::string tried;
  for (const std::string& c : cuda_module_candidates(override_path)) {
    const bool bare = c.find('/') == std::string::npos;
    if (!bare && override_path.empty() && !std::filesystem::exists(c)) {
      tried += (tried.empty() ? "" : ", ") + c;
      continue;
    }
    ::dlerror();
    const std::string why = open_module(c, l);
    if (why.empty()) return l;
    // The bare name not on the loader's path is "not found"; a file that
    // exists but does not load is the error to report.
    if (bare && why.find("cannot open shared object file") != std::string::npos) {
      tried += (tried.empty() ? "" : ", ") + std::string("the loader's path");
      continue;
    }
    l.error = "cannot load the CUDA backend " + c + ": " + why;
    return l;
  }
  l.error = std::string("cannot load the CUDA backend ") + kCudaModuleName + ": not found (tried " + tried +
            "); set DS_CUDA_BACKEND to its path";
  return l;
}

const Loaded& loaded() {
  static const Loaded l = [] {
    Loaded r = load();
    if (r.error.empty()) g_loaded.store(true);
    return r;
  }();
  return l;
}

}  // namespace

bool cuda_module_built() {
#ifdef DS_CUDA_MODULE_BUILD_PATH
  return true;
#else
  return false;
#endif
}

std::vector<std::string> cuda_module_candidates(const std::string& override_path) {
  if (!override_path.empty()) return {override_path};
  std::vector<std::string> c;
  const std::string dir = self_dir();
  if (!dir.empty()) {
    c.push_back(dir + "/" + kCudaModuleName);
    c.push_back(dir + "/../lib/" + kCudaModuleName);
  }
#ifdef DS_CUDA_MODULE_BUILD_PATH
  c.emplace_back(DS_CUDA_MODULE_BUILD_PATH);
#endif
  c.emplace_back(kCudaModuleName);
  return c;
}

const std::string& cuda_module_error() { return loaded().error; }

void* cuda_module_part(CudaModulePart p) {
  const Loaded& l = loaded();
  if (!l.error.empty()) throw UserError("--device cuda: " + l.error);
  const auto i = static_cast<size_t>(p);
  DS_CHECK(i < kCudaModuleParts, "CUDA backend module part {}", i);
  return l.table.parts[i];
}

std::string cuda_module_loaded_path() { return g_loaded.load() ? loaded().path : std::string(); }

}  // namespace ds
