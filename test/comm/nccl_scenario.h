// The NCCL collective checks, shared by the gpu test (in-process, world of 1)
// and ds_comm_worker (one rank per GPU). Returns 0 when all checks pass, and
// also 0 after printing a "SKIP:" line when the build or machine has no CUDA
// device; throws std::logic_error on a failed check.
#pragma once

namespace ds::test {

int nccl_scenario();

}  // namespace ds::test
