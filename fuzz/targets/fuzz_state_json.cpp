// Fuzz target: checkpoint state.json validation (lib/ckpt/state_json.cpp).
#include "fuzz/targets/fuzz_common.h"
#include "lib/ckpt/state_json.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  return ds::fuzz::run_one([&] {
    const ds::StepState s = ds::parse_step_state(text, "fuzz/state.json");
    int64_t numel = 0;
    for (const auto& [name, shape] : s.layout) numel += ds::shape_numel(shape);  // validated: no overflow
    if (s.shards < 1 || numel < 1) std::abort();
  });
}
