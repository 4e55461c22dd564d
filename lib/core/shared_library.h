// Finding and opening shared libraries loaded at run time (NCCL, cuDNN), so
// that a build links neither and a missing one is an error only for the job
// that asks for it. pip's nvidia-* wheels put these libraries under
// site-packages/nvidia/<name>/lib, which the system loader does not search.
#pragma once
#include <dlfcn.h>

#include <string>
#include <vector>

namespace ds {

// The paths matching a glob pattern, in glob's (sorted) order.
std::vector<std::string> glob_paths(const std::string& pattern);

// site-packages / dist-packages directories where pip may have installed
// wheels: $VIRTUAL_ENV's, $PYTHONPATH's entries, ~/.local's, the system's and
// conda's.
std::vector<std::string> python_site_dirs();

// Where to look for a library: `override_path` alone when given; otherwise
// the bare soname (the loader's own search), the CUDA toolkit's and Debian's
// library directories, then `wheel_glob` (e.g. "nvidia/nccl/lib/libnccl.so*")
// under every python_site_dirs() entry.
std::vector<std::string> shared_library_candidates(const std::string& override_path, const std::string& soname,
                                                   const std::string& wheel_glob);

// Looks `name` up in `lib` into `slot`; false (and `why` set) when absent.
template <class F>
bool resolve_symbol(void* lib, const char* name, F& slot, std::string& why) {
  slot = reinterpret_cast<F>(::dlsym(lib, name));
  if (!slot) why = std::string("symbol ") + name + " missing";
  return slot != nullptr;
}

}  // namespace ds
