// Fuzz target: PyTorch zip checkpoints (lib/ckpt/torch_file.cpp): the zip
// directory, the restricted unpickler, then every tensor read back.
#include "fuzz/targets/fuzz_common.h"
#include "lib/ckpt/torch_file.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = ds::fuzz::write_scratch("t.pt", std::string_view(reinterpret_cast<const char*>(data), size));
  return ds::fuzz::run_one([&] {
    const ds::TorchFile f = ds::TorchFile::open(path);
    for (const auto& entry : f.tensors())
      ds::fuzz::run_one([&] { (void)f.get(entry.first).numel(); });  // unsupported dtypes are UserErrors
    (void)f.scalars().size();
  });
}
