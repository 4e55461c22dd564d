// The one Catch2 main shared by all test binaries. It runs the selected test
// cases and exits 77 (ctest: skipped) when none failed and at least one of
// them could not run here (DS_SKIP, test/skip.h).
#define CATCH_CONFIG_RUNNER
#include <catch2/catch.hpp>

#include <cstdio>

#include "test/skip.h"

namespace ds::test {
namespace {
int g_skips = 0;
}  // namespace

void note_skip(const std::string& reason) {
  std::printf("SKIP: %s\n", reason.c_str());
  std::fflush(stdout);
  ++g_skips;
}

int skip_count() { return g_skips; }

}  // namespace ds::test

int main(int argc, char** argv) {
  const int failed = Catch::Session().run(argc, argv);
  if (failed == 0 && ds::test::skip_count() > 0) {
    std::printf("%d check(s) could not run here: reporting this test as skipped (exit %d)\n",
                ds::test::skip_count(), ds::test::kSkipExitCode);
    return ds::test::kSkipExitCode;
  }
  return failed;
}
