// The NCCL collective checks, shared by the gpu test (in-process, world of 1)
// and ds_comm_worker (one rank per GPU). Returns 0 when all checks pass, and
// kScenarioSkipped (77, a skipped test's exit code) after printing the reason
// when the build or machine has no CUDA device; throws std::logic_error on a
// failed check.
#pragma once

namespace ds::test {

inline constexpr int kScenarioSkipped = 77;
int nccl_scenario();

}  // namespace ds::test
