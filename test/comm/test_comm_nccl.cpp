// NCCL backend tests (label gpu): a world of one in this process (collectives,
// stream order, host synchronisations, DS_NCCL_BLOCKING_WAIT), the watchdog's
// failure paths in child processes, and with two or more visible devices
// 2-process jobs, one GPU per rank ([multigpu], ctest test_comm_nccl_multigpu).
// Without a device each test is skipped (exit 77) with the reason.
#include <catch2/catch.hpp>

#include <cstdio>
#include <map>
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

TEST_CASE("nccl: two processes, one GPU each", "[gpu][multigpu]") {
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

// The watchdog's failure paths run in child processes (ds_comm_worker): the
// default handling ends the process. A world of one can miss a deadline: the
// scenario holds the stream with a sleeping host function.
static bool contains(const std::string& s, const std::string& part) { return s.find(part) != std::string::npos; }

namespace {

// The nccl_watchdog_timeout scenario (an op held past DS_COMM_TIMEOUT=1) in a
// child process with `env` added (the caller checks for a CUDA device).
test::JobResult run_watchdog_timeout(std::map<std::string, std::string> env) {
  test::JobSpec s;
  s.scenario = "nccl_watchdog_timeout";
  s.world = 1;
  s.timeout_s = 60;
  s.env = std::move(env);
  s.env["DS_COMM_TIMEOUT"] = "1";
  return test::run_job(s);
}

}  // namespace

TEST_CASE("nccl: the watchdog ends a process whose op misses DS_COMM_TIMEOUT", "[gpu]") {
  std::string why;
  if (device_count(why) < 1) DS_SKIP("the NCCL watchdog test needs a CUDA device: " << why);
  test::JobResult r = run_watchdog_timeout({});
  INFO(r.summary());
  REQUIRE_FALSE(r.timed_out);
  const std::string& out = r.ranks[0].output;
  CHECK(r.ranks[0].exit_code == 75);
  CHECK(contains(out, "NCCL watchdog"));
  CHECK(contains(out, "NCCL all_reduce on group 'world' (rank 0 of 1"));
  CHECK(contains(out, "timed out after 1 s (DS_COMM_TIMEOUT)"));
  CHECK(contains(out, "ending the process (exit code 75)"));
  CHECK_FALSE(contains(out, "FAIL"));
}

TEST_CASE("nccl: DS_NCCL_WATCHDOG_EXIT=0 makes the training thread throw the watchdog's error", "[gpu]") {
  std::string why;
  if (device_count(why) < 1) DS_SKIP("the NCCL watchdog test needs a CUDA device: " << why);
  test::JobResult r = run_watchdog_timeout({{"DS_NCCL_WATCHDOG_EXIT", "0"}});
  INFO(r.summary());
  REQUIRE_FALSE(r.timed_out);
  const std::string& out = r.ranks[0].output;
  CHECK(r.ranks[0].exit_code == 2);
  CHECK(contains(out, "ERROR: NCCL all_reduce on group 'world' (rank 0 of 1"));
  CHECK(contains(out, "timed out after 1 s (DS_COMM_TIMEOUT)"));
  CHECK_FALSE(contains(out, "ending the process"));
}

TEST_CASE("nccl: a dead peer ends the survivor through the watchdog, two GPUs", "[gpu][multigpu]") {
  std::string why;
  int n = device_count(why);
  if (n < 2) DS_SKIP("the dead-peer NCCL test needs 2 CUDA devices, found " << n << (why.empty() ? "" : ": ") << why);
  test::JobSpec s;
  s.scenario = "nccl_dead_peer";
  s.world = 2;
  s.timeout_s = 120;
  s.env = {{"DS_COMM_TIMEOUT", "5"}, {"DS_TEST_DIE_RANK", "1"}};
  test::JobResult r = test::run_job(s);
  INFO(r.summary());
  REQUIRE_FALSE(r.timed_out);
  CHECK(r.ranks[1].exit_code == 3);
  const std::string& out = r.ranks[0].output;
  CHECK(r.ranks[0].exit_code == 75);
  CHECK(contains(out, "NCCL watchdog"));
  CHECK(contains(out, "on group 'world' (rank 0 of 2"));
  CHECK((contains(out, "timed out after 5 s") || contains(out, "a peer probably failed")));
}
