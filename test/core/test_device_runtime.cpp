// DeviceRuntime (lib/core/device_runtime.h): the CPU runtime's buffers and
// copies, its refusal of step graphs, and a device type whose backend is
// missing (no CUDA in the build, or a CUDA backend module that does not
// load): unavailable with a reason, every use one user error naming --device
// cuda; where the module is looked for (lib/core/cuda_module.h).
// Also the programs' shared exit policy (run_main).
#include <catch2/catch.hpp>
#include <cstdlib>
#include <cstring>
#include <new>
#include <stdexcept>
#include <string>
#include <vector>

#include "lib/core/cuda_module.h"
#include "lib/core/device_runtime.h"
#include "lib/core/error.h"
#include "lib/core/run_main.h"

using namespace ds;
using Catch::Matchers::Contains;

TEST_CASE("the CPU runtime: host buffers, copies in order, no step graphs") {
  DeviceRuntime& rt = device_runtime(Device::cpu());
  CHECK(rt.type() == DeviceType::CPU);
  CHECK(rt.available());
  CHECK(rt.unavailable_reason().empty());
  float* p = static_cast<float*>(rt.alloc_pinned(4 * sizeof(float)));
  REQUIRE(p != nullptr);
  const float src[4] = {1, 2, 3, 4};
  float dst[4] = {};
  rt.upload_async(p, src, sizeof src);
  rt.copy_pinned_async(dst, p, sizeof dst);
  rt.synchronize();
  CHECK(std::memcmp(dst, src, sizeof src) == 0);
  rt.free_pinned(p);
  CHECK(rt.max_allocated_bytes() == 0);
  CHECK_THROWS_AS(rt.make_graph(), UserError);
}

TEST_CASE("a device type whose backend is missing is unavailable, and using it is a user error") {
  // A CUDA build loads its backend module here: point it at one that is not there.
  const std::string missing = "/nonexistent/libds_cuda_backend.so";
  ::setenv("DS_CUDA_BACKEND", missing.c_str(), 1);
  const std::string why =
      cuda_module_built() ? "cannot load the CUDA backend " + missing + ": " : "this build has no CUDA backend";
  DeviceRuntime& rt = device_runtime(DeviceType::CUDA);
  CHECK_FALSE(rt.available());
  CHECK(rt.device_count() == 0);
  CHECK_THAT(rt.unavailable_reason(), Contains(why));
  CHECK_THROWS_WITH(rt.init_device(0), Contains("--device cuda: " + why));
  CHECK_THROWS_AS(rt.alloc_pinned(16), UserError);
  CHECK_THROWS_AS(rt.make_graph(), UserError);
  CHECK_THROWS_WITH(cuda_module_part(CudaModulePart::Ops), Contains("--device cuda: " + why));
  CHECK(cuda_module_loaded_path().empty());
}

TEST_CASE("the CUDA backend module is looked for in $DS_CUDA_BACKEND alone, else beside the program") {
  CHECK(cuda_module_candidates("/x/m.so") == std::vector<std::string>{"/x/m.so"});
  const std::vector<std::string> c = cuda_module_candidates("");
  REQUIRE(c.size() >= 3);
  CHECK(c.front().ends_with("/test/core/libds_cuda_backend.so"));
  CHECK(c[1].ends_with("/test/core/../lib/libds_cuda_backend.so"));
  CHECK(c.back() == "libds_cuda_backend.so");  // the loader's own search last
  CHECK(c.size() == (cuda_module_built() ? 4u : 3u));
}

TEST_CASE("run_main: 0/body's code, 1 for user errors and out of memory, 2 for internal errors") {
  CHECK(run_main("prog", [] { return 0; }) == 0);
  CHECK(run_main("prog", [] { return 3; }) == 3);
  CHECK(run_main("prog", []() -> int { throw UserError("bad input"); }) == 1);
  CHECK(run_main("prog", []() -> int { throw std::bad_alloc(); }) == 1);
  CHECK(run_main("prog", []() -> int { throw std::runtime_error("a bug"); }) == 2);
  CHECK(run_main("prog", []() -> int { throw 42; }) == 2);
}
