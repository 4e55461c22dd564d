// Fuzz target: the training config parser (lib/train config*): JSON text ->
// strict sections -> derived and validated TrainConfig, for a few job sizes.
#include "fuzz/targets/fuzz_common.h"
#include "lib/config/config.h"
#include "lib/core/json_config.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  ds::fuzz::quiet();
  const std::string_view text(reinterpret_cast<const char*>(data), size);
  const int world = size > 0 ? 1 + data[0] % 8 : 1;
  return ds::fuzz::run_one([&] {
    const nlohmann::json j = ds::parse_json_text(text, "fuzz config");
    const ds::TrainConfig cfg = ds::train_config_from_json(j, world);
    (void)cfg.resolved.dump();
  });
}
