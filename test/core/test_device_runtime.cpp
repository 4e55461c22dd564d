// DeviceRuntime (lib/core/device_runtime.h): the CPU runtime's buffers and
// copies, its refusal of step graphs, and a device type with no registered
// backend (this binary links no op dispatcher, so CUDA has none here):
// unavailable with a reason, every use one user error naming --device cuda.
// Also the programs' shared exit policy (run_main).
#include <catch2/catch.hpp>
#include <cstring>
#include <new>
#include <stdexcept>

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

TEST_CASE("a device type without a registered backend is unavailable, and using it is a user error") {
  DeviceRuntime& rt = device_runtime(DeviceType::CUDA);
  CHECK_FALSE(rt.available());
  CHECK(rt.device_count() == 0);
  CHECK_THAT(rt.unavailable_reason(), Contains("no CUDA backend"));
  CHECK_THROWS_WITH(rt.init_device(0), Contains("--device cuda: this build has no CUDA backend"));
  CHECK_THROWS_AS(rt.alloc_pinned(16), UserError);
  CHECK_THROWS_AS(rt.make_graph(), UserError);
}

TEST_CASE("run_main: 0/body's code, 1 for user errors and out of memory, 2 for internal errors") {
  CHECK(run_main("prog", [] { return 0; }) == 0);
  CHECK(run_main("prog", [] { return 3; }) == 3);
  CHECK(run_main("prog", []() -> int { throw UserError("bad input"); }) == 1);
  CHECK(run_main("prog", []() -> int { throw std::bad_alloc(); }) == 1);
  CHECK(run_main("prog", []() -> int { throw std::runtime_error("a bug"); }) == 2);
  CHECK(run_main("prog", []() -> int { throw 42; }) == 2);
}
