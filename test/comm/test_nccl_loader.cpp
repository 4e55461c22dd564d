// NCCL is loaded at run time (lib/comm/nccl/nccl_api.h): no binary links
// libnccl, and a missing or wrong library is one clear error naming what was
// tried. Runs without a GPU.
#include <catch2/catch.hpp>

#include <cstdio>
#include <cstdlib>
#include <string>

#include "lib/comm/nccl/nccl_api.h"
#include "lib/core/error.h"

using namespace ds;
using Catch::Matchers::Contains;

namespace {

// The DT_NEEDED entries of an ELF file (readelf -d).
std::string needed_libs(const std::string& path) {
  std::string out;
  FILE* p = ::popen(("readelf -d '" + path + "' 2>&1").c_str(), "r");
  REQUIRE(p != nullptr);
  char buf[512];
  while (std::fgets(buf, sizeof buf, p))
    if (std::string(buf).find("NEEDED") != std::string::npos) out += buf;
  REQUIRE(::pclose(p) == 0);
  return out;
}

}  // namespace

TEST_CASE("no binary links libnccl") {
  const char* bin = std::getenv("DS_BINARY_DIR");
  REQUIRE(bin != nullptr);
  for (const char* exe : {"/apps/dstrain/dstrain", "/test/comm/test_nccl_loader"}) {
    const std::string libs = needed_libs(std::string(bin) + exe);
    INFO(exe << " needs:\n" << libs);
    CHECK(libs.find("libc.so") != std::string::npos);  // the listing is real
    CHECK(libs.find("libnccl") == std::string::npos);
  }
}

TEST_CASE("DS_NCCL_LIBRARY pointing nowhere is one clear error naming the path") {
  CHECK(nccl_library_candidates("/nonexistent/libnccl.so.2") == std::vector<std::string>{"/nonexistent/libnccl.so.2"});
  CHECK_THROWS_WITH(load_nccl("/nonexistent/libnccl.so.2"),
                    Contains("cannot load NCCL") && Contains("/nonexistent/libnccl.so.2") &&
                        Contains("DS_NCCL_LIBRARY"));
  // A library that loads but is not NCCL: the missing symbol is named.
  CHECK_THROWS_WITH(load_nccl("libm.so.6"), Contains("libm.so.6") && Contains("ncclGetUniqueId"));
}

TEST_CASE("the search covers the loader path, the CUDA toolkit and pip's nvidia-nccl") {
  const std::vector<std::string> c = nccl_library_candidates("");
  REQUIRE(c.size() >= 3);
  CHECK(c[0] == "libnccl.so.2");
  CHECK(c[1] == "/usr/local/cuda/lib64/libnccl.so.2");
}
