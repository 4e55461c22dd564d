// The steady-state training step on the GPU synchronises the host once: the
// packed read of the step's losses, gradient norm and fp16 overflow flag
// (docs/distributed.md, host synchronisations per step). A single-process
// dstrain step with --profile in bf16 and fp16 must report at most that one;
// an fp32 run on the GPU must follow the CPU's loss curve (the losses now
// reach the host through the packed read). The bf16/fp16 steps must run the
// MLP's GELU in the cuBLASLt epilogues (the fp32 curve runs them too where
// cuBLASLt offers them). Skipped (exit 77) without a device.
#include <catch2/catch.hpp>

#include <cmath>

#include "cuda/blas/lt_gemm.h"
#include "cuda/cuda_api.h"
#include "test/skip.h"
#include "test/train/train_fixture.h"

using namespace ds;
using namespace ds::test;

namespace {

// The fewest host synchronisations a GPU step can have: the loss scaler's
// skip decision and the clip coefficient are taken on the host.
constexpr int64_t kStepSyncs = 1;

}  // namespace

TEST_CASE("a GPU training step synchronises the host once", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  const std::string dir = (fixture().dir / "profile").string();
  fs::create_directories(dir);
  cuda::set_gemm_epilogues(cuda::GemmEpilogues::Fused);  // whatever DS_GEMM_EPILOGUES says
  for (const char* precision : {"--bf16", "--fp16"}) {
    INFO(precision);
    Trainer t(make_config({"--device", "cuda", precision, "--train-iters", "4", "--profile", "--profile-dir", dir}),
              single_process());
    const cuda::EpiloguePathCounts before = cuda::epilogue_path_counts();
    const std::vector<float> losses = t.run();
    const cuda::EpiloguePathCounts after = cuda::epilogue_path_counts();
    REQUIRE(losses.size() == 4);
    for (float l : losses) CHECK(std::isfinite(l));
    // The GPT-2 MLP ran its GELU in the cuBLASLt epilogues, every call.
    CHECK(after.fused_fwd > before.fused_fwd);
    CHECK(after.fused_bwd > before.fused_bwd);
    CHECK(after.unfused_fwd == before.unfused_fwd);
    CHECK(after.unfused_bwd == before.unfused_bwd);
    CHECK(t.profiled_host_syncs() >= 1);
    CHECK(t.profiled_host_syncs() <= kStepSyncs);
  }
}

TEST_CASE("the GPU loss curve in fp32 follows the CPU's", "[gpu]") {
  if (!cuda::device_available()) DS_SKIP("no CUDA device: " << cuda::unavailable_reason());
  const std::vector<float> cpu = train({"--train-iters", "6"});
  const std::vector<float> gpu = train({"--device", "cuda", "--train-iters", "6"});
  REQUIRE(cpu.size() == 6);
  REQUIRE(gpu.size() == 6);
  for (size_t i = 0; i < cpu.size(); ++i) {
    INFO("iteration " << i + 1 << ": cpu " << cpu[i] << ", cuda " << gpu[i]);
    CHECK(std::fabs(gpu[i] - cpu[i]) <= 1e-3 * std::fabs(cpu[i]));
  }
}
