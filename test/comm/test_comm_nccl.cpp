// NCCL backend tests (label gpu): a world of one in this process, and with two
// or more visible devices a 2-process job, one GPU per rank. Without a device
// each test is skipped (exit 77) with the reason.
#include <catch2/catch.hpp>

#include <cstdio>
#include <string>

#include "lib/comm/communicator.h"
#include "test/comm/nccl_scenario.h"
#include "test/comm/proc_harness.h"
#ifdef DS_WITH_NCCL
#include "lib/comm/nccl/nccl_communicator.h"
#include "test/skip.h"
#endif

using namespace ds;

static int device_count(std::string& why) {
#ifdef DS_WITH_NCCL
  return cuda_device_count(&why);
#else
  why = "built without NCCL";
  return 0;
#endif
}

TEST_CASE("nccl: world of one", "[gpu]") {
  const int r = test::nccl_scenario();
  if (r == test::kScenarioSkipped) DS_SKIP("the NCCL checks need a CUDA device");
  CHECK(r == 0);
}

TEST_CASE("nccl: two processes, one GPU each", "[gpu]") {
  std::string why;
  int n = device_count(why);
  if (n < 2) DS_SKIP("the 2-process NCCL test needs 2 CUDA devices, found " << n << (why.empty() ? "" : ": ") << why);
  test::JobSpec s;
  s.scenario = "nccl";
  s.world = 2;
  s.timeout_s = 120;
  test::JobResult r = test::run_job(s);
  INFO(r.summary());
  REQUIRE_FALSE(r.timed_out);
  for (const auto& rank : r.ranks) CHECK(rank.exit_code == 0);
}
