// LaunchCounter: CUPTI callbacks at the entry of every CUDA runtime and
// driver API call, sorted by the function's name (launch_counter.h).
#include "test/train/launch_counter.h"

#include <cuda_runtime_api.h>
#include <cupti.h>
#include <dlfcn.h>

#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <vector>

#include "lib/core/shared_library.h"

namespace ds::test {
namespace {

using SubscribeFn = CUptiResult (*)(CUpti_SubscriberHandle*, CUpti_CallbackFunc, void*);
using EnableDomainFn = CUptiResult (*)(uint32_t, CUpti_SubscriberHandle, CUpti_CallbackDomain);
using UnsubscribeFn = CUptiResult (*)(CUpti_SubscriberHandle);
using ResultStringFn = CUptiResult (*)(CUptiResult, const char**);

struct Cupti {
  SubscribeFn subscribe = nullptr;
  EnableDomainFn enable_domain = nullptr;
  UnsubscribeFn unsubscribe = nullptr;
  ResultStringFn result_string = nullptr;
};

// Loaded once and kept (CUPTI is not unloaded while the process runs).
const Cupti& cupti() {
  static const Cupti api = [] {
    const std::string soname = "libcupti.so." + std::to_string(CUDART_VERSION / 1000);
    std::string tried;
    // The toolkit keeps CUPTI outside its lib64 (extras/CUPTI/lib64).
    std::vector<std::string> paths = shared_library_candidates("", soname, "nvidia/*/lib/libcupti.so*");
    paths.insert(paths.begin() + 1, "/usr/local/cuda/extras/CUPTI/lib64/" + soname);
    for (const std::string& path : paths) {
      void* lib = ::dlopen(path.c_str(), RTLD_NOW | RTLD_LOCAL);
      if (!lib) {
        tried += "; " + path + ": " + ::dlerror();
        continue;
      }
      Cupti c;
      std::string why;
      if (resolve_symbol(lib, "cuptiSubscribe", c.subscribe, why) &&
          resolve_symbol(lib, "cuptiEnableDomain", c.enable_domain, why) &&
          resolve_symbol(lib, "cuptiUnsubscribe", c.unsubscribe, why) &&
          resolve_symbol(lib, "cuptiGetResultString", c.result_string, why))
        return c;
      tried += "; " + path + ": " + why;
    }
    throw std::runtime_error("cannot load CUPTI to count launches (" + tried.substr(2) +
                             "); install the CUDA toolkit's CUPTI or pip's nvidia-cuda-cupti");
  }();
  return api;
}

bool starts_with(const char* s, const char* prefix) { return std::strncmp(s, prefix, std::strlen(prefix)) == 0; }

}  // namespace

struct LaunchCounter::Impl {
  CUpti_SubscriberHandle handle = nullptr;
  std::atomic<int64_t> kernels{0}, graphs{0}, memsets{0}, async_copies{0}, sync_copies{0}, driver_kernels{0};

  static void CUPTIAPI on_call(void* user, CUpti_CallbackDomain domain, CUpti_CallbackId, const void* data) {
    const auto* d = static_cast<const CUpti_CallbackData*>(data);
    if (d->callbackSite != CUPTI_API_ENTER || !d->functionName) return;
    Impl& c = *static_cast<Impl*>(user);
    const char* f = d->functionName;
    if (domain == CUPTI_CB_DOMAIN_DRIVER_API) {
      if (starts_with(f, "cuLaunch") && !std::strstr(f, "HostFunc")) ++c.driver_kernels;
      return;
    }
    if (starts_with(f, "cudaLaunch") && !std::strstr(f, "HostFunc")) ++c.kernels;
    else if (std::strstr(f, "GraphLaunch")) ++c.graphs;
    else if (starts_with(f, "cudaMemset")) ++c.memsets;
    else if (starts_with(f, "cudaMemcpy")) ++(std::strstr(f, "Async") ? c.async_copies : c.sync_copies);
  }
};

LaunchCounter::LaunchCounter() : impl_(new Impl) {
  const Cupti& api = cupti();
  auto check = [&](CUptiResult r, const char* what) {
    if (r == CUPTI_SUCCESS) return;
    const char* text = "?";
    api.result_string(r, &text);
    throw std::runtime_error(std::string("CUPTI ") + what + " failed: " + text);
  };
  check(api.subscribe(&impl_->handle, &Impl::on_call, impl_.get()), "cuptiSubscribe");
  try {
    check(api.enable_domain(1, impl_->handle, CUPTI_CB_DOMAIN_RUNTIME_API), "cuptiEnableDomain (runtime)");
    check(api.enable_domain(1, impl_->handle, CUPTI_CB_DOMAIN_DRIVER_API), "cuptiEnableDomain (driver)");
  } catch (...) {
    api.unsubscribe(impl_->handle);
    throw;
  }
}

LaunchCounter::~LaunchCounter() { cupti().unsubscribe(impl_->handle); }

LaunchCounts LaunchCounter::counts() const {
  const Impl& c = *impl_;
  return {c.kernels.load(),      c.graphs.load(),      c.memsets.load(),
          c.async_copies.load(), c.sync_copies.load(), c.driver_kernels.load()};
}

std::string LaunchCounts::str() const {
  return "kernel launches " + std::to_string(kernels) + " (driver API " + std::to_string(driver_kernels) +
         "), graph launches " + std::to_string(graphs) + ", memsets " + std::to_string(memsets) +
         ", async copies " + std::to_string(async_copies) + ", synchronous copies " + std::to_string(sync_copies);
}

}  // namespace ds::test
