// Fuzz target: the safetensors reader (lib/ckpt/safetensors.cpp): header
// validation, then every tensor read back.
#include "fuzz/targets/fuzz_common.h"
#include "lib/ckpt/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path =
      ds::fuzz::write_scratch("t.safetensors", std::string_view(reinterpret_cast<const char*>(data), size));
  return ds::fuzz::run_one([&] {
    const ds::SafetensorsFile f = ds::SafetensorsFile::open(path);
    for (const std::string& name : f.names()) {
      (void)f.shape(name);
      ds::fuzz::run_one([&] { (void)f.get(name).numel(); });  // unsupported dtypes are UserErrors
    }
    (void)f.metadata();
  });
}
