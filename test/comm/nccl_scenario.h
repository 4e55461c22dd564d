// The NCCL collective checks, shared by the gpu test (in-process, world of 1)
// and ds_comm_worker (one rank per GPU). Returns 0 when all checks pass, and
// kScenarioSkipped (77, a skipped test's exit code) after printing the reason
// when the build or machine has no CUDA device; throws std::logic_error on a
// failed check.
#pragma once

namespace ds::test {

inline constexpr int kScenarioSkipped = 77;
int nccl_scenario();
// The watchdog's failure paths, each in a process of its own (they end it):
// - a world of one whose asynchronous all_reduce is held by a sleeping host
//   function enqueued inside it, past DS_COMM_TIMEOUT (the test sets 1 s);
// - two ranks, DS_TEST_DIE_RANK exits after the first barrier and the other
//   issues all_reduces and waits for them.
// Default handling: the watchdog prints its line and exits with
// kNcclWatchdogExitCode (75). With DS_NCCL_WATCHDOG_EXIT=0 the training
// thread throws the error; it is printed as "ERROR: ..." and the process
// exits 2 at once (the aborted communicators are not torn down).
int nccl_watchdog_timeout_scenario();
int nccl_dead_peer_scenario();

}  // namespace ds::test
