// Fuzz target: the MPI-style hostfile parser (launcher/hostfile.cpp).
#include "fuzz/targets/fuzz_common.h"
#include "launcher/hostfile.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  return ds::fuzz::run_one([&] {
    const auto pool = ds::launch::parse_hostfile(text, "fuzz-hostfile");
    for (const auto& h : pool)
      if (h.host.empty() || h.slots < 1) std::abort();  // the parser promised HOST slots=N, N >= 1
  });
}
